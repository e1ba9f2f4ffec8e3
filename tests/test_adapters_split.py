"""The split output layout: OUT/shared/ once and each client's own part, loaded in PEFT.

PEFT's effective ΔW of a loaded client (both adapters active, or concatenated with
``add_weighted_adapter(..., "cat")``) is compared with the weighted refinement
``ΔW_k (I - a_k (I - P_Â)) + a_k ΔW̄_Ĉ (I - P_Â)`` computed on full matrices in numpy, with ``P_Â``
from :func:`lowrank_fl.clair.fit` on the full updates (an independent solve of (7))."""
import json
import re

import numpy as np
import pytest

from lowrank_fl import clair
from lowrank_fl.adapters import ModuleOptions, aggregate_to_dir, load_adapters
from lowrank_fl.adapters.io import module_key
from lowrank_fl.adapters.split import MANIFEST, SHARED, shared_weights
from lowrank_fl.adapters.synthetic import write_synthetic_adapters
from lowrank_fl.cli import main

K = 6


def _weighted_refinement(W, P, benign, a):
    """(K, out, in) of ΔW_k (I - a_k (I - P)) + a_k ΔW̄_Ĉ (I - P); own ΔW_k outside Ĉ."""
    Iperp = np.eye(P.shape[0]) - P
    mean = W[benign].mean(axis=0) @ Iperp
    return np.stack([W[k] - a[k] * W[k] @ Iperp + a[k] * mean if benign[k] else W[k]
                     for k in range(len(W))])


def _reference(dirs, summary, weights):
    """{module: (K, out, in)} from full matrices, P_Â from clair.fit with the module's λ (on the
    clients kept by the client-level rule where the module was re-solved without the flagged)."""
    ad = load_adapters(dirs)
    out = {}
    for m in ad.modules:
        f = ad.factors(m)
        W = np.stack([f.delta(k) for k in range(len(dirs))])
        s = summary["modules"][m]
        # flagged clients do not steer P_Â: (7) re-solved on the others' contrasts (refit)
        keep = [k for k in range(len(dirs)) if not s["refit"] or k not in s["refit"]["excluded"]]
        lam = s["refit"] or s
        fit = clair.fit(W[keep], rank=s["rank"], lam_L=lam["lam_L"], lam_S=lam["lam_S"], tol=1e-11,
                        max_iter=100000)
        benign = np.array(s["benign_applied"], bool)
        out[m] = _weighted_refinement(W, fit.projector, benign, weights[m])
    return out


# ------------------------------------------------------------------------------ numpy only
@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("split_src")
    return write_synthetic_adapters(root, n_clients=K, n_layers=1, modules=("q_proj", "v_proj"),
                                    shape=(40, 32), rank=3, contaminated=1, dtype="float32",
                                    seed=3)


def _read(dir_):
    from safetensors.numpy import load_file

    t = load_file(str(dir_ / "adapter_model.safetensors"))
    cfg = json.loads((dir_ / "adapter_config.json").read_text())
    mods = sorted({k.rsplit(".lora_", 1)[0] for k in t})
    # every written module has scaling 1 (lora_alpha = r, alpha_pattern = rank_pattern)
    assert cfg["lora_alpha"] == cfg["r"] and cfg["alpha_pattern"] == cfg["rank_pattern"]
    return {m: t[f"{m}.lora_B.weight"].astype(float) @ t[f"{m}.lora_A.weight"].astype(float)
            for m in mods}


WEIGHTS = [None, [1.0, 0.5, 0.0, 1.0, 0.25, 1.0], "per-module"]


