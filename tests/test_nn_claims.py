"""The torch-only claims: smoke runs of both experiments, criteria that can fail, and the
"requires torch" status when the optional packages are missing."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import verify.claims.clair  # noqa: F401  (registers the claims, §8 included)
import verify.claims.rolora  # noqa: F401  (§5.2 included)
from verify.claim import REGISTRY, REQUIRES_VERDICT, VERDICTS, Context
from verify.claims.clair import _backbone_rule as B8
from verify.claims.clair import _sec8 as S8
from verify.claims.clair import _sec8_backbone as SB
from verify.claims.rolora import _sec5_2 as R52
from verify.sweep import Sweep

SEC8 = sorted(k for k in REGISTRY if k.startswith("clair.sec8."))
SEC52 = sorted(k for k in REGISTRY if k.startswith("rolora.sec5_2."))


def test_registry():
    assert set(SEC8) == {"clair.sec8.table3", "clair.sec8.detection", "clair.sec8.oracle_best_homogeneous",
                         "clair.sec8.clair_best_heterogeneous", "clair.sec8.fedavg_negative_transfer",
                         "clair.sec8.contamination_task", "clair.sec8.background_reading",
                         "clair.sec8.backbone_seeds"}
    assert REGISTRY["clair.sec8.background_reading"].kind == REGISTRY["clair.sec8.backbone_seeds"].kind == "remark"
    assert set(SEC52) == {"rolora.sec5_2.ffa_plateau", "rolora.sec5_2.rolora_vs_fedavg",
                          "rolora.sec5_2.fedavg_degrades"}
    assert all("torch" in REGISTRY[c].requires for c in SEC8 + SEC52)
    assert "MNIST" in R52.__doc__ and "d = 64, 1797 images" in R52.__doc__ and "MNIST" in R52._SUB


def test_importing_the_library_does_not_import_torch():
    code = ("import sys, lowrank_fl, lowrank_fl.clair, lowrank_fl.algorithms, verify.claims; "
            "verify.claims.load_all(); "       # every paper's package, torch-only topics included
            "assert 'torch' not in sys.modules and 'peft' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_torch_gives_requires_torch(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    ev = REGISTRY["clair.sec8.table3"].run(Context(scale="smoke"))
    assert ev.verdict == REQUIRES_VERDICT == "requires torch" and ev.verdict in VERDICTS
    assert "peft" in ev.summary and 'pip install ".[peft]"' in ev.summary and ev.measured["missing"] == ["peft"]


def test_nn_package_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import importlib.util as u; real = u.find_spec\n"
            "u.find_spec = lambda n, *a: None if n == 'torch' else real(n, *a)\n"
            "try:\n    import lowrank_fl.nn\nexcept ImportError as e:\n    assert '[peft]' in str(e), e\n"
            "else:\n    raise SystemExit('no ImportError')")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------ criteria
def _results(acc_by_method, *, reps=4, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for reg in S8.REGIMES:
        out[reg] = []
        for _ in range(reps):
            acc = {m: np.r_[v + noise * rng.standard_normal(9), np.nan] for m, v in acc_by_method[reg].items()}
            benign = np.ones((8, 10), dtype=bool)
            benign[:, 9] = False
            out[reg].append({"accuracy": acc, "benign": benign, "truth": np.r_[np.ones(9, bool), False]})
    return out


def test_table3_and_orderings_criteria_can_fail():
    paper = _results({r: dict(v) for r, v in S8.TABLE3.items()}, noise=0.3)
    assert S8.table3_verdict(S8.table3_rows(paper)) is True
    off = _results({r: {m: v - 20 for m, v in d.items()} for r, d in S8.TABLE3.items()}, noise=0.3)
    assert S8.table3_verdict(S8.table3_rows(off)) is False
    mean, se, lo, hi = S8.paired(paper, "homogeneous", "oracle", "local")
    assert lo > 0                                     # the paper's ordering is detected
    flat = _results({r: {m: 70.0 for m in S8.METHODS} for r in S8.REGIMES}, noise=1.0)
    mean, se, lo, hi = S8.paired(flat, "heterogeneous", "clair", "local")
    assert lo < 0 < hi                                # within noise → inconclusive


def test_detection_criterion_can_fail():
    res = _results({r: {m: 70.0 for m in S8.METHODS} for r in S8.REGIMES})
    counts = S8.detection_counts(res)
    assert S8.detection_verdict(counts) is True and counts["homogeneous"]["excluded"][:, 9].tolist() == [4] * 8
    res["homogeneous"][0]["benign"][3, 2] = False     # one benign client excluded on one matrix
    assert S8.detection_verdict(S8.detection_counts(res)) is False


def test_copying_threshold_is_the_midpoint_above_the_most_frequent_letter():
    assert B8.unigram_share(1.1) == pytest.approx(25.94074136449203, abs=1e-9)
    assert B8.copying_threshold(1.1) == pytest.approx((25.94074136449203 + 100) / 2, abs=1e-9)
    assert B8.copying_threshold(0.0) == pytest.approx((100 / 52 + 100) / 2)     # uniform letters
    pytest.importorskip("torch")
    from lowrank_fl.nn import copying

    for t in (0.0, 0.95, 1.1, 1.6):
        assert B8.unigram_share(t) == pytest.approx(100 * copying.power_law(t)[0], rel=1e-12)


def test_plateau_copying_split_on_the_outside_readings_seeds():
    # issue 18: pretraining seeds 0-8 of our recipe at 5500 steps
    acc = [60.3, 97.7, 97.6, 58.9, 97.7, 97.5, 97.5, 97.5, 97.1]
    split = B8.split_seeds(acc, B8.copying_threshold(1.1))
    assert split == {"copying": [1, 2, 4, 5, 6, 7, 8], "plateau": [0, 3]}
    # at the threshold counts as copying, just below (and NaN) as plateau
    assert B8.split_seeds([63.0, np.nextafter(63.0, 0), np.nan], 63.0) == {"copying": [0], "plateau": [1, 2]}


def _curve(seed, steps, base, common):
    return {"seed": seed, "steps": list(steps), "base": list(base), "common": list(common)}


def test_selection_rule_order_from_step_and_target():
    curves = [_curve(0, (5000, 5500, 6000), (90, 40, 45), (90, 40, 45)),      # plateau after 5500
              _curve(1, (5000, 5500, 6000, 6500), (80, 70, 85, 90), (70, 76, 78.27, 80)),
              _curve(2, (5000, 5500), (99, 99), (99, 99))]
    assert B8.select(curves, threshold=63.0, target=78.27, from_step=5500) == (1, 6000)    # 78.27 reached exactly
    assert B8.select(curves, threshold=63.0, target=None, from_step=5500) == (1, 5500)
    assert B8.select(curves, threshold=63.0, target=None, from_step=0) == (0, 5000)      # before S5's steps
    assert B8.select(curves[:1], threshold=63.0, target=78.27, from_step=5500) is None
    summ = SB.seeds_summary(curves, threshold=63.0, target=78.27, from_step=5500)
    assert summ == {"copying": [1, 2], "plateau": [0], "chosen": {"seed": 1, "step": 6000}}


def test_chosen_backbone_follows_the_rule_in_seed_order(monkeypatch):
    pytest.importorskip("torch")
    tried = []
    curves = {0: _curve(0, (5000, 5500, 6000), (60, 60, 60), (50, 55, 58)),          # plateau
              1: _curve(1, (5000, 5500, 6000), (90, 92, 95), (70, 79, 85)),
              2: _curve(2, (5000, 5500, 6000), (99, 99, 99), (99, 99, 99))}

    def fake_curve(scale, seed, cache_dir):
        tried.append(seed)
        return curves[seed]

    monkeypatch.setattr(B8, "seed_curve", fake_curve)
    # the backbone-target rule of the first full-scale run (kept for scales that do not calibrate)
    monkeypatch.setitem(B8.SCALES, "full", {**B8.SCALES["full"], "seeds": 3, "calibrate": False})
    c = B8.chosen("full", 0, "unused")
    assert (c["seed"], c["step"], c["selected"]) == (1, 5500, True) and tried == [0, 1]   # seed 2 never trained
    assert c["settings"].steps == 5500 and c["settings"].seed == 1 and c["settings"].loss == "all"   # Song's recipe
    assert c["threshold"] == pytest.approx(B8.copying_threshold(1.1))
    curves[1] = _curve(1, (5000, 5500, 6000), (90, 92, 95), (70, 75, 78))          # never reaches 78.27
    curves[2] = _curve(2, (5000, 5500, 6000), (99, 99, 99), (79, 60, 70))          # only before step 5500
    tried.clear()
    c = B8.chosen("full", 0, "unused")
    assert c["selected"] is False and c["seed"] == 0 and tried == [0, 1, 2]
    assert c["settings"].steps == B8.SCALES["full"]["checkpoints"][-1]


def test_calibrated_rule_searches_coarse_then_fine():
    curve = _curve(0, (5000, 5500, 6000, 6500, 7000), (90, 50, 70, 80, 90), (0,) * 5)
    local = {5000: 99.0, 5500: 99.0, 6000: 70.0, 6500: 79.0, 6100: 75.0, 6200: 78.27, 6300: 80.0, 6400: 81.0}
    calls = []

    def level(step, base=None):
        calls.append(step)
        return {"local": local[step], "base": 70.0 if base is None else base.get(step, 70.0)}

    kw = dict(threshold=63.0, target=78.27, from_step=5500, fine_step=100)
    step, levels = B8.select_calibrated(curve, level, **kw)
    # 5000 is before from_step, 5500 does not copy: neither is evaluated; 6200 reaches 78.27 exactly
    assert step == 6200 and calls == [6000, 6500, 6100, 6200] and set(levels) == set(calls)
    calls.clear()
    step, _ = B8.select_calibrated(curve, lambda st: level(st, {6200: 62.9}), **kw)
    assert step == 6300 and calls == [6000, 6500, 6100, 6200, 6300]     # a fine checkpoint must copy too
    calls.clear()
    local.update({6100: 70.0, 6200: 70.0, 6300: 70.0, 6400: 78.26})
    step, levels = B8.select_calibrated(curve, level, **kw)
    assert step == 6500 and list(levels) == [6000, 6500, 6100, 6200, 6300, 6400]   # no fine one: the coarse
    # the first copying checkpoint at from_step qualifies: no fine candidate before from_step
    first = _curve(0, (5000, 5500, 6000), (90, 90, 90), (0,) * 3)
    calls.clear()
    assert B8.select_calibrated(first, level, **kw)[0] == 5500 and calls == [5500]
    local.update({6500: 78.0, 7000: 78.2})
    calls.clear()
    step, levels = B8.select_calibrated(curve, level, **kw)
    assert step is None and list(levels) == [6000, 6500, 7000]


def test_chosen_calibrates_full_scale_on_the_level(monkeypatch):
    curves = {0: _curve(0, (5500, 6000), (50, 55), (0, 0)),                       # plateau: never evaluated
              1: _curve(1, (5500, 6000, 6500), (70, 80, 90), (0, 0, 0))}
    monkeypatch.setattr(B8, "seed_curve", lambda scale, seed, cache_dir: curves[seed])
    monkeypatch.setitem(B8.SCALES, "full", {**B8.SCALES["full"], "seeds": 2})
    asked = []

    def level(seed, step):
        asked.append((seed, step))
        return {"local": {5500: 70.0, 6000: 80.0, 5600: 77.0, 5700: 79.0}[step], "base": 70.0}

    with pytest.raises(ValueError, match="level"):
        B8.chosen("full", 0, "unused")
    c = B8.chosen("full", 0, "unused", level=level)
    assert (c["seed"], c["step"], c["selected"], c["settings"].steps) == (1, 5700, True, 5700)
    assert asked == [(1, 5500), (1, 6000), (1, 5600), (1, 5700)]
    assert [cal["seed"] for cal in c["calibration"]] == [0, 1] and c["calibration"][0]["levels"] == {}


def test_calibration_level_trains_fine_checkpoints_and_runs_local(monkeypatch, tmp_path):
    pytest.importorskip("peft")
    from lowrank_fl.nn.pretrain import _cache_path

    tiny = {**B8.SCALES["full"], "checkpoints": (2, 4), "fine_step": 1, "from_step": 2, "n_eval": 20,
            "calibration_reps": 2}
    monkeypatch.setitem(B8.SCALES, "full", tiny)
    sub = Context(scale="smoke").for_claim(SB.CALIBRATION)
    lv = SB._calibration_level(sub, "full", str(tmp_path), {"n_train": 50, "n_test": 20}, 1, 3)
    settings = B8.pretrain_settings("full", 1)
    # the fine checkpoint was trained and cached under its own settings, the coarse ones were not
    assert _cache_path(dataclasses.replace(settings, steps=3), tmp_path).exists()
    assert not _cache_path(dataclasses.replace(settings, steps=4), tmp_path).exists()
    assert len(lv["replicates"]) == 2 and all(0 <= v <= 100 for v in lv["replicates"])
    assert lv["local"] == pytest.approx(np.mean(lv["replicates"]))
    assert lv["base"] == pytest.approx(B8.checkpoint_base("full", 1, 3, str(tmp_path)))
    assert len(set(sub.seeds_used)) == 2
    # the replicate is Local in Table 3's homogeneous design, recomputed directly
    from lowrank_fl.nn.clients import LoraSettings
    from lowrank_fl.nn.pretrain import pretrained_backbone
    from lowrank_fl.nn.sec8 import run_replicate

    rep = run_replicate(pretrained_backbone(dataclasses.replace(settings, steps=3), cache_dir=tmp_path),
                        "homogeneous", n_clients=9, contaminated=0, n_test=20, methods=("local",),
                        lora=LoraSettings(n_train=50, loss="all"), seed=sorted(sub.seeds_used)[0])
    assert 100 * np.nanmean(rep.accuracy["local"]) in [pytest.approx(v) for v in lv["replicates"]]


def test_seed_curve_runs_the_full_scale_recipe(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    tiny = {**B8.SCALES["full"], "checkpoints": (2, 3), "n_eval": 20, "seeds": 2}
    monkeypatch.setitem(B8.SCALES, "full", tiny)
    B8.seed_curve.cache_clear()
    c = B8.seed_curve("full", 1, str(tmp_path))
    assert c["seed"] == 1 and c["steps"] == [2, 3] and len(c["base"]) == len(c["common_song"]) == 2
    assert all(0 <= a <= 100 for a in c["base"] + c["common"] + c["common_song"])
    assert len(list(tmp_path.glob("copying-backbone-*.safetensors"))) == 2     # one file per checkpoint
    s = B8.pretrain_settings("full", 1)
    assert (s.loss, s.optimizer, s.final_norm, s.bias) == ("all", "adamw", False, True)   # Song et al.'s
    B8.seed_curve.cache_clear()
    assert B8.seed_curve("full", 1, str(tmp_path)) == c          # reloaded from the cache: the same numbers
    picked = B8.chosen("full", 0, str(tmp_path), level=lambda seed, step: 1 / 0)  # nothing reaches step 5500
    assert picked["selected"] is False and [k["seed"] for k in picked["curves"]] == [0, 1]
    B8.seed_curve.cache_clear()


def test_size_verdict_at_the_band_edges():
    # the paper's number inside the band around ours: holds, exactly at the edge included
    assert S8.size_verdict(10.5, 10.0, 11.0, 15.5, band=5.0) is True
    assert S8.size_verdict(20.5, 20.0, 21.0, 15.5, band=5.0) is True
    # just outside, but the interval reaches into the band: too noisy to tell
    assert S8.size_verdict(10.25, 10.0, 10.75, 15.5, band=5.0) is None
    # the whole interval beyond the band: fails, on either side
    assert S8.size_verdict(0.25, 0.0, 0.5, 15.5, band=5.0) is False
    assert S8.size_verdict(30.0, 29.0, 31.0, 15.5, band=5.0) is False
    assert S8.size_verdict(0.25, float("-inf"), float("inf"), 15.5) is None    # one replicate


@pytest.mark.parametrize("drop, verdict", [(0.23, "fails"), (15.33, "holds"), (10.5, "holds"), (9.8, "fails")])
def test_negative_transfer_is_judged_on_size(monkeypatch, drop, verdict):
    base = {m: 70.0 for m in S8.METHODS}
    res = _results({"homogeneous": {**base, "fedavg": 70.0 - drop},
                    "heterogeneous": {**base, "fedavg": 70.0 - 1.81}}, reps=6, noise=0.05)
    monkeypatch.setattr(S8, "runs", lambda ctx, **kw: res)
    monkeypatch.setattr(S8, "baseline_gate", lambda ctx, ev: ev)
    ev = REGISTRY["clair.sec8.fedavg_negative_transfer"].experiment(Context(scale="smoke"))
    assert ev.verdict == verdict, ev.summary
    assert ev.table[0]["paper"] == pytest.approx(15.33) and ev.table[1]["paper"] == pytest.approx(1.81)
    assert ev.table[0]["sign"] == "> 0"                  # every drop here is positive: the sign decides nothing


@pytest.mark.parametrize("margin, verdict", [(0.13, "holds"), (-4.5, "holds"), (-6.0, "fails")])
def test_clair_best_heterogeneous_is_judged_on_size(monkeypatch, margin, verdict):
    het = {"local": 77.77, "fedavg": 75.96, "oracle": 76.96, "clair": 77.77 + margin, "clair-auto": 77.0}
    res = _results({"homogeneous": dict(S8.TABLE3["homogeneous"], **{"clair-auto": 70.0}), "heterogeneous": het},
                   reps=6, noise=0.05)
    monkeypatch.setattr(S8, "runs", lambda ctx, **kw: res)
    monkeypatch.setattr(S8, "baseline_gate", lambda ctx, ev: ev)
    ev = REGISTRY["clair.sec8.clair_best_heterogeneous"].experiment(Context(scale="smoke"))
    assert ev.verdict == verdict, ev.summary
    assert [r["paper"] for r in ev.table] == pytest.approx([0.13, 1.94, 0.94])


def test_largest_gap_tau_of_the_block_norms():
    # one (replicate, matrix): benign pairs 0.1..0.2, contaminated pairs 1.0..1.2 -> midpoint 0.6
    norms = np.array([[[0.1, 0.15, 0.2, 1.0, 1.2, 1.1]]])
    out = S8.largest_gap_taus(norms)
    assert out["largest_gap_tau_median"] == pytest.approx(0.6)
    two = np.concatenate([norms, norms * 2], axis=1)       # medians of 0.6 and 1.2
    assert S8.largest_gap_taus(two)["largest_gap_tau_median"] == pytest.approx(0.9)


def test_plateau_and_best_lr():
    curve = np.r_[0.0, np.linspace(0.1, 0.9, 20)]
    assert np.isclose(R52.plateau(curve), 100 * curve[-2:].mean())
    reps = [{m: {0.1: curve * (0.5 if m == "ffa" else 1.0), 1.0: curve * 0.2} for m in R52.METHODS}] * 2
    b = R52.best({5: reps})
    assert b[5]["fedavg"][0] == 0.1 and b[5]["ffa"][1].mean() < b[5]["rolora"][1].mean()


# ------------------------------------------------------------------------------------------ smoke runs
@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    pytest.importorskip("sklearn")
    return Context(scale="smoke", sweep=Sweep(cache_dir=tmp_path_factory.mktemp("cache")),
                   out_dir=tmp_path_factory.mktemp("report"))


@pytest.mark.parametrize("cid", SEC8 + SEC52)
def test_claim_runs_at_smoke_scale(ctx, cid):
    ev = REGISTRY[cid].run(ctx)
    assert ev.verdict in VERDICTS and ev.verdict != REQUIRES_VERDICT and ev.summary and ev.seeds
    json.dumps(ev.to_dict())
    if cid.startswith("clair.sec8.") and cid != B8.BACKBONE_CLAIM:
        # the smoke backbone copies: the claims run past their baseline check
        assert ev.measured["backbone"]["copies"] is True and "baseline check failed" not in ev.summary
    if cid == "clair.sec8.detection":
        assert set(ev.measured["readings"]) == {"alpha", "scaling"} and ev.measured["default_reading"] == "alpha"
        assert {r["LoRA scale reading"] for r in ev.table} == {"alpha (lora_alpha = 16)", "scaling (lora_alpha = 48)"}
    if cid == B8.BACKBONE_CLAIM:
        assert [r["seed"] for r in ev.table] == [0, 1, 2, 3, 4] and ev.measured["chosen"] is not None


def test_smoke_runs_are_reproducible(ctx):
    a = S8.runs(ctx)                                      # served by the cache of the runs above
    fresh = Context(scale="smoke", sweep=Sweep(backend="sequential"))
    b = S8.runs(fresh)                                    # recomputed from scratch, same seeds
    for reg in S8.REGIMES:
        for ra, rb in zip(a[reg], b[reg]):
            for m in S8.METHODS:
                np.testing.assert_array_equal(ra["accuracy"][m], rb["accuracy"][m])
            np.testing.assert_array_equal(ra["benign"], rb["benign"])


def test_runs_are_computed_once_per_sweep_without_a_cache(ctx):
    """The §8 claims share their runs (issue 33): without a disk cache, the second claim that reads
    them gets the first one's results, seeds and solve records, and runs no task."""
    fresh = Context(scale="smoke", sweep=Sweep(backend="sequential"))      # no cache
    first = fresh.for_claim("clair.sec8.table3")
    a = S8.runs(first)
    executed = fresh.sweep.executed
    second = fresh.for_claim("clair.sec8.detection")
    b = S8.runs(second)
    assert executed > 0 and fresh.sweep.executed == executed
    assert sorted(second.seeds_used) == sorted(first.seeds_used) and second.solves == first.solves
    for reg in S8.REGIMES:
        for ra, rb in zip(a[reg], b[reg]):
            np.testing.assert_array_equal(ra["accuracy"]["clair"], rb["accuracy"]["clair"])
    b[S8.REGIMES[0]][0]["benign"][...] = False                            # a copy: the memo is intact
    assert S8.runs(second)[S8.REGIMES[0]][0]["benign"].any()
    other = Context(scale="smoke", sweep=Sweep(backend="sequential"))     # another run recomputes
    S8.runs(other.for_claim("clair.sec8.table3"))
    assert other.sweep.executed == executed


def test_baseline_gate_turns_a_broken_backbone_into_inconclusive(monkeypatch):
    from verify.claim import Evidence

    diag = {"pretraining": "100 steps on the pretraining mixture", "pretraining_masked_accuracy": 27.0,
            "most_frequent_letter_share": 25.9, "baseline_threshold": 63.0, "copies": False}
    monkeypatch.setattr(SB, "backbone_diagnostic", lambda ctx: dict(diag))
    ev = SB.baseline_gate(None, Evidence(verdict="fails", summary="CLAIR 26.0 (paper 78.5)"))
    assert ev.verdict == "inconclusive" and "baseline check failed" in ev.summary and "< 63.0%" in ev.summary
    assert "would be fails" in ev.summary and ev.measured["backbone"]["copies"] is False
    diag.update(copies=True, pretraining_masked_accuracy=90.0)
    ev = SB.baseline_gate(None, Evidence(verdict="fails", summary="CLAIR 60.0 (paper 78.5)"))
    assert ev.verdict == "fails" and ev.summary == "CLAIR 60.0 (paper 78.5)"