"""Trained adapter sets (lowrank_fl.nn.trained_sets): determinism, cache, ground truth, shapes,
and the factors' ΔW against PEFT's own forward pass (Llama GQA, GPT-2 Conv1D and the §8 backbone)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

from lowrank_fl.nn.trained_sets import (TrainedSetSettings, _logits, _lora_config, _loss,  # noqa: E402
                                        client_tasks, heldout_loss, model_with, trained_set)

TINY = dict(n_clients=4, n_contaminated=2, pretrain_steps=2, steps=2, batch_size=4, rank=2)


@pytest.fixture(scope="module", params=["llama", "gpt2", "sec8"])
def built(request, tmp_path_factory):
    cache = tmp_path_factory.mktemp(f"cache-{request.param}")
    s = TrainedSetSettings.for_base(request.param, **TINY)
    return s, cache, trained_set(s, cache_dir=cache)


def test_truth_shapes_and_tasks(built):
    s, _, ts = built
    assert ts.names == ["client00", "client01", "client02", "client03"]
    assert ts.contaminated == ["client02", "client03"] and ts.benign == ["client00", "client01"]
    bad = ["reverse", "shift"] if s.base == "sec8" else ["shift", "clean"]
    assert [ts.tasks[n].kind for n in ts.names] == ["fuzzy", "fuzzy", *bad]
    mods = ts.factors["client00"]
    assert (ts.local == {}) == (s.base != "sec8")
    if s.base == "sec8":
        # the eight attention projections are aggregated, the output layer stays local (§8)
        assert sorted(m.split("model.")[-1] for m in mods) == [f"blocks.{b}.{x}_proj" for b in (0, 1) for x in "koqv"]
        assert all(m.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) for m in mods)
        ((head, (A, B, sc)),) = ts.local["client00"].items()
        assert head.endswith("lm_head") and A.shape == (2, 64) and B.shape == (53, 2) and sc == 16 / 2
        assert mods[next(iter(mods))][0].shape == (2, 64)
    elif s.base == "llama":
        assert len(mods) == 8                                       # q, k, v, o in 2 layers
        k = next(m for m in mods if m.endswith("layers.0.self_attn.k_proj"))
        q = next(m for m in mods if m.endswith("layers.0.self_attn.q_proj"))
        assert mods[k][1].shape == (32, 2) and mods[q][1].shape == (64, 2)   # GQA: 2 of 4 heads
    else:
        assert len(mods) == 4
        c = next(m for m in mods if m.endswith("h.0.attn.c_attn"))
        assert mods[c][0].shape == (2, 64) and mods[c][1].shape == (192, 2)  # A (r, in), B (out, r)
    for A, B, scaling in mods.values():
        assert A.dtype == np.float64 and scaling == s.lora_alpha / s.rank
    # LoRA updates are non-zero after training (B starts at 0)
    assert all(np.abs(B).max() > 0 for _, B, _ in mods.values())


def test_deterministic_and_cached(built):
    s, cache, ts = built
    again = trained_set(s, cache_dir=cache)                         # from the cache file
    fresh = trained_set(s)                                          # retrained in process
    for n in ts.names:
        for m, (A, B, sc) in ts.factors[n].items():
            for other in (again, fresh):
                A2, B2, sc2 = other.factors[n][m]
                assert np.array_equal(A, A2) and np.array_equal(B, B2) and sc == sc2
    assert len(list(cache.glob("trained-set-*.safetensors"))) == 1


def test_factors_reproduce_peft_forward(built):
    """model_with(factors) (ΔW = s B A added to the base weights, transposed for Conv1D) gives
    the logits of PEFT's LoRA model carrying the same state dict."""
    from peft import get_peft_model, set_peft_model_state_dict

    s, cache, ts = built
    name = "client02"
    own = {**ts.local.get(name, {}), **ts.factors[name]}
    merged = model_with(ts, own, cache_dir=cache)
    torch.manual_seed(0)
    peft_model = get_peft_model(model_with(ts, {}, cache_dir=cache), _lora_config(s))
    sd = {}
    for m, (A, B, _) in own.items():
        sd[f"{m}.lora_A.weight"] = torch.from_numpy(A).float()
        sd[f"{m}.lora_B.weight"] = torch.from_numpy(B).float()
    set_peft_model_state_dict(peft_model, sd)
    batch = ts.tasks[name].sample(8, s.seq_len, seed=1)
    tok = torch.from_numpy(batch.tokens)
    with torch.no_grad():
        a = _logits(merged, tok)
        b = _logits(peft_model.eval(), tok)
    assert torch.allclose(a, b, atol=1e-4)
    with torch.no_grad():
        assert float(_loss(merged, batch)) == pytest.approx(float(_loss(peft_model, batch)), abs=1e-4)
    # heldout_loss adds the client's local modules to the factors it is given
    got = heldout_loss(ts, name, ts.factors[name], n=8, cache_dir=cache)
    assert got == heldout_loss(ts, name, own, n=8, cache_dir=cache)
    if ts.local:
        assert got != heldout_loss(ts, name, {**ts.factors[name], **ts.local["client00"]}, n=8, cache_dir=cache)


