"""Client-level detection (adapters.detect, adapters.decision) and the robust baselines
(adapters.robust), pinned to hand computations, published definitions and ByzFL."""
import importlib
import importlib.util
import json
import statistics
import sys
import types

import numpy as np
import pytest
from safetensors.numpy import load_file

from lowrank_fl.adapters import (ModuleOptions, aggregate_adapters, aggregate_factors, aggregate_to_dir,
                                 load_adapters, write_outputs)
from lowrank_fl.adapters.decision import detection_sentence, refinement_sentence
from lowrank_fl.adapters.detect import (POOLED_MIN_RATIO, pooled_flags, pooled_ratios, pooled_scores,
                                        pooled_threshold, robust_z)
from lowrank_fl.adapters.robust import default_f, geometric_median, krum_scores, robust_combine
from lowrank_fl.adapters.synthetic import write_synthetic_adapters
from lowrank_fl.cli import main


# ------------------------------------------------------------------ pooled score by hand
def _hand_modified_z(values):
    """Iglewicz & Hoaglin's modified z-score, 0.6745 (x - med) / MAD, with 0.6745 written as
    1 / 1.4826 (the normal consistency constant, to the digits the library uses)."""
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    if mad > 0:
        return [(v - med) / (1.4826 * mad) for v in values]
    meanad = sum(abs(v - med) for v in values) / len(values)
    return [(v - med) / (1.253314 * meanad) if meanad > 0 else 0.0 for v in values]


def test_pooled_score_recomputed_by_hand():
    K = 5
    pairs = [(j, k) for j in range(K) for k in range(j + 1, K)]
    rng = np.random.default_rng(3)
    norms = rng.uniform(1, 2, size=(3, len(pairs)))
    norms[:, [g for g, (j, k) in enumerate(pairs) if 4 in (j, k)]] += 3.0   # client 4 far
    norms[1] *= 100.0                                                      # a module of another scale
    per_module = []
    for row in norms:
        med = [statistics.median([row[g] for g, p in enumerate(pairs) if k in p]) for k in range(K)]
        per_module.append(_hand_modified_z(med))
    S = [sum(z[k] for z in per_module) / 3 for k in range(K)]
    expected = _hand_modified_z(S)
    got, S_got = pooled_scores(norms, K)
    assert np.allclose(S_got, S, rtol=1e-12)
    assert np.allclose(got, expected, rtol=1e-12)
    assert pooled_flags(norms, K).tolist() == [e > pooled_threshold(K) for e in expected]
    assert pooled_flags(norms, K).tolist() == [False] * 4 + [True]


def test_robust_z_meanad_fallback_and_constant():
    # MAD = 0 (three of five values tie): Iglewicz & Hoaglin's MeanAD form
    z = robust_z([1.0, 1.0, 1.0, 2.0, 5.0])
    meanad = (0 + 0 + 0 + 1 + 4) / 5
    assert np.allclose(z, [0, 0, 0, 1 / (1.253314 * meanad), 4 / (1.253314 * meanad)])
    assert np.array_equal(robust_z([2.0, 2.0, 2.0]), np.zeros(3))
    # pooled scores are scale- and shift-free per module
    rng = np.random.default_rng(0)
    n = rng.uniform(1, 2, size=(4, 10))
    assert np.allclose(pooled_scores(n, 5)[0], pooled_scores(7.0 * n + 0.0, 5)[0])
    with pytest.raises(ValueError, match="K\\(K-1\\)/2 = 10"):
        pooled_scores(np.ones((2, 9)), 5)


