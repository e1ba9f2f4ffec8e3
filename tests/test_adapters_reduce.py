"""The exact joint-subspace reduction: reduced CLAIR equals full-dimension clair.fit."""
import numpy as np
import pytest

from lowrank_fl import clair
from lowrank_fl.adapters import ModuleOptions, aggregate_module
from lowrank_fl.adapters.io import ModuleFactors
from lowrank_fl.adapters.reduce import pair_blocks, reduce_module
from lowrank_fl.adapters.tuning import auto_lambdas

RTOL = 1e-9


def _factors(ranks, out=40, inn=30, contaminated=1, deficient=False, seed=0):
    rng = np.random.default_rng(seed)
    K = len(ranks)
    rmax = max(ranks)
    A0 = np.linalg.qr(rng.standard_normal((inn, rmax)))[0].T
    A, B = [], []
    for k, r in enumerate(ranks):
        if k >= K - contaminated:
            a = rng.standard_normal((r, inn))
        else:
            a = A0[:r] + 0.05 * rng.standard_normal((r, inn))
        b = rng.standard_normal((out, r))
        if deficient and r >= 2:
            b[:, -1] = b[:, 0]                  # rank(B_k) < r_k
            a[-1] = 2.0 * a[0]                 # rank(A_k) < r_k
        A.append(a)
        B.append(b)
    scaling = np.array([16.0 / r for r in ranks])
    return ModuleFactors(name="m", A=A, B=B, scaling=scaling)


def _full(f):
    return np.stack([f.delta(k) for k in range(len(f.A))])


CASES = [
    dict(ranks=[3, 3, 3, 3, 3, 3]),
    dict(ranks=[3, 3, 2, 3, 4, 3]),                              # unequal ranks
    dict(ranks=[3, 4, 3, 3, 3], deficient=True),                 # rank-deficient factors
    dict(ranks=[2, 2, 2, 2, 2, 2, 2], out=12, inn=50),          # 2 r_max >= q′: no pair reduction
]


@pytest.mark.parametrize("case", CASES)
def test_reduced_clair_equals_full_fit(case):
    # dense contrasts: the same FISTA iterates as clair.fit (reduce.py), hence 1e-9 agreement;
    # the factored solver is compared with both in tests/test_clair_factored.py
    f = _factors(**case)
    # clip=None: the paper's (7) on the raw contrasts (the contaminated client here is more than
    # 5x the median norm, which the default clips in the solve)
    opts0 = ModuleOptions(method="clair", output_dtype="float64", tol=1e-10, contrasts="dense", clip=None)
    auto = aggregate_module(f, opts0)
    res = aggregate_module(f, ModuleOptions(method="clair", lam_L=auto.lam_L, lam_S=auto.lam_S,
                                            output_dtype="float64", tol=1e-10,
                                            contrasts="dense", clip=None))
    full = clair.fit(_full(f), rank=res.rank, lam_L=res.lam_L, lam_S=res.lam_S, tol=1e-10)
    obj = res.state["objective"]
    assert abs(obj - full.solution.objective) <= RTOL * full.solution.objective
    red = reduce_module(f)
    Z = res.state["Z"]
    P = red.V @ Z @ Z.T @ red.V.T
    assert np.abs(P - full.projector).max() <= RTOL
    np.testing.assert_array_equal(res.benign, full.benign)
    assert res.separated == full.separated
    if len(set(case["ranks"])) == 1:
        # equal ranks: the benign clients share one r-dimensional row space and the contaminated
        # one is out; with unequal ranks the benign norms spread and the no-separation rule of
        # clair.fit may keep everyone, which both paths must then agree on (checked above)
        assert not all(res.benign)
    for k in range(len(f.A)):
        Bk, Ak, err = res.outputs(k)
        assert err == 0.0
        ref = full.refined[k]
        assert np.linalg.norm(Bk @ Ak - ref) <= RTOL * np.linalg.norm(ref)


def test_reduction_is_exact_and_lifts():
    f = _factors([3, 4, 2, 3], deficient=True, seed=3)
    red = reduce_module(f)
    W = _full(f)
    assert red.discarded < 1e-12
    for k in range(4):
        np.testing.assert_allclose(red.lift(red.M[k]), W[k], atol=1e-12 * np.abs(W).max())
    np.testing.assert_allclose(red.U.T @ red.U, np.eye(red.U.shape[1]), atol=1e-13)
    np.testing.assert_allclose(red.V.T @ red.V, np.eye(red.V.shape[1]), atol=1e-13)
    assert red.dims[0] < sum(f.ranks) and red.dims[1] < sum(f.ranks)   # deficiency detected
    # pair blocks preserve every block norm and the stacked singular values
    D, h = pair_blocks(red)
    Dfull = clair.contrasts(W)
    G = 6
    nf = np.linalg.norm(Dfull.reshape(G, -1), axis=1)
    nr = np.linalg.norm(D.reshape(G, -1), axis=1)
    np.testing.assert_allclose(nr, nf, rtol=1e-12)
    sf = np.linalg.svd(Dfull, compute_uv=False)[:D.shape[1]]
    sr = np.linalg.svd(D, compute_uv=False)
    np.testing.assert_allclose(sr[:10], sf[:10], rtol=1e-10)