def test_sec8_family_is_s5s_backbone_and_lora_recipe(tmp_path):
    """The "sec8" family's base is the §8 backbone pretrained by S5's recipe, bit for bit, and its
    LoRA configuration is S5's (lowrank_fl.nn.clients.LoraSettings' default reading)."""
    from lowrank_fl.nn.clients import LoraSettings
    from lowrank_fl.nn.pretrain import PretrainSettings, pretrained_backbone

    cache = tmp_path
    s = TrainedSetSettings.for_base("sec8", **TINY)
    ts = trained_set(s, cache_dir=cache)
    ref = pretrained_backbone(PretrainSettings(steps=s.pretrain_steps, seed=s.base_seed), cache_dir=cache)
    got = model_with(ts, {}, cache_dir=cache)
    assert set(ref.state_dict()) == set(got.state_dict())
    assert all(torch.equal(ref.state_dict()[k], got.state_dict()[k]) for k in ref.state_dict())
    full = TrainedSetSettings.for_base("sec8")
    cfg, s5 = _lora_config(full), LoraSettings().config()
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, set(cfg.target_modules)) == (
        s5.r, s5.lora_alpha, s5.lora_dropout, set(s5.target_modules))
    assert (full.steps * full.batch_size, full.batch_size, full.lr) == (LoraSettings().n_train, 50, 1e-3)
    assert (full.exponent, full.length, full.base_seed) == (1.1, 16, 1)


def test_task_variations_and_bad_settings():
    het = client_tasks(TrainedSetSettings(n_clients=6, n_contaminated=0, seed=3))
    assert len({(t.length, t.exponent) for t in het.values()}) > 1
    assert all(abs(t.exponent - 0.0) <= 0.15 and abs(t.length - 6) <= 1 for t in het.values())
    hom = client_tasks(TrainedSetSettings(n_clients=6, n_contaminated=3, heterogeneous=False))
    assert {(t.length, t.exponent) for t in hom.values()} == {(6, 0.0)}
    assert [t.kind for t in hom.values()][3:] == ["shift", "clean", "reverse"]
    sec8 = client_tasks(TrainedSetSettings.for_base("sec8", n_clients=40, n_contaminated=0, seed=3))
    assert all(0.95 <= t.exponent <= 1.6 and 10 <= t.length <= 26 for t in sec8.values())   # §8.2's draws
    assert len({t.length for t in sec8.values()}) > 8 and len({t.exponent for t in sec8.values()}) == 40
    hom8 = client_tasks(TrainedSetSettings.for_base("sec8", n_contaminated=1, heterogeneous=False))
    assert {(t.length, t.exponent) for t in hom8.values()} == {(16, 1.1)} and hom8["client09"].kind == "reverse"
    with pytest.raises(ValueError, match="seq_len"):
        TrainedSetSettings.for_base("sec8", seq_len=52)          # the draws reach L = 26: 2 L < 52 fails
    with pytest.raises(ValueError, match="base"):
        TrainedSetSettings.for_base("bert")
    with pytest.raises(ValueError, match="lora_dropout"):
        TrainedSetSettings(lora_dropout=1.0)
    # the field added later keeps the keys of sets cached before it (at its old value)
    assert TrainedSetSettings().key() == TrainedSetSettings(lora_dropout=0.0).key() != \
        TrainedSetSettings(lora_dropout=0.005).key()
    with pytest.raises(ValueError, match="base"):
        TrainedSetSettings(base="bert")
    with pytest.raises(ValueError, match="contamination"):
        TrainedSetSettings(contamination=("swap",))
    with pytest.raises(ValueError, match="n_contaminated"):
        TrainedSetSettings(n_clients=3, n_contaminated=3)


