"""Program (7) on pair-factored contrasts (lowrank_fl.clair.factored, issue 21): the structured
products equal the dense ones, the factored certificate equals program7.certify on the formed
arrays, and the optimum equals the dense FISTA's and CVXPY's; on adapters the collaborative set
(8) and P_Â equal the dense path's."""
import warnings

import numpy as np
import pytest

from lowrank_fl import clair
from lowrank_fl.adapters import ModuleOptions, aggregate_module
from lowrank_fl.adapters.io import ModuleFactors
from lowrank_fl.adapters.reduce import pair_blocks, pair_factors, reduce_module
from lowrank_fl.adapters.tuning import solve_module
from lowrank_fl.clair.factored import PairContrasts, solve_penalized_factored
from lowrank_fl.clair.program7 import block_sq_norms, certify
from lowrank_fl.results import ConvergenceWarning


def _pc(K=5, h=4, r=2, p=9, seed=0):
    rng = np.random.default_rng(seed)
    G = K * (K - 1) // 2
    return PairContrasts(T=rng.standard_normal((G, h, 2 * r)), X=rng.standard_normal((K, r, p)))


def _module(K, n=64, r=3, contaminated=1, seed=0):
    rng = np.random.default_rng(seed)
    A0 = np.linalg.qr(rng.standard_normal((n, r)))[0].T
    A = [A0 + 0.05 * np.sqrt(r / n) * rng.standard_normal((r, n)) for _ in range(K - contaminated)]
    A += [np.linalg.qr(rng.standard_normal((n, r)))[0].T for _ in range(contaminated)]
    B = [rng.standard_normal((n, r)) for _ in range(K)]
    return ModuleFactors(name="m", A=A, B=B, scaling=np.full(K, 2.0))


def _projector(sol, rank):
    V = np.asarray(sol.Vt)[:rank].T
    return V @ V.T


def test_structured_products_equal_dense():
    D = _pc()
    Dd = D.dense()
    G, h, p = D.n_pairs, D.q, D.p
    rng = np.random.default_rng(1)
    W = rng.standard_normal((p, 3))
    U = rng.standard_normal((G, h, 3))
    a = rng.random(G)
    np.testing.assert_allclose(D.apply(W).reshape(-1, 3), Dd @ W, atol=1e-12)
    np.testing.assert_allclose(D.apply_t(U), Dd.T @ U.reshape(-1, 3), atol=1e-12)
    np.testing.assert_allclose(D.weighted_gram(a), Dd.T @ (Dd * np.repeat(a, h)[:, None]),
                               atol=1e-11)
    np.testing.assert_allclose(D.block_sq_norms, block_sq_norms(Dd, h), rtol=1e-12)
    assert D.op_norm == pytest.approx(np.linalg.norm(Dd, 2), rel=1e-12)
    # block g = (j, k) in eq. (6) order: D_g = T_g [X_j; X_k]
    g = 5                                                      # pair (1, 3) for K = 5
    assert tuple(D.pairs[g]) == (1, 3)
    np.testing.assert_allclose(Dd[g * h:(g + 1) * h], D.T[g] @ np.vstack([D.X[1], D.X[3]]))


def test_pair_contrasts_rejects_bad_shapes():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="T must have shape"):
        PairContrasts(T=rng.standard_normal((9, 4, 4)), X=rng.standard_normal((5, 2, 7)))
    with pytest.raises(ValueError, match="T must have shape"):
        PairContrasts(T=rng.standard_normal((10, 4, 3)), X=rng.standard_normal((5, 2, 7)))
    with pytest.raises(TypeError, match="PairContrasts"):
        solve_penalized_factored(np.zeros((10, 3)), 1.0, 1.0)


@pytest.mark.parametrize("ranks,out,inn", [([3] * 6, 40, 30), ([3, 3, 2, 3, 4, 3], 40, 30),
                                           ([2] * 7, 12, 50)])