def test_pooled_threshold_is_the_null_quantile_of_the_largest_modified_z():
    """c_K against an independent Monte Carlo (other seed, the textbook 0.6745 / MAD form):
    the familywise false-flag rate of the cutoff on i.i.d. normal scores is alpha = 1 %, where
    Iglewicz & Hoaglin's 3.5 over K clients is far above it."""
    rng = np.random.default_rng(12345)
    for K in (6, 10):
        x = rng.standard_normal((20000, K))
        med = np.median(x, axis=1, keepdims=True)
        mz = 0.6745 * (x - med) / np.median(np.abs(x - med), axis=1, keepdims=True)
        rate = float((mz.max(axis=1) > pooled_threshold(K)).mean())
        assert abs(rate - 0.01) < 0.003                       # 3 binomial standard errors
        assert float((mz.max(axis=1) > 3.5).mean()) > 0.05
    # the floor: at alpha = 0.9 the null quantile (about 1.5 at K = 10) lies below 3.5
    assert float(np.quantile(mz.max(axis=1), 0.1)) < 3.5 and pooled_threshold(10, alpha=0.9) == 3.5
    assert pooled_threshold(10) == pytest.approx(float(np.quantile(mz.max(axis=1), 0.99)), abs=0.3)
    assert pooled_threshold(10) < pooled_threshold(6)
    with pytest.raises(ValueError, match="K must be"):
        pooled_threshold(2)


def _two_level_norms(K, far, d_far, modules=3, d=1.0, jitter=None):
    """Pair norms (modules, G): ``d`` between ordinary clients, ``d_far`` for pairs with ``far``;
    ``jitter`` (modules, G) multiplies them."""
    P = [(j, k) for j in range(K) for k in range(j + 1, K)]
    row = np.array([d_far if far in p else d for p in P])
    out = np.tile(row, (modules, 1))
    return out if jitter is None else out * jitter


def test_pooled_ratios_closed_form_and_by_hand():
    """A client whose pairs are all c times the others' has R = c and everyone else R = 1 (their
    median pair is an ordinary one for K >= 4); on random norms R is the geometric mean over
    modules of s_mk / median_k s_mk, recomputed with the statistics module."""
    for c in (1.0, 1.2, 3.0):
        R = pooled_ratios(_two_level_norms(6, 5, c), 6)
        assert np.allclose(R, [1, 1, 1, 1, 1, c], rtol=1e-14)
    K = 5
    P = [(j, k) for j in range(K) for k in range(j + 1, K)]
    norms = np.random.default_rng(4).uniform(0.5, 3.0, size=(3, len(P)))
    norms[2] *= 1e4                                                  # scale-free per module
    logs = []
    for row in norms:
        med = [statistics.median([row[g] for g, p in enumerate(P) if k in p]) for k in range(K)]
        mm = statistics.median(med)
        logs.append([np.log(v / mm) for v in med])
    expected = [float(np.exp(sum(lg[k] for lg in logs) / 3)) for k in range(K)]
    assert np.allclose(pooled_ratios(norms, K), expected, rtol=1e-12)
    # identical clients (all norms 0) and a lone nonzero pair (every median 0): R = 1, no division
    assert np.array_equal(pooled_ratios(np.zeros((2, 10)), 5), np.ones(5))
    assert np.array_equal(pooled_ratios(np.r_[np.zeros(9), 1.0][None], 5), np.ones(5))
    with pytest.raises(ValueError, match="non-negative"):
        pooled_ratios(-np.ones((1, 10)), 5)


