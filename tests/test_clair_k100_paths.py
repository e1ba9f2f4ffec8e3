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


def _projected(D, seed, n):
    """``(V, F, D N, rng)``: a random orthonormal ``V`` (p, n), shares ``F`` in (0.1, 0.9) and the projected
    contrasts ``D N``, ``N = I - V diag(F) V^T``, and the generator for the test's further draws."""
    rng = np.random.default_rng(seed)
    V = np.linalg.qr(rng.standard_normal((D.p, n)))[0]
    F = rng.uniform(0.1, 0.9, n)
    return V, F, D.projected(V, F), rng


def test_projected_contrasts_equal_the_formed_ones():
    # D N with N = I - V diag(F) V^T: the low-rank update of X X^T against the products of the
    # formed coordinates, and the block norms against the dense D N
    D = _pc()
    V, F, DN, _ = _projected(D, 1, 5)
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


# --- issue 30 item 3: the shortcuts that took K = 100, 4096², r = 16 below 15 CPU-s ----------

def _lower_pc(K=8, r=8, h=None, seed=11):
    """Pair contrasts whose stacked X (K r × p, p = K r) is lower triangular, as the reduction's
    CholeskyQR2 coordinates are."""
    rng = np.random.default_rng(seed)
    p = K * r
    h = 2 * r if h is None else h
    X = np.tril(rng.standard_normal((p, p))) + 3.0 * np.eye(p)
    return PairContrasts(T=rng.standard_normal((K * (K - 1) // 2, h, 2 * r)),
                         X=X.reshape(K, r, p))


def test_triangular_products_equal_the_dense_ones():
    # trmm / trmv on the triangular X against the plain products, and every structured product
    # that goes through them against the formed D (weights folded into the selector included)
    D = _lower_pc()
    assert D._lower is not None
    Dd = D.dense()
    Xs = D.X.reshape(-1, D.p)
    rng = np.random.default_rng(12)
    for m in (1, 5):
        W = rng.standard_normal((D.p, m))
        np.testing.assert_allclose(D.x_product(W), Xs @ W, rtol=0, atol=1e-13 * np.abs(Xs @ W).max())
        np.testing.assert_allclose(D.xt_product(W), Xs.T @ W, rtol=0,
                                   atol=1e-13 * np.abs(Xs.T @ W).max())
    G, h = D.n_pairs, D.q
    W = rng.standard_normal((D.p, 4))
    U = rng.standard_normal((G, h, 4))
    a = rng.random(G)
    scale = np.abs(Dd).max() ** 2
    np.testing.assert_allclose(D.apply(W).reshape(-1, 4), Dd @ W, atol=1e-12 * np.abs(Dd @ W).max())
    np.testing.assert_allclose(D.apply_t(U, a), Dd.T @ (U.reshape(-1, 4) * np.repeat(a, h)[:, None]),
                               atol=1e-12 * scale)
    wg = D.weighted_gram(a)
    np.testing.assert_allclose(wg, Dd.T @ (Dd * np.repeat(a, h)[:, None]), atol=1e-11 * scale)
    np.testing.assert_array_equal(wg, wg.T)
    H = D.client_gram(a)
    np.testing.assert_array_equal(H, H.T)                   # the (k, j) block is (j, k)'s transpose
    np.testing.assert_allclose(D.block_sq_norms, np.einsum("ghp,ghp->g", *2 * [Dd.reshape(G, h, -1)]),
                               rtol=1e-12)
    # not triangular (one entry above the diagonal): the plain products
    X2 = D.X.reshape(-1, D.p).copy()
    X2[0, 5] = 1.0
    assert PairContrasts(T=D.T, X=X2.reshape(D.X.shape))._lower is None


def test_reduction_coordinates_are_triangular_and_exact():
    # CholeskyQR2's coordinates U^T F = L2^T L^T: upper triangular (so the clients' X is lower
    # triangular) and F = U (U^T F) to rounding, tighter than L2^{-1} L^T
    from lowrank_fl.adapters.reduce import pair_factors, reduce_module
    from lowrank_fl.adapters.io import ModuleFactors
    rng = np.random.default_rng(13)
    K, r, n = 8, 8, 300
    A0 = np.linalg.qr(rng.standard_normal((n, r)))[0].T
    A = [A0 + 0.05 * rng.standard_normal((r, n)) for _ in range(K)]
    B = [rng.standard_normal((n, r)) for _ in range(K)]
    F = np.vstack(A).T
    V, ca = _basis(F, 1e-12)
    assert np.count_nonzero(np.tril(ca, -1)) == 0
    np.testing.assert_allclose(V @ ca, F, rtol=0, atol=1e-14 * np.abs(F).max())
    np.testing.assert_allclose(ca, V.T @ F, rtol=0, atol=1e-14 * np.abs(F).max())
    red = reduce_module(ModuleFactors(name="m", A=A, B=B, scaling=np.full(K, 2.0)))
    D = pair_factors(red)
    assert D._lower is not None                             # the solver's products are trmm
    for k in range(K):
        np.testing.assert_allclose(red.V @ red.X[k].T, A[k].T, atol=1e-13 * np.abs(A[k]).max())


def test_projected_products_go_through_the_base():
    # D N's products as X W - (X V) diag(F) V^T W (the base's triangular ones) against the
    # formed X N
    D = _lower_pc()
    V, F, DN, rng = _projected(D, 14, 6)
    XN = D.X.reshape(-1, D.p) @ (np.eye(D.p) - (V * F) @ V.T)
    np.testing.assert_allclose(DN.X.reshape(-1, D.p), XN, atol=1e-13 * np.abs(XN).max())
    for m in (1, 4):
        W = rng.standard_normal((D.p, m))
        np.testing.assert_allclose(DN.x_product(W), XN @ W, atol=1e-12 * np.abs(XN @ W).max())
        np.testing.assert_allclose(DN.xt_product(W), XN.T @ W, atol=1e-12 * np.abs(XN.T @ W).max())
    U = rng.standard_normal((D.n_pairs, D.q, 3))
    Dn = DN.dense()
    np.testing.assert_allclose(DN.apply_t(U), Dn.T @ U.reshape(-1, 3), atol=1e-11 * np.abs(Dn).max() ** 2)


def test_lazy_combination_and_reused_pieces_equal_the_formed_ones():
    # the extrapolated point c1 Sn + c2 S kept as parts (U never written, U^T U from the parts'
    # Grams), and the certificate's residual operator from the SVT's pieces (N P), against the
    # formed matrices
    from lowrank_fl.clair.affine_blocks import (AffineBlocks as _Affine, apply_blocks as _apply,
                                                combine as _combine, dense as _dense)
    from lowrank_fl.clair.factored import _gram_operator, _operator_pieces
    D = _lower_pc()
    rng = np.random.default_rng(15)
    G, h, p = D.n_pairs, D.q, D.p

    def point(m):
        U = rng.standard_normal((G, h, m))
        Uf = U.reshape(-1, m)
        return _Affine(rng.random(G), U, np.linalg.qr(rng.standard_normal((p, m)))[0], None, None,
                       Uf.T @ Uf)

    Sn, S = point(4), point(3)
    YtX = S.U.reshape(-1, 3).T @ Sn.U.reshape(-1, 4)
    y = _combine(1.7, Sn, -0.7, S, YtX)
    assert y.U is None
    dense_y = 1.7 * _dense(D, Sn) - 0.7 * _dense(D, S)
    np.testing.assert_allclose(_dense(D, y), dense_y, atol=1e-12 * np.abs(dense_y).max())
    B = _Affine(1.0 - y.a, None, -y.V, None, y.uparts, y.UtU)          # D - y, as the solver's
    Bd = D.dense() - dense_y
    W = np.linalg.qr(rng.standard_normal((p, 5)))[0]
    sc = rng.random(5)
    np.testing.assert_allclose(_apply(D, B, W, sc).reshape(-1, 5), Bd @ W * sc,
                               atol=1e-12 * np.abs(Bd).max())
    x = rng.standard_normal((p, 2))
    ref = Bd.T @ (Bd @ x)
    np.testing.assert_allclose(_gram_operator(D, B).matmat(x), ref, atol=1e-11 * np.abs(ref).max())
    # the certificate's R = B N on D N: pieces from B's, against R's own
    V = np.linalg.qr(rng.standard_normal((p, 4)))[0]
    Fw = rng.uniform(0.2, 0.8, 4)
    Bc = _Affine(1.0 - S.a, S.U, -S.V, None, None, S.UtU)
    H, P, UtU = _operator_pieces(D, Bc)
    DN = D.projected(V, Fw)
    R = _Affine(Bc.a, Bc.U, Bc.V - (V * Fw) @ (V.T @ Bc.V))
    derived = (H, P - (V * Fw) @ (V.T @ P), UtU)
    Rd = (D.dense() - _dense(D, S)) @ (np.eye(p) - (V * Fw) @ V.T)
    ref = Rd.T @ (Rd @ x)
    for pieces in (derived, None):
        np.testing.assert_allclose(_gram_operator(DN, R, pieces).matmat(x), ref,
                                   atol=1e-11 * np.abs(ref).max())


def test_warm_start_at_the_same_lam_L_reuses_the_certified_L():
    # the first L_y of a warm start at init's λ_L is init's certified L: the same iterations and
    # optimum as a run that computes it (init's λ_L nudged by one ulp turns the reuse off)
    import dataclasses

    from lowrank_fl.clair.factored import solve_penalized_factored
    D = _lower_pc(K=10, r=8)
    lam_L = 0.1 * D.op_norm / 10
    first = solve_penalized_factored(D, lam_L, 0.2 * lam_L, tol=1e-3, svt="block")
    from lowrank_fl.clair import factored
    nudged = dataclasses.replace(first, lam_L=float(np.nextafter(lam_L, np.inf)))
    counts = []
    orig = factored._svt_step

    def counted(*args, **kw):
        counts[-1] += 1
        return orig(*args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(factored, "_svt_step", counted)
        counts.append(0)
        a = solve_penalized_factored(D, lam_L, 0.4 * lam_L, tol=1e-9, init=first, svt="block")
        counts.append(0)
        b = solve_penalized_factored(D, lam_L, 0.4 * lam_L, tol=1e-9, init=nudged, svt="block")
    assert a.status == b.status == "optimal"
    assert a.iterations == b.iterations
    assert counts[0] == counts[1] - 1                       # one SVT fewer: init's L reused
    F0 = 0.5 / 10 * float(D.block_sq_norms.sum())
    assert abs(a.objective - b.objective) <= 1e-9 * F0
    np.testing.assert_allclose(a.singular_values, b.singular_values, atol=1e-7 * D.op_norm)


def test_cold_start_svt_gives_the_operator_norm():
    # a cold start's first SVT is SVT(D; τ) by the Gram route, whose eigenproblem also gives
    # ||D||_op: against LAPACK on the formed D
    from lowrank_fl.clair.factored import solve_penalized_factored
    from lowrank_fl.clair import pair_contrasts
    D = _lower_pc(K=10, r=8)
    ref = np.linalg.norm(D.dense(), 2)
    E = PairContrasts(T=D.T, X=D.X)

    def unused(C):
        raise AssertionError("op_norm solved a second eigenproblem")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pair_contrasts, "top_eigenvalue", unused)
        sol = solve_penalized_factored(E, 0.02 * ref / 10, 0.05 * ref / 10, tol=1e-6,
                                       svt="block")
    assert E.op_norm == pytest.approx(ref, rel=1e-12)
    assert sol.data_norm == pytest.approx(ref, rel=1e-12)