def test_evaluate_set_records_every_method(built):
    from lowrank_fl.nn.trained_eval import LOSS_METHODS, evaluate_set, flags_of

    s, cache, ts = built
    rec = evaluate_set(ts, cache_dir=cache, n_heldout=16)
    assert rec["truth"] == ts.contaminated and set(rec["flagged"]) == {"per-module", "majority", "any", "pooled", "updates"}
    assert set(rec["heldout_loss"]) == set(ts.benign)
    for n, row in rec["heldout_loss"].items():
        assert set(row) == set(LOSS_METHODS)
        # "local" is the client's own adapter: the same number as heldout_loss on its factors
        from lowrank_fl.nn.trained_sets import heldout_loss
        assert row["local"] == heldout_loss(ts, n, ts.factors[n], n=16, cache_dir=cache)
    assert len(rec["selected"]["krum"]) == 1
    assert flags_of(rec, "krum") == [n for n in ts.names if n not in rec["selected"]["krum"]]
    # the rho sweep: one entry per floor, and at the default floor the default rule's own flags
    from lowrank_fl.adapters.detect import POOLED_MIN_RATIO
    from lowrank_fl.nn.trained_eval import MIN_RATIOS
    assert list(rec["updates_by_min_ratio"]) == [f"{r:g}" for r in MIN_RATIOS]
    assert flags_of(rec, f"updates@{POOLED_MIN_RATIO:g}") == rec["flagged"]["updates"]
    with pytest.raises(ValueError, match="floors"):
        flags_of(rec, "updates@1.7")


def test_evaluate_set_accuracies_against_the_base(built):
    """"base" is the model with no adapter: the same accuracy as the model built without any LoRA
    factor (another path: no LoRA module at all); contaminated clients get their adapter's and the
    base's accuracy on their own task."""
    from lowrank_fl.nn.trained_eval import ACCURACY_METHODS, evaluate_set
    from lowrank_fl.nn.trained_sets import heldout_accuracy

    s, cache, ts = built
    rec = evaluate_set(ts, cache_dir=cache, with_loss=False, with_accuracy=True, n_heldout=16)
    assert set(rec["accuracy"]) == set(ts.benign) and set(rec["contaminated_accuracy"]) == set(ts.contaminated)
    for n in ts.benign:
        assert set(rec["accuracy"][n]) == set(ACCURACY_METHODS)
        assert rec["accuracy"][n]["base"] == heldout_accuracy(ts, n, {}, n=16, cache_dir=cache)
        assert rec["accuracy"][n]["local"] == heldout_accuracy(ts, n, ts.factors[n], n=16, cache_dir=cache)
    from lowrank_fl.adapters import ModuleOptions, aggregate_factors
    from lowrank_fl.nn.trained_eval import oracle_agreement
    want = oracle_agreement(np.array([r.gram for r in aggregate_factors(ts.factors, ModuleOptions(
        output_dtype="float64")).aggregation.results]), [n not in ts.contaminated for n in ts.names])
    assert list(rec["oracle_agreement"].values()) == pytest.approx(want.tolist(), abs=1e-12)
    for n, v in rec["contaminated_accuracy"].items():
        assert v == {"local": heldout_accuracy(ts, n, ts.factors[n], n=16, cache_dir=cache),
                     "base": heldout_accuracy(ts, n, {}, n=16, cache_dir=cache)}