@pytest.mark.parametrize("weights", WEIGHTS, ids=["a=1", "per-client", "per-module"])
@pytest.mark.parametrize("rule", ["pooled", "per-module"])
def test_split_parts_sum_to_the_weighted_refinement(src, tmp_path, weights, rule):
    ad = load_adapters(src)
    if weights == "per-module":
        weights = {m: [0.5, 1.0, 0.0, 0.75, 1.0, 0.5][::(1 if i == 0 else -1)]
                   for i, m in enumerate(ad.modules)}
    opts = ModuleOptions(output_dtype="float64", tol=1e-11, contrasts="dense")
    agg, summary = aggregate_to_dir(ad, opts, tmp_path / "out", client_rule=rule,
                                    dtype="float64", progress=False, shared_weights=weights,
                                    refine="paper")
    out = tmp_path / "out"
    assert summary["layout"] == "split" and summary["outputs"] == ad.names + [SHARED]
    a = shared_weights(weights, ad.names, ad.modules)
    ref = _reference(src, summary, a)
    shared = _read(out / SHARED)
    for k, name in enumerate(ad.names):
        own = _read(out / name)
        man = json.loads((out / name / MANIFEST).read_text())
        w = man["shared_weight"]
        assert man["shared_weight"] == summary["refinement_weights"][name]
        for m in ad.modules:
            wm = w[m] if isinstance(w, dict) else w
            benign = summary["modules"][m]["benign_applied"][k]
            assert wm == (a[m][k] if benign else 0.0)
            got = own[m] + wm * shared[m]
            assert np.linalg.norm(got - ref[m][k]) <= 1e-6 * np.linalg.norm(ref[m][k]), (name, m)
            if not benign or wm == 0:                   # its own adapter, exactly
                f = ad.factors(m)
                assert np.array_equal(own[m], f.delta(k))
    # the contaminated client (the last) is outside the set and gets no shared part
    assert summary["refinement_weights"][ad.names[-1]] == 0.0
    # the shared adapter's rank is the collaborative clients' total rank
    for m in ad.modules:
        n = sum(summary["modules"][m]["benign_applied"])
        cfg = json.loads((out / SHARED / "adapter_config.json").read_text())
        assert cfg["rank_pattern"].get(re.escape(module_key(m)), cfg["r"]) == 3 * n


def test_merged_weighted_outputs_match_the_formula(src, tmp_path):
    ad = load_adapters(src)
    weights = [1.0, 0.5, 0.0, 1.0, 0.25, 1.0]
    opts = ModuleOptions(output_dtype="float64", tol=1e-11, contrasts="dense")
    _, summary = aggregate_to_dir(ad, opts, tmp_path / "m", output="merged", dtype="float64",
                                  progress=False, shared_weights=weights)
    assert summary["layout"] == "merged" and summary["outputs"] == ad.names
    ref = _reference(src, summary, shared_weights(weights, ad.names, ad.modules))
    for k, name in enumerate(ad.names):
        got = _read(tmp_path / "m" / name)
        assert not (tmp_path / "m" / name / MANIFEST).exists()
        for m in ad.modules:
            assert np.linalg.norm(got[m] - ref[m][k]) <= 1e-6 * np.linalg.norm(ref[m][k])


def test_merged_with_unit_weights_is_unchanged(src, tmp_path):
    """weight=1 is exactly the former (9) path: byte-identical files with and without weights."""
    ad = load_adapters(src)
    opts = ModuleOptions(tol=1e-8)
    aggregate_to_dir(ad, opts, tmp_path / "a", output="merged", progress=False, refine="paper")
    aggregate_to_dir(ad, opts, tmp_path / "b", output="merged", progress=False,
                     shared_weights=[1.0] * K)
    for name in ad.names:
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            assert (tmp_path / "a" / name / f).read_bytes() == (tmp_path / "b" / name / f).read_bytes()


@pytest.mark.parametrize("bad, match", [([1.0] * (K - 1), "one weight per client"),
                                        ([1.5] + [1.0] * (K - 1), r"\[0, 1\], got client_00: 1.5$"),
                                        ([np.nan] + [1.0] * (K - 1), r"\[0, 1\], got client_00: nan$"),
                                        (1.5, r"\[0, 1\], got 1.5$"),
                                        ({"nosuchmodule": [0.3] * K}, "unknown client.*a mapping by module names"),
                                        ({"client_00": 1.0}, "no weight for client"),
                                        ({"nobody": 1.0}, "unknown client")])
def test_bad_weights_are_refused_before_solving(src, tmp_path, bad, match):
    ad = load_adapters(src)
    with pytest.raises(ValueError, match=match):
        aggregate_to_dir(ad, ModuleOptions(), tmp_path / "x", progress=False, shared_weights=bad)
    assert not (tmp_path / "x").exists()


