"""conic.py and clair/program7.py: the documented numbers against hand computations and an
independent CVXPY formulation of program (7) (``cp.normNuc``, written here, not the library's)."""
import math
import warnings

import cvxpy as cp
import numpy as np
import pytest

from lowrank_fl.clair import contrasts, solve_penalized
from lowrank_fl.clair.program7 import certify, penalized_objective, zero_objective
from lowrank_fl.clair.programs import solve_program7
from lowrank_fl.conic import data_scale, decide, safe_scale
from lowrank_fl.results import ConvergenceWarning, SolverError


# --------------------------------------------------------------------------------------------
# conic.data_scale: a power of two near the largest |entry|, whatever the signs
@pytest.mark.parametrize("arrays, want", [
    (([-3.0, -1.0],), 4.0),
    (([-1e-6, -2e-7],), 2.0 ** -19),             # frexp(1e-6) = (0.524288, -19)
    ((np.full((2, 3), -5e8),), 2.0 ** 29),
    (([1.0], [-5.0]), 8.0),
    (([0.5], [-0.25]), 1.0),
    (([0.0, -0.0],), 1.0),
    ((np.zeros(0),), 1.0),
])
def test_data_scale_by_hand(arrays, want):
    got = data_scale(*arrays)
    assert got == want
    m = max(float(np.max(np.abs(a))) if np.size(a) else 0.0 for a in arrays)
    if m > 0:
        assert 0.5 <= m / got < 1.0 and math.frexp(got)[0] == 0.5    # exactly a power of two


def test_safe_scale_all_negative_outside_the_safe_range():
    assert safe_scale(np.full(3, -1e-120)) == data_scale(np.full(3, -1e-120)) != 1.0
    assert safe_scale(np.full(3, -7.0)) == 1.0


def _negative_problem(scale):
    """Program (7) data whose every entry is negative (K = 3 clients, q = 2, p = 3)."""
    rng = np.random.default_rng(4)
    D = -scale * (1.0 + rng.random((3 * 2, 3)))
    return D


@pytest.mark.parametrize("scale", [1e-6, 1e6])
def test_all_negative_data_are_solved_to_the_tolerance(scale):
    D = _negative_problem(scale)
    lam_L, lam_S = 0.3 * scale, 0.2 * scale
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)      # an inaccurate answer fails here
        res = solve_program7(D, 2, lam_L, lam_S, tol=1e-7)
    assert res.status == "optimal" and res.relative_gap <= 1e-7
    ref = solve_penalized(D, 2, lam_L, lam_S, method="fista", tol=1e-10, max_iter=100_000)
    assert res.objective == pytest.approx(ref.objective, rel=1e-6)


# --------------------------------------------------------------------------------------------
# conic.decide: the certificate decides; without one, only "optimal" is accepted
@pytest.mark.parametrize("gap, raw, want", [
    (None, "optimal", "optimal"),
    (None, "optimal_inaccurate", "inaccurate"),
    (1e-9, "optimal_inaccurate", "optimal"),
    (1e-6, "optimal", "optimal"),               # exactly at the tolerance
    (1.0000001e-6, "optimal", "inaccurate"),
    (float("nan"), "optimal", "inaccurate"),
])
def test_decide(gap, raw, want):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = decide(gap, 1e-6, raw, what="program (x)", solver="cvxpy:CLARABEL")
    assert d.status == want
    assert any(issubclass(w.category, ConvergenceWarning) for w in caught) == (want != "optimal")
    if want != "optimal":
        with pytest.raises(SolverError):
            decide(gap, 1e-6, raw, what="program (x)", solver="cvxpy:CLARABEL",
                   on_inaccurate="raise")


# --------------------------------------------------------------------------------------------
# program (7): F(0, 0) = 1/2 sum_g w_g ||D_g||^2, and relative gaps against CVXPY's optimum
def _instance(seed=0, K=4, q=3, p=3):
    rng = np.random.default_rng(seed)
    A = np.linalg.qr(rng.standard_normal((p, 1)))[0].T           # shared rank-1 row space
    W = rng.standard_normal((K, q, 1)) @ A[None] + 0.05 * rng.standard_normal((K, q, p))
    W[-1] = rng.standard_normal((q, p))                          # a contaminated client
    return contrasts(W), q, K