def test_distance_ratio_keeps_a_statistically_extreme_but_small_difference():
    """The homogeneous case of detect's docstring: ordinary pairs agree to 1e-3, one client is 5 %
    farther from the rest. Its pooled score is far above c_K, yet it is kept (R = 1.05 < 1.2); the
    score alone (min_ratio=0, the first pooled rule) flags it; a client 30 % farther is flagged."""
    K = 10
    jitter = 1.0 + 1e-3 * np.random.default_rng(0).standard_normal((4, K * (K - 1) // 2))
    near = _two_level_norms(K, 9, 1.05, modules=4, jitter=jitter)
    M, _ = pooled_scores(near, K)
    assert M[9] > 10 * pooled_threshold(K)
    assert pooled_ratios(near, K)[9] == pytest.approx(1.05, abs=2e-3)
    assert not pooled_flags(near, K).any()
    assert pooled_flags(near, K, min_ratio=0.0).tolist() == [False] * 9 + [True]
    far = _two_level_norms(K, 9, 1.3, modules=4, jitter=jitter)
    assert pooled_flags(far, K).tolist() == [False] * 9 + [True]
    # the boundary: R >= min_ratio flags, the next float above R does not
    R = float(pooled_ratios(far, K)[9])
    assert pooled_flags(far, K, min_ratio=R)[9] and not pooled_flags(far, K, min_ratio=np.nextafter(R, 2))[9]
    assert POOLED_MIN_RATIO == 1.2
    with pytest.raises(ValueError, match="min_ratio"):
        pooled_flags(far, K, min_ratio=-1.0)


def test_summary_and_sentence_report_the_distance_ratio():
    """The ratio is in summary.json["detection"] for every client, and the sentence says why a
    client above the cutoff was kept (or, under another rule, that the pooled rule would flag it)."""
    K = 10
    jitter = 1.0 + 1e-3 * np.random.default_rng(0).standard_normal(K * (K - 1) // 2)
    names = [f"c{k}" for k in range(K)]
    res = [types.SimpleNamespace(name=f"m{i}", benign=np.ones(K, bool), separated=False, gap_ratio=1.5,
                                 block_norms=_two_level_norms(K, 9, 1.05, modules=1, jitter=jitter)[0])
           for i in range(2)]
    from lowrank_fl.adapters.decision import detection_summary
    det = detection_summary(res, names, "pooled")
    assert det["flagged"] == [] and det["pooled_min_ratio"] == POOLED_MIN_RATIO
    assert det["pooled_ratios"]["c9"] == pytest.approx(1.05, abs=2e-3)
    assert det["pooled_scores"]["c9"] > det["pooled_threshold"]
    s = detection_sentence(det)
    assert "(c9) against the cutoff 5.91, its distance ratio 1.05 below the 1.2 a pooled flag needs" in s
    base = {"rule": "majority", "flagged": [], "scores": {"a": 0.0, "b": 0.0, "c": 0.0},
            "pooled_scores": {"a": 0.1, "b": 9.0, "c": 7.0}, "pooled_threshold": 5.9,
            "pooled_ratios": {"a": 1.0, "b": 1.1, "c": 1.6}, "pooled_min_ratio": 1.2, "pooled_flagged": ["c"],
            "pooled_tie": False, "separated_modules": [], "threshold": 0.5, "modules": {"m1": {"gap_ratio": 2.0}}}
    # another rule: whom the pooled rule would flag, even when it is not the top score
    assert detection_sentence(base).endswith(
        "largest pooled score 9.00 (b) against the cutoff 5.90; the pooled rule would flag c); a contaminated "
        "client below these limits goes unflagged.")
    flagged = detection_sentence({**base, "rule": "pooled", "flagged": ["c"], "scores": base["pooled_scores"],
                                  "threshold": 5.9})
    assert "(pooled score c 7.00 > 5.90, distance ratio 1.60 >= 1.2;" in flagged


def test_sentence_never_rounds_across_the_boundary():
    """A ratio a hair below ρ or a score a hair above c_K reads on its own side of it, and the JSON
    holds the exact floats the decision compared."""
    det = {"rule": "pooled", "flagged": [], "scores": {"a": 0.0, "b": 9.0}, "threshold": 5.9,
           "pooled_scores": {"a": 0.0, "b": 9.0}, "pooled_threshold": 5.9,
           "pooled_ratios": {"a": 1.0, "b": 1.1999997}, "pooled_min_ratio": 1.2, "pooled_flagged": [],
           "pooled_tie": False, "separated_modules": [], "modules": {"m1": {"gap_ratio": None}}}
    s = detection_sentence(det)
    assert "its distance ratio 1.1999997 below the 1.2" in s
    s = detection_sentence({**det, "pooled_ratios": {"a": 1.0, "b": 1.196}})
    assert "its distance ratio 1.196 below the 1.2" in s
    up = {**det, "flagged": ["b"], "pooled_flagged": ["b"], "scores": {"a": 0.0, "b": 5.9000001},
          "pooled_scores": {"a": 0.0, "b": 5.9000001}, "pooled_ratios": {"a": 1.0, "b": 1.2}}
    assert "(pooled score b 5.9000001 > 5.90, distance ratio 1.20 >= 1.2;" in detection_sentence(up)
    # a poisoned update's score in scientific notation, still on its side of the cutoff
    huge = {**up, "scores": {"a": 0.0, "b": 7.3844e40}, "pooled_scores": {"a": 0.0, "b": 7.3844e40}}
    assert "(pooled score b 7.384e+40 > 5.90," in detection_sentence(huge)
    assert "(pooled score b 999999.99 > 5.90," in detection_sentence(
        {**up, "scores": {"a": 0.0, "b": 999999.99}, "pooled_scores": {"a": 0.0, "b": 999999.99}})
    # the summary keeps the exact floats (no rounding to a few digits)
    K = 10
    jitter = 1.0 + 1e-3 * np.random.default_rng(0).standard_normal(K * (K - 1) // 2)
    norms = _two_level_norms(K, 9, 1.2 - 1e-7, modules=1, jitter=jitter)[0]
    res = [types.SimpleNamespace(name="m", benign=np.ones(K, bool), separated=False, gap_ratio=np.nan,
                                 block_norms=norms)]
    from lowrank_fl.adapters.decision import detection_summary
    out = detection_summary(res, [f"c{k}" for k in range(K)], "pooled")
    exact = float(pooled_ratios(norms, K)[9])
    assert out["pooled_ratios"]["c9"] == exact != round(exact, 6)
    assert out["pooled_scores"]["c9"] == float(pooled_scores(norms, K)[0][9])
    assert out["modules"]["m"]["gap_ratio"] is None


def test_separated_modules_and_infinite_gap_in_the_sentence():
    """K = 3: a module whose split has one pair below the gap (zero spread: gap ratio "inf")
    separates; when the pooled rule flags nobody the sentence says the modules' own sets exclude
    the client and that the scores tie, and the summary warns."""
    names = ["c0", "c1", "c2"]
    res = [types.SimpleNamespace(name=f"m{i}", benign=np.array([True, True, False]), separated=True,
                                 gap_ratio=np.inf, block_norms=np.array([0.26, 0.84 + 0.01 * (i % 2), 0.85 - 0.01 * (i % 2)]))
           for i in range(8)]
    from lowrank_fl.adapters.decision import detection_summary
    with pytest.warns(RuntimeWarning, match="tie exactly"):
        det = detection_summary(res, names, "pooled")
    assert det["pooled_tie"] is True and det["flagged"] == []
    assert all(v["gap_ratio"] == "inf" for v in det["modules"].values())
    json.dumps(det, allow_nan=False)                                   # strict JSON
    s = detection_sentence(det)
    assert s.startswith("no client flagged (8 module(s) separated, their own collaborative sets of "
                        "CLAIR's (8) "
                        "excluding c2 there, but the pooled rule flags nobody;")
    assert "the pooled scores of most clients tie" in s and "two distinct block norms" not in s
    # a gap ratio "inf" in a module that did not separate: identical pairs below a gap, too few
    # of them for a majority set; the sentence says so instead of quoting "inf"
    det2 = {**det, "separated_modules": [], "modules": {"m": {"gap_ratio": "inf", "flagged": []}}}
    s2 = detection_sentence(det2)
    assert ("in m the pairs below the widest gap have identical block norms (an unbounded gap ratio), "
            "but fewer pairs lie below it than a majority set (8) has") in s2 and "inf" not in s2
    # beside a module with a finite gap ratio above the 6 needed, the unbounded one is named
    det3 = {**det2, "modules": {"m": {"gap_ratio": "inf", "flagged": []}, "n": {"gap_ratio": 7.5, "flagged": []}}}
    assert "unbounded gap ratio" in detection_sentence(det3)


def test_pooled_argument_errors_name_the_argument():
    ok = np.ones((1, 10))
    for kw, match in ((dict(norms=np.ones((2, 2, 10))), "norms must have 1 or 2 dimensions"),
                      (dict(norms=np.ones((0, 10))), "at least one module"),
                      (dict(norms=np.full((1, 10), np.nan)), "norms must be finite"),
                      (dict(norms=-ok), "non-negative"),
                      (dict(norms=np.ones((1, 9))), "K\\(K-1\\)/2 = 10")):
        with pytest.raises(ValueError, match=match):
            pooled_flags(kw["norms"], 5)
    with pytest.raises(ValueError, match="rescale"):
        pooled_ratios(np.full((1, 10), 1e308), 5)
    for bad in (None, "1.2", [1.2], float("nan"), -1.0, True):
        with pytest.raises(ValueError, match="min_ratio"):
            pooled_flags(ok, 5, min_ratio=bad)
    for bad in ("x", float("nan"), True):
        with pytest.raises(ValueError, match="cutoff"):
            pooled_flags(ok, 5, cutoff=bad)
    for bad in ("5", 5.5):
        with pytest.raises(TypeError, match="K must be an integer"):
            pooled_flags(ok, bad)
    assert not pooled_flags(_two_level_norms(5, 4, 9.0), 5, cutoff=np.inf).any()
    assert pooled_flags(_two_level_norms(5, 4, 9.0, jitter=1 + 1e-3 * np.random.default_rng(1).standard_normal((3, 10))),
                        5, cutoff=0.0, min_ratio=1.2).tolist() == [False] * 4 + [True]


def test_ties_bound_the_scores_and_are_reported():
    """Five identical clients and one ten times farther: the scores tie, the MeanAD fallback bounds
    the far client's score below c_6 (Iglewicz & Hoaglin's convention), scores_tie says so; a
    jitter of 1e-9 breaks the tie and the rule flags it."""
    from lowrank_fl.adapters.detect import scores_tie
    tied = _two_level_norms(6, 5, 10.0)
    assert scores_tie(tied, 6) and pooled_scores(tied, 6)[0][5] < pooled_threshold(6)
    assert not pooled_flags(tied, 6).any()
    jit = tied * (1 + 1e-9 * np.random.default_rng(2).standard_normal(tied.shape))
    assert not scores_tie(jit, 6) and pooled_flags(jit, 6).tolist() == [False] * 5 + [True]


# ------------------------------------------------------------------ on adapters
def _clients(K, bad, seed, noise=0.05):
    rng = np.random.default_rng(seed)
    mods = ("l0.q_proj", "l0.v_proj", "l1.q_proj", "l1.v_proj")
    base = {m: (np.linalg.qr(rng.standard_normal((16, 3)))[0].T, rng.standard_normal((12, 3))) for m in mods}
    out = {}
    for k in range(K):
        fac = {}
        for m, (A, B) in base.items():
            Ak = A + noise * rng.standard_normal(A.shape)
            if k >= K - bad:
                Ak = Ak + 0.6 * rng.standard_normal(A.shape)
            fac[m] = (Ak, B + noise * rng.standard_normal(B.shape), 2.0)
        out[f"c{k}"] = fac
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pooled_keeps_everyone_without_contamination_and_flags_exactly_the_contaminated(seed):
    clean = aggregate_factors(_clients(8, 0, seed), ModuleOptions(output_dtype="float64"),
                              client_rule="pooled").summary["detection"]
    assert clean["flagged"] == [] and clean["rule"] == "pooled" and clean["threshold"] == pooled_threshold(8)
    assert max(clean["scores"].values()) <= clean["threshold"]
    dirty = aggregate_factors(_clients(8, 2, seed), ModuleOptions(output_dtype="float64"),
                              client_rule="pooled")
    det = dirty.summary["detection"]
    assert det["flagged"] == ["c6", "c7"]
    assert set(det) >= {"rule", "flagged", "scores", "threshold", "separated_modules", "modules"}
    # the flagged set is the one applied in every module; the per-module sets stay labelled
    for m, s in dirty.summary["modules"].items():
        assert s["benign_applied"] == [True] * 6 + [False] * 2
        assert s["benign_scope"] == "per-module (8)"
    # excluded clients keep their own update, benign ones are refined with the pooled set
    own = _clients(8, 2, seed)
    for m, (A, B, _) in dirty.outputs["c7"].items():
        A0, B0, s0 = own["c7"][m]
        assert np.allclose(B @ A, s0 * B0 @ A0, atol=1e-12)
    assert detection_sentence(det).startswith("flagged c6, c7 by the pooled rule")
    assert detection_sentence(clean).startswith("no client flagged (")


def test_detection_block_per_rule():
    cl = _clients(8, 2, 0)
    s = aggregate_factors(cl, ModuleOptions(output_dtype="float64"), client_rule="any").summary
    det = s["detection"]
    frac = {n: 1 - np.mean([m["benign"][i] for m in s["modules"].values()])
            for i, n in enumerate(s["clients"])}
    assert det["scores"] == pytest.approx(frac)
    assert det["flagged"] == [n for n in s["clients"] if frac[n] > 0]
    assert det["separated_modules"] == [m for m, v in s["modules"].items() if v["separated"]]
    assert {m: v["flagged"] for m, v in det["modules"].items()} == {
        m: [n for n, b in zip(s["clients"], v["benign"]) if not b] for m, v in s["modules"].items()}


@pytest.mark.parametrize("method,rule", [("clair", "pooled"), ("krum", "per-module"),
                                         ("trimmed-mean", "per-module")])
def test_directory_path_applies_the_same_decision(tmp_path, method, rule):
    src = write_synthetic_adapters(tmp_path / "in", n_clients=7, n_layers=2, modules=("q_proj", "v_proj"),
                                   shape=(20, 18), rank=3, contaminated=2, dtype="float32", seed=4)
    opts = ModuleOptions(method=method)
    _, ref = aggregate_to_dir(load_adapters(src), opts, tmp_path / "out", client_rule=rule, progress=False,
                              output="split")
    got = aggregate_factors(load_adapters(src), opts, client_rule=rule, output="split")
    for key in ("detection", "robust", "outputs"):
        assert got.summary.get(key) == ref.get(key), key
    for name in ref["outputs"]:
        files = load_file(str(tmp_path / "out" / name / "adapter_model.safetensors"))
        for m, (A, B, _) in got.outputs[name].items():
            assert np.array_equal(files[f"{m}.lora_A.weight"], A) and np.array_equal(files[f"{m}.lora_B.weight"], B)
    # the two-step directory path (aggregate, then write_outputs) writes the same files
    two = write_outputs(aggregate_adapters(load_adapters(src), opts, progress=False), tmp_path / "out2",
                        client_rule=rule, output="split")
    for key in ("detection", "robust", "outputs"):
        assert two.get(key) == ref.get(key), key
    for name in ref["outputs"]:
        a = load_file(str(tmp_path / "out" / name / "adapter_model.safetensors"))
        b = load_file(str(tmp_path / "out2" / name / "adapter_model.safetensors"))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    if method == "clair":
        assert ref["detection"]["flagged"] == [p.name for p in src[-2:]]


def test_cli_ends_with_the_detection_and_refinement_sentences_and_runs_robust_methods(tmp_path, capsys):
    src = write_synthetic_adapters(tmp_path / "in", n_clients=6, n_layers=1, modules=("q_proj",),
                                   shape=(16, 14), rank=2, contaminated=0, dtype="float32", seed=1)
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "o1"),
                 "--client-rule", "pooled", "--quiet"]) == 0
    *_, last, closing = capsys.readouterr().out.strip().splitlines()
    summary1 = json.loads((tmp_path / "o1" / "summary.json").read_text())
    det = summary1["detection"]
    assert last == detection_sentence(det)
    assert closing == refinement_sentence(summary1["refinement"])
    assert last.startswith("no client flagged (" if not det["flagged"] else
                           f"flagged {', '.join(det['flagged'])} by the pooled rule")
    # one module, K = 6: far from the normal model of the cutoff; a benign client of this seed
    # stands out (score 10.0 against c_6 = 7.9): the sentence names it and its evidence
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "o2"),
                 "--method", "multikrum", "--byzantine", "1", "--quiet"]) == 0
    summary = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert summary["robust"]["f"] == 1 and len(summary["robust"]["selected"]) == 5
    assert (tmp_path / "o2" / "aggregated" / "adapter_model.safetensors").exists()
    # --client-rule decides CLAIR's refinement only: with another method it is ignored, and said so
    capsys.readouterr()
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "o3"),
                 "--method", "fedavg", "--client-rule", "any", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "warning: --client-rule any is ignored: it decides CLAIR's refinement, and --method fedavg has none" in err
    assert json.loads((tmp_path / "o3" / "summary.json").read_text())["client_rule"] is None
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "o4"),
                 "--method", "fedavg", "--quiet"]) == 0
    assert "--client-rule" not in capsys.readouterr().err