def test_evaluate_set_reruns_the_update_rule_at_each_floor(built, monkeypatch):
    """Each floor's entry is the update rule's flags at that ρ, under the small-federation guard:
    a stand-in rule that flags the last client up to ρ = 1.2, nobody at 1.3 and 1.5, and half of
    the clients at 2 (not a strict majority left: undecided, nobody flagged)."""
    import lowrank_fl.nn.trained_eval as te

    s, cache, ts = built
    K = len(ts.names)

    def fake(grams, outside, min_ratio):
        assert grams.shape[-1] == K and outside.shape == grams.shape[:2]
        if min_ratio == 2.0:
            return np.arange(K) < (K + 1) // 2
        return (np.arange(K) == K - 1) & (min_ratio <= 1.2)

    monkeypatch.setattr(te, "update_flags", fake)
    rec = te.evaluate_set(ts, cache_dir=cache, with_loss=False)
    last = [ts.names[-1]]
    assert rec["updates_by_min_ratio"] == {"1": last, "1.1": last, "1.2": last, "1.3": [], "1.5": [], "2": []}


def test_evaluate_set_counts_an_undecided_set_as_nobody_flagged(built, monkeypatch):
    """A client-level set that decides nothing (not a strict majority: the guard's undecided set,
    all False) flags nobody, as the CLI reports it, not every client."""
    import lowrank_fl.nn.trained_eval as te

    from lowrank_fl.adapters import guard

    s, cache, ts = built
    # every client-level set undecided (the guard's answer when a set is not a strict majority)
    monkeypatch.setattr(guard, "guard_set", lambda benign: np.zeros(len(ts.names), bool))
    rec = te.evaluate_set(ts, cache_dir=cache, with_loss=False)
    assert all(rec["flagged"][rule] == [] for rule in ("majority", "any", "pooled", "updates"))


def test_evaluate_set_flags_whom_the_cli_flags(built):
    """Per rule, the benchmark's flags are the CLI summary's (an undecided module abstains under
    "per-module": it flags nobody), computed here from the same module results."""
    from lowrank_fl.adapters import ModuleOptions, aggregate_factors
    from lowrank_fl.nn.trained_eval import RULES, evaluate_set

    s, cache, ts = built
    rec = evaluate_set(ts, cache_dir=cache, with_loss=False)
    for rule in RULES:
        res = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"), client_rule=rule)
        assert rec["flagged"][rule] == res.summary["detection"]["flagged"], rule


def test_detection_table_counts_by_hand():
    from lowrank_fl.nn.trained_eval import detection_table

    names = ["a", "b", "c", "d"]
    recs = [{"names": names, "truth": ["d"], "flagged": {"pooled": ["c", "d"]}},
            {"names": names, "truth": ["c", "d"], "flagged": {"pooled": ["d"]}},
            {"names": names, "truth": [], "flagged": {"pooled": ["a"]}},
            {"names": names, "truth": [], "flagged": {"pooled": []}}]
    (row,) = detection_table(recs, rules=("pooled",))
    # true positives d, d; false positives c, a; false negative c
    assert row["precision"] == 2 / 4 and row["recall"] == 2 / 3
    assert (row["exact_sets"], row["contaminated_sets"]) == (0, 2)
    assert (row["clean_sets_false_flag"], row["clean_sets"]) == (1, 2)
    assert (row["benign_flagged"], row["benign_clients"]) == (2, 3 + 2 + 4 + 4)


