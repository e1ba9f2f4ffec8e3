"""Program (7): Algorithm 1, FISTA and CVXPY agree; duality gaps, KKT, certified CVXPY answers,
scale invariance, errors."""
import warnings

import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions

from lowrank_fl.clair.contrasts import contrasts
from lowrank_fl.clair.penalized import (dual_point, dual_value, duality_gap, kkt_residuals,
                                        penalized_objective, solve_penalized)
from lowrank_fl.clair.simulate import generate
from lowrank_fl.results import ConvergenceWarning, SolverError

K, P, Q, R = 8, 5, 3, 2
G = K * (K - 1) // 2
LAM_L, LAM_S = 1 / np.sqrt(K), 3 / K ** 1.5   # the §7 scalings with (c1, c2) = (1, 3)


def _instance(seed):
    inst = generate(n_clients=K, p=P, q=Q, rank=R, contaminated=2, noise=0.1, seed=seed)
    return contrasts(inst.W_hat)


WEIGHTS = {"uniform": None,
           "nonuniform": np.random.default_rng(7).uniform(0.5, 2.0, G) / K}


@pytest.fixture(scope="module", params=[(0, "uniform"), (1, "nonuniform")],
                ids=["uniform", "nonuniform"])
def solved(request):
    seed, wname = request.param
    D = _instance(seed)
    w = WEIGHTS[wname]
    out = {m: solve_penalized(D, Q, LAM_L, LAM_S, weights=w, method=m)
           for m in ("fista", "proxgrad", "cvxpy")}
    return D, w, out


def test_iterative_match_clarabel(solved):
    D, w, out = solved
    ref = out["cvxpy"]
    assert ref.status == "optimal" and ref.solver == "cvxpy:CLARABEL"
    # numerical rank against ||D||_op: Clarabel leaves ~1e-7 tails
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
    assert ref.gap >= 0 and ref.relative_gap <= 1e-6


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
    scs = solve_penalized(D, Q, LAM_L, LAM_S, weights=w, method="cvxpy", solver="SCS")
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
        bad = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", step_size=400.0)
    assert bad.status == "diverged" and isinstance(bad.diverged_at, int)
    assert np.all(np.isfinite(bad.L))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", tol=None, max_iter=5)
    assert ok.status == "completed"


def test_cvxpy_uncertified_answer_is_inaccurate_and_warns_or_raises():
    D = _instance(5)
    with pytest.raises(SolverError, match="program \\(7\\) not solved to the tolerance") as exc:
        solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", solver="SCS",
                        solver_options={"max_iters": 5}, on_inaccurate="raise")
    assert exc.value.status == "optimal_inaccurate"
    with pytest.warns(ConvergenceWarning, match="certified relative duality gap .* > tol"):
        res = solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", solver="SCS",
                              solver_options={"max_iters": 5})
    assert res.status == "inaccurate" and res.relative_gap > 1e-7
    assert "not solved to the tolerance" in res.message


def test_cvxpy_status_is_decided_by_the_certificate():
    """A loose tol accepts the SCS answer that CVXPY calls optimal_inaccurate (the certificate
    decides); a tol below what Clarabel reaches marks its 'optimal' answer inaccurate."""
    D = _instance(5)
    loose = solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", solver="SCS",
                            solver_options={"max_iters": 200}, tol=0.5)
    assert "optimal_inaccurate" in loose.message and loose.status == "optimal"
    with pytest.warns(ConvergenceWarning, match="status optimal; certified"):
        strict = solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", tol=1e-15)
    assert strict.status == "inaccurate"
    with pytest.raises(ValueError, match="tol=None"):
        solve_penalized(D, Q, LAM_L, LAM_S, method="cvxpy", tol=None)


@pytest.mark.parametrize("scale", [1e-9, 1e-6, 1e9])
def test_cvxpy_is_exact_at_every_data_scale(scale):
    """Regression: without internal rescaling Clarabel reported 'optimal' with relative gap 7e-4
    (projector off by 0.012) at scale 1e-6, gap 0.19 at 1e-9, and 'infeasible' at 1e9. With
    (D, lam) scaled together the answer is the FISTA answer scaled (program (7) is homogeneous)."""
    D = _instance(0)
    ref = solve_penalized(D, Q, LAM_L, LAM_S, tol=1e-12, max_iter=100000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = solve_penalized(scale * D, Q, scale * LAM_L, scale * LAM_S, method="cvxpy")
    assert res.status == "optimal" and res.relative_gap <= 1e-7
    assert abs(res.objective / scale ** 2 - ref.objective) <= 1e-6 * ref.objective
    r = ref.rank(1e-6)
    assert np.linalg.norm(res.projector(r) - ref.projector(r), 2) < 1e-4


def test_step_is_a_deprecated_alias_of_step_size():
    D = _instance(1)
    new = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", tol=None, max_iter=2,
                          step_size=1.0)
    with pytest.warns(DeprecationWarning, match="step_size"):
        old = solve_penalized(D, Q, LAM_L, LAM_S, method="proxgrad", tol=None, max_iter=2,
                              step=1.0)
    np.testing.assert_array_equal(old.L, new.L)
    with pytest.raises(TypeError, match="4 positional arguments"):
        solve_penalized(D, Q, LAM_L, LAM_S, None)          # weights is keyword-only