def test_cli_output_option_and_sizes(src, tmp_path, capsys):
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "s"),
                 "--quiet", "--refine", "paper"]) == 0
    text = capsys.readouterr().out
    assert "split layout" in text and (tmp_path / "s" / SHARED).is_dir()
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "m"),
                 "--quiet", "--output", "merged", "--refine", "paper"]) == 0
    size = {d: sum(p.stat().st_size for p in (tmp_path / d).rglob("*.safetensors"))
            for d in ("s", "m")}
    assert size["s"] < size["m"]
    # --refine own: nothing shared is written, and the output line says so instead of shared/
    capsys.readouterr()
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "o"),
                 "--quiet", "--refine", "own"]) == 0
    text = capsys.readouterr().out
    assert "no client uses a shared part, so none was written" in text and "shared/ once" not in text
    assert not (tmp_path / "o" / SHARED).exists()
    # a flagged client under --refine own: nobody receives anything, and the sentence says so
    assert "flagged client_05 by the update rule" in text
    assert "every client keeps its own adapter (--refine own), so nobody receives them." in text
    assert "left out of what the others receive" not in text
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "d"), "--quiet"]) == 0
    assert "their updates are left out of what the others receive." in capsys.readouterr().out
    assert "none was written" in json.loads((tmp_path / "o" / src[0].name / MANIFEST).read_text())["note"]
    # --rank-out is a truncation of merged outputs: with --output split it is refused
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "r"),
                 "--quiet", "--output", "split", "--rank-out", "2"]) == 2
    assert "--rank-out" in capsys.readouterr().err


def test_client_named_shared_is_refused_in_split_layout(src, tmp_path, capsys):
    names = ",".join(["shared"] + [f"c{k}" for k in range(1, K)])
    assert main(["adapters", "aggregate", *map(str, src), "--names", names, "--out",
                 str(tmp_path / "o"), "--quiet"]) == 2
    assert "named 'shared'" in capsys.readouterr().err
    assert main(["adapters", "aggregate", *map(str, src), "--names", names, "--out",
                 str(tmp_path / "o"), "--quiet", "--output", "merged"]) == 0


@pytest.mark.parametrize("how", ["refine own", "weights 0"])
def test_an_unused_shared_adapter_is_not_written(src, tmp_path, how):
    # --refine own (or every weight 0): every client keeps its own adapter, nothing refers to
    # OUT/shared, so it is not written and the manifests say so
    ad = load_adapters(src)
    kw = {"refine": "own"} if how == "refine own" else {"refine": "paper", "shared_weights": 0.0}
    _, summary = aggregate_to_dir(ad, ModuleOptions(output_dtype="float64"), tmp_path / "out",
                                  dtype="float64", progress=False, **kw)
    out = tmp_path / "out"
    assert not (out / SHARED).exists()
    assert summary["outputs"] == ad.names and summary["layout"] == "split"
    for k, name in enumerate(ad.names):
        man = json.loads((out / name / MANIFEST).read_text())
        assert man["shared"] is None and man["shared_weight"] == 0.0
        own = _read(out / name)
        for m in ad.modules:                             # its own adapter, exactly
            assert np.array_equal(own[m], ad.factors(m).delta(k))
    # the in-memory path returns what the directory path writes
    from lowrank_fl.adapters import aggregate_factors
    mem = aggregate_factors(ad, ModuleOptions(output_dtype="float64"), output="split", **kw)
    assert SHARED not in mem.outputs and mem.summary["outputs"] == ad.names
    # with one weight above 0 the shared adapter is written and referred to
    _, summary = aggregate_to_dir(ad, ModuleOptions(output_dtype="float64"), tmp_path / "one",
                                  dtype="float64", progress=False, refine="paper",
                                  shared_weights=[0.5] + [0.0] * (K - 1))
    assert (tmp_path / "one" / SHARED).is_dir() and summary["outputs"] == ad.names + [SHARED]
    assert json.loads((tmp_path / "one" / ad.names[0] / MANIFEST).read_text())["shared"] == f"../{SHARED}"