def test_harm_table_by_hand():
    """Two sets of two benign clients: set 1, where the benign FedAvg gains 0.10 on average (a set
    where averaging pays); set 2, where it loses. For "clair-shrink": changes (+0.05, +0.03) and
    (-0.01, -0.04) -> worst set mean -0.025, one client losing more than 0.03, gain kept 0.04/0.10."""
    from lowrank_fl.nn.trained_eval import ACCURACY_METHODS, harm_table

    def rec(local, shrink, fedavg_benign):
        return {"accuracy": {f"c{i}": {**{m: local[i] for m in ACCURACY_METHODS}, "clair-shrink": shrink[i],
                                       "fedavg-benign": fedavg_benign[i]} for i in range(2)}}

    recs = [rec([0.5, 0.6], [0.55, 0.63], [0.6, 0.7]), rec([0.7, 0.8], [0.69, 0.76], [0.6, 0.7]),
            {"no": "accuracy"}]                                  # records without accuracies are skipped
    rows = {r["method"]: r for r in harm_table(recs)}
    assert list(rows) == list(ACCURACY_METHODS)
    sh = rows["clair-shrink"]
    assert sh["worst_set_mean_change"] == pytest.approx(-0.025) and (sh["clients_losing"], sh["clients"]) == (1, 4)
    assert sh["collab_sets"] == 1 and sh["gain_kept_median"] == pytest.approx(0.4) == sh["gain_kept_min"]
    assert rows["local"]["worst_set_mean_change"] == 0 and rows["local"]["gain_kept_median"] == 0
    assert rows["fedavg-benign"]["gain_kept_median"] == pytest.approx(1.0)


def test_harm_table_skips_a_method_older_records_lack():
    from lowrank_fl.nn.trained_eval import ACCURACY_METHODS, harm_table

    old = {"accuracy": {"c0": {m: 0.5 for m in ACCURACY_METHODS if m != "base"}}}
    assert [r["method"] for r in harm_table([old])] == [m for m in ACCURACY_METHODS if m != "base"]


def test_learning_table_by_hand():
    """Benign gains (own - base) -0.10, +0.05, +0.01 -> median +0.01, one learned (> 0.02);
    contaminated gains +0.30 (found), +0.015 (below the margin, found), -0.05 (missed)."""
    from lowrank_fl.nn.trained_eval import learning_table

    def rec(benign, bad, flagged):
        return {"names": [*benign, *bad], "truth": list(bad), "default_flagged": flagged,
                "accuracy": {n: {"local": b + g, "base": b} for n, (b, g) in benign.items()},
                "contaminated_accuracy": {n: {"local": b + g, "base": b} for n, (b, g) in bad.items()}}

    recs = [rec({"a": (0.5, -0.10), "b": (0.25, 0.05)}, {"x": (0.25, 0.30), "y": (0.5, 0.015)}, ["x", "y"]),
            rec({"c": (0.5, 0.01)}, {"z": (0.5, -0.05)}, ["c"]), {"no": "accuracy"}]
    t = learning_table(recs)
    assert (t["sets"], t["benign"], t["benign_learned"], t["contaminated"]) == (2, 3, 1, 3)
    assert t["benign_gain_median"] == pytest.approx(0.01) and t["contaminated_gain_median"] == pytest.approx(0.015)
    assert (t["contaminated_learned"], t["learned_found"], t["not_learned_found"]) == (1, 1, 1)
    assert learning_table(recs, margin=0.0)["contaminated_learned"] == 2       # y's +0.015 counts now


def test_oracle_agreement_against_a_loop():
    """Each client's mean cosine with the truly benign others, per module then averaged, against a
    plain loop over clients and modules; a zero update agrees 0 with everyone."""
    from lowrank_fl.nn.trained_eval import oracle_agreement

    rng = np.random.default_rng(4)
    X = rng.standard_normal((3, 6, 20))
    X[1, 2] = 0.0                                            # client 2 untrained in module 1
    G = X @ X.transpose(0, 2, 1)
    benign = np.array([True, True, False, True, False, True])
    got = oracle_agreement(G, benign)
    for k in range(6):
        per = []
        for m in range(3):
            cos = [0.0 if not X[m, k].any() or not X[m, j].any() else
                   X[m, k] @ X[m, j] / np.linalg.norm(X[m, k]) / np.linalg.norm(X[m, j])
                   for j in range(6) if benign[j] and j != k]
            per.append(np.mean(cos))
        assert got[k] == pytest.approx(np.mean(per), abs=1e-12)
    assert np.isnan(oracle_agreement(G, [True] + [False] * 5)).all()    # one benign client: undefined


def test_oracle_table_by_hand():
    from lowrank_fl.nn.trained_eval import oracle_table

    recs = [{"names": ["a", "b", "c", "d"], "truth": ["c", "d"],
             "oracle_agreement": {"a": 0.05, "b": 0.02, "c": 0.01, "d": 0.03}},     # c below both
            {"names": ["a", "b", "c"], "truth": [], "oracle_agreement": {"a": 0.1, "b": 0.1, "c": 0.1}},
            {"names": ["a", "b"], "truth": ["b"], "oracle_agreement": {"a": None, "b": None}},   # 1 benign
            {"names": ["a"], "truth": []}]                                              # not measured
    assert oracle_table(recs) == {"contaminated": 2, "separable": 1}


def test_flags_of_comparison_rules():
    """"pooled-z" is the score against the record's c_K alone (the first pooled rule), "pooled@3.5"
    against 3.5; with fewer than 3 clients (no cutoff) the score flags nobody."""
    from lowrank_fl.nn.trained_eval import flags_of

    rec = {"names": ["a", "b", "c"], "pooled_block": {"a": 0.2, "b": 4.0, "c": 6.5},
           "pooled_threshold": 6.0, "flagged": {"pooled": []}}
    assert flags_of(rec, "pooled-z") == ["c"] and flags_of(rec, "pooled@3.5") == ["b", "c"]
    assert flags_of(rec, "pooled") == []
    assert flags_of({**rec, "pooled_threshold": None}, "pooled-z") == []
    assert flags_of({**rec, "updates_by_min_ratio": {"1.2": ["b"], "1.5": []}}, "updates@1.5") == []
    assert flags_of({**rec, "updates_by_min_ratio": {"1.2": ["b"], "1.5": []}}, "updates@1.2") == ["b"]


@pytest.fixture(scope="module")
def copying_sets(tmp_path_factory):
    """A llama base that copies (600 pretraining steps: masked accuracy above the copying
    threshold) and two federations of 6 clients on it: one contaminated client ("shift"), and none."""
    cache = tmp_path_factory.mktemp("copying")
    common = dict(base="llama", n_clients=6, pretrain_steps=600, seed=5)
    return cache, {bad: trained_set(TrainedSetSettings(**common, n_contaminated=bad), cache_dir=cache)
                   for bad in (0, 1)}


def test_base_copies_and_accuracy_matches_predictions(copying_sets):
    from lowrank_fl.nn import copying
    from lowrank_fl.nn.trained_sets import base_accuracy, copying_threshold

    cache, sets = copying_sets
    s = sets[1].settings
    assert copying_threshold(0.0) == pytest.approx((100 / 52 + 100) / 2)
    acc = base_accuracy(s, cache_dir=cache, n=200)
    assert acc > copying_threshold(s.exponent)
    # the same number by hand: argmax predictions of the base scored on §8.2's positions
    from lowrank_fl.validation import as_generator
    from lowrank_fl.nn.trained_sets import ClientTask
    batch = ClientTask("fuzzy", s.length, s.exponent).sample(
        200, s.seq_len, seed=as_generator(0, "trained-set-base-accuracy"))
    with torch.no_grad():
        logits = model_with(sets[1], {}, cache_dir=cache)(torch.from_numpy(batch.tokens[:, :-1])).logits
    pred = np.concatenate([np.full((200, 1), -1), logits.argmax(-1).numpy()], axis=1)
    assert acc == pytest.approx(100 * (1 - copying.masked_error(pred, batch)))


