"""Pairwise contrasts and the block structure of CLAIR (§3.1, eqs. (5)–(6)).

Clients are 0-based here: the paper's pair (j, k) with 1 <= j < k <= K is row ``g`` of
``pairs(K)`` holding ``(j - 1, k - 1)``, in the paper's lexicographic order
(1,2), (1,3), ..., (1,K), (2,3), ..., (K-1,K). The stacked contrast ``D`` is (G*q, p) with
``G = K(K-1)/2``; :func:`as_blocks` gives the (G, q, p) view on which every block operation
(``P_g``, block norms, block soft thresholding) is a cheap axis operation. Nothing (Gq x Gq) is
ever built.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse

from ..validation import as_float_array, check_int

__all__ = [
    "BlockRows",
    "pairs",
    "n_pairs",
    "n_clients",
    "pair_index",
    "pair_matrix",
    "pairs_of_client",
    "incidence",
    "pair_values_to_matrix",
    "contaminated_pairs",
    "contrasts",
    "as_blocks",
    "check_block_rows",
    "check_weights",
    "uniform_weights",
]


def n_pairs(K: int) -> int:
    """Number of unordered client pairs ``G = K (K - 1) / 2``."""
    K = check_int(K, "K", minimum=2)
    return K * (K - 1) // 2


def n_clients(G: int) -> int:
    """Invert ``G = K (K - 1) / 2``: the number of clients ``K`` behind ``G`` pairs.

    Raises
    ------
    ValueError
        If ``G`` is not a triangular number ``K (K - 1) / 2`` with ``K >= 2``.
    """
    G = check_int(G, "G", minimum=1)
    K = int(round((1 + np.sqrt(1 + 8 * G)) / 2))
    if K * (K - 1) // 2 != G:
        raise ValueError(
            f"G must be a number of client pairs K(K-1)/2 (1, 3, 6, 10, ...), got {G}")
    return K


def pairs(K: int) -> np.ndarray:
    """All client pairs ``(j, k)``, ``j < k``, in the paper's lexicographic order (eq. (6)).

    Parameters
    ----------
    K : int
        Number of clients, ``K >= 2``.

    Returns
    -------
    ndarray of int, shape (G, 2)
        Row ``g`` is the 0-based pair ``(j, k)`` with ``j < k``; rows are ordered
        (0,1), (0,2), ..., (0,K-1), (1,2), ..., (K-2,K-1).
    """
    K = check_int(K, "K", minimum=2)
    j, k = np.triu_indices(K, 1)  # row-major upper triangle = lexicographic order
    return np.stack([j, k], axis=1).astype(np.intp)


def pair_index(j, k, K: int):
    """Row index ``g`` of the unordered pair {j, k} (0-based, ``j != k``; order irrelevant).

    ``j`` and ``k`` may be integer arrays of equal shape; the result has that shape.
    """
    K = check_int(K, "K", minimum=2)
    j = np.asarray(j)
    k = np.asarray(k)
    if not (np.issubdtype(j.dtype, np.integer) and np.issubdtype(k.dtype, np.integer)):
        raise TypeError(f"j and k must be integers, got dtypes {j.dtype} and {k.dtype}")
    if np.any((j < 0) | (j >= K) | (k < 0) | (k >= K)):
        raise ValueError(f"j and k must lie in [0, {K - 1}] for K={K}")
    if np.any(j == k):
        raise ValueError("j and k must differ (a pair needs two distinct clients)")
    a = np.minimum(j, k)
    b = np.maximum(j, k)
    # pairs before row a: sum_{i<a} (K-1-i) = a K - a(a+1)/2
    g = a * K - a * (a + 1) // 2 + (b - a - 1)
    return int(g) if g.ndim == 0 else g.astype(np.intp)


def pair_matrix(K: int) -> np.ndarray:
    """(K, K) int array whose entry (j, k) is the pair index of {j, k}; ``-1`` on the diagonal."""
    K = check_int(K, "K", minimum=2)
    M = np.full((K, K), -1, dtype=np.intp)
    j, k = np.triu_indices(K, 1)
    g = np.arange(j.size)
    M[j, k] = g
    M[k, j] = g
    return M


def pairs_of_client(K: int) -> np.ndarray:
    """Pair indices involving each client: (K, K-1) int array, row ``k`` = pairs {k, j}, j != k.

    Columns run over ``j`` in increasing order with ``j = k`` skipped.
    """
    M = pair_matrix(K)
    K = M.shape[0]
    off = ~np.eye(K, dtype=bool)
    return M[off].reshape(K, K - 1)


def incidence(K: int, *, signed: bool = True) -> scipy.sparse.csr_matrix:
    """Client-pair incidence matrix ``E`` (G, K), sparse CSR.

    Row ``g = (j, k)`` has ``+1`` at column ``j`` and ``-1`` (or ``+1`` if ``signed=False``) at
    column ``k``. With ``signed=True``, ``contrasts(W).reshape(G, -1) == E @ W.reshape(K, -1)``
    (eq. (5)); with ``signed=False``, ``E.T @ x`` sums a per-pair quantity over the pairs of each
    client.
    """
    P = pairs(K)
    G = P.shape[0]
    rows = np.repeat(np.arange(G), 2)
    cols = P.reshape(-1)
    vals = np.tile([1.0, -1.0 if signed else 1.0], G)
    return scipy.sparse.csr_matrix((vals, (rows, cols)), shape=(G, K))


def pair_values_to_matrix(values, K: int, *, fill: float = np.nan) -> np.ndarray:
    """Scatter per-pair values (G,) into a symmetric (K, K) matrix, ``fill`` on the diagonal.

    Handy for the majority vote (8): entry (j, k) is the value for pair {j, k}.
    """
    K = check_int(K, "K", minimum=2)
    G = K * (K - 1) // 2
    values = as_float_array(values, "values", shape=(G,), finite=False)
    out = np.full((K, K), float(fill))
    j, k = np.triu_indices(K, 1)
    out[j, k] = values
    out[k, j] = values
    return out


def contaminated_pairs(benign) -> np.ndarray:
    """The contaminated pair set ``I`` (§3.1) as a (G,) bool mask from a (K,) bool mask of
    benign clients: pair (j, k) is in ``I`` iff ``j`` or ``k`` is not benign."""
    b = np.asarray(benign)
    if b.dtype != bool or b.ndim != 1 or b.size < 2:
        raise ValueError(f"benign must be a 1-D boolean array with at least 2 clients, got "
                         f"dtype {b.dtype} and shape {b.shape}")
    j, k = np.triu_indices(b.size, 1)
    return ~(b[j] & b[k])


def contrasts(W_hat) -> np.ndarray:
    """Stacked pairwise contrasts ``D̂`` of eqs. (5)–(6).

    Parameters
    ----------
    W_hat : array_like, shape (K, q, p)
        Per-client estimates ``Ŵ^(k)``, client axis first, ``K >= 2``.

    Returns
    -------
    D : ndarray, shape (G*q, p)
        Block ``g = (j, k)`` (rows ``g*q:(g+1)*q``) is ``Ŵ^(j) - Ŵ^(k)`` with ``j < k`` in
        lexicographic order.
    """
    W = as_float_array(W_hat, "W_hat", ndim=3)
    K, q, p = W.shape
    if K < 2:
        raise ValueError(f"W_hat must hold at least 2 clients (shape (K, q, p)), got shape {W.shape}")
    j, k = np.triu_indices(K, 1)
    return (W[j] - W[k]).reshape(-1, p)


class BlockRows(NamedTuple):
    """Block height ``q`` and number of blocks ``G`` of a stacked (G*q, p) array."""

    q: int
    G: int


def check_block_rows(X, q: int, name: str = "D") -> BlockRows:
    """Validate the block height ``q`` of a stacked 2-D array ``X`` (G*q, p).

    Returns
    -------
    BlockRows
        ``(q, G)``.

    Raises
    ------
    TypeError
        ``q`` not an integer.
    ValueError
        ``q < 1``, or ``X`` is not 2-D with a positive multiple of ``q`` rows (message names
        ``name``).
    """
    q = check_int(q, "q", minimum=1)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[0] % q != 0:
        raise ValueError(
            f"{name} must be a 2-D array with a positive number of rows that is a multiple of "
            f"q={q} "
            f"(G*q rows), got shape {X.shape}")
    return BlockRows(q, X.shape[0] // q)


def as_blocks(D, q: int) -> np.ndarray:
    """The (G, q, p) block view of a stacked (G*q, p) matrix (no copy for a C-contiguous ``D``).

    Parameters
    ----------
    D : array_like, shape (G*q, p)
    q : int
        Block height (rows per pair).

    Returns
    -------
    ndarray, shape (G, q, p)
        ``out[g]`` is block ``P_g(D)`` without its zero padding.
    """
    D = np.asarray(D, dtype=np.float64)
    q, G = check_block_rows(D, q, "D")
    return D.reshape(G, q, D.shape[1])


def uniform_weights(G: int) -> np.ndarray:
    """The §7 default ``w_g = 1/K`` for all ``G = K(K-1)/2`` pairs, shape (G,)."""
    K = n_clients(G)
    return np.full(G, 1.0 / K)


def check_weights(weights, G: int) -> np.ndarray:
    """Validate pair weights ``w_g`` of the loss in (7).

    Parameters
    ----------
    weights : None, float or array_like of shape (G,)
        ``None`` gives the §7 choice ``w_g = 1/K`` (requires ``G = K(K-1)/2``); a scalar is
        broadcast to all pairs.
    G : int
        Number of blocks.

    Returns
    -------
    ndarray, shape (G,)
        Finite, strictly positive weights.
    """
    G = check_int(G, "G", minimum=1)
    if weights is None:
        try:
            return uniform_weights(G)
        except ValueError as exc:
            raise ValueError(
                f"weights=None means w_g = 1/K, which needs G = K(K-1)/2 blocks; got G={G}. "
                "Pass explicit weights of shape (G,)") from exc
    w = as_float_array(weights, "weights", ndim=(0, 1))
    if w.ndim == 0:
        w = np.full(G, float(w))
    if w.shape != (G,):
        raise ValueError(f"weights must have shape ({G},) (one per block), got {w.shape}")
    if np.any(w <= 0):
        raise ValueError(f"weights must be strictly positive, got minimum {w.min()}")
    return w
