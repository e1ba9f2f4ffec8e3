"""The torch-only claims: smoke runs of both experiments, criteria that can fail, and the
"requires torch" status when the optional packages are missing."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import verify.claims  # noqa: F401  (registers every claim module)
from verify.claim import REGISTRY, REQUIRES_VERDICT, VERDICTS, Context
from verify.claims import clair_sec8 as S8
from verify.claims import rolora_sec5_2 as R52
from verify.sweep import Sweep

SEC8 = sorted(k for k in REGISTRY if k.startswith("clair.sec8."))
SEC52 = sorted(k for k in REGISTRY if k.startswith("rolora.sec5_2."))


def test_registry():
    assert set(SEC8) == {"clair.sec8.table3", "clair.sec8.detection", "clair.sec8.oracle_best_homogeneous",
                         "clair.sec8.clair_best_heterogeneous", "clair.sec8.fedavg_negative_transfer",
                         "clair.sec8.contamination_task", "clair.sec8.background_reading"}
    assert REGISTRY["clair.sec8.background_reading"].kind == "remark"
    assert set(SEC52) == {"rolora.sec5_2.ffa_plateau", "rolora.sec5_2.rolora_vs_fedavg",
                          "rolora.sec5_2.fedavg_degrades"}
    assert all("torch" in REGISTRY[c].requires for c in SEC8 + SEC52)
    assert "MNIST" in R52.__doc__ and "d = 64, 1797 images" in R52.__doc__ and "MNIST" in R52._SUB


def test_importing_the_library_does_not_import_torch():
    code = ("import sys, lowrank_fl, lowrank_fl.clair, lowrank_fl.algorithms, verify.claims; "
            "assert 'torch' not in sys.modules and 'peft' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_torch_gives_requires_torch(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    ev = REGISTRY["clair.sec8.table3"].run(Context(scale="smoke"))
    assert ev.verdict == REQUIRES_VERDICT == "requires torch" and ev.verdict in VERDICTS
    assert "peft" in ev.summary and "lowrank_fl[peft]" in ev.summary and ev.measured["missing"] == ["peft"]


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


def test_smoke_runs_are_reproducible(ctx):
    a = S8.runs(ctx)                                      # served by the cache of the runs above
    fresh = Context(scale="smoke", sweep=Sweep(backend="sequential"))
    b = S8.runs(fresh)                                    # recomputed from scratch, same seeds
    for reg in S8.REGIMES:
        for ra, rb in zip(a[reg], b[reg]):
            for m in S8.METHODS:
                np.testing.assert_array_equal(ra["accuracy"][m], rb["accuracy"][m])
            np.testing.assert_array_equal(ra["benign"], rb["benign"])


def test_baseline_gate_turns_a_broken_backbone_into_inconclusive(monkeypatch):
    from verify.claim import Evidence

    diag = {"pretraining": "100 steps on the pretraining mixture", "pretraining_masked_accuracy": 27.0, "most_frequent_letter_share": 27.0,
            "copies": False}
    monkeypatch.setattr(S8, "backbone_diagnostic", lambda ctx: dict(diag))
    ev = S8.baseline_gate(None, Evidence(verdict="fails", summary="CLAIR 26.0 (paper 78.5)"))
    assert ev.verdict == "inconclusive" and "baseline check failed" in ev.summary
    assert "would be fails" in ev.summary and ev.measured["backbone"]["copies"] is False
    diag.update(copies=True, pretraining_masked_accuracy=90.0)
    ev = S8.baseline_gate(None, Evidence(verdict="fails", summary="CLAIR 60.0 (paper 78.5)"))
    assert ev.verdict == "fails" and ev.summary == "CLAIR 60.0 (paper 78.5)"
    pytest.importorskip("torch")
    from lowrank_fl.nn import copying

    assert S8.BASELINE_MIN_ACCURACY > 100 * copying.power_law(1.1)[0] + 20     # far above "always 'a'"