def test_default_rule_flags_exactly_the_contaminated_client_and_nobody_without(copying_sets):
    """The default client-level decision on PEFT-trained adapters: the contaminated client alone
    when there is one, nobody when there is none (the issue's acceptance criterion)."""
    from lowrank_fl.adapters import DEFAULT_CLIENT_RULE, ModuleOptions, aggregate_factors

    _, sets = copying_sets
    assert DEFAULT_CLIENT_RULE == "updates"
    for bad, ts in sets.items():
        res = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"))
        det = res.summary["detection"]
        assert det["rule"] == "updates"
        assert det["flagged"] == ts.contaminated == (["client05"] if bad else [])
        if bad:                              # the flagged client keeps its own update, every module
            for m, (A, B, sc) in res.outputs["client05"].items():
                A0, B0, s0 = ts.factors["client05"][m]
                assert np.allclose(sc * B @ A, s0 * B0 @ A0, rtol=0, atol=1e-9 * np.abs(s0 * B0 @ A0).max())


def test_one_base_serves_every_client_seed_without_a_cache(monkeypatch):
    """With cache_dir=None the base is pretrained once per base settings, not once per set or call."""
    import lowrank_fl.nn.trained_sets as T

    calls = []
    real = T._pretrained_base
    monkeypatch.setattr(T, "_pretrained_base", lambda s, c: calls.append(s.seed) or real(s, c))
    monkeypatch.setattr(T, "_BASES", {})
    threads = torch.get_num_threads()
    s = TrainedSetSettings(**{**TINY, "pretrain_steps": 3}, seed=11)
    a = trained_set(s)
    b = trained_set(TrainedSetSettings(**{**TINY, "pretrain_steps": 3}, seed=12))
    T.base_accuracy(s, n=8)
    heldout_loss(a, "client00", a.factors["client00"], n=4)
    assert calls == [11] and a.names == b.names
    assert torch.get_num_threads() == threads                     # the caller's setting is restored
    trained_set(TrainedSetSettings(**{**TINY, "pretrain_steps": 4}, seed=11))
    assert calls == [11, 11]                                      # another base: pretrained again


def test_settings_are_checked_and_contamination_is_hashable():
    s = TrainedSetSettings(contamination=["reverse"])
    assert s.contamination == ("reverse",) and hash(s) == hash(TrainedSetSettings(contamination=("reverse",)))
    assert s.key() == TrainedSetSettings(contamination=("reverse",)).key()
    with pytest.raises(ValueError, match="contamination"):
        TrainedSetSettings(contamination="reverse")
    for name, bad in (("lr", 0.0), ("lr", float("nan")), ("pretrain_lr", -1e-3), ("lora_alpha", float("inf")),
                      ("spread", -0.1), ("exponent", float("nan")), ("lora_dropout", "x"), ("lora_dropout", 1.0)):
        with pytest.raises(ValueError, match=name):
            TrainedSetSettings(**{name: bad})
    # homogeneous sets need 2 L < seq_len, heterogeneous ones room for their longest draw
    TrainedSetSettings.for_base("sec8", heterogeneous=False, seq_len=33)
    with pytest.raises(ValueError, match="seq_len must exceed 32"):
        TrainedSetSettings.for_base("sec8", heterogeneous=False, seq_len=32)
    TrainedSetSettings(length=6, seq_len=15)                       # llama: L up to 7
    with pytest.raises(ValueError, match="seq_len must exceed 14"):
        TrainedSetSettings(length=6, seq_len=14)


def test_model_with_names_the_bad_factors(built):
    s, cache, ts = built
    with pytest.raises(ValueError, match=r"pass tset.factors\[client\]"):
        model_with(ts, ts.factors, cache_dir=cache)
    name, (A, B, sc) = next(iter(ts.factors["client00"].items()))
    with pytest.raises(ValueError, match=rf"factors\['{name}'\]: A \(2, 5\)"):
        model_with(ts, {name: (A[:, :5], B, sc)}, cache_dir=cache)
    with pytest.raises(ValueError, match=r"must be \(A, B, scaling\)"):
        model_with(ts, {name: (A, B)}, cache_dir=cache)
