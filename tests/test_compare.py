"""lowrank_fl.compare: the comparison engine (program (7), nuclear, (24)) and its JSON schema."""
import json
import time
import tomllib
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from lowrank_fl.clair import contrasts, duality_gap, penalized_objective, solve_penalized
from lowrank_fl.clair.simulate import generate
from lowrank_fl.compare import (Comparison, compare_clair, compare_noiseless, compare_nuclear,
                                load_schema)
from lowrank_fl.compare import runners
from lowrank_fl.compare.methods import estimate_memory, plan_methods
from lowrank_fl.problems import multitask_linear

LAM_L = 1e-2
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def instance():
    return generate(n_clients=5, p=4, q=4, rank=2, contaminated=1, noise=1e-3, seed=3)


@pytest.fixture(scope="module")
def lams(instance):
    return LAM_L, float(LAM_L / np.sqrt(instance.s))


@pytest.fixture(scope="module")
def comparison(instance, lams):
    return compare_clair(instance.W_hat, *lams, tol=1e-9, time_limit=120,
                         methods=["fista", "proxgrad", "cvxpy:CLARABEL", "cvxpy:SCS"])


def _validate(d):
    jsonschema.validate(d, load_schema())


def test_methods_agree_and_are_certified(comparison, instance, lams):
    assert [r.outcome for r in comparison.methods] == ["ok"] * 4
    objs = np.array([r.objective for r in comparison.methods])
    # every objective is an upper bound of the best certified lower bound, and they agree
    assert np.all(objs >= comparison.lower_bound - 1e-12 * comparison.scale)
    assert np.ptp(objs) <= 1e-7 * comparison.scale
    for r in comparison.methods:
        assert 0 <= r.relative_gap <= 1e-7
        assert r.gap == pytest.approx(r.relative_gap * comparison.scale, rel=1e-12)
        assert r.dual == pytest.approx(r.objective - r.gap, rel=1e-12)
        assert r.seconds > 0 and r.iterations > 0 and r.memory_measure == "rss_growth"
        assert r.collaborative_set == [int(k) for k in np.flatnonzero(instance.benign)]
    assert comparison.settings["rank"] == 2
    assert len(comparison.pairs) == 6
    for p in comparison.pairs:
        assert p.projector_distance < 1e-3 and p.collaborative_sets_agree
        assert abs(p.relative_objective_difference) <= 1e-7
    # the certificate is the library's formula at the method's own point: same as FISTA's
    D = contrasts(instance.W_hat)
    ref = solve_penalized(D, 4, *lams, method="fista", tol=1e-9, max_iter=100_000)
    fista = comparison.row("fista")
    assert fista.objective == pytest.approx(ref.objective, rel=1e-12)
    assert fista.gap == pytest.approx(duality_gap(D, 4, ref.L, ref.S, *lams), rel=1e-9)
    assert fista.history["objective"][-1] == pytest.approx(ref.objective, rel=1e-12)
    assert np.all(np.diff(fista.history["seconds"]) > 0)


def test_to_dict_is_json_and_matches_schema(comparison):
    d = comparison.to_dict()
    _validate(d)
    back = json.loads(json.dumps(d))            # builtins only: no numpy scalars
    assert back == d
    assert [m["name"] for m in d["methods"]] == [r.name for r in comparison.methods]
    assert comparison.to_dict(history=False)["methods"][0]["history"] is None
    assert Comparison.from_dict(back).to_dict() == d
    assert Comparison.from_dict(back).table() == comparison.table()
    table = comparison.table()
    for r in comparison.methods:
        assert f"| {r.name} |" in table
    assert "projector dist." in table


