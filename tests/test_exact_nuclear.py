
import numpy as np
import pytest

from lowrank_fl.exact.nuclear import (nuclear_duality_gap, nuclear_objective, nuclear_statistics,
                                      solve_nuclear_cvxpy, solve_nuclear_prox)
from lowrank_fl.problems.multitask import multitask_linear
from lowrank_fl.results import ConvergenceWarning, SolverError


@pytest.fixture(scope="module")
def data():
    p = multitask_linear(d=8, rank=2, n_clients=10, samples_per_client=6, noise=0.1, seed=0)
    return p.X, p.y


@pytest.mark.parametrize("mu", [0.02, 0.3])
def test_prox_matches_cvxpy(data, mu):
    X, y = data
    ref = solve_nuclear_cvxpy(X, y, mu)
    fast = solve_nuclear_prox(X, y, mu, tol=1e-10)
    assert ref.status == "optimal" and fast.status == "optimal"
    # Clarabel's default tolerances (~1e-8) and the prox gap certificate (1e-10 of P(0)) bound both
    # objectives' suboptimality far below 1e-6 relative; a wrong solution would differ by >> 1e-6.
    assert fast.objective == pytest.approx(ref.objective, rel=1e-6)
    assert fast.objective <= ref.objective + 1e-6 * abs(ref.objective)
    # the prox gap certifies the CVXPY objective too (P(ref) >= P* >= P(fast) - gap)
    assert ref.objective >= fast.objective - fast.gap - 1e-12
    assert 0 <= fast.gap <= 1e-10 * fast.gap_scale and fast.relative_gap <= 1e-10


def test_gap_is_nonnegative_and_zero_only_at_optimum(data):
    X, y = data
    rng = np.random.default_rng(0)
    for _ in range(5):
        T = rng.standard_normal((10, 8))
        assert nuclear_duality_gap(T, X, y, 0.1) > 0
    opt = solve_nuclear_prox(X, y, 0.1, tol=1e-11)
    assert nuclear_duality_gap(opt.Theta, X, y, 0.1) <= 1e-11 * opt.gap_scale


def test_large_mu_gives_zero_solution(data):
    X, y = data
    S, b, c = nuclear_statistics(X, y)
    mu = 1.01 * np.linalg.norm(-b, 2)      # Theta = 0 is optimal iff ||grad f(0)||_2 <= mu
    res = solve_nuclear_prox(X, y, mu)
    assert res.rank == 0 and np.allclose(res.Theta, 0)
    assert res.objective == pytest.approx(c.sum())


def test_ragged_clients_match_equal_layout(data):
    X, y = data
    Xs, ys = list(X), list(y)
    a = solve_nuclear_prox(X, y, 0.1, tol=1e-10)
    b = solve_nuclear_prox(Xs, ys, 0.1, tol=1e-10)
    assert np.allclose(a.Theta, b.Theta, atol=1e-10)
    Xr = [X[0][:3]] + Xs[1:]
    yr = [y[0][:3]] + ys[1:]
    r1 = solve_nuclear_prox(Xr, yr, 0.1, tol=1e-10)
    r2 = solve_nuclear_cvxpy(Xr, yr, 0.1)
    assert r1.objective == pytest.approx(r2.objective, rel=1e-6)
    assert nuclear_objective(r2.Theta, Xr, yr, 0.1) == pytest.approx(r2.objective, rel=1e-12)


def test_scs_solver_and_inaccurate_handling(data):
    X, y = data
    res = solve_nuclear_cvxpy(X, y, 0.3, solver="SCS", solver_options={"eps": 1e-9})
    assert res.solver == "cvxpy:SCS"
    ref = solve_nuclear_prox(X, y, 0.3, tol=1e-10)
    assert res.objective == pytest.approx(ref.objective, rel=1e-6)
    # SCS capped at 2 iterations cannot reach optimality: never silently accepted
    with pytest.raises(SolverError, match="not solved to the tolerance.*optimal_inaccurate"):
        solve_nuclear_cvxpy(X, y, 0.3, solver="SCS", solver_options={"max_iters": 2},
                            on_inaccurate="raise")
    # by default reported as such, with a warning and its (large) certified relative gap
    with pytest.warns(ConvergenceWarning, match="certified relative duality gap"):
        loose = solve_nuclear_cvxpy(X, y, 0.3, solver="SCS", solver_options={"max_iters": 2})
    assert loose.status == "inaccurate" and not loose.converged
    assert loose.relative_gap > 1e-3 and loose.message
    with pytest.raises(TypeError, match="unexpected keyword"):
        solve_nuclear_cvxpy(X, y, 0.3, max_iters=2)        # no **kwargs: options are a mapping