def test_pair_factors_have_the_pair_blocks_grams(ranks, out, inn):
    # T_g^T T_g = [Y_j, -Y_k]^T [Y_j, -Y_k]: D_g^T D_g agree block by block, so (7) is the same
    rng = np.random.default_rng(3)
    A = [rng.standard_normal((r, inn)) for r in ranks]
    B = [rng.standard_normal((out, r)) for r in ranks]
    red = reduce_module(ModuleFactors(name="m", A=A, B=B, scaling=np.ones(len(ranks))))
    D, h = pair_blocks(red)
    F = pair_factors(red)
    Fd = F.dense()
    G, p = F.n_pairs, F.p
    Db, Fb = D.reshape(G, h, p), Fd.reshape(G, F.q, p)
    scale = float(np.abs(D).max()) ** 2
    np.testing.assert_allclose(np.einsum("gia,gib->gab", Fb, Fb),
                               np.einsum("gia,gib->gab", Db, Db), atol=1e-12 * scale)


@pytest.mark.parametrize("lam", [(0.5, 0.6), (0.05, 0.3), (2.0, 0.2), (0.3, 5.0)])
def test_factored_optimum_and_certificate_equal_dense(lam):
    D = _pc(K=6, h=4, r=2, p=12, seed=2)
    Dd = D.dense()
    G, h = D.n_pairs, D.q
    w = np.full(G, 1.0 / 6)
    lam_L, lam_S = lam[0] * D.op_norm / np.sqrt(6), lam[1] * D.op_norm / 6 ** 1.5
    tol = 1e-10
    new = solve_penalized_factored(D, lam_L, lam_S, tol=tol)
    old = clair.solve_penalized(Dd, q=h, lam_L=lam_L, lam_S=lam_S, weights=w, tol=tol)
    assert new.status == old.status == "optimal"
    F0 = 0.5 * float(w @ block_sq_norms(Dd, h))
    # both objectives lie within their certified gaps (<= tol F0) above the optimum
    assert abs(new.objective - old.objective) <= tol * F0
    # the factored certificate is program7.certify on the formed (L, S)
    L, S = new.dense_L(), new.dense_S(D)
    cert = certify(Dd, h, L, S, lam_L, lam_S, w)
    assert cert.objective == pytest.approx(new.objective, rel=1e-12)
    assert cert.dual == pytest.approx(new.dual, rel=1e-12, abs=1e-13 * F0)
    assert cert.relative_gap <= tol + 1e-13
    sv = np.linalg.svd(L, compute_uv=False)
    np.testing.assert_allclose(sv, new.singular_values[:sv.size], atol=1e-12 * D.op_norm)
    k = old.rank()
    assert new.rank() == k
    if 0 < k < D.p:
        assert np.linalg.norm(_projector(new, k) - _projector(old, k), 2) <= 1e-6


def test_factored_equals_cvxpy_small():
    D = _pc(K=4, h=2, r=1, p=4, seed=4)
    Dd = D.dense()
    w = np.full(D.n_pairs, 0.25)
    lam_L, lam_S = 0.3 * D.op_norm, 0.2 * D.op_norm
    new = solve_penalized_factored(D, lam_L, lam_S, tol=1e-10)
    ref = clair.solve_penalized(Dd, q=D.q, lam_L=lam_L, lam_S=lam_S, weights=w, method="cvxpy",
                                tol=1e-7)
    F0 = 0.5 * float(w @ block_sq_norms(Dd, D.q))
    assert ref.status == "optimal"
    # CVXPY's answer is certified to 1e-7 F0 by the library, ours to 1e-10 F0
    assert abs(new.objective - ref.objective) <= (1e-7 + 1e-10) * F0
    assert new.objective <= ref.objective + 1e-10 * F0


