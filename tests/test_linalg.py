"""Properties of the linear-algebra building blocks (closed forms, invariances)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl import linalg as la

seeds = st.integers(0, 2**31 - 1)


@given(seeds, st.integers(2, 8), st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_subspace_distance_invariant_to_basis_and_equals_projector_gap(seed, extra, k):
    rng = np.random.default_rng(seed)
    d = k + extra
    U, V = rng.normal(size=(d, k)), rng.normal(size=(d, k))
    M = rng.normal(size=(k, k)) + 3 * np.eye(k)
    assert la.subspace_distance(U, U @ M) < 1e-10
    dist = la.subspace_distance(U, V)
    assert abs(dist - la.subspace_distance(V @ M, U)) < 1e-10
    assert abs(dist - la.projector_distance(la.projector(U), la.projector(V))) < 1e-10


def test_subspace_distance_small_angle_is_accurate():
    # rotate e1 by angle 1e-9: sin(angle) must come out to ~1e-9, not 0 (sqrt(1 - cos^2) gives 0).
    a = 1e-9
    U = np.array([[1.0], [0.0], [0.0]])
    V = np.array([[np.cos(a)], [np.sin(a)], [0.0]])
    assert la.subspace_distance(U, V) == pytest.approx(np.sin(a), rel=1e-6)


def test_row_projector_matches_formula_for_non_orthonormal_A():
    rng = np.random.default_rng(1)
    A = rng.uniform(-1, 1, size=(2, 7))
    P = la.row_projector(A)
    assert np.allclose(P, A.T @ np.linalg.solve(A @ A.T, A), atol=1e-12)


def test_svt_is_prox_of_nuclear_norm():
    rng = np.random.default_rng(2)
    M = rng.normal(size=(30, 5))
    X, s = la.svt(M, 1.5)
    sv = np.linalg.svd(M, compute_uv=False)
    assert np.allclose(s, np.maximum(sv - 1.5, 0))
    assert la.nuclear_norm(X) == pytest.approx(s.sum(), rel=1e-12)
    # optimality: M - X = tau * (U V^T + W) has spectral norm <= tau
    assert la.spectral_norm(M - X) <= 1.5 * (1 + 1e-12)


def test_block_soft_threshold_matches_per_block_formula():
    rng = np.random.default_rng(3)
    M = rng.normal(size=(6, 2, 3))
    tau = 1.7
    out = la.block_soft_threshold(M, tau)
    for g in range(6):
        nrm = np.linalg.norm(M[g])
        expect = max(0.0, 1 - tau / nrm) * M[g]
        assert np.allclose(out[g], expect, atol=1e-14)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="U must have full column rank"):
        la.subspace_distance(np.zeros((4, 2)), np.eye(4)[:, :2])
    with pytest.raises(ValueError, match="same space"):
        la.subspace_distance(np.eye(4)[:, :2], np.eye(5)[:, :2])
    with pytest.raises(ValueError, match="rank must be <= 3"):
        la.truncated_svd(np.ones((3, 5)), 4)
    with pytest.raises(ValueError, match="M must be finite"):
        la.thin_svd(np.array([[np.nan, 1.0]]))


def test_span_mode_scores_collapsed_iterates():
    rng = np.random.default_rng(4)
    truth = la.orth(rng.normal(size=(6, 2)))
    B = truth @ rng.normal(size=(2, 2))
    assert la.subspace_distance(truth, B, rank_deficient="span") < 1e-12
    collapsed = np.column_stack([truth[:, 0], 2 * truth[:, 0]])  # rank 1: misses a truth direction
    assert la.subspace_distance(truth, collapsed, rank_deficient="span") == 1.0
    assert np.isnan(la.subspace_distance(truth, np.full((6, 2), np.nan), rank_deficient="span"))
    V = rng.normal(size=(6, 2))
    assert la.subspace_distance(truth, V, rank_deficient="span") == pytest.approx(
        la.subspace_distance(truth, V), abs=1e-12)
    with pytest.raises(ValueError, match="rank_deficient must be"):
        la.subspace_distance(truth, V, rank_deficient="ignore")


def test_block_helpers_validate_their_input():
    M = np.ones((3, 2, 2))
    with pytest.raises(ValueError, match=r"tau must be a scalar or have shape \(3,\) .* got "
                                         r"shape \(2,\)"):
        la.block_soft_threshold(M, np.ones(2))
    with pytest.raises(ValueError, match="tau must be non-negative, got minimum -0.5"):
        la.block_soft_threshold(M, np.array([1.0, -0.5, 0.0]))
    with pytest.raises(ValueError, match="tau must be finite"):
        la.block_soft_threshold(M, np.nan)
    with pytest.raises(ValueError, match="M must have 3 dimensions"):
        la.block_soft_threshold(np.ones((2, 2)), 0.1)
    with pytest.raises(ValueError, match="M must be finite"):
        la.block_norms(np.full((2, 1, 1), np.inf))
    # per-block thresholds: block g shrinks by tau_g (norm 2 each)
    out = la.block_soft_threshold(M, np.array([0.0, 1.0, 3.0]))
    np.testing.assert_allclose(la.block_norms(out), [2.0, 1.0, 0.0])


def test_spectral_and_nuclear_norm_validate():
    M = np.diag([3.0, 1.0])
    assert la.spectral_norm(M) == pytest.approx(3.0) and la.nuclear_norm(M) == pytest.approx(4.0)
    assert la.spectral_norm(np.zeros((0, 3))) == 0.0 == la.nuclear_norm(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="M must have 2 dimensions"):
        la.spectral_norm(np.ones(3))
    with pytest.raises(ValueError, match="A must be finite"):
        la.nuclear_norm(np.full((2, 2), np.nan), name="A")
    with pytest.raises(TypeError, match="M must be a real numeric array"):
        la.spectral_norm(np.eye(2) * 1j)


@settings(max_examples=30, deadline=None)
@given(q=st.integers(1, 9), p=st.integers(1, 9), R=st.integers(1, 14), seed=st.integers(0, 2**16))
def test_compact_factors_keeps_the_product_at_rank_min_out_in(q, p, R, seed):
    """At or below min(out, in) the factors come back untouched; above, the same product (to
    rounding, against the dense B A) at rank min(out, in), its singular values split evenly."""
    rng = np.random.default_rng(seed)
    B, A = rng.standard_normal((q, R)), rng.standard_normal((R, p))
    B2, A2 = la.compact_factors(B, A)
    if R <= min(q, p):
        assert B2 is B and A2 is A
        return
    assert B2.shape == (q, min(q, p)) and A2.shape == (min(q, p), p)
    ref = B @ A
    assert np.linalg.norm(B2 @ A2 - ref) <= 1e-12 * max(np.linalg.norm(ref), 1.0)
    np.testing.assert_allclose(np.linalg.norm(B2, axis=0), np.linalg.norm(A2, axis=1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rank", [1, 3])
def test_compact_factors_with_rtol_keeps_the_numerical_rank(rank):
    """With ``rtol`` the factors are always rebuilt at the product's numerical rank: the dense SVD's
    truncation (numpy), even below min(out, in); an all-zero product keeps one (zero) direction."""
    rng = np.random.default_rng(rank)
    B = rng.standard_normal((7, rank)) @ rng.standard_normal((rank, 4))        # (7, 4) of rank `rank`
    A = rng.standard_normal((4, 6))
    B2, A2 = la.compact_factors(B, A, rtol=1e-12)
    s = np.linalg.svd(B @ A, compute_uv=False)
    assert B2.shape == (7, rank) and A2.shape == (rank, 6) == (int(np.sum(s > 1e-12 * s[0])), 6)
    np.testing.assert_allclose(B2 @ A2, B @ A, rtol=0, atol=1e-12 * s[0])
    np.testing.assert_allclose(np.linalg.svd(B2 @ A2, compute_uv=False)[:rank], s[:rank], rtol=1e-12)
    Z2, Y2 = la.compact_factors(np.zeros((3, 2)), np.zeros((2, 5)), rtol=1e-12)
    assert Z2.shape == (3, 1) and Y2.shape == (1, 5) and not (Z2 @ Y2).any()
