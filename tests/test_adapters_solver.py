"""The SVT step at the adapters' scale: the partial Gram route (only eigenpairs above the
threshold) equals LAPACK's SVT, and solves through it keep their certificates."""
import numpy as np
import pytest

from lowrank_fl import clair
from lowrank_fl.clair.penalized import _complete_right_basis, _svt
from lowrank_fl.linalg import svt


@pytest.mark.parametrize("p,scale", [(60, 1.0), (160, 0.2), (64, 0.0), (80, 50.0)])
def test_partial_svt_equals_lapack(p, scale):
    rng = np.random.default_rng(p)
    M = rng.standard_normal((5 * p, p)) @ np.diag(np.linspace(3.0, 0.1, p))
    tau = scale * np.linalg.norm(M, 2) / 3 if scale else 1e3 * np.linalg.norm(M, 2)
    ref, sref = svt(M, tau)
    out = np.empty_like(M)
    X, s, Vt = _svt(M, tau, "auto", out=out)
    assert X is out
    np.testing.assert_allclose(X, ref, atol=1e-10 * max(np.abs(ref).max(), 1.0))
    k = int(np.count_nonzero(sref))
    assert s.size == k and Vt.shape == (k, p)                  # only the kept values
    np.testing.assert_allclose(s, sref[:k], rtol=1e-10, atol=1e-12)
    s_full, V_full = _complete_right_basis(s, Vt)
    assert s_full.shape == (p,)
    np.testing.assert_allclose(V_full @ V_full.T, np.eye(p), atol=1e-10)


def test_solver_with_partial_svt_matches_lapack_route():
    rng = np.random.default_rng(0)
    K, q, p = 4, 3, 50                                         # p >= 48: partial route
    W = rng.standard_normal((K, q, p))
    D = clair.contrasts(W)
    fast = clair.solve_penalized(D, q=q, lam_L=0.5, lam_S=0.6, tol=1e-10)
    assert fast.status == "optimal" and fast.relative_gap <= 1e-10
    assert fast.singular_values.shape == (p,) and fast.Vt.shape == (p, p)
    ref = clair.solve_penalized(D, q=q, lam_L=0.5, lam_S=0.6, tol=1e-10, svd="lapack")
    assert abs(fast.objective - ref.objective) <= 1e-9 * ref.objective
    assert fast.iterations == ref.iterations