def test_gram_fallback_and_full_rank_boundary():
    # τ <= 1e-6 σ_1: the Gram cannot resolve the kept values and the step forms B (LAPACK);
    # a small τ keeps every singular value (k = p): both boundaries match the dense solver
    D = _pc(K=5, h=4, r=2, p=8, seed=5)
    Dd = D.dense()
    w = np.full(D.n_pairs, 0.2)
    for lam_L in (1e-8 * D.op_norm, 1e-3 * D.op_norm):
        lam_S = 0.5 * D.op_norm
        new = solve_penalized_factored(D, lam_L, lam_S, tol=1e-10)
        old = clair.solve_penalized(Dd, q=D.q, lam_L=lam_L, lam_S=lam_S, weights=w, tol=1e-10)
        F0 = 0.5 * float(w @ block_sq_norms(Dd, D.q))
        assert new.status == "optimal" and new.rank() == D.p
        assert abs(new.objective - old.objective) <= 1e-10 * F0
        cert = certify(Dd, D.q, new.dense_L(), new.dense_S(D), lam_L, lam_S, w)
        assert cert.relative_gap <= 1e-10 + 1e-13


def test_warm_start_max_iter_and_bad_init():
    D = _pc(K=6, h=4, r=2, p=12, seed=6)
    lam_L, lam_S = 0.3 * D.op_norm / np.sqrt(6), 2.0 * D.op_norm / 6 ** 1.5
    cold = solve_penalized_factored(D, lam_L, lam_S, tol=1e-9)
    near = solve_penalized_factored(D, 1.1 * lam_L, lam_S, tol=1e-9)
    warm = solve_penalized_factored(D, lam_L, lam_S, tol=1e-9, init=near)
    F0 = cold.gap_scale
    assert warm.iterations <= cold.iterations
    assert abs(warm.objective - cold.objective) <= 1e-9 * F0
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        capped = solve_penalized_factored(D, lam_L, 0.1 * lam_S, tol=1e-14, max_iter=1)
    assert capped.status == "max_iter" and capped.gap > 0
    with pytest.raises(ValueError, match="another problem"):
        solve_penalized_factored(_pc(K=5, h=4, r=2, p=12), lam_L, lam_S, init=cold)
    with pytest.raises(ValueError, match="equal pair weights"):
        solve_module(D, D.q, lam_L, lam_S, weights=np.arange(1.0, D.n_pairs + 1), tol=1e-6,
                     max_iter=10)


def test_module_options_contrasts_is_checked():
    with pytest.raises(ValueError, match="contrasts must be one of"):
        ModuleOptions(contrasts="sparse")


@pytest.mark.parametrize("K,contaminated", [(6, 1), (12, 2)])
def test_adapters_factored_equals_dense_path(K, contaminated):
    f = _module(K, contaminated=contaminated, seed=K)
    tol = 1e-10
    res = {c: aggregate_module(f, ModuleOptions(contrasts=c, tol=tol, output_dtype="float64"))
           for c in ("dense", "factored")}
    d, n = res["dense"], res["factored"]
    # λ: the same rule on the same ranks (path solves to 1e-3 decide ranks only)
    assert n.lam_L == pytest.approx(d.lam_L, rel=1e-12)
    assert n.lam_S == pytest.approx(d.lam_S, rel=1e-12)
    assert n.benign == d.benign and n.benign.count(False) == contaminated
    assert n.numerical_rank == d.numerical_rank == n.rank
    # both objectives are certified within tol F(0, 0) above the optimum
    F0 = 0.5 / K * float(pair_factors(reduce_module(f)).block_sq_norms.sum())
    assert abs(n.state["objective"] - d.state["objective"]) <= tol * F0
    Zn, Zd = n.state["Z"], d.state["Z"]
    assert np.linalg.norm(Zn @ Zn.T - Zd @ Zd.T, 2) <= 1e-6
    np.testing.assert_allclose(n.block_norms, d.block_norms, rtol=1e-6, atol=1e-9)
    for k in range(K):
        Bn, An, _ = n.outputs(k)
        Bd, Ad, _ = d.outputs(k)
        ref = Bd @ Ad
        assert np.linalg.norm(Bn @ An - ref) <= 1e-6 * np.linalg.norm(ref)