def test_every_result_has_a_message():
    D = _instance(2)
    for kw in ({}, {"method": "proxgrad", "tol": None, "max_iter": 3}, {"method": "cvxpy"}):
        assert solve_penalized(D, Q, LAM_L, LAM_S, **kw).message.endswith(".")


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
        solve_penalized(D, Q, LAM_L, LAM_S, weights=np.ones(5))
    with pytest.raises(ValueError, match="weights must be strictly positive"):
        solve_penalized(D, Q, LAM_L, LAM_S, weights=-np.ones(G))
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
    # a relative gap of 1 or more certifies nothing ((0, 0) has one of at most 1); below float64's
    # resolution only a gap rounding to 0 would stop the solve: said
    for bad in (1.0, 10.0):
        with pytest.raises(ValueError, match=rf"tol must be below 1 \(a relative duality gap of {bad:g} certifies "
                                             r"nothing: CLAIR's start \(0, 0\) has one of at most 1\)"):
            solve_penalized(D, Q, LAM_L, LAM_S, tol=bad)
    with pytest.raises(ValueError, match="tol must be below 1"):
        ModuleOptions(tol=1.0)
    # a q that splits D into a number of blocks no federation has names q, not the weights
    with pytest.raises(ValueError, match=r"^D has 120 rows, so q=3 gives G=40 blocks, which is K\(K-1\)/2 for "
                                         r"no number of clients K: check q"):
        solve_penalized(np.ones((120, 8)), 3, LAM_L, LAM_S)
    assert solve_penalized(np.ones((120, 8)), 3, LAM_L, LAM_S, weights=0.1).status == "optimal"
    with pytest.warns(UserWarning, match=r"^tol=1e-30 is below what float64 can certify"):
        solve_penalized(D, Q, LAM_L, LAM_S, tol=1e-30, max_iter=5)
    with pytest.raises(ValueError, match="max_iter must be >= 1"):
        solve_penalized(D, Q, LAM_L, LAM_S, max_iter=0)
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        solve_penalized(D, Q, LAM_L, LAM_S, step_size=-1.0)
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
    with pytest.raises(ValueError, match="rtol must be finite and >= 0"):
        dual_value(D, Q, np.zeros_like(D), LAM_L, LAM_S, rtol=-1.0)
    with pytest.raises(ValueError, match="rank_tol must be finite and > 0"):
        kkt_residuals(D, Q, D, D, LAM_L, LAM_S, rank_tol=0.0)


@pytest.mark.parametrize("method, kw", [
    ("cvxpy", {"max_iter": 2}), ("cvxpy", {"step_size": 0.1}),
    ("cvxpy", {"check_every": 1}), ("cvxpy", {"svd": "lapack"}),
    ("fista", {"nuclear": "normNuc"}), ("proxgrad", {"on_inaccurate": "raise"}),
    ("fista", {"solver_options": {"max_iters": 5}}), ("fista", {"verbose": True})])
def test_options_of_the_other_method_family_are_refused(method, kw):
    """A non-default option the chosen method would ignore is an error, not a silent no-op."""
    D = _instance(6)
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name} is only used with"):
        solve_penalized(D, Q, LAM_L, LAM_S, method=method, **kw)


def test_one_step_with_nonuniform_weights_is_the_hand_computed_step():
    """Algorithm 1 from L = S = 0 with non-uniform w: t = 1/(2 max w), the gradient step (19)
    is t P_w D, then (21): L1 = SVT(t P_w D; t lam_L), S1 = BST(t P_w D; t lam_S)."""
    D = _instance(1)
    w = WEIGHTS["nonuniform"]
    one = solve_penalized(D, Q, LAM_L, LAM_S, weights=w, method="proxgrad", tol=None, max_iter=1)
    t = 1.0 / (2.0 * w.max())
    M = t * D * np.repeat(w, Q)[:, None]
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    L1 = (U * np.maximum(s - t * LAM_L, 0.0)) @ Vt
    Mb = M.reshape(G, Q, P)
    n = np.linalg.norm(Mb.reshape(G, -1), axis=1)
    S1 = (Mb * np.maximum(1.0 - t * LAM_S / n, 0.0)[:, None, None]).reshape(D.shape)
    np.testing.assert_allclose(one.L, L1, atol=1e-12)
    np.testing.assert_allclose(one.S, S1, atol=1e-12)
    # a different step gives a different iterate (the default is not ignored)
    other = solve_penalized(D, Q, LAM_L, LAM_S, weights=w, method="proxgrad", tol=None, max_iter=1,
                            step_size=0.5 * t)
    assert np.abs(other.L - L1).max() > 1e-6


