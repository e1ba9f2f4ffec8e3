"""Program (7): Algorithm 1, FISTA and CVXPY agree; duality gaps, KKT, errors (notes §6.D, §7.6)."""
import warnings

import numpy as np
import pytest

from lowrank_fl.clair.contrasts import contrasts
from lowrank_fl.clair.penalized import (dual_point, dual_value, duality_gap, kkt_residuals,
                                        penalized_objective, solve_penalized)
from lowrank_fl.clair.simulate import generate
from lowrank_fl.results import ConvergenceWarning, SolverError

K, P, Q, R = 8, 5, 3, 2
G = K * (K - 1) // 2
LAM_L, LAM_S = 1 / np.sqrt(K), 3 / K ** 1.5   # the §7 scalings with (c1, c2) = (1, 3)


def _instance(seed):
    inst = generate(K, P, Q, R, contaminated=2, noise=0.1, seed=seed)
    return contrasts(inst.W_hat)


WEIGHTS = {"uniform": None,
           "nonuniform": np.random.default_rng(7).uniform(0.5, 2.0, G) / K}


@pytest.fixture(scope="module", params=[(0, "uniform"), (1, "nonuniform")],
                ids=["uniform", "nonuniform"])
def solved(request):
    seed, wname = request.param
    D = _instance(seed)
    w = WEIGHTS[wname]
    out = {m: solve_penalized(D, Q, LAM_L, LAM_S, w, method=m)
           for m in ("fista", "proxgrad", "cvxpy")}
    return D, w, out


def test_iterative_match_clarabel(solved):
    D, w, out = solved
    ref = out["cvxpy"]
    assert ref.status == "optimal" and ref.solver == "cvxpy:CLARABEL"
    # numerical rank against ||D||_op (notes §7.7): Clarabel leaves ~1e-7 tails
    r = ref.rank(1e-6, np.linalg.norm(D, 2))
    assert r >= 1
    for m in ("fista", "proxgrad"):
        res = out[m]
        assert res.status == "optimal" and res.solver == m
        # interior point reaches ~1e-9 relative objective accuracy; 1e-6 leaves room
        assert abs(res.objective - ref.objective) <= 1e-6 * abs(ref.objective)
        # the iterative certificates themselves: stopping rule tol = 1e-8
        assert res.relative_gap <= 1e-8
        assert res.gap >= -1e-12                       # weak duality
        assert res.rank(1e-6, np.linalg.norm(D, 2)) == r
        # Davis–Kahan: ||dP|| <~ 2||dL||/sigma_r; Clarabel's L is accurate to ~1e-7 and
        # sigma_r is O(1) here, so 1e-4 is a safe bound (observed ~3e-6)
        assert np.linalg.norm(res.projector(r) - ref.projector(r), 2) < 1e-4
    # the two iterative methods solve the same problem to 1e-8 gap: much closer to each other
    assert np.linalg.norm(out["fista"].projector(r) - out["proxgrad"].projector(r), 2) < 1e-5
    # the CVXPY point certified with the same dual formula (comparable gaps)
    assert 0 <= ref.gap <= 1e-6 * max(1.0, abs(ref.objective))


def test_kkt_at_solution(solved):
    D, w, out = solved
    res = out["fista"]
    k = kkt_residuals(D, Q, res.L, res.S, LAM_L, LAM_S, w)
    # relative gap 1e-8 -> subgradient residuals of order sqrt(gap) at worst; observed ~1e-8
    assert max(k.values()) < 1e-5
    # a non-optimal point violates them
    k_bad = kkt_residuals(D, Q, 0.5 * res.L, res.S, LAM_L, LAM_S, w)
    assert max(k_bad.values()) > 1e-2


def test_public_objective_dual_gap(solved):
    D, w, out = solved
    res = out["proxgrad"]
    assert penalized_objective(D, Q, res.L, res.S, LAM_L, LAM_S, w) == pytest.approx(
        res.objective, rel=1e-12)
    Qd, val = dual_point(D, Q, res.L, res.S, LAM_L, LAM_S, w)
    assert dual_value(D, Q, Qd, LAM_L, LAM_S, w) == pytest.approx(val, rel=1e-12)
    assert duality_gap(D, Q, res.L, res.S, LAM_L, LAM_S, w) == pytest.approx(res.gap, abs=1e-10)
    # weak duality at arbitrary points
    rng = np.random.default_rng(0)
    for _ in range(5):
        L, S = rng.standard_normal((2,) + D.shape)
        assert duality_gap(D, Q, L, S, LAM_L, LAM_S, w) > 0


def test_scs_agrees_with_clarabel(solved):
    D, w, out = solved
    scs = solve_penalized(D, Q, LAM_L, LAM_S, w, method="cvxpy", solver="SCS")
    assert scs.solver == "cvxpy:SCS" and scs.status == "optimal"
    # SCS is first order with eps = 1e-9 (our default): objective to ~1e-7 relative;
    # 1e-5 allows for its slower tail convergence
    assert abs(scs.objective - out["cvxpy"].objective) <= 1e-5 * abs(out["cvxpy"].objective)


def test_proxgrad_monotone_and_fixed_steps():
    D = _instance(2)
    res = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", tol=None, max_iter=60)
    assert res.status == "completed" and res.iterations == 60
    obj = res.history["objective"]
    assert obj.shape == (60,)
    # t = 1/(2 max w) is 1/Lipschitz: prox-gradient descent is monotone
    assert np.all(np.diff(obj) <= 1e-12 * abs(obj[0]))
    fista = solve_penalized(D, Q, LAM_L, LAM_S, method="fista")
    assert np.all(np.diff(fista.history["objective"]) <= 1e-12 * abs(obj[0]))  # function restart
    # FISTA needs fewer iterations than Algorithm 1 for the same tolerance
    pg = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad")
    assert fista.iterations < pg.iterations