def test_schema_rejects_a_broken_document(comparison):
    d = comparison.to_dict()
    d["methods"][0]["outcome"] = "fine"
    with pytest.raises(jsonschema.ValidationError):
        _validate(d)
    d = comparison.to_dict()
    del d["pairs"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(d)


def test_schema_is_package_data():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = meta["tool"]["setuptools"]["package-data"]["lowrank_fl.compare"]
    assert "compare.schema.json" in data
    assert load_schema()["properties"]["schema_version"]["const"] == 1


def _lying_runner(data, kind, solver, nuclear, options):
    """Claims optimality at a point that is not optimal."""
    out = runners.run_clair(data, kind, solver, nuclear, options)
    out["point"]["L"] = out["point"]["L"] * 0.5
    out["status"] = "optimal"
    return out


def _slow_runner(data, kind, solver, nuclear, options):
    time.sleep(30)


def test_gap_is_recomputed_not_the_solver_claim(instance, lams, monkeypatch):
    monkeypatch.setitem(runners.RUNNERS, "clair", _lying_runner)
    c = compare_clair(instance.W_hat, *lams, methods=["fista"], tol=1e-9)
    r = c.row("fista")
    assert r.status == "optimal" and r.relative_gap > 1e-4
    D = contrasts(instance.W_hat)
    Z = np.zeros_like(D)
    assert c.scale == pytest.approx(penalized_objective(D, 4, Z, Z, *lams), rel=1e-12)


def test_time_limit_stops_a_slow_solve(instance, lams, monkeypatch):
    monkeypatch.setitem(runners.RUNNERS, "clair", _slow_runner)
    t0 = time.perf_counter()
    c = compare_clair(instance.W_hat, *lams, methods=["cvxpy:CLARABEL"], time_limit=0.5)
    assert time.perf_counter() - t0 < 20
    r = c.row("cvxpy:CLARABEL")
    assert r.outcome == "time_limit" and "time limit of 0.5 s" in r.reason
    assert r.objective is None and c.lower_bound is None and c.pairs == []
    _validate(c.to_dict())


def test_methods_that_cannot_run_are_listed_with_a_reason(instance, lams):
    c = compare_clair(instance.W_hat, *lams,
                      methods=["fista", "cvxpy:OSQP", "cvxpy:MOSEK", "cvxpy:CLARABEL:normNuc"],
                      memory_limit=1e4, tol=1e-6)
    reasons = {r.name: r.reason for r in c.methods}
    assert c.row("fista").outcome == "not_run" and "estimated memory" in reasons["fista"]
    assert "semidefinite" in reasons["cvxpy:OSQP"]
    assert "not installed" in reasons["cvxpy:MOSEK"]
    assert "estimated memory" in reasons["cvxpy:CLARABEL:normNuc"]
    assert all(r.outcome == "not_run" for r in c.methods)
    _validate(c.to_dict())


def test_normnuc_estimate_at_k20_is_refused():
    """cp.normNuc on the (Gq, p) = (1900, 10) matrix: one PSD cone of size 1910, whose dense
    interior-point scaling block is 8 (1910*1911/2)^2 = 26.6 TB (Clarabel's failed allocation)."""
    sizes = {"rows": 1900, "cols": 10, "blocks": 190, "block_rows": 10}
    est = estimate_memory("clair", "conic", "CLARABEL", "normNuc", sizes)
    assert 2.6e13 < est < 2.8e13
    schur = estimate_memory("clair", "conic", "CLARABEL", "schur", sizes)
    assert schur < 1e9
    plans = plan_methods("clair", ["cvxpy:CLARABEL", "cvxpy:CLARABEL:normNuc"], sizes,
                         memory_limit=64e9)
    assert plans[0].runnable and not plans[1].runnable


@pytest.mark.parametrize("bad", ["newton", "cvxpy", "cvxpy:NOPE", "cvxpy:SCS:svd", "prox"])
def test_unknown_method_is_named(instance, lams, bad):
    with pytest.raises(ValueError, match="unknown method"):
        compare_clair(instance.W_hat, *lams, methods=[bad])


@pytest.mark.parametrize("kw, name", [({"lam_L": 0.0}, "lam_L"), ({"lam_S": -1.0}, "lam_S"),
                                      ({"tol": 0.0}, "tol"), ({"time_limit": -1}, "time_limit"),
                                      ({"tau": "median"}, "tau"), ({"alpha": 1.0}, "alpha"),
                                      ({"rank": 5}, "rank")])
def test_bad_arguments_are_named(instance, lams, kw, name):
    args = {"lam_L": lams[0], "lam_S": lams[1], **kw}
    lam_L, lam_S = args.pop("lam_L"), args.pop("lam_S")
    with pytest.raises(ValueError, match=name):
        compare_clair(instance.W_hat, lam_L, lam_S, methods=["fista"], **args)


def test_compare_nuclear():
    prob = multitask_linear(d=6, k=2, n_clients=8, samples_per_client=10, seed=0)
    X, y = np.asarray(prob.X), np.asarray(prob.y)
    c = compare_nuclear(X, y, 0.05, methods=["prox", "cvxpy:CLARABEL"], tol=1e-10)
    assert [r.outcome for r in c.methods] == ["ok", "ok"]
    a, b = c.methods
    assert abs(a.objective - b.objective) <= 1e-6 * c.scale
    assert a.relative_gap <= 1e-8 and b.relative_gap <= 1e-6
    assert c.pairs[0].collaborative_sets_agree is None and a.collaborative_set is None
    assert c.pairs[0].projector_distance < 1e-3
    _validate(c.to_dict())


def test_compare_noiseless():
    inst = generate(n_clients=5, p=4, q=4, rank=2, contaminated=1, noise=0.0, seed=1)
    lam_L = 1.0
    c = compare_noiseless(inst.W, lam_L, lam_L / np.sqrt(inst.s),
                          methods=["cvxpy:CLARABEL", "cvxpy:SCS"])
    assert [r.outcome for r in c.methods] == ["ok", "ok"]
    for r in c.methods:
        assert 0 <= r.relative_gap <= 1e-5
        assert r.collaborative_set == [int(k) for k in np.flatnonzero(inst.benign)]
    assert c.pairs[0].collaborative_sets_agree
    _validate(c.to_dict())
    assert isinstance(c, Comparison) and c.problem == "noiseless"


def test_tracemalloc_measure_for_iterative_methods(instance, lams):
    c = compare_clair(instance.W_hat, *lams, methods=["fista", "cvxpy:CLARABEL"], tol=1e-6,
                      memory_measure="tracemalloc")
    fista, cvx = c.methods
    assert fista.memory_measure == "tracemalloc" and cvx.memory_measure == "rss_growth"
    D_bytes = contrasts(instance.W_hat).nbytes
    assert fista.peak_memory_bytes >= 3 * D_bytes        # at least L, S and a residual
    assert c.settings["memory_measure"] == "tracemalloc"
    with pytest.raises(ValueError, match="memory_measure"):
        compare_clair(instance.W_hat, *lams, methods=["fista"], memory_measure="rss")


# ----------------------------------------------------------------------------- trivial instances
@pytest.mark.parametrize("W", [np.zeros((3, 2, 4)), np.tile(np.arange(8.0).reshape(2, 4), (3, 1, 1))],
                         ids=["all-zero", "equal-clients"])
def test_equal_clients_are_refused_not_divided_by_zero(W):
    """Every contrast 0: (7) is solved by L = S = 0 with objective F(0, 0) = 0, the relative
    gap's scale, so the comparison is refused with a message saying so (was ZeroDivisionError)."""
    D = contrasts(W)
    Z = np.zeros_like(D)
    assert penalized_objective(D, 2, Z, Z, 0.1, 0.1) == 0.0            # the scale is exactly 0
    res = solve_penalized(D, 2, 0.1, 0.1)                              # and 0 is the optimum
    assert res.objective == 0.0 and not np.any(res.L) and not np.any(res.S)
    with pytest.raises(ValueError, match=r"W_hat: all K = 3 clients' matrices are equal.*"
                                         r"L = S = 0 with objective F\(0, 0\) = 0.*scale 0"):
        compare_clair(W, 0.1, 0.1, methods=["fista"])
    with pytest.raises(ValueError, match=r"W: all K = 3 clients.*program \(24\)"):
        compare_noiseless(W, 0.1, 0.1, methods=["cvxpy:CLARABEL"])


def test_nearly_equal_clients_are_still_compared():
    """The refusal is for scale exactly 0: clients differing by 1e-6 are a normal instance."""
    W = np.zeros((3, 2, 4))
    W[0, 0, 0] = 1e-6
    c = compare_clair(W, 1e-8, 1e-8, methods=["fista"], tol=1e-9)
    D = contrasts(W)
    Z = np.zeros_like(D)
    assert c.scale > 0
    assert c.scale == pytest.approx(penalized_objective(D, 2, Z, Z, 1e-8, 1e-8), rel=1e-12)
    assert c.row("fista").outcome == "ok" and c.row("fista").relative_gap <= 1e-9


def test_zero_responses_are_refused_by_nuclear():
    X = np.random.default_rng(0).standard_normal((3, 5, 2))
    with pytest.raises(ValueError, match=r"y: every response is 0.*Theta = 0 is optimal"):
        compare_nuclear(X, np.zeros((3, 5)), 0.1, methods=["prox"])


_AFTER_CLARABEL = '''
import sys
import numpy as np
import cvxpy as cp
from lowrank_fl.compare.child import run_in_child


def solve(n):
    A = np.random.default_rng(0).standard_normal((n, n))
    X = cp.Variable((n, 30))
    p = cp.Problem(cp.Minimize(cp.sum_squares(A @ X - 1) + cp.norm1(X)))
    p.solve(solver="CLARABEL")
    return p.status


if __name__ == "__main__":
    solve(150)               # the parent runs Clarabel first: rayon's global pool now exists
    r = run_in_child(solve, (150,), time_limit=float(sys.argv[1]), measure="rss_growth")
    print(r["outcome"], r.get("result"))
'''


def test_solve_process_after_a_threaded_solver_in_the_parent(tmp_path):
    """A plain fork of a process that ran Clarabel hangs the child on rayon's missing pool (the
    verifier hung this way); the default fork server runs the solve."""
    import os
    import subprocess
    import sys

    script = tmp_path / "after_clarabel.py"
    script.write_text(_AFTER_CLARABEL)
    env = {k: v for k, v in os.environ.items() if k != "LOWRANK_FL_START_METHOD"}
    out = subprocess.run([sys.executable, str(script), "120"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.stdout.split() == ["ok", "optimal"], out.stderr[-2000:]


def test_start_method_option(monkeypatch):
    from lowrank_fl.compare import child

    monkeypatch.delenv(child.START_METHOD_ENV, raising=False)
    assert child._context().get_start_method() == "forkserver"
    monkeypatch.setenv(child.START_METHOD_ENV, "fork")
    assert child._context().get_start_method() == "fork"
    monkeypatch.setenv(child.START_METHOD_ENV, "vfork")
    with pytest.raises(ValueError, match="LOWRANK_FL_START_METHOD must be one of"):
        child._context()


def _compare_in_worker(seed):
    from lowrank_fl.clair.simulate import generate
    from lowrank_fl.compare import compare_clair

    inst = generate(n_clients=5, p=4, q=4, rank=2, contaminated=1, noise=0.1, seed=seed)
    c = compare_clair(inst.W_hat, 5 ** -0.5, 3 * 5 ** -1.5, methods=["fista"], tol=1e-9, time_limit=120)
    return [(m.name, m.outcome) for m in c.methods]


def test_solve_processes_start_inside_loky_workers(monkeypatch):
    """The verifier calls compare inside loky workers, whose global start method is "loky": the
    solve process must still start (it crashed at start-up in the full run before the fix)."""
    from joblib import Parallel, delayed

    from lowrank_fl.compare import child

    monkeypatch.delenv(child.START_METHOD_ENV, raising=False)
    out = Parallel(n_jobs=2, backend="loky")(delayed(_compare_in_worker)(s) for s in range(2))
    assert out == [[("fista", "ok")], [("fista", "ok")]]