def test_a_split_client_part_is_refused_as_an_adapter_unless_it_is_the_whole_update(src, tmp_path, capsys):
    """A client directory of a split-layout output holds only the client's own part where its shared
    weight is above 0: read as an adapter (a second round started from it) it would silently drop
    the shared part, so it is refused, naming the directory and the way out; with every weight 0 it
    is the client's own adapter and reads as one."""
    from lowrank_fl.adapters.io import AdapterError
    ad = load_adapters(src)
    aggregate_to_dir(ad, ModuleOptions(output_dtype="float64"), tmp_path / "out", dtype="float64",
                     progress=False, refine="paper", shared_weights=[0.0, 0.0] + [0.5] * (K - 2))
    parts = [tmp_path / "out" / n for n in ad.names]
    with pytest.raises(AdapterError, match=rf"{ad.names[2]}: the client's own part in a lowrank-fl split-layout output "
                                           r".*shared weight up to 0\.5\).*load_split\(\.\.\., combine='cat'\)"
                                           r".*re-run the aggregation "
                                           r"that wrote it with --output merged"):
        load_adapters(parts)
    assert load_adapters(parts[:2]).names == ad.names[:2]            # weight 0: their whole updates
    assert load_adapters(parts, split_parts=True).names == ad.names  # as they are (inspect)
    assert main(["adapters", "aggregate", *map(str, parts), "--out", str(tmp_path / "again"), "--quiet"]) == 2
    assert "split-layout output" in capsys.readouterr().err and not (tmp_path / "again").exists()
    man = json.loads((parts[2] / MANIFEST).read_text())
    for w, refused in (({m: 0.0 for m in ad.modules}, False), ({m: float(m == ad.modules[-1]) for m in ad.modules},
                       True), (float("nan"), "manifest")):
        (parts[1] / MANIFEST).write_text(json.dumps(dict(man, shared_weight=w)))   # per module, or not a weight
        if refused:
            match = "not a lowrank-fl split-layout manifest" if refused == "manifest" else "shared weight up to 1\\)"
            with pytest.raises(AdapterError, match=match):
                load_adapters(parts[:2])
        else:
            assert load_adapters(parts[:2]).names == ad.names[:2]
    (parts[1] / MANIFEST).write_text(json.dumps(dict(man, shared=None)))      # nothing shared was written
    assert load_adapters(parts[:2]).names == ad.names[:2]
    (parts[1] / MANIFEST).write_text("{not json")
    with pytest.raises(AdapterError, match="not a lowrank-fl split-layout manifest"):
        load_adapters(parts[:2])


# ------------------------------------------------------------------------------ PEFT
def _peft_case(tmp_path):
    peft = pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def base():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=4, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(cfg).double().eval()

    rng = np.random.default_rng(7)
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    dirs, common = [], {}
    for k in range(K):
        model = peft.get_peft_model(base(), lcfg)
        for name, mod in model.named_modules():
            if "default" in getattr(mod, "lora_A", {}):
                A0 = common.setdefault(name, rng.standard_normal((4, 32)))
                A = rng.standard_normal((4, 32)) if k == K - 1 else A0 + 0.05 * rng.standard_normal((4, 32))
                with torch.no_grad():
                    mod.lora_A["default"].weight.copy_(torch.from_numpy(A))
                    mod.lora_B["default"].weight.copy_(torch.from_numpy(0.1 * rng.standard_normal((32, 4))))
        d = tmp_path / f"client{k}"
        model.save_pretrained(str(d))
        dirs.append(d)
    return peft, torch, base, dirs


def _effective(model):
    """{module: Σ over the layer's active adapters of PEFT's get_delta_weight}."""
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "get_delta_weight") and getattr(mod, "lora_A", None):
            active = [a for a in mod.active_adapters if a in mod.lora_A]
            out[name.removeprefix("base_model.model.")] = sum(
                mod.get_delta_weight(a).detach().double().numpy() for a in active)
    return out