def test_warm_start_and_svd_modes():
    D = _instance(3)
    a = solve_penalized(D, Q, LAM_L, LAM_S, svd="lapack")
    b = solve_penalized(D, Q, LAM_L, LAM_S, svd="gram")
    assert abs(a.objective - b.objective) <= 1e-8 * abs(a.objective)
    c = solve_penalized(D, Q, LAM_L, LAM_S, init=(a.L, a.S), check_every=1)
    assert c.status == "optimal" and c.iterations <= 2
    # L^0 = S^0 = 0 in Algorithm 1: one step from zero is SVT/BST of t P_w D
    one = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", tol=None, max_iter=1)
    t = K / 2
    from lowrank_fl.linalg import block_soft_threshold, svt
    np.testing.assert_allclose(one.L, svt(t * D / K, t * LAM_L)[0], atol=1e-12)
    np.testing.assert_allclose(one.S, block_soft_threshold(
        (t * D / K).reshape(G, Q, P), t * LAM_S).reshape(D.shape), atol=1e-12)


def test_max_iter_warning_and_divergence():
    D = _instance(4)
    with pytest.warns(ConvergenceWarning, match=r"max_iter=3 with relative duality gap"):
        res = solve_penalized(D, Q, LAM_L, LAM_S, max_iter=3)
    assert res.status == "max_iter" and res.iterations == 3 and res.relative_gap > 1e-8
    with pytest.warns(ConvergenceWarning, match="diverged at iteration"):
        bad = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", step=400.0)
    assert bad.status == "diverged" and isinstance(bad.diverged_at, int)
    assert np.all(np.isfinite(bad.L))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", tol=None, max_iter=5)
    assert ok.status == "completed"


def test_cvxpy_failure_raises_and_inaccurate_is_reported():
    D = _instance(5)
    with pytest.raises(SolverError, match="status: optimal_inaccurate") as exc:
        solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", solver="SCS",
                        solver_options={"max_iters": 5})
    assert exc.value.status == "optimal_inaccurate"
    with pytest.warns(ConvergenceWarning, match="optimal_inaccurate"):
        res = solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", solver="SCS",
                              solver_options={"max_iters": 5}, accept_inaccurate=True)
    assert res.status == "optimal_inaccurate"


def test_input_errors():
    D = _instance(6)
    bad = D.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="D must be finite"):
        solve_penalized(bad, Q, LAM_L, LAM_S)
    with pytest.raises(ValueError, match="D must have 2 dimensions"):
        solve_penalized(D.reshape(G, Q, P), Q, LAM_L, LAM_S)
    with pytest.raises(ValueError, match="multiple of q=5"):
        solve_penalized(D, 5, LAM_L, LAM_S)
    with pytest.raises(ValueError, match="lam_L must be finite and > 0"):
        solve_penalized(D, Q, 0.0, LAM_S)
    with pytest.raises(ValueError, match="lam_S must be finite and > 0"):
        solve_penalized(D, Q, LAM_L, -1.0)
    with pytest.raises(ValueError, match=r"weights must have shape \(28,\)"):
        solve_penalized(D, Q, LAM_L, LAM_S, np.ones(5))
    with pytest.raises(ValueError, match="weights must be strictly positive"):
        solve_penalized(D, Q, LAM_L, LAM_S, -np.ones(G))
    with pytest.raises(ValueError, match="method must be one of"):
        solve_penalized(D, Q, LAM_L, LAM_S, method="admm")
    with pytest.raises(ValueError, match="solver must be one of"):
        solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", solver="MOSEK")
    with pytest.raises(ValueError, match="solver is only used with method='cvxpy'"):
        solve_penalized(D, Q, LAM_L, LAM_S, solver="SCS")
    with pytest.raises(ValueError, match="nuclear must be one of"):
        solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", nuclear="full")
    with pytest.raises(ValueError, match="tol must be finite and > 0"):
        solve_penalized(D, Q, LAM_L, LAM_S, tol=0.0)
    with pytest.raises(ValueError, match="max_iter must be >= 1"):
        solve_penalized(D, Q, LAM_L, LAM_S, max_iter=0)
    with pytest.raises(ValueError, match="step must be finite and > 0"):
        solve_penalized(D, Q, LAM_L, LAM_S, step=-1.0)
    with pytest.raises(ValueError, match="svd must be one of"):
        solve_penalized(D, Q, LAM_L, LAM_S, svd="randomized")
    with pytest.raises(TypeError, match="init must be a pair"):
        solve_penalized(D, Q, LAM_L, LAM_S, init=D)
    with pytest.raises(ValueError, match=r"init\[1\] \(S0\) must have shape"):
        solve_penalized(D, Q, LAM_L, LAM_S, init=(D, D[:3]))
    with pytest.raises(ValueError, match="Q is not dual feasible: \\|\\|Q\\|\\|_op"):
        dual_value(D, Q, 10 * D, LAM_L, LAM_S)
    with pytest.raises(ValueError, match="Q is not dual feasible: max_g"):
        Qs = np.zeros_like(D)
        Qs[:Q] = 1.0                                  # one block of norm sqrt(Q*P) > lam_S
        dual_value(D, Q, Qs * LAM_S, LAM_L * 100, LAM_S)
    with pytest.raises(ValueError, match="L must have shape"):
        penalized_objective(D, Q, D[:3], D, LAM_L, LAM_S)
