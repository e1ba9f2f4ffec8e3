"""benchmarks/bench_detection_ceiling.py: its logistic fit against the closed-form maximum-likelihood
estimate and its own optimality conditions, its leave-one-family-out table on hand-built records
whose answers are known, and its features against the library's update evidence."""
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.detect_updates import update_evidence

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_detection_ceiling",
                                                  ROOT / "benchmarks" / "bench_detection_ceiling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _one_feature(bench, x):
    """X with ``x`` in a non-heavy column (``log_size_ratio``) and zeros elsewhere."""
    X = np.zeros((len(x), len(bench.FEATURES)))
    X[:, [f for f, _ in bench.FEATURES].index("log_size_ratio")] = x
    return X


def test_unpenalised_fit_is_the_closed_form_log_odds(bench):
    # one binary feature: the maximum-likelihood linear predictor is the log-odds of each group
    x = np.array([0] * 10 + [1] * 10, float)
    y = np.array([1, 1, 1] + [0] * 7 + [1] * 6 + [0] * 4, bool)       # 3/10 and 6/10
    model = bench.fit_logistic(_one_feature(bench, x), y, penalty=1e9)
    s = bench.score(model, _one_feature(bench, np.array([0.0, 1.0])))
    np.testing.assert_allclose(s, [np.log(3 / 7), np.log(6 / 4)], atol=1e-4)


def test_penalised_fit_meets_its_optimality_conditions(bench):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, len(bench.FEATURES)))
    y = X[:, 0] + 0.5 * rng.standard_normal(60) > 0.3
    mu, sd, w, b = bench.fit_logistic(X, y, penalty=0.5)
    Z = (bench._transform(X) - mu) / sd
    p = 1 / (1 + np.exp(-(Z @ w + b)))
    # gradient of sum log-loss + |w|^2 / (2 penalty): Z'(p - y) + w / penalty = 0, sum(p - y) = 0
    np.testing.assert_allclose(Z.T @ (p - y) + w / 0.5, 0, atol=1e-4)
    assert abs(np.sum(p - y)) < 1e-4


def _rec(family, x, truth_idx, default=()):
    names = [f"c{i}" for i in range(len(x))]
    return {"family": family, "names": names, "truth": [names[i] for i in truth_idx],
            "default": [names[i] for i in default], "X": x}


def test_table_counts_separable_and_inseparable_families(bench):
    rng = np.random.default_rng(0)
    recs = []
    for fam in ("a", "b"):                                 # contaminated far out in one column
        for _ in range(3):
            x = rng.normal(0, 0.1, 8)
            x[[6, 7]] += 3.0
            recs.append(_rec(fam, _one_feature(bench, x), [6, 7], default=[7]))
    for _ in range(3):                                     # contaminated exactly like a benign client
        x = rng.normal(0, 0.1, 8)
        x[7] = x[0]
        recs.append(_rec("c", _one_feature(bench, x), [7]))
    rows = {r["family"]: r for r in bench.ceiling_table(recs)}
    for fam in ("a", "b"):
        assert rows[fam]["oracle_found"] == 6 and rows[fam]["contaminated"] == 6
        assert (rows[fam]["default_found"], rows[fam]["default_benign"]) == (3, 0)
        assert (rows[fam]["fitted_found"], rows[fam]["fitted_benign"]) == (6, 0)
    assert rows["c"]["oracle_found"] == 0 and rows["c"]["contaminated"] == 3
    assert rows["all"]["oracle_found"] == 12 and rows["all"]["benign"] == 3 * 6 * 2 + 3 * 7


def test_features_are_the_update_evidence(bench):
    rng = np.random.default_rng(1)
    A0 = rng.standard_normal((2, 12)) / np.sqrt(12)
    factors = {}
    for k in range(8):
        A = A0 + 0.1 * rng.standard_normal(A0.shape)
        B = rng.standard_normal((10, 2)) * (5.0 if k == 7 else 1.0)
        factors[f"c{k}"] = {"m0": (A, B, 1.0), "m1": (A.copy(), rng.standard_normal((10, 2)), 1.0)}
    names, X, default = bench.client_features(factors)
    res = aggregate_factors(factors, ModuleOptions(output_dtype="float64"))
    assert names == list(factors) and default == res.summary["detection"]["flagged"]
    grams = np.array([r.gram for r in res.aggregation.results])
    ev = update_evidence(grams, np.array([r.outside for r in res.aggregation.results]))
    col = {f: i for i, (f, _) in enumerate(bench.FEATURES)}
    np.testing.assert_allclose(X[:, col["log_size_ratio"]], np.log(ev.size_ratios))
    np.testing.assert_allclose(X[:, col["direction_score"]], ev.direction_scores)
    assert X[7, col["log_size_ratio"]] == X[:, col["log_size_ratio"]].max() and np.isfinite(X).all()


def test_a_benign_client_the_default_flags_sets_no_threshold_and_one_family_is_refused(bench):
    recs = []
    for fam in ("a", "b"):
        for _ in range(3):                                  # the same benign spread in every set
            x = np.array([9.0, -0.2, -0.1, 0.0, 0.1, 0.2, 2.0, -0.3])
            # client 0: benign, diverged (the default flags it); client 6: contaminated, unflagged
            recs.append(_rec(fam, _one_feature(bench, x), [6], default=[0]))
    rows = {r["family"]: r for r in bench.ceiling_table(recs)}
    for fam in ("a", "b"):
        # without the exclusion the diverged benign clients (at 9) would set both thresholds above 2
        assert rows[fam]["oracle_found"] == 3 and rows[fam]["fitted_found"] == 3
        assert rows[fam]["default_benign"] == rows[fam]["fitted_benign"] == 3     # the default's own, no more
    with pytest.raises(ValueError, match="at least 2 families"):
        bench.ceiling_table([r for r in recs if r["family"] == "a"])


@pytest.mark.parametrize("content, message", [("{", "cannot read a JSON list"), ('{"a": 1}', "must hold a JSON list"),
                                              ('[["llama"]]', "must hold a JSON list"),
                                              ('[["nope", 1], ["llama", 2]]', "is not \\[family, integer seed\\]"),
                                              ('[["llama", 1]]', "at least 2 families")])
def test_bad_sets_files_are_one_line_errors(bench, tmp_path, capsys, content, message):
    f = tmp_path / "sets.json"
    f.write_text(content)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--sets", str(f)])
    assert exc.value.code == 2 and re.search(message, capsys.readouterr().err)


def test_out_must_be_new_in_an_existing_folder_and_table_must_be_an_out_file(bench, tmp_path, capsys):
    sets = tmp_path / "sets.json"
    sets.write_text('[["llama", 1], ["gpt2", 1]]')
    (tmp_path / "taken.json").write_text("mine")
    for out in (tmp_path / "taken.json", tmp_path / "no_folder" / "x.json"):
        with pytest.raises(SystemExit):
            bench.main(["--sets", str(sets), "--out", str(out)])
        assert "choose a new file in an existing folder" in capsys.readouterr().err
    assert (tmp_path / "taken.json").read_text() == "mine"
    with pytest.raises(SystemExit):
        bench.main(["--table", str(sets)])
    assert "is not an --out file" in capsys.readouterr().err