def _cvxpy_optimum(D, q, lam_L, lam_S, w):
    """Program (7) written directly with cp.normNuc (independent of lowrank_fl.clair.programs)."""
    G = D.shape[0] // q
    L = cp.Variable(D.shape)
    S = cp.Variable(D.shape)
    R = D - L - S
    loss = 0.5 * sum(w[g] * cp.sum_squares(R[g * q:(g + 1) * q]) for g in range(G))
    blocks = sum(cp.norm(S[g * q:(g + 1) * q], "fro") for g in range(G))
    prob = cp.Problem(cp.Minimize(loss + lam_L * cp.normNuc(L) + lam_S * blocks))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert prob.status == "optimal"
    return float(prob.value)


def test_zero_objective_by_hand():
    D, q, K = _instance()
    G = K * (K - 1) // 2
    w = np.linspace(0.2, 1.0, G)
    by_hand = 0.5 * sum(w[g] * np.sum(D[g * q:(g + 1) * q] ** 2) for g in range(G))
    assert zero_objective(D, q, w) == pytest.approx(by_hand, rel=1e-14)
    Z = np.zeros_like(D)
    assert penalized_objective(D, q, Z, Z, 1.0, 1.0, w) == pytest.approx(by_hand, rel=1e-14)
    assert zero_objective(np.zeros_like(D), q, w) == 1.0
    c = certify(D, q, Z, Z, 0.1, 0.1, w)
    assert c.scale == pytest.approx(by_hand, rel=1e-14)
    assert c.relative_gap == pytest.approx(c.gap / by_hand, rel=1e-14)


@pytest.mark.parametrize("method", ["fista", "proxgrad"])
def test_loose_solve_reports_a_relative_gap_bounding_the_true_one(method):
    """A tol = 1e-3 solve: its reported relative gap is gap / F(0, 0) and bounds the true
    relative suboptimality (objective - CVXPY optimum) / F(0, 0)."""
    D, q, K = _instance(seed=1)
    G = K * (K - 1) // 2
    w = np.full(G, 1.0 / K)
    lam_L, lam_S = 0.05, 0.05 / np.sqrt(q)
    f00 = 0.5 * sum(w[g] * np.sum(D[g * q:(g + 1) * q] ** 2) for g in range(G))
    p_star = _cvxpy_optimum(D, q, lam_L, lam_S, w)
    res = solve_penalized(D, q, lam_L, lam_S, method=method, tol=1e-3, max_iter=100_000)
    assert res.status == "optimal"
    assert res.gap_scale == pytest.approx(f00, rel=1e-13)
    assert res.relative_gap == pytest.approx(res.gap / f00, rel=1e-12)
    assert res.relative_gap <= 1e-3
    true_rel = (res.objective - p_star) / f00
    assert -1e-9 <= true_rel <= res.relative_gap + 1e-9
    # and the dual is a lower bound of the optimum
    assert res.objective - res.gap <= p_star + 1e-9 * f00


def test_top_eigenvalue_survives_a_failing_mrrr(monkeypatch):
    """LAPACK's syevr can stop with "Internal Error" on clustered spectra (seen on an 8-client,
    uncontaminated adapter module); the top eigenvalue then comes from the full solver."""
    import scipy.linalg

    from lowrank_fl.clair import program7

    rng = np.random.default_rng(3)
    X = rng.standard_normal((7, 5))
    C = X.T @ X
    want = float(np.linalg.eigvalsh(C)[-1])
    assert np.isclose(program7.top_eigenvalue(C), want, rtol=1e-12)

    def failing(*args, **kwargs):
        raise np.linalg.LinAlgError("Internal Error.")

    monkeypatch.setattr(scipy.linalg, "eigh", failing)
    assert np.isclose(program7.top_eigenvalue(C), want, rtol=1e-12)
    assert program7.top_eigenvalue(np.zeros((3, 3))) == 0.0