def test_truncated_reduction_reports_discarded_energy():
    f = _factors([4, 4, 4, 4, 4], seed=5)
    exact = reduce_module(f)
    trunc = reduce_module(f, energy=0.9)
    assert trunc.dims[0] < exact.dims[0] and trunc.dims[1] < exact.dims[1]
    W = _full(f)
    resid = sum(np.linalg.norm(W[k] - trunc.lift(trunc.M[k])) ** 2 for k in range(5))
    rel = resid / sum(np.linalg.norm(W[k]) ** 2 for k in range(5))
    assert 0 < trunc.discarded <= 0.2
    assert trunc.discarded == pytest.approx(rel, rel=1e-8)


def test_auto_lambdas_scale_equivariant_and_reduction_invariant():
    f = _factors([3, 3, 3, 3, 3, 3], seed=7)
    red = reduce_module(f)
    D, h = pair_blocks(red)
    K = 6
    lam = auto_lambdas(D, h, K, 3)
    lam_c = auto_lambdas(7.0 * D, h, K, 3)
    assert lam_c.lam_L == pytest.approx(7.0 * lam.lam_L, rel=1e-12)
    assert lam_c.lam_S == pytest.approx(7.0 * lam.lam_S, rel=1e-12)
    full = auto_lambdas(clair.contrasts(_full(f)), 40, K, 3)
    assert full.lam_L == pytest.approx(lam.lam_L, rel=1e-9)
    assert full.lam_S == pytest.approx(lam.lam_S, rel=1e-9)
    # every adapter times c: the same benign set
    fc = ModuleFactors(name="m", A=f.A, B=[3.0 * b for b in f.B], scaling=f.scaling)
    r1 = aggregate_module(f, ModuleOptions())
    r2 = aggregate_module(fc, ModuleOptions())
    assert r1.benign == r2.benign
    assert r1.lam_rule == "band"


@pytest.mark.parametrize("method", ["fedavg", "flexlora", "fedavg-factors", "ffa"])
def test_single_output_methods(method):
    f = _factors([3, 3, 3, 3], seed=2)
    if method == "ffa":
        f = ModuleFactors(name="m", A=[f.A[0]] * 4, B=f.B, scaling=f.scaling)
    res = aggregate_module(f, ModuleOptions(method=method, output_dtype="float64"))
    B, A, _ = res.outputs(0)
    W = _full(f)
    if method in ("fedavg", "ffa"):
        ref = W.mean(axis=0)
    elif method == "fedavg-factors":
        ref = np.mean([s * b for s, b in zip(f.scaling, f.B)], axis=0) @ np.mean(f.A, axis=0)
    else:
        U, s, Vt = np.linalg.svd(W.mean(axis=0))
        ref = (U[:, :3] * s[:3]) @ Vt[:3]
    np.testing.assert_allclose(B @ A, ref, atol=1e-10 * np.abs(ref).max())


def test_ffa_refuses_different_A():
    f = _factors([3, 3, 3], seed=2)
    with pytest.raises(ValueError, match="ffa"):
        aggregate_module(f, ModuleOptions(method="ffa"))


def test_rank_out_truncation_error():
    f = _factors([3, 3, 3, 3, 3], seed=4)
    res = aggregate_module(f, ModuleOptions(output_dtype="float64"))
    B, A, _ = res.outputs(0)
    Bt, At, err = res.outputs(0, rank_out=2)
    assert Bt.shape[1] == 2
    full = B @ A
    assert err == pytest.approx(np.linalg.norm(full - Bt @ At) / np.linalg.norm(full), rel=1e-8)


def test_client_rule_override_keeps_own_update_and_refines_with_given_set():
    f = _factors([3, 3, 3, 3, 3], seed=6)
    res = aggregate_module(f, ModuleOptions(output_dtype="float64"))
    assert res.benign[0]
    W = _full(f)
    b = np.array([False, True, True, True, False])          # client 0 excluded by a global rule
    B, A, _ = res.outputs(0, benign=b)
    np.testing.assert_allclose(B @ A, W[0], atol=1e-10 * np.abs(W[0]).max())
    red = reduce_module(f)
    Z = res.state["Z"]
    P = red.V @ Z @ Z.T @ red.V.T
    ref = clair.refine_closed_form(W, P, b)[1]
    B, A, _ = res.outputs(1, benign=b)
    np.testing.assert_allclose(B @ A, ref, atol=1e-10 * np.abs(ref).max())
