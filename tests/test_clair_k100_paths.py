"""The shortcuts that make the factored solver cheap at K = 100 (issue 30) against the direct
computations they replace: projected client products, remembered pair products, the certificate's
Lanczos bound on the top eigenvalue, the block SVT's growing block, CholeskyQR2 in the reduction."""
import numpy as np
import pytest
import scipy.sparse.linalg

from lowrank_fl.adapters.reduce import _basis
from lowrank_fl.clair.pair_contrasts import PairContrasts
from lowrank_fl.clair.subspace import eigenpairs_above, top_eigenvalue_bound


def _pc(K=6, h=4, r=3, p=40, seed=0):
    rng = np.random.default_rng(seed)
    return PairContrasts(T=rng.standard_normal((K * (K - 1) // 2, h, 2 * r)),
                         X=rng.standard_normal((K, r, p)))


def test_projected_contrasts_equal_the_formed_ones():
    # D N with N = I - V diag(F) V^T: the low-rank update of X X^T against the products of the
    # formed coordinates, and the block norms against the dense D N
    D = _pc()
    rng = np.random.default_rng(1)
    V = np.linalg.qr(rng.standard_normal((D.p, 5)))[0]
    F = rng.uniform(0.1, 0.9, 5)
    DN = D.projected(V, F)
    Xs = DN.X.reshape(-1, D.p)
    np.testing.assert_allclose(DN.client_products, Xs @ Xs.T, rtol=0, atol=1e-12 * np.abs(Xs @ Xs.T).max())
    dense = (D.dense() @ (np.eye(D.p) - (V * F) @ V.T)).reshape(D.n_pairs, D.q, D.p)
    np.testing.assert_allclose(DN.block_sq_norms, np.einsum("ghp,ghp->g", dense, dense), rtol=1e-11)
    # F = 1: the projection removes V entirely (the boundary case)
    D1 = D.projected(V, np.ones(5))
    np.testing.assert_allclose(D1.X @ V, 0.0, atol=1e-12)
    assert D1.T is D.T and D1._TtT is D._TtT


def test_remembered_products_are_right_and_read_only():
    D = _pc()
    rng = np.random.default_rng(2)
    W = rng.standard_normal((D.p, 4))
    first = D.apply(W)
    np.testing.assert_allclose(first.reshape(-1, 4), D.dense() @ W, atol=1e-12)
    assert D.apply(W) is first                             # the same basis: remembered
    with pytest.raises(ValueError):
        first[0, 0, 0] = 1.0                               # never changed under a later caller
    W[3, 1] += 1.0                                         # changed in place: recomputed
    np.testing.assert_allclose(D.apply(W).reshape(-1, 4), D.dense() @ W, atol=1e-12)
    assert not np.allclose(D.apply(W), first)


@pytest.mark.parametrize("gap", [0.0, 1e-3, 0.5])
def test_top_eigenvalue_bound_bounds_the_top_eigenvalue(gap):
    # a clustered top (gap 0: the SVT residual's spectrum, several values at τ²) or a separated
    # one: the bound is above the true top and within 1e-8 of it
    rng = np.random.default_rng(3)
    p = 300
    Q = np.linalg.qr(rng.standard_normal((p, p)))[0]
    ev = np.concatenate([np.full(5, 1.0), np.full(1, 1.0 + gap), rng.uniform(0, 0.9, p - 6)])
    A = (Q * ev) @ Q.T
    A = 0.5 * (A + A.T)
    op = scipy.sparse.linalg.aslinearoperator(A)
    top = np.linalg.eigvalsh(A)[-1]
    bound = top_eigenvalue_bound(op, p, rng.standard_normal(p))
    assert top <= bound <= top * (1 + 1e-8)


def test_block_subspace_iteration_grows_when_every_value_is_above():
    # 40 eigenvalues far above the threshold, a block of 16 to start: it doubles to 64 and finds
    # all 40 (before, it declined and the solver fell back to Lanczos)
    rng = np.random.default_rng(4)
    p = 400
    Q = np.linalg.qr(rng.standard_normal((p, p)))[0]
    ev = np.concatenate([np.linspace(10, 20, 40), rng.uniform(0, 0.1, p - 40)])
    A = (Q * ev) @ Q.T
    A = 0.5 * (A + A.T)
    report = {}
    found = eigenpairs_above(lambda X: A @ X, p, 1.0, None, max_block=p // 4, report=report)
    assert found is not None and report["above"] == 40
    vals, vecs = found
    np.testing.assert_allclose(vals, np.sort(ev[:40])[::-1], rtol=1e-10)
    np.testing.assert_allclose(np.abs(vecs.T @ A @ vecs), np.diag(vals), atol=1e-8 * vals[0])
    # a cap below what is needed: declined, and the report says how many it saw above
    report = {}
    assert eigenpairs_above(lambda X: A @ X, p, 1.0, None, max_block=32, report=report) is None
    assert report["above"] >= 16


def test_cholesky_basis_agrees_with_the_eigenvalue_route_and_falls_back():
    from lowrank_fl.adapters import reduce as R
    rng = np.random.default_rng(5)
    F = rng.standard_normal((200, 30))
    U, C = _basis(F, 1e-12)                                 # well conditioned: CholeskyQR2
    assert R._cholesky_basis(F, F.T @ F) is not None
    np.testing.assert_allclose(U.T @ U, np.eye(30), atol=1e-14)
    np.testing.assert_allclose(U @ C, F, atol=1e-12 * np.abs(F).max())
    Ue = np.linalg.qr(F)[0]
    np.testing.assert_allclose(U @ U.T, Ue @ Ue.T, atol=1e-12)   # the same column space
    # a direction at relative energy 1e-16 (below the 1e-13 cut): Cholesky declines, the
    # eigenvalue route drops it
    G = F.copy()
    G[:, 5] = G[:, 4] + 1e-8 * rng.standard_normal(200)
    assert R._cholesky_basis(G, G.T @ G) is None
    U2, C2 = _basis(G, 1e-12)
    assert U2.shape[1] == 29
    np.testing.assert_allclose(U2 @ C2, G, atol=1e-7 * np.abs(G).max())