@pytest.mark.parametrize("combine", ["active", "cat"])
def test_peft_loads_both_parts_and_matches_the_formula(tmp_path, combine):
    peft, torch, base, dirs = _peft_case(tmp_path)
    from lowrank_fl.adapters.peft_load import load_split

    ad = load_adapters(dirs)
    weights = [1.0, 0.5, 0.0, 1.0, 0.5, 1.0]
    opts = ModuleOptions(output_dtype="float64", tol=1e-11, contrasts="dense")
    _, summary = aggregate_to_dir(ad, opts, tmp_path / "out", dtype="float64", progress=False,
                                  shared_weights=weights)
    assert summary["modules"][ad.modules[0]]["benign_applied"] == [True] * (K - 1) + [False]
    ref = _reference(dirs, summary, shared_weights(weights, ad.names, ad.modules))
    for k, name in enumerate(ad.names):
        model = load_split(base(), tmp_path / "out", name, combine=combine)
        names = {a for _, mod in model.named_modules() for a in getattr(mod, "lora_A", {})}
        assert names == ({"default"} if combine == "cat" or weights[k] == 0 or k == K - 1
                         else {"default", SHARED})
        got = _effective(model)
        assert len(got) == len(ad.modules)
        for m in ad.modules:
            key = m.removeprefix("base_model.model.")
            assert np.linalg.norm(got[key] - ref[m][k]) <= 1e-6 * np.linalg.norm(ref[m][k]), (name, m)
        # PEFT's forward adds the same ΔW (both adapters active at once, or the concatenation)
        layer = dict(model.named_modules())["base_model.model." + ad.modules[0].removeprefix("base_model.model.")]
        x = torch.eye(32, dtype=torch.float64)
        with torch.no_grad():
            dy = (layer(x) - layer.base_layer(x)).numpy().T
        want = ref[ad.modules[0]][k]
        assert np.linalg.norm(dy - want) <= 1e-6 * np.linalg.norm(want)


def test_peft_loads_a_merged_output_as_one_adapter(tmp_path):
    peft, torch, base, dirs = _peft_case(tmp_path)
    from lowrank_fl.adapters.peft_load import load_split

    ad = load_adapters(dirs)
    opts = ModuleOptions(output_dtype="float64", tol=1e-11, contrasts="dense")
    _, summary = aggregate_to_dir(ad, opts, tmp_path / "out", dtype="float64", progress=False,
                                  output="merged", refine="paper")
    ref = _reference(dirs, summary, shared_weights(None, ad.names, ad.modules))
    for k, name in enumerate(ad.names):
        got = _effective(load_split(base(), tmp_path / "out", name))
        for m in ad.modules:
            key = m.removeprefix("base_model.model.")
            assert np.linalg.norm(got[key] - ref[m][k]) <= 1e-6 * np.linalg.norm(ref[m][k])


def test_load_split_refuses_a_weight_without_a_shared_adapter(src, tmp_path):
    pytest.importorskip("peft")
    from lowrank_fl.adapters.io import AdapterError
    from lowrank_fl.adapters.peft_load import load_split

    ad = load_adapters(src)
    aggregate_to_dir(ad, ModuleOptions(output_dtype="float64"), tmp_path / "out", dtype="float64",
                     progress=False, refine="own")
    man = tmp_path / "out" / ad.names[0] / MANIFEST
    doc = json.loads(man.read_text())
    doc["shared_weight"] = 0.5                       # edited by hand: nothing to scale
    man.write_text(json.dumps(doc))
    with pytest.raises(AdapterError, match="no shared adapter was written"):
        load_split(object(), tmp_path / "out", ad.names[0])


def test_peft_loads_a_refine_own_output_as_the_clients_own_adapters(tmp_path):
    peft, torch, base, dirs = _peft_case(tmp_path)
    from lowrank_fl.adapters.peft_load import load_split

    ad = load_adapters(dirs)
    _, summary = aggregate_to_dir(ad, ModuleOptions(output_dtype="float64"), tmp_path / "out", dtype="float64",
                                  progress=False, refine="own")
    assert not (tmp_path / "out" / SHARED).exists()
    # a per-module weight dict of zeros (as another tool might write it) reads the same
    man = tmp_path / "out" / ad.names[1] / MANIFEST
    doc = json.loads(man.read_text())
    doc["shared_weight"] = {m: 0.0 for m in ad.modules}
    man.write_text(json.dumps(doc))
    for k, name in enumerate(ad.names):
        model = load_split(base(), tmp_path / "out", name)
        assert {a for _, mod in model.named_modules() for a in getattr(mod, "lora_A", {})} == {"default"}
        got = _effective(model)
        for m in ad.modules:
            want = ad.factors(m).delta(k)                    # the client's own ΔW = s B A, as read
            key = m.removeprefix("base_model.model.")
            assert np.linalg.norm(got[key] - want) <= 1e-12 * np.linalg.norm(want), (name, m)