# ------------------------------------------------------------------ robust methods
def _byzfl():
    """ByzFL's aggregators module, loaded without its package __init__ (which imports
    torchvision for its datasets)."""
    pytest.importorskip("torch")
    spec = importlib.util.find_spec("byzfl")
    if spec is None:
        pytest.skip("byzfl is not installed (optional extra 'robust')")
    if "byzfl" not in sys.modules:
        pkg = types.ModuleType("byzfl")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["byzfl"] = pkg
    return importlib.import_module("byzfl.aggregators.aggregators")


def test_robust_combine_matches_byzfl_on_vectors():
    agg = _byzfl()
    rng = np.random.default_rng(7)
    X = rng.standard_normal((9, 30))
    X[7:] += 4.0
    f = 2
    assert np.allclose(robust_combine(X, "krum", f).aggregate, agg.Krum(f=f)(X), atol=1e-12)
    assert np.allclose(robust_combine(X, "multikrum", f).aggregate, agg.MultiKrum(f=f)(X), atol=1e-12)
    assert np.allclose(robust_combine(X, "trimmed-mean", f).aggregate, agg.TrMean(f=f)(X), atol=1e-12)
    assert np.allclose(robust_combine(X, "median").aggregate, agg.Median()(X), atol=1e-12)
    z, _, it = geometric_median(X, nu=0.1, max_iter=3, tol=0.0, init=np.zeros(30))
    assert it == 3 and np.allclose(z, agg.GeometricMedian(nu=0.1, T=3)(X), atol=1e-12)
    # converged: the first-order condition of the geometric median, Σ_k (x_k - z)/||x_k - z|| = 0
    zc = robust_combine(X, "geomed").aggregate
    u = (X - zc) / np.linalg.norm(X - zc, axis=1)[:, None]
    assert np.linalg.norm(u.sum(axis=0)) < 1e-6
    sel = robust_combine(X, "multikrum", f).selected
    assert sel.tolist() == [True] * 7 + [False] * 2


