"""Contrasts, pair indexing and block algebra of CLAIR (§3.1, eqs. (5)-(6), (11))."""
import itertools

import numpy as np
import pytest
import scipy.sparse.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

from lowrank_fl.clair.contrasts import (as_blocks, check_block_rows, check_weights, contaminated_pairs, contrasts,
                                        incidence, n_clients, n_pairs, pair_index, pair_matrix,
                                        pair_values_to_matrix, pairs, pairs_of_client,
                                        uniform_weights)
from lowrank_fl.clair.penalized import _bst, _svt
from lowrank_fl.linalg import svt

FAST = settings(max_examples=25, deadline=None)


def _W(seed, K, q, p):
    return np.random.default_rng(seed).standard_normal((K, q, p))


@FAST
@given(K=st.integers(2, 12))
def test_pairs_lexicographic_and_index_roundtrip(K):
    P = pairs(K)
    assert P.shape == (n_pairs(K), 2) == (K * (K - 1) // 2, 2)
    assert [tuple(r) for r in P] == list(itertools.combinations(range(K), 2))
    g = pair_index(P[:, 0], P[:, 1], K)
    np.testing.assert_array_equal(g, np.arange(len(P)))
    np.testing.assert_array_equal(pair_index(P[:, 1], P[:, 0], K), g)  # order irrelevant
    assert n_clients(len(P)) == K


@FAST
@given(K=st.integers(2, 10))
def test_pair_matrix_and_pairs_of_client(K):
    M = pair_matrix(K)
    np.testing.assert_array_equal(M, M.T)
    assert np.all(np.diag(M) == -1)
    P = pairs(K)
    byc = pairs_of_client(K)
    assert byc.shape == (K, K - 1)
    for k in range(K):
        expected = np.flatnonzero((P[:, 0] == k) | (P[:, 1] == k))
        np.testing.assert_array_equal(np.sort(byc[k]), expected)
    # every pair appears exactly twice (once per endpoint)
    np.testing.assert_array_equal(np.bincount(byc.ravel(), minlength=len(P)), 2)


@FAST
@given(K=st.integers(2, 8), q=st.integers(1, 4), p=st.integers(1, 5), seed=st.integers(0, 10**6))
def test_contrasts_blocks_antisymmetry_and_incidence(K, q, p, seed):
    W = _W(seed, K, q, p)
    D = contrasts(W)
    G = n_pairs(K)
    assert D.shape == (G * q, p)
    B = as_blocks(D, q)
    assert np.shares_memory(B, D)
    for g, (j, k) in enumerate(pairs(K)):
        np.testing.assert_array_equal(B[g], W[j] - W[k])
    E = incidence(K)
    np.testing.assert_allclose(E @ W.reshape(K, -1), D.reshape(G, -1), atol=1e-13)
    # unsigned incidence counts K-1 pairs per client
    np.testing.assert_array_equal(incidence(K, signed=False).sum(axis=0).A1, K - 1)
    # relabelling clients permutes blocks with a sign flip when the order reverses
    perm = np.random.default_rng(seed).permutation(K)
    Bp = as_blocks(contrasts(W[perm]), q)
    for g, (a, b) in enumerate(pairs(K)):
        h = pair_index(perm[a], perm[b], K)
        sign = 1.0 if perm[a] < perm[b] else -1.0
        np.testing.assert_array_equal(Bp[g], sign * B[h])


@FAST
@given(K=st.integers(2, 9), q=st.integers(1, 3), p=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_lemma_s11_identity(K, q, p, seed):
    """||E1||_F^2 = K sum_k ||Xi_k||_F^2 - ||sum_k Xi_k||_F^2 (Lemma S11), exactly."""
    Xi = _W(seed, K, q, p)
    lhs = np.sum(contrasts(Xi) ** 2)
    rhs = K * np.sum(Xi ** 2) - np.sum(Xi.sum(axis=0) ** 2)
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)


@FAST
@given(G=st.integers(1, 15), q=st.integers(1, 3), p=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_lipschitz_constant_is_twice_max_weight(G, q, p, seed):
    """||P_w||_op = max w_g and the product-space Hessian of the loss has norm 2 max w_g (the
    loss is (2 max w)-smooth in (L, S)): the math behind the default step t = 1/(2 max w). That the solver
    uses this step is tested in test_clair_penalized (one step against a hand-computed one)."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.1, 2.0, G)
    wr = np.repeat(w, q)[:, None]
    n = G * q * p

    def pw(x):
        return (x.reshape(G * q, p) * wr).ravel()

    def hess(x):
        Lx, Sx = x[:n], x[n:]
        y = pw(Lx + Sx)
        return np.concatenate([y, y])

    ops = [(pw, n, w.max()), (hess, 2 * n, 2 * w.max())]
    for f, m, expected in ops:
        op = scipy.sparse.linalg.LinearOperator((m, m), matvec=f, dtype=float)
        if m > 2:
            top = scipy.sparse.linalg.eigsh(op, k=1, which="LA", tol=1e-12)[0][0]
        else:
            top = np.linalg.eigvalsh(np.column_stack([f(e) for e in np.eye(m)])).max()
        assert top == pytest.approx(expected, rel=1e-9)


@FAST
@given(G=st.integers(1, 8), q=st.integers(1, 3), p=st.integers(1, 4),
       tau=st.floats(0.0, 3.0), seed=st.integers(0, 10**6))
def test_block_soft_threshold_is_the_prox(G, q, p, tau, seed):
    """BST(M; tau) = argmin_X 1/2||X - M||^2 + tau sum_g ||X_g||_F: check optimality against
    random perturbations and the closed-form block norms."""
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((G * q, p)) * rng.uniform(0.1, 3.0)
    X, nn = _bst(M, q, tau)
    nM = np.linalg.norm(M.reshape(G, -1), axis=1)
    np.testing.assert_allclose(nn, np.maximum(nM - tau, 0), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(X.reshape(G, -1), axis=1), nn, atol=1e-12)

    def h(Y):
        return 0.5 * np.sum((Y - M) ** 2) + tau * np.linalg.norm(Y.reshape(G, -1), axis=1).sum()

    base = h(X)
    for _ in range(10):
        assert h(X + 1e-3 * rng.standard_normal(X.shape)) >= base - 1e-12


@FAST
@given(m=st.integers(1, 30), p=st.integers(1, 6), tau=st.floats(0.0, 2.0),
       seed=st.integers(0, 10**6))
def test_svt_routes_agree(m, p, tau, seed):
    """The Gram-route SVT of the hot path equals LAPACK SVT (lowrank_fl.linalg.svt)."""
    M = np.random.default_rng(seed).standard_normal((m, p))
    ref, sref = svt(M, tau)
    for mode in ("gram", "lapack", "auto"):
        X, s, Vt = _svt(M, tau, mode)
        np.testing.assert_allclose(X, ref, atol=1e-9)
        np.testing.assert_allclose(np.sort(s)[::-1][:sref.size], sref, atol=1e-9)
        np.testing.assert_allclose(Vt @ Vt.T, np.eye(p), atol=1e-10)


def test_pair_values_to_matrix_and_contaminated_pairs():
    K = 5
    vals = np.arange(n_pairs(K), dtype=float)
    M = pair_values_to_matrix(vals, K, fill=-1.0)
    np.testing.assert_array_equal(M, M.T)
    assert M[1, 3] == vals[pair_index(1, 3, K)]
    assert np.all(np.diag(M) == -1.0)
    benign = np.array([True, False, True, True, False])
    I = contaminated_pairs(benign)
    P = pairs(K)
    np.testing.assert_array_equal(I, ~(benign[P[:, 0]] & benign[P[:, 1]]))
    # s = G - C(|C|, 2) (the counting in the proof of Lemma 2)
    assert I.sum() == n_pairs(K) - 3


def test_check_weights():
    np.testing.assert_allclose(check_weights(None, 10), np.full(10, 0.2))
    np.testing.assert_allclose(uniform_weights(3), np.full(3, 1 / 3))
    np.testing.assert_allclose(check_weights(0.5, 4), np.full(4, 0.5))
    w = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(check_weights(w, 3), w)
    with pytest.raises(ValueError, match=r"weights must have shape \(3,\)"):
        check_weights(np.ones(4), 3)
    with pytest.raises(ValueError, match="weights must be strictly positive"):
        check_weights(np.array([1.0, 0.0, 1.0]), 3)
    with pytest.raises(ValueError, match="weights must be finite"):
        check_weights(np.array([1.0, np.nan, 1.0]), 3)
    with pytest.raises(ValueError, match="weights=None means w_g = 1/K"):
        check_weights(None, 4)


def test_errors():
    with pytest.raises(ValueError, match="K must be >= 2"):
        pairs(1)
    with pytest.raises(TypeError, match="K must be an integer"):
        pairs(3.0)
    with pytest.raises(ValueError, match="G must be a number of client pairs"):
        n_clients(4)
    with pytest.raises(ValueError, match="W_hat must have 3 dimensions"):
        contrasts(np.ones((3, 2)))
    with pytest.raises(ValueError, match="W_hat must hold at least 2 clients"):
        contrasts(np.ones((1, 2, 2)))
    with pytest.raises(ValueError, match="W_hat must be finite"):
        contrasts(np.full((3, 2, 2), np.inf))
    with pytest.raises(ValueError, match="multiple of q=2"):
        as_blocks(np.ones((5, 3)), 2)
    with pytest.raises(ValueError, match="D must be a 2-D"):
        as_blocks(np.ones(6), 2)
    with pytest.raises(ValueError, match=r"X must be a 2-D array .* multiple of q=3"):
        check_block_rows(np.ones((4, 2)), 3, "X")
    with pytest.raises(TypeError, match="q must be an integer"):
        check_block_rows(np.ones((4, 2)), 2.0)
    assert check_block_rows(np.ones((6, 2)), 3) == (3, 2)
    with pytest.raises(ValueError, match="j and k must differ"):
        pair_index(1, 1, 4)
    with pytest.raises(ValueError, match=r"j and k must lie in \[0, 3\]"):
        pair_index(0, 4, 4)
    with pytest.raises(TypeError, match="j and k must be integers"):
        pair_index(0.0, 1, 4)
    with pytest.raises(ValueError, match=r"values must have shape \(3\), got \(4,\)"):
        pair_values_to_matrix(np.ones(4), 3)
    with pytest.raises(ValueError, match="benign must be a 1-D boolean array"):
        contaminated_pairs(np.array([1, 0, 1]))