def test_load_split_refuses_a_model_that_already_holds_adapters(tmp_path):
    peft, torch, base, dirs = _peft_case(tmp_path)
    from lowrank_fl.adapters.peft_load import load_split

    ad = load_adapters(dirs)
    aggregate_to_dir(ad, ModuleOptions(output_dtype="float64"), tmp_path / "out", dtype="float64",
                     progress=False, shared_weights=0.5)
    model = base()
    first = load_split(model, tmp_path / "out", ad.names[0])       # injects LoRA layers into `model`
    before = _effective(first)
    for again in (model, first):                                   # the same base, or the PeftModel
        with pytest.raises(ValueError, match="already carries PEFT adapters.*fresh base model"):
            load_split(again, tmp_path / "out", ad.names[0], combine="cat")
    after = _effective(first)                                      # nothing was stacked on it
    assert before.keys() == after.keys() and all(np.array_equal(before[m], after[m]) for m in before)


def test_weight_errors_say_what_they_leave_out(src, tmp_path):
    ad = load_adapters(src)
    assert K == 6
    with pytest.raises(ValueError,
                       match=r"no weight for client\(s\) 'client_01', 'client_02', 'client_03' and 2 more$"):
        aggregate_to_dir(ad, ModuleOptions(), tmp_path / "x", progress=False, shared_weights={"client_00": 1.0})
    with pytest.raises(ValueError, match=r"unknown client\(s\) 'nobody'; clients are 'client_00', .*, "
                                         r"'client_04' and 1 more \(a mapping"):
        aggregate_to_dir(ad, ModuleOptions(), tmp_path / "x", progress=False, shared_weights={"nobody": 1.0})


def test_a_shared_part_above_the_module_size_is_stored_at_min_out_in_exactly(tmp_path, capsys):
    """Five collaborating clients of rank 3 on a 12 x 10 module stack to rank 15 > min(12, 10): the
    shared adapter holds the same product at rank 10 (QR and an SVD of the core), which PEFT's
    readers and ours accept; the parts still sum to the weighted refinement of an independent
    solve (clair.fit on the full updates)."""
    src = write_synthetic_adapters(tmp_path / "in", n_clients=K, n_layers=1, modules=("q_proj",),
                                   shape=(12, 10), rank=3, contaminated=1, dtype="float32", seed=3)
    ad = load_adapters(src)
    opts = ModuleOptions(output_dtype="float64", tol=1e-11, contrasts="dense")
    out = tmp_path / "out"
    _, summary = aggregate_to_dir(ad, opts, out, dtype="float64", progress=False, refine="paper")
    (m,) = ad.modules
    assert sum(summary["modules"][m]["benign_applied"]) == K - 1          # 15 stacked ranks
    cfg = json.loads((out / SHARED / "adapter_config.json").read_text())
    assert cfg["rank_pattern"].get(re.escape(module_key(m)), cfg["r"]) == 10
    ref = _reference(src, summary, shared_weights(None, ad.names, ad.modules))
    shared = _read(out / SHARED)
    for k, name in enumerate(ad.names):
        w = json.loads((out / name / MANIFEST).read_text())["shared_weight"]
        got = _read(out / name)[m] + w * shared[m]
        assert np.linalg.norm(got - ref[m][k]) <= 1e-6 * np.linalg.norm(ref[m][k]), name
    assert main(["adapters", "inspect", str(out / SHARED), str(out / ad.names[0])]) == 0
    assert "12 x 10" in capsys.readouterr().out