def test_krum_score_closed_form_and_f_checks():
    X = np.array([[0.0], [1.0], [3.0], [10.0]])
    # f = 0: mean of the K - 1 = 3 smallest squared distances to the others
    assert np.allclose(krum_scores(X, 0), [(1 + 9 + 100) / 3, (1 + 4 + 81) / 3, (9 + 4 + 49) / 3,
                                           (100 + 81 + 49) / 3])
    assert np.allclose(krum_scores(X, 1), [(1 + 9) / 2, (1 + 4) / 2, (4 + 9) / 2, (49 + 81) / 2])
    assert default_f(10) == 3 and default_f(3) == 0
    with pytest.raises(ValueError, match="byzantine"):
        robust_combine(X, "krum", 2)


@pytest.mark.parametrize("method", ["krum", "multikrum", "geomed", "median", "trimmed-mean"])
def test_robust_methods_on_adapters_lift_exactly(method):
    """Distance-based methods on the reduced coordinates equal the method on the full ΔW
    vectors (an isometry); coordinate-wise ones equal the method on the joint-basis
    coordinates, lifted by U, V."""
    cl = _clients(7, 2, 5)
    res = aggregate_factors(cl, ModuleOptions(method=method, output_dtype="float64", byzantine=2))
    mods = list(next(iter(cl.values())))
    full = np.stack([np.concatenate([(s * B @ A).ravel() for A, B, s in (c[m] for m in mods)])
                     for c in cl.values()])
    out = np.concatenate([(B @ A).ravel() for A, B, _ in (res.outputs["aggregated"][m] for m in mods)])
    if method in ("krum", "multikrum", "geomed"):
        ref = robust_combine(full, method, 2).aggregate
        assert np.allclose(out, ref, atol=1e-8 * np.abs(ref).max())
        if method != "geomed":
            assert res.summary["robust"]["selected"] == [n for n, s in zip(cl, robust_combine(full, method, 2).selected) if s]
    else:
        parts = []
        for r in res.aggregation.results:
            U, V, M = r.state["U"], r.state["V"], r.state["M"]
            Z = robust_combine(M.reshape(M.shape[0], -1), method, 2).aggregate.reshape(M.shape[1:])
            parts.append((U @ Z @ V.T).ravel())
        assert np.allclose(out, np.concatenate(parts), atol=1e-10)
    # identical clients: every method returns their common update exactly
    same = {f"c{k}": cl["c0"] for k in range(5)}
    r2 = aggregate_factors(same, ModuleOptions(method=method, output_dtype="float64", byzantine=1))
    for m in mods:
        A, B, _ = r2.outputs["aggregated"][m]
        A0, B0, s0 = cl["c0"][m]
        assert np.allclose(B @ A, s0 * B0 @ A0, atol=1e-10)


