"""Tests of the CLAIR pipeline: fit, detection (8), refinement (9)/(S4.3), λ-path, baselines."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lowrank_fl.clair.contrasts import pairs
from lowrank_fl.clair.pipeline import (ClairFit, collaborative_set, detection_counts, fedavg, fit,
                                       largest_gap_split, majority_pairs,
                                       lambda_path, largest_gap_threshold, local, numerical_rank,
                                       oracle_fedavg, refine, refine_closed_form,
                                       subspace_projector)
from lowrank_fl.clair.simulate import generate, simulate
from lowrank_fl.results import ConvergenceWarning, SolverError

# Noiseless instance, one contaminated client (K=8, q=4, p=6, r=2). On such instances (7) with
# lam_S sqrt(s)/lam_L ~ 1 recovers row(A) (measured band ~[0.7, 1.1]); (7) is the
# penalized relaxation of (24), so P_Â deviates from P_A by O(lam/w) — measured 5e-6..2e-5 at
# lam_L = 1e-4, w = 1/K. Tolerances below use 1e-3 for that bias.
LAM_L = 1e-4
SOLVE = dict(tol=1e-10, max_iter=50000)


@pytest.fixture(scope="module")
def noiseless():
    inst = generate(n_clients=8, p=6, q=4, rank=2, contaminated=1, seed=0)
    res = fit(inst.W_hat, LAM_L, LAM_L / np.sqrt(inst.s), rank=2, **SOLVE)
    return inst, res


def test_fit_noiseless_recovers_subspace_and_benign_set(noiseless):
    inst, res = noiseless
    assert isinstance(res, ClairFit)
    assert res.solution.status == "optimal"
    assert np.linalg.norm(res.projector - inst.projector, 2) < 1e-3
    assert np.array_equal(res.benign, inst.benign)
    assert res.rank == 2 and res.numerical_rank == 2
    # largest-gap tau sits between the ~0 benign blocks and the mixed-pair signal beta_min
    assert res.block_norms[~inst.I].max() < 1e-3 < res.tau < inst.beta_min
    assert res.tau_rule == "largest-gap"
    # votes: benign clients see |C|-1 = 6 of 7 small blocks, the contaminated one none
    assert np.allclose(res.votes[inst.benign], 6 / 7) and np.all(res.votes[~inst.benign] == 0)
    # refined benign estimates equal the truth (noiseless) up to the O(lam) bias; excluded
    # client keeps its local estimate exactly
    assert np.abs(res.refined[inst.benign] - inst.W[inst.benign]).max() < 1e-3
    assert np.array_equal(res.refined[~inst.benign], inst.W_hat[~inst.benign])
    assert np.allclose(res.refined, refine_closed_form(inst.W_hat, res.projector, res.benign),
                       atol=1e-12)


def test_fit_output_depends_on_program_only_through_projector(noiseless):
    inst, res = noiseless
    warm = dict(SOLVE, init=(res.solution.L, res.solution.S))   # already optimal: fast
    again = fit(inst.W_hat, LAM_L, LAM_L / np.sqrt(inst.s), rank=2, refinement="closed-form", **warm)
    assert np.allclose(again.refined, res.refined, atol=1e-12)
    # block norms are those of D̂ P_Â⊥ (8), not of Ŝ from (7)
    G, q, p = inst.G, inst.q, inst.p
    D = inst.D_hat
    expected = np.linalg.norm((D - D @ res.projector).reshape(G, q * p), axis=1)
    assert np.allclose(res.block_norms, expected, atol=1e-12)
    S_norms = np.linalg.norm(res.solution.S.reshape(G, q * p), axis=1)
    assert not np.allclose(S_norms, expected, atol=1e-6)


def test_fit_ignores_S_hat_when_the_projector_is_fixed(noiseless, monkeypatch):
    """Replace Ŝ (and L̂ itself) by other matrices with the same right singular subspace: the
    collaborative set, block norms and refinement do not move (the output depends on (7) only through P_Â)."""
    import dataclasses

    import lowrank_fl.clair.pipeline as pl

    inst, res = noiseless
    rng = np.random.default_rng(0)
    real = pl._solve

    def tampered(*args):
        sol, held = real(*args)
        S = rng.standard_normal(sol.S.shape)
        L = 3.0 * sol.L + 0 * S                           # same Vt, other singular values
        return dataclasses.replace(sol, S=S, L=L, singular_values=3.0 * sol.singular_values), held

    monkeypatch.setattr(pl, "_solve", tampered)
    warm = dict(SOLVE, init=(res.solution.L, res.solution.S))
    other = fit(inst.W_hat, LAM_L, LAM_L / np.sqrt(inst.s), rank=2, **warm)
    assert np.abs(other.solution.S - res.solution.S).max() > 0.1
    np.testing.assert_allclose(other.projector, res.projector, atol=1e-10)
    np.testing.assert_array_equal(other.benign, res.benign)
    np.testing.assert_allclose(other.block_norms, res.block_norms, atol=1e-10)
    np.testing.assert_allclose(other.refined, res.refined, atol=1e-10)


def test_fit_reports_unconverged_and_refuses_diverged_solves():
    inst = generate(n_clients=8, p=6, q=4, rank=2, contaminated=1, seed=0)
    lam_S = LAM_L / np.sqrt(inst.s)
    with pytest.warns(ConvergenceWarning, match="CLAIR fit: .*max_iter=3") as rec:
        res = fit(inst.W_hat, LAM_L, lam_S, rank=2, max_iter=3)
    assert res.status == res.solution.status == "max_iter"
    # the warning points at the caller's line, not inside the library
    assert {r.filename for r in rec if r.category is ConvergenceWarning} == {__file__}
    with pytest.raises(SolverError, match="diverged") as exc:
        fit(inst.W_hat, LAM_L, lam_S, rank=2, method="proxgrad", step_size=1e4)
    assert exc.value.status == "diverged"
    assert fit(inst.W_hat, LAM_L, lam_S, rank=2, tol=None, max_iter=5).status == "completed"
    with pytest.raises(TypeError, match="unexpected keyword argument 'q'"):
        fit(inst.W_hat, LAM_L, lam_S, rank=2, q=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'weight'"):
        lambda_path(inst.W_hat, LAM_L, [1.0], rank=2, weight=1.0)
    with pytest.raises(TypeError, match="3 positional arguments"):
        fit(inst.W_hat, 2, LAM_L, lam_S)                 # the old order: rank is keyword-only


def test_eq9_literal_sum():
    """(9) against a literal double loop over j, k in Ĉ with the antisymmetric corrections."""
    rng = np.random.default_rng(3)
    K, q, p = 5, 3, 4
    W = rng.standard_normal((K, q, p))
    P = rng.standard_normal((p, p))
    benign = np.array([True, False, True, True, True])
    out = refine(W, P, benign)
    C = np.flatnonzero(benign)
    for k in C:
        acc = np.zeros((q, p))
        for j in C:
            LA = 0.0 if j == k else (W[j] - W[k]) @ P     # L̂_A^{(j,k)} = ±(D̂ P)^{(min,max)}
            acc += W[j] - LA
        np.testing.assert_allclose(out[k], acc / C.size, atol=1e-12)
    np.testing.assert_array_equal(out[1], W[1])


def test_fit_fixed_tau_and_alpha(noiseless):
    inst, res = noiseless
    warm = dict(SOLVE, init=(res.solution.L, res.solution.S))   # already optimal: fast
    fixed = fit(inst.W_hat, LAM_L, LAM_L / np.sqrt(inst.s), rank=2, tau=0.5 * inst.beta_min,
                alpha=0.75, **warm)
    assert fixed.tau == 0.5 * inst.beta_min and fixed.tau_rule == "fixed"
    assert np.array_equal(fixed.benign, inst.benign)          # 6/7 >= 0.75
    strict = fit(inst.W_hat, LAM_L, LAM_L / np.sqrt(inst.s), rank=2, tau=0.0, **warm)
    assert not strict.benign.any()                            # no block is exactly 0


# ----------------------------------------------------------------------------------------------
def _refine_loops(W, P, benign):
    """Independent reference: (9) with explicit loops and the antisymmetric corrections."""
    K = W.shape[0]
    C = [k for k in range(K) if benign[k]]
    out = W.copy()
    for k in C:
        acc = np.zeros_like(W[0])
        for j in C:
            if j < k:
                LA = (W[j] - W[k]) @ P            # (D̂ P_Â)^{(j,k)}
            elif j > k:
                LA = -((W[k] - W[j]) @ P)         # -(D̂ P_Â)^{(k,j)}
            else:
                LA = np.zeros_like(W[0])
            acc += W[j] - LA
        out[k] = acc / len(C)
    return out


@st.composite
def _refine_case(draw):
    K = draw(st.integers(2, 6))
    q = draw(st.integers(1, 4))
    p = draw(st.integers(1, 5))
    k = draw(st.integers(0, p))
    elems = st.floats(-10, 10, allow_nan=False)
    W = draw(arrays(np.float64, (K, q, p), elements=elems))
    if k == 0:
        P = np.zeros((p, p))
    else:
        M = draw(arrays(np.float64, (p, k), elements=st.floats(-1, 1, allow_nan=False)))
        M = M + np.eye(p, k)                      # keep full column rank
        Q, _ = np.linalg.qr(M)
        P = Q @ Q.T
    benign = np.array(draw(st.lists(st.booleans(), min_size=K, max_size=K)))
    return W, P, benign


@settings(max_examples=60, deadline=None)
@given(_refine_case())
def test_eq9_equals_closed_form_S43(case):
    W, P, benign = case
    a = refine(W, P, benign)
    b = refine_closed_form(W, P, benign)
    c = _refine_loops(W, P, benign)
    scale = 1.0 + np.abs(W).max()
    # sums of <= 6 terms of size <= 10 * ||P||: rounding is far below 1e-11 * scale
    assert np.allclose(a, b, atol=1e-11 * scale, rtol=0)
    assert np.allclose(a, c, atol=1e-11 * scale, rtol=0)
    assert np.array_equal(a[~benign], W[~benign])


def test_refine_with_true_projector_keeps_own_row_space_component():
    inst = generate(n_clients=5, p=6, q=4, rank=2, contaminated=1, noise=0.3, seed=9)
    P = inst.projector
    out = refine(inst.W_hat, P, inst.benign)
    b = inst.benign
    assert np.allclose(out[b] @ P, inst.W_hat[b] @ P, atol=1e-12)           # own P_A part kept
    Pp = np.eye(6) - P
    assert np.allclose(out[b] @ Pp, inst.W_hat[b].mean(0) @ Pp, atol=1e-12)  # ⊥ part = mean


# ----------------------------------------------------------------------------------------------
def test_largest_gap_threshold():
    assert largest_gap_threshold([0.1, 1.1, 0.2, 1.0]) == pytest.approx(0.6)
    assert largest_gap_threshold([1e-9, 1e-8, 1.0, 2.0], log=True) == pytest.approx(1e-4)
    # exact zeros are floored at 1e-12 * max on the log scale
    assert largest_gap_threshold([0.0, 0.0, 1.0, 1.5], log=True) == pytest.approx(np.sqrt(1.5e-12))
    assert largest_gap_threshold([2.0, 2.0, 2.0]) == 2.0          # no gap: keep every pair
    assert largest_gap_threshold([3.0]) == 3.0
    # ties: the first (smallest-valued) largest gap
    assert largest_gap_threshold([0.0, 1.0, 2.0]) == pytest.approx(0.5)


@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, st.integers(2, 30), elements=st.floats(0, 100, allow_nan=False)))
def test_largest_gap_splits_at_the_largest_gap(x):
    tau = largest_gap_threshold(x)
    xs = np.sort(x)
    if xs[-1] == xs[0]:
        assert tau == xs[-1]
        return
    below, above = xs[xs <= tau], xs[xs > tau]
    assert below.size and above.size
    assert above.min() - below.max() == pytest.approx(np.diff(xs).max())


@pytest.mark.parametrize("x, match", [([], "at least one value"), ([1.0, -0.5], "non-negative"),
                                      ([1.0, np.nan], "must be finite")])
def test_largest_gap_errors(x, match):
    with pytest.raises(ValueError, match=match):
        largest_gap_threshold(x)


def test_collaborative_set_majority_vote():
    K = 5
    P = pairs(K)
    # client 4 is far from everyone; clients 0..3 are close to each other
    norms = np.where((P == 4).any(axis=1), 5.0, 0.1)
    benign, votes = collaborative_set(norms, K, tau=1.0, alpha=0.5)
    assert np.array_equal(benign, [True, True, True, True, False])
    assert np.allclose(votes, [0.75, 0.75, 0.75, 0.75, 0.0])
    benign, _ = collaborative_set(norms, K, tau=1.0, alpha=0.8)     # 3/4 < 0.8
    assert not benign.any()
    benign, _ = collaborative_set(norms, K, tau=10.0, alpha=0.99)   # every block close
    assert benign.all()


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(alpha=1.0), ValueError, r"alpha must lie in \[0.5, 1.0\)"),
    (dict(alpha=0.49), ValueError, r"alpha must lie in \[0.5, 1.0\)"),
    (dict(tau=-1.0), ValueError, "tau must be finite and >= 0"),
    (dict(block_norms=np.ones(5)), ValueError, r"block_norms must have shape \(6\)"),
])
def test_collaborative_set_errors(kwargs, exc, match):
    args = dict(block_norms=np.ones(6), K=4, tau=0.5, alpha=0.5) | kwargs
    with pytest.raises(exc, match=match):
        collaborative_set(**args)


# ----------------------------------------------------------------------------------------------
def test_numerical_rank_is_relative_to_reference():
    s = np.array([1e-9, 1e-10])
    assert numerical_rank(s, reference=1.0) == 0        # relative to ||D̂||: L̂ ≈ 0 has rank 0
    assert numerical_rank(s, reference=s[0]) == 2       # what a σ1(L̂)-relative rule reports
    assert numerical_rank(np.array([3.0, 1.0, 0.0]), reference=3.0) == 2
    with pytest.raises(ValueError, match="threshold must be finite and > 0"):
        numerical_rank(s, 1.0, threshold=0.0)


def test_subspace_projector():
    rng = np.random.default_rng(0)
    L = rng.standard_normal((12, 2)) @ rng.standard_normal((2, 5))
    P, s = subspace_projector(L, 2)
    assert np.allclose(P @ L.T, L.T, atol=1e-10) and np.trace(P) == pytest.approx(2)
    assert s[2:].max() < 1e-10
    assert np.all(subspace_projector(L, 0)[0] == 0)


def test_rank_modes_when_lhat_vanishes_or_inflates():
    inst = generate(n_clients=8, p=6, q=4, rank=2, contaminated=1, seed=0)
    rs = np.sqrt(inst.s)
    # ratio far below the band: L̂ = 0 (everything goes to Ŝ)
    with pytest.warns(RuntimeWarning, match="numerical rank 0 < rank=2"):
        top = fit(inst.W_hat, LAM_L, 0.1 * LAM_L / rs, rank=2, **SOLVE)
    assert top.numerical_rank == 0 and top.rank == 2
    with pytest.warns(RuntimeWarning, match="P_A_hat = 0"):
        num = fit(inst.W_hat, LAM_L, 0.1 * LAM_L / rs, rank=2, rank_mode="numerical", **SOLVE)
    assert num.rank == 0 and np.all(num.projector == 0)
    # ratio far above the band: rank inflation; numerical mode uses the compact SVD
    with pytest.warns(RuntimeWarning, match="P_A_hat = I"):
        big = fit(inst.W_hat, LAM_L, 3.0 * LAM_L / rs, rank=2, rank_mode="numerical", **SOLVE)
    assert big.rank == big.numerical_rank > 2
    assert np.trace(big.projector) == pytest.approx(big.rank)


def test_lambda_path_band():
    inst = generate(n_clients=8, p=6, q=4, rank=2, contaminated=1, seed=0)
    rs = np.sqrt(inst.s)
    ratios = np.array([0.3, 0.6, 0.95, 1.05, 3.0]) / rs
    path = lambda_path(inst.W_hat, 1e-3, ratios, rank=2, truth_projector=inst.projector,
                       tol=1e-9, max_iter=50000)
    assert path.numerical_rank.shape == (1, 5)
    r = path.numerical_rank[0]
    assert r[0] == 0 and r[-1] > 2                       # L̂ = 0 below, inflation above
    assert np.all(r[2:4] == 2)
    low, high = path.band
    assert low <= 0.95 / rs and high >= 1.05 / rs and high < 3.0 / rs
    inside = path.numerical_rank[0] == 2
    # O(lam/w) = O(1e-2) bias of the penalized program at lam_L = 1e-3, w = 1/8
    assert np.all(path.projector_error[0, inside] < 5e-3)
    assert np.all(path.status == "optimal")
    assert np.allclose(path.lam_S, 1e-3 * ratios[None, :])
    warm = lambda_path(inst.W_hat, 1e-3, ratios, rank=2, truth_projector=inst.projector,
                       tol=1e-9, max_iter=50000, warm_start=True)
    assert np.array_equal(warm.numerical_rank, path.numerical_rank)
    # same optimum to a 1e-9 relative gap: the rank-2 subspaces agree far below the 5e-3 bias
    assert np.allclose(warm.projector_error[0, inside], path.projector_error[0, inside],
                       atol=1e-4)
    no_truth = lambda_path(inst.W_hat, [1e-3, 2e-3], ratios[:1], rank=2, tol=1e-8)
    assert no_truth.numerical_rank.shape == (2, 1) and np.isnan(no_truth.projector_error).all()
    assert no_truth.bands == (None, None) and no_truth.band is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(ratios=[1.0, 0.5]), "strictly increasing"),
    (dict(ratios=[]), "non-empty"),
    (dict(lam_L=0.0), "lam_L must be > 0"),
    (dict(rank=4), "rank must satisfy"),
    (dict(truth_projector=np.eye(3)), r"truth_projector must have shape \(6, 6\)"),
    (dict(warm_start=True, method="cvxpy"), "warm_start=True needs an iterative method"),
])
def test_lambda_path_errors(kwargs, match):
    W = generate(n_clients=4, p=6, q=4, rank=2, seed=0).W_hat
    args = dict(W_hat=W, rank=2, lam_L=1.0, ratios=[0.5, 1.0]) | kwargs
    with pytest.raises(ValueError, match=match):
        lambda_path(**args)


# ----------------------------------------------------------------------------------------------
def test_baselines():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((5, 3, 4))
    benign = np.array([True, False, True, True, False])
    loc = local(W)
    assert np.array_equal(loc, W) and loc is not W
    loc[0, 0, 0] += 1.0
    assert loc[0, 0, 0] != W[0, 0, 0]                     # a copy
    fa = fedavg(W)
    assert np.allclose(fa, W.mean(0)[None], atol=1e-15)
    fa[0, 0, 0] = 99.0
    assert fa[1, 0, 0] != 99.0                            # writable, independent rows
    of = oracle_fedavg(W, benign)
    assert np.allclose(of[benign], W[benign].mean(0), atol=1e-15)
    assert np.array_equal(of[~benign], W[~benign])
    assert np.array_equal(oracle_fedavg(W, np.zeros(5, bool)), W)


@pytest.mark.parametrize("benign, exc, match", [
    (np.ones(4, bool), ValueError, r"benign must have shape \(5,\)"),
    (np.ones(5), TypeError, "benign must be a boolean array"),
])
def test_baseline_errors(benign, exc, match):
    with pytest.raises(exc, match=match):
        oracle_fedavg(np.zeros((5, 2, 3)), benign)


def test_detection_counts():
    truth = np.array([True, True, True, False, False])
    est = np.array([True, False, True, True, False])
    d = detection_counts(est, truth)
    assert (d.tp, d.tn, d.fp, d.fn) == (2, 1, 1, 1)
    assert d.accuracy == pytest.approx(3 / 5)
    assert d.contaminated_recall == pytest.approx(1 / 2)
    assert d.benign_recall == pytest.approx(2 / 3)
    assert d.false_exclusion_rate == pytest.approx(1 / 3)
    assert not d.exact and detection_counts(truth, truth).exact
    assert d.as_dict()["tp"] == 2
    allb = detection_counts(np.ones(3, bool), np.ones(3, bool))
    assert np.isnan(allb.contaminated_recall) and allb.accuracy == 1.0
    with pytest.raises(ValueError, match=r"estimated must have shape \(5,\)"):
        detection_counts(est[:4], truth)
    with pytest.raises(ValueError, match="truth must be a 1-D boolean array"):
        detection_counts(est, truth[None])
    with pytest.raises(TypeError, match="estimated must be a boolean array"):
        detection_counts(est.astype(int), truth)


# ----------------------------------------------------------------------------------------------
# every input error of fit (all raised before any solve)
_W = np.random.default_rng(0).standard_normal((4, 3, 5))


def _bad_nan():
    W = _W.copy()
    W[1, 2, 3] = np.nan
    return W


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(W_hat=_bad_nan()), ValueError, "W_hat must be finite, got 1 non-finite"),
    (dict(W_hat=np.where(_W > 1, np.inf, _W)), ValueError, "W_hat must be finite"),
    (dict(W_hat=_W[0]), ValueError, "W_hat must have 3 dimensions"),
    (dict(W_hat=_W[:1]), ValueError, "W_hat must hold at least K = 2 clients"),
    (dict(W_hat="abc"), TypeError, "W_hat must be a numeric array"),
    (dict(rank=3), ValueError, r"rank must satisfy 1 <= rank < min\(p, q\) = 3, got 3"),
    (dict(rank=0), ValueError, "rank must be >= 1"),
    (dict(rank=1.5), TypeError, "rank must be an integer"),
    (dict(lam_L=0.0), ValueError, "lam_L must be finite and > 0"),
    (dict(lam_S=-1.0), ValueError, "lam_S must be finite and > 0"),
    (dict(weights=np.ones(5)), ValueError, r"weights must have shape \(6,\)"),
    (dict(weights=np.array([1, 1, 1, 0, 1, 1.0])), ValueError, "weights must be strictly positive"),
    (dict(alpha=1.0), ValueError, r"alpha must lie in \[0.5, 1.0\)"),
    (dict(alpha=0.4), ValueError, r"alpha must lie in \[0.5, 1.0\)"),
    (dict(tau=-0.1), ValueError, "tau must be finite and >= 0"),
    (dict(tau="biggest-gap"), ValueError, "tau must be one of"),
    (dict(rank_mode="compact"), ValueError, "rank_mode must be one of"),
    (dict(rank_threshold=0.0), ValueError, "rank_threshold must be finite and > 0"),
    (dict(refinement="s43"), ValueError, "refinement must be one of"),
])
def test_fit_errors(kwargs, exc, match):
    args = dict(W_hat=_W, rank=1, lam_L=1.0, lam_S=1.0) | kwargs
    with pytest.raises(exc, match=match):
        fit(**args)


def test_fit_alpha_half_is_allowed_and_solver_options_are_forwarded():
    res = fit(_W, 0.1, 0.1, rank=1, alpha=0.5, tol=None, max_iter=3, method="proxgrad")
    assert res.solution.status == "completed" and res.solution.iterations == 3
    with pytest.raises(ValueError, match="method must be one of"):
        fit(_W, 0.1, 0.1, rank=1, method="admm")


def test_refine_errors():
    with pytest.raises(ValueError, match=r"projector must have shape \(5, 5\)"):
        refine(_W, np.eye(4), np.ones(4, bool))
    with pytest.raises(ValueError, match=r"benign must have shape \(4,\)"):
        refine_closed_form(_W, np.eye(5), np.ones(3, bool))


def test_fit_with_cvxpy_matches_fista():
    # Exact conic solve (Clarabel, ~1e-8 accuracy) vs FISTA to a 1e-12 relative gap on a small
    # noisy instance: the top-1 subspaces agree to 1e-4 (measured 2.5e-6; the gap between
    # sigma_1 and sigma_2 of L̂ keeps the subspace well conditioned) and the sets are equal.
    inst = generate(n_clients=6, p=4, q=3, rank=1, contaminated=1, noise=0.05, seed=3)
    lam_S = 0.05 / np.sqrt(inst.s)
    exact = fit(inst.W_hat, 0.05, lam_S, rank=1, method="cvxpy")
    it = fit(inst.W_hat, 0.05, lam_S, rank=1, tol=1e-12, max_iter=100000)
    assert exact.solution.solver.startswith("cvxpy")
    assert np.linalg.norm(exact.projector - it.projector, 2) < 1e-4
    assert np.array_equal(exact.benign, it.benign) and np.array_equal(it.benign, inst.benign)


# ----------------------------------------------------------------------------------------------
# units: one normalisation at the entry


@pytest.mark.parametrize("scale", [1e-200, 1e-160, 1e160, 1e200])
def test_fit_is_scale_free(scale):
    """Regression: fit was exact for data scales 1e-154..1e152 only, then raised LinAlgError or
    (below 1e-170) reported optimal with a wrong answer. (7) is homogeneous: with W_hat and the
    lambdas scaled together, the subspace, the set and the refined estimates (scaled) agree."""
    inst = simulate(p=6, q=5, n_clients=8, samples_per_client=40, seed=4)
    lam_L, lam_S = 8 ** -0.5, 3.5 / 8 ** 1.5                  # the §7 scalings
    ref = fit(inst.W_hat, lam_L, lam_S, rank=2)
    assert ref.separated and ref.benign.sum() == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = fit(scale * inst.W_hat, scale * lam_L, scale * lam_S, rank=2)
    assert res.status == "optimal" and res.solution.relative_gap <= 1e-8
    np.testing.assert_allclose(res.projector, ref.projector, atol=1e-6)
    np.testing.assert_array_equal(res.benign, ref.benign)
    np.testing.assert_allclose(res.refined / scale, ref.refined, rtol=1e-6,
                               atol=1e-6 * np.abs(ref.refined).max())
    assert res.tau / scale == pytest.approx(ref.tau, rel=1e-6)
    np.testing.assert_allclose(res.block_norms / scale, ref.block_norms, rtol=1e-6)
    # the solution is that of the normalised program: the same one whatever the units
    assert ref.scale == 1.0 and res.scale != 1.0
    assert res.solution.objective == pytest.approx(ref.solution.objective * (scale / res.scale) ** 2,
                                                   rel=1e-6)


# ----------------------------------------------------------------------------------------------
# the tau rule when there is nothing to separate


def test_majority_pairs():
    # m_min = ceil(alpha (K - 1)) + 1 clients, C(m_min, 2) pairs
    assert majority_pairs(10, 0.5) == 15          # m_min = 6
    assert majority_pairs(5, 0.5) == 3            # m_min = 3
    assert majority_pairs(20, 0.5) == 55          # m_min = 11
    assert majority_pairs(10, 0.9) == 45          # m_min = 10 = K
    with pytest.raises(ValueError, match="alpha must lie"):
        majority_pairs(10, 0.3)


def test_largest_gap_split_says_no_separation():
    x = np.array([1.0, 1.3, 1.32, 1.35, 1.4, 1.41, 1.45, 1.5])   # largest gap at the bottom
    plain = largest_gap_split(x)
    assert plain.separated and plain.n_below == 1 and plain.threshold == pytest.approx(1.15)
    guarded = largest_gap_split(x, min_below=3)
    assert not guarded.separated and guarded.threshold == 1.5 and guarded.n_below == x.size
    assert largest_gap_threshold(x, min_below=3) == 1.5
    two = np.array([0.1, 0.11, 0.12, 0.13, 2.0, 2.1])
    assert largest_gap_split(two, min_below=3).separated
    with pytest.raises(ValueError, match="min_below must be >= 1"):
        largest_gap_split(x, min_below=0)


@pytest.mark.parametrize("K", [5, 10, 20])
def test_no_contamination_keeps_every_client(K):
    """Regression (issue: 8 of 20 seeds excluded every benign client, status optimal, no
    warning): with every client benign the largest-gap rule finds no admissible separation and
    keeps all of them, in every seed."""
    for seed in range(20):
        inst = simulate(p=10, q=10, n_clients=K, samples_per_client=100, contaminated=0,
                        seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            res = fit(inst.W_hat, K ** -0.5, 3.5 / K ** 1.5, rank=2)
        assert res.benign.all(), (K, seed, res.benign)


def test_one_contaminated_client_is_excluded():
    for seed in range(10):
        inst = simulate(p=10, q=10, n_clients=10, samples_per_client=100, contaminated=1,
                        seed=seed)
        res = fit(inst.W_hat, 10 ** -0.5, 3.5 / 10 ** 1.5, rank=2)
        assert res.separated
        np.testing.assert_array_equal(res.benign, inst.benign)


def test_fewer_than_two_kept_clients_warn():
    inst = generate(n_clients=6, p=6, q=4, rank=2, contaminated=1, noise=0.05, seed=1)
    with pytest.warns(RuntimeWarning, match="collaborative set has 0 client"):
        res = fit(inst.W_hat, LAM_L, LAM_L / np.sqrt(inst.s), rank=2, tau=0.0)
    assert not res.benign.any()
    np.testing.assert_array_equal(res.refined, inst.W_hat)