def test_kkt_cross_terms():
    """Z = P_w R must also satisfy P_U Z P_V⊥ = 0 and P_U⊥ Z P_V = 0 for Z in lam_L d||L||_*.
    The point with Z = lam_L u v^T + 0.5 u x^T (x ⊥ v) passes the aligned and off-range tests
    but is not optimal (positive duality gap)."""
    G1, q, p = 3, 2, 3
    w = np.ones(G1)
    u = np.zeros(G1 * q)
    u[0] = 1.0
    v, x = np.eye(p)[0], np.eye(p)[1]
    lam_L, lam_S = 1.0, 10.0
    L = np.outer(u, v)
    Z = lam_L * np.outer(u, v) + 0.5 * np.outer(u, x)
    D = L + Z                                           # S = 0, R = D - L = Z (w = 1)
    k = kkt_residuals(D, q, L, np.zeros_like(D), lam_L, lam_S, w)
    assert k["nuclear_aligned"] < 1e-12 and k["nuclear_op"] == 0.0
    assert k["nuclear_cross"] == pytest.approx(0.5)
    assert duality_gap(D, q, L, np.zeros_like(D), lam_L, lam_S, w) > 0.1


def test_scale_invariance():
    """(7) is homogeneous: (D, lam) -> (c D, c lam) scales the objective by c^2. Stopping rule,
    relative gap and numerical rank must not depend on c (no floors at 1)."""
    D = _instance(0)
    ref = solve_penalized(D, Q, LAM_L, LAM_S)
    r = ref.rank()
    assert r >= 1 and ref.status == "optimal"
    for c in (1e-3, 1e3):
        res = solve_penalized(c * D, Q, c * LAM_L, c * LAM_S)
        assert res.status == "optimal"
        assert res.objective == pytest.approx(c * c * ref.objective, rel=1e-6)
        assert res.relative_gap <= 1e-8
        assert res.gap_scale == pytest.approx(c * c * ref.gap_scale, rel=1e-12)
        assert res.rank() == r
        # both at relative gap 1e-8: the subspaces agree far below the 1e-4 of the CVXPY test
        assert np.linalg.norm(res.projector(r) - ref.projector(r), 2) < 1e-5
        k = kkt_residuals(c * D, Q, res.L, res.S, c * LAM_L, c * LAM_S)
        assert max(k.values()) < 1e-5


def test_fista_function_restart_on_last_iteration_still_checks_the_gap():
    """A function restart at iteration max_iter leaves x unchanged; the gap check must still
    run there, so a converged point is reported "optimal", not "max_iter"."""
    D = _instance(2)
    free = solve_penalized(D, Q, LAM_L, LAM_S, tol=None, max_iter=400)
    obj = free.history["objective"]
    stalls = np.flatnonzero(np.diff(obj) == 0) + 2        # iterations whose step was dropped
    assert stalls.size, "no function restart in 400 FISTA iterations"
    k = int(stalls[0])
    at_k = solve_penalized(D, Q, LAM_L, LAM_S, tol=None, max_iter=k)
    tol = 2.0 * at_k.relative_gap
    res = solve_penalized(D, Q, LAM_L, LAM_S, tol=tol, max_iter=k, check_every=10 ** 6)
    assert res.iterations == k and res.status == "optimal"


def test_a_tiny_step_is_named_as_the_cause_of_a_stall_and_the_fit_blames_the_solve():
    """step_size 4e8 times below 1/(2 max w): the solve stalls far from its tolerance, its warning
    names the step, and clair.fit's rank warning points at the unfinished solve, not at λ."""
    from lowrank_fl import clair

    inst = clair.simulate(n_clients=8, samples_per_client=100, p=10, q=10, seed=0)
    with pytest.warns(ConvergenceWarning, match=r"step_size t=1e-08 is 4e\+08x below 1/\(2 max w\) = 4 "
                                                r"\(the default\)") as rec, \
            pytest.warns(RuntimeWarning, match=r"the solve ended 'stalled' before its tolerance, so L_hat "
                                               r"is not yet \(7\)'s solution"):
        fit = clair.fit(inst.W_hat, 0.3, 0.1, rank=2, step_size=1e-8)
    assert fit.status == "stalled"
    assert not any("probably too small" in str(w.message) for w in rec)
    # the default step reaches the tolerance on the same instance: no such warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        assert clair.fit(inst.W_hat, 0.3, 0.1, rank=2).status == "optimal"