@pytest.mark.parametrize("scale", [1e-4, 1e-8, 1e6])
def test_relative_gaps_make_both_solvers_scale_free(data, scale):
    """Regression: the prox stopping rule gap <= tol * max(1, |P|) had an absolute floor, so with
    y and mu scaled by 1e-4 it stopped after 5 iterations 43% away from the optimum. Both
    solvers now use gap <= tol * P(0) and state it (gap_scale)."""
    X, y = data
    ref = solve_nuclear_prox(X, y, 0.3, tol=1e-10)
    small = solve_nuclear_prox(X, scale * y, scale * 0.3, tol=1e-10)
    assert small.status == "optimal" and small.relative_gap <= 1e-10
    assert small.gap_scale == pytest.approx(scale ** 2 * ref.gap_scale, rel=1e-12)
    err = np.linalg.norm(small.Theta / scale - ref.Theta) / np.linalg.norm(ref.Theta)
    assert err < 1e-4
    exact = solve_nuclear_cvxpy(X, scale * y, scale * 0.3)
    assert exact.status == "optimal" and exact.relative_gap <= 1e-7
    assert np.linalg.norm(exact.Theta / scale - ref.Theta) / np.linalg.norm(ref.Theta) < 1e-3


def test_theta0_is_a_deprecated_alias_of_init(data):
    X, y = data
    start = np.full((10, 8), 0.1)
    a = solve_nuclear_prox(X, y, 0.3, init=start, tol=1e-10)
    with pytest.warns(DeprecationWarning, match="init"):
        b = solve_nuclear_prox(X, y, 0.3, Theta0=start, tol=1e-10)
    np.testing.assert_array_equal(a.Theta, b.Theta)


def test_max_iter_warns(data):
    X, y = data
    with pytest.warns(ConvergenceWarning, match="stopped at max_iter=3"):
        res = solve_nuclear_prox(X, y, 0.01, max_iter=3)
    assert res.status == "max_iter" and res.iterations == 3


def test_recovers_low_rank_subspace_noiseless():
    p = multitask_linear(d=6, rank=2, n_clients=30, samples_per_client=12, seed=1)
    res = solve_nuclear_prox(p.X, p.y, 1e-4, tol=1e-10)
    from lowrank_fl.linalg import subspace_distance, truncated_svd
    V = truncated_svd(res.Theta, 2)[2].T
    assert subspace_distance(p.B_star, V) < 1e-2


@pytest.mark.parametrize("call, err, match", [
    (lambda X, y: solve_nuclear_prox(X, y, 0.0), ValueError, "mu must be finite and > 0"),
    (lambda X, y: solve_nuclear_prox(X, y, 0.1, tol=-1), ValueError, "tol must be finite and > 0"),
    (lambda X, y: solve_nuclear_prox(X, y, 0.1, max_iter=0), ValueError, "max_iter must be >= 1"),
    (lambda X, y: solve_nuclear_prox(X, y, 0.1, init=np.zeros((3, 3))), ValueError, r"init must have shape \(10, 8\)"),
    (lambda X, y: solve_nuclear_cvxpy(X, y, 0.1, solver="MOSEK"), ValueError, "solver must be one of"),
    (lambda X, y: solve_nuclear_cvxpy(X, y[:, :2], 0.1), ValueError, r"y must have shape \(10, 6\)"),
    (lambda X, y: solve_nuclear_prox("X", y, 0.1), TypeError, "X and y must be arrays"),
    (lambda X, y: solve_nuclear_prox(list(X), list(y)[:3], 0.1), ValueError, "same \\(positive\\) number of clients"),
    (lambda X, y: solve_nuclear_prox([X[0], X[1][:, :3]], [y[0], y[1]], 0.1), ValueError, r"X\[1\] must have shape"),
    (lambda X, y: nuclear_objective(np.zeros((2, 2)), X, y, 0.1), ValueError, r"Theta must have shape"),
])
def test_bad_input(data, call, err, match):
    X, y = data
    with pytest.raises(err, match=match):
        call(X, y)


@pytest.mark.parametrize("mu, rank", [(0.3, 2), (0.05, 7)])
def test_cvxpy_and_prox_report_the_same_rank(mu, rank):
    # the interior point leaves its zero singular values at 1e-7..2e-5 of the largest (a 1e-8
    # threshold counted 8 and 10); the prox's SVT sets them to 0
    from lowrank_fl.exact.nuclear import solve_nuclear_cvxpy, solve_nuclear_prox
    prob = multitask_linear(d=10, rank=2, n_clients=15, samples_per_client=20, noise=0.1, seed=3)
    a, b = solve_nuclear_cvxpy(prob.X, prob.y, mu), solve_nuclear_prox(prob.X, prob.y, mu)
    assert a.rank == b.rank == rank
    sv = np.linalg.svd(b.Theta, compute_uv=False)
    assert sv[rank - 1] > 1e-3 * sv[0] and np.all(sv[rank:] <= 1e-15 * sv[0])   # a clear gap


@pytest.mark.parametrize("X, y", [
    (np.zeros((0, 5, 3)), np.zeros((0, 5))),
    (np.zeros((2, 0, 3)), np.zeros((2, 0))),
    ([np.ones((4, 3)), np.zeros((0, 3))], [np.ones(4), np.zeros(0)]),
])
def test_empty_data_is_refused_naming_it(X, y):
    from lowrank_fl.exact.nuclear import solve_nuclear_cvxpy, solve_nuclear_prox
    for solve in (solve_nuclear_prox, solve_nuclear_cvxpy):
        with pytest.raises(ValueError, match="X must hold at least one client, one sample per client"):
            solve(X, y, 0.1)