def test_adapters_factored_warns_nothing_and_certifies():
    f = _module(8, contaminated=1, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = aggregate_module(f, ModuleOptions(tol=1e-8))
    assert res.status == "optimal" and res.relative_gap <= 1e-8


def _affine_point(D, seed):
    """A point B = diag(a) D + U V^T like the solver's SVT inputs."""
    from lowrank_fl.clair.affine_blocks import AffineBlocks as _Affine
    rng = np.random.default_rng(seed)
    return _Affine(rng.random(D.n_pairs), 0.1 * rng.standard_normal((D.n_pairs, D.q, 3)),
                   rng.standard_normal((D.p, 3)))


@pytest.mark.parametrize("index", [0, 5])
def test_partial_svt_equals_gram_route(index):
    from lowrank_fl.clair.affine_blocks import dense as _dense
    from lowrank_fl.clair.factored import _svt, _svt_partial
    D = _pc(K=8, h=4, r=6, p=64, seed=7)
    B = _affine_point(D, 8)
    s = np.linalg.svd(_dense(D, B), compute_uv=False)
    tau = 0.5 * (s[index] + s[index + 1])                      # index + 1 values above τ
    full = _svt(D, B, tau)
    part = _svt_partial(D, B, tau, 0, np.ones(D.p))
    assert part is not None
    k = int(np.count_nonzero(s > tau))
    assert full[2].size == part[2].size == k == index + 1
    np.testing.assert_allclose(part[2], s[:k] - tau, rtol=1e-10)
    np.testing.assert_allclose(full[2], s[:k] - tau, rtol=1e-10)
    Lp = np.matmul(part[0], part[1].T).reshape(D.shape)
    Lf = np.matmul(full[0], full[1].T).reshape(D.shape)
    np.testing.assert_allclose(Lp, Lf, atol=1e-9 * s[0])


def test_partial_svt_falls_back_below_many_values():
    # τ below more than p/4 singular values: Lanczos would need most of the spectrum, the
    # partial route declines (None) and the solver takes the Gram route; the optimum is the same
    from lowrank_fl.clair.affine_blocks import dense as _dense
    from lowrank_fl.clair.factored import _svt_partial
    D = _pc(K=8, h=4, r=6, p=64, seed=7)
    B = _affine_point(D, 8)
    s = np.linalg.svd(_dense(D, B), compute_uv=False)
    assert _svt_partial(D, B, 0.5 * (s[40] + s[41]), 0, np.ones(D.p)) is None
    assert _svt_partial(D, B, 0.5 * (s[3] + s[4]), 0, np.ones(D.p)) is not None
    lam_S = 0.4 * D.op_norm / 8
    F0 = 0.5 / 8 * float(D.block_sq_norms.sum())
    for lam_L in (0.02 * D.op_norm / 8, 0.3 * D.op_norm / 8):
        runs = {m: solve_penalized_factored(D, lam_L, lam_S, tol=1e-10, svt=m)
                for m in ("full", "partial")}
        assert runs["full"].status == runs["partial"].status == "optimal"
        assert abs(runs["full"].objective - runs["partial"].objective) <= 1e-10 * F0
        assert runs["full"].rank() == runs["partial"].rank()
    with pytest.raises(ValueError, match="svt must be one of"):
        solve_penalized_factored(D, lam_L, lam_S, svt="lanczos")


def test_factored_matches_cvxpy_on_a_small_module():
    # K = 5 adapters of rank 1, one contaminated: program (7) on the pair factors by the
    # factored solver and by CVXPY (Clarabel, certified by the library to 1e-7 F0): objective
    # within the two certified gaps, the same rank-1 P′ (to the CVXPY solution's accuracy) and the
    # same collaborative set (8)
    f = _module(5, n=16, r=1, contaminated=1, seed=3)
    D = pair_factors(reduce_module(f))
    Dd = D.dense()
    K, G = 5, D.n_pairs
    w = np.full(G, 1.0 / K)
    lam_L, lam_S = 0.4 * D.op_norm / np.sqrt(K), 0.4 * D.op_norm / K
    new = solve_penalized_factored(D, lam_L, lam_S, tol=1e-10)
    ref = clair.solve_penalized(Dd, q=D.q, lam_L=lam_L, lam_S=lam_S, weights=w, method="cvxpy",
                                tol=1e-7)
    F0 = 0.5 * float(w @ block_sq_norms(Dd, D.q))
    assert ref.status == "optimal"
    assert abs(new.objective - ref.objective) <= (1e-7 + 1e-10) * F0
    assert new.rank() == ref.rank() == 1
    assert np.linalg.norm(_projector(new, 1) - _projector(ref, 1), 2) <= 1e-3

    def benign(sol):
        P = _projector(sol, 1)
        R = (Dd - Dd @ P).reshape(G, D.q, -1)
        norms = np.sqrt(np.einsum("gij,gij->g", R, R))
        tau = clair.largest_gap_split(norms, min_below=clair.majority_pairs(K, 0.5)).threshold
        return clair.collaborative_set(norms, K, tau, alpha=0.5)[0]

    np.testing.assert_array_equal(benign(new), benign(ref))
    assert benign(new).tolist() == [True] * 4 + [False]


@pytest.mark.parametrize("warm", [False, True])
def test_block_svt_equals_gram_route(warm):
    # three values stand far above the rest (a strong rank-3 term): subspace iteration, cold or
    # warm-started from perturbed singular vectors of the last step, gives the Gram route's SVT
    from lowrank_fl.clair.affine_blocks import AffineBlocks as _Affine, dense as _dense
    from lowrank_fl.clair.factored import _svt, _svt_block
    D = _pc(K=8, h=4, r=6, p=64, seed=7)
    P = _affine_point(D, 8)
    B = _Affine(P.a, 30.0 * P.U, P.V)
    Vt = np.linalg.svd(_dense(D, B), full_matrices=False)[2]
    s = np.linalg.svd(_dense(D, B), compute_uv=False)
    tau = 1.5 * s[3]
    assert s[2] > tau and s[3] ** 2 <= 0.5 * tau ** 2            # the setting the route needs
    V_prev = Vt[:3].T + 1e-3 * np.random.default_rng(1).standard_normal((D.p, 3)) if warm else None
    full, block = _svt(D, B, tau), _svt_block(D, B, tau, V_prev)
    assert block is not None
    assert block[2].size == full[2].size == 3
    np.testing.assert_allclose(block[2], s[:3] - tau, rtol=1e-10)
    Lb = np.matmul(block[0], block[1].T).reshape(D.shape)
    Lf = np.matmul(full[0], full[1].T).reshape(D.shape)
    np.testing.assert_allclose(Lb, Lf, atol=1e-9 * s[0])
    # τ between two close values: the block cannot tell the rest below τ^2 apart, it declines
    # (the solver then takes the Lanczos route)
    close = 0.5 * (s[5] + s[6])
    assert s[6] ** 2 > 0.5 * close ** 2
    assert _svt_block(D, B, close, None) is None


def test_block_svt_solves_to_the_same_optimum():
    D = _pc(K=8, h=4, r=6, p=64, seed=7)
    lam_S = 0.4 * D.op_norm / 8
    F0 = 0.5 / 8 * float(D.block_sq_norms.sum())
    for lam_L in (0.02 * D.op_norm / 8, 0.3 * D.op_norm / 8):
        runs = {m: solve_penalized_factored(D, lam_L, lam_S, tol=1e-10, svt=m)
                for m in ("full", "block")}
        assert runs["full"].status == runs["block"].status == "optimal"
        assert abs(runs["full"].objective - runs["block"].objective) <= 1e-10 * F0
        assert runs["full"].rank() == runs["block"].rank()