def test_per_module_sentence_says_the_client_is_outside_the_set():
    det = {"rule": "per-module", "flagged": ["client_03", "client_05"],
           "scores": {"client_03": 1.0, "client_05": 0.5}, "pooled_scores": {"client_03": 2.0},
           "pooled_threshold": 1.5, "pooled_ratios": {"client_03": 1.5}, "pooled_min_ratio": 1.2,
           "pooled_flagged": ["client_03"], "pooled_tie": False,
           "separated_modules": ["m1", "m2"], "modules": {"m1": {"gap_ratio": 4.0}, "m2": {"gap_ratio": None}}}
    s = detection_sentence(det)
    assert ": client_03 is outside the collaborative set of CLAIR's (8) in 100% of the modules; client_05 is " \
           "outside the collaborative set of CLAIR's (8) in 50% of the modules (2 module(s) separated;" in s
    assert "excluded by client" not in s


def test_clean_sentence_explains_a_wide_gap_that_did_not_separate():
    """A module whose gap ratio passes the bound but has too few pairs below the gap (a minority
    of clients) does not separate: the sentence must not read "13.70 of the 6 needed"."""
    base = {"rule": "pooled", "flagged": [], "scores": {"a": 0.1}, "pooled_scores": {"a": 0.1, "b": 0.3},
            "pooled_threshold": 5.9, "pooled_ratios": {"a": 1.0, "b": 1.1}, "pooled_min_ratio": 1.2,
            "pooled_flagged": [], "pooled_tie": False, "separated_modules": [], "threshold": 5.9}
    wide = detection_sentence({**base, "modules": {"m1": {"gap_ratio": 13.7}, "m2": {"gap_ratio": 2.0}}})
    assert "largest gap ratio 13.70 in m1, above the 6 needed but with fewer pairs below the gap" in wide
    assert "of the 6 needed" not in wide and wide.startswith("no client flagged (no module separated;")
    narrow = detection_sentence({**base, "modules": {"m1": {"gap_ratio": 5.99}}})
    assert "largest gap ratio 5.99 of the 6 needed, in m1" in narrow
    none = detection_sentence({**base, "modules": {"m1": {"gap_ratio": None}}})
    assert "no module had two distinct block norms" in none and "largest pooled score 0.30 (b)" in none


def test_the_refinement_sentence_gives_each_group_its_own_reason_when_nobody_moves():
    """Nobody's output moves: the sentence names why per group (zero update, outside the set, no
    agreement), singular or plural, and keeps the agreement wording only where that is the one reason."""
    def ref(**whys):
        return {"mode": "exchangeable", "target": "the collaborative mean", "clients": {
            n: {"weight": 0.0, "agreement": a, "relative_change": 0.0, "why": w} for n, (w, a) in whys.items()}}
    zero, out, low = ("its update is zero: nothing to move", None), ("outside the collaborative set", None), \
        ("its update does not agree", 0.01)
    assert refinement_sentence(ref(a=zero, b=out, c=out, d=low)) == (
        "refinement: every client keeps its own adapter: d: its update does not agree with the others' mean; "
        "a: its update is zero; b, c (2 clients): they are outside the collaborative set.")
    assert refinement_sentence(ref(a=low, b=low)) == (
        "refinement: every client keeps its own adapter: no collaborating client's update agrees with the "
        "others' mean (largest agreement 0.010), so averaging could only replace what it learned.")
