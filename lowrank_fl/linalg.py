"""Linear-algebra building blocks: orthonormal bases, projectors, subspace distances, truncated
SVD, singular value thresholding and block soft thresholding.

Everything here is float64 and, where noted, batched over leading axes (``(..., m, n)``).
Tall matrices (the CLAIR contrast stack is ``(G*q, p)`` with ``G*q >> p``) are only ever
decomposed with a thin SVD, whose cost is ``O(G q p^2)``; nothing ``(Gq, Gq)`` is ever formed.
"""
from __future__ import annotations

import numpy as np

from .validation import as_float_array, check_int, check_positive

__all__ = [
    "compact_factors",
    "orth",
    "projector",
    "row_projector",
    "subspace_distance",
    "projector_distance",
    "thin_svd",
    "truncated_svd",
    "svt",
    "block_norms",
    "block_soft_threshold",
    "spectral_norm",
    "nuclear_norm",
]


def compact_factors(B, A, *, rtol: float | None = None) -> tuple:
    """``(B, A)`` (out × R, R × in) unchanged where ``R <= min(out, in)``; above it, the same product
    ``B A`` to rounding (an error of order eps ||B|| ||A||) at rank ``min(out, in)``: ``B = Q_b R_b``,
    ``A^T = Q_a R_a`` and an SVD of the
    small core ``R_b R_a^T``, split evenly (balanced factors). A factorization of rank above
    ``min(out, in)`` stores more numbers than the matrix itself, and LoRA readers refuse it (a
    stacked sum of several clients' factors, or an update beside a correction, reaches it).
    With ``rtol``, always factorized, at the product's numerical rank: the singular values above
    ``rtol σ_1`` (at least one kept; the error is then also up to ``rtol σ_1``)."""
    q, R = B.shape
    p = A.shape[1]
    if rtol is None and R <= min(q, p):
        return B, A
    Qb, Rb = np.linalg.qr(B)                     # (q, min(q, R)), (min(q, R), R)
    Qa, Ra = np.linalg.qr(A.T)                   # (p, min(p, R)), (min(p, R), R)
    X, s, Yt = np.linalg.svd(Rb @ Ra.T, full_matrices=False)
    if rtol is not None:
        k = max(int(np.count_nonzero(s > rtol * s[0])) if s.size and s[0] > 0 else 0, 1)
        X, s, Yt = X[:, :k], s[:k], Yt[:k]
    root = np.sqrt(s)
    return Qb @ (X * root), (root[:, None] * Yt) @ Qa.T


def orth(A, *, name: str = "A") -> np.ndarray:
    """Orthonormal basis of the column space of a full-column-rank ``A``.

    Parameters
    ----------
    A : array_like, shape (..., m, k) with k <= m
        Batched over leading axes.

    Returns
    -------
    Q : ndarray, shape (..., m, k)
        ``Q^T Q = I_k`` and ``col(Q) = col(A)``. Signs follow Householder QR.

    Raises
    ------
    ValueError
        If ``k > m`` or ``A`` is (numerically) rank deficient: the smallest ``|R_ii|`` is below
        ``1e-12 * max |R_ii|``.
    """
    A = as_float_array(A, name)
    if A.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions, got shape {A.shape}")
    m, k = A.shape[-2:]
    if k == 0 or A.size == 0:
        raise ValueError(f"{name} must have at least one row and one column, got shape {A.shape}")
    if k > m:
        raise ValueError(f"{name} must have at most as many columns as rows, got shape {A.shape}")
    Q, R = np.linalg.qr(A)
    diag = np.abs(np.diagonal(R, axis1=-2, axis2=-1))
    scale = np.max(diag, axis=-1, keepdims=True)
    if np.any(diag <= 1e-12 * np.maximum(scale, np.finfo(float).tiny)):
        raise ValueError(f"{name} must have full column rank (shape {A.shape})")
    return Q


def projector(A, *, name: str = "A") -> np.ndarray:
    """Orthogonal projector ``Q Q^T`` onto the column space of ``A`` (shape (..., m, k)) → (..., m, m)."""
    Q = orth(A, name=name)
    return Q @ np.swapaxes(Q, -1, -2)


def row_projector(A, *, name: str = "A") -> np.ndarray:
    """Projector onto the row space of ``A`` (shape (r, p), full row rank) → (p, p).

    Equals ``A^T (A A^T)^{-1} A`` (CLAIR's P_A, valid also when ``A`` is not orthonormal, as in the
    paper's §7 simulation) but is computed from an orthonormal basis, which is stable.
    """
    A = as_float_array(A, name)
    if A.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions, got shape {A.shape}")
    return projector(np.swapaxes(A, -1, -2), name=name)


def subspace_distance(U, V, *, rank_deficient: str = "raise") -> float | np.ndarray:
    """Sine of the largest principal angle between ``col(U)`` and ``col(V)``.

    ``dist(U, V) = ||(I - P_U) orth(V)||_2``, computed from orthonormal bases (not from
    ``sqrt(1 - sigma_min^2)``, which loses all accuracy near 0).

    Parameters
    ----------
    U : array_like, shape (..., d, k)
    V : array_like, shape (..., d, l)
        Full column rank; any scaling or basis. With ``k == l`` the distance is symmetric and
        equals ``||P_U - P_V||_2``; with ``k != l`` it measures how far ``col(V)`` sticks out of
        ``col(U)``.
    rank_deficient : {"raise", "span"}
        ``"raise"`` (default): a rank-deficient input is a ``ValueError``. ``"span"``: each input
        stands for the subspace it numerically spans (singular values above ``1e-12`` times the
        largest), and the distance is ``||P_U - P_V||_2`` — equal to the above when the spans have
        the same dimension, and 1 when they do not (an iterate that collapsed a column is at
        distance 1 from a k-dimensional truth). Non-finite input gives ``nan``. 2-D inputs only.
        Used to score iterates of federated methods, which may lose rank.

    Returns
    -------
    float in [0, 1] (or an array over the batch axes).
    """
    if rank_deficient == "span":
        U = np.asarray(U, dtype=np.float64)
        V = np.asarray(V, dtype=np.float64)
        if U.ndim != 2 or V.ndim != 2 or U.shape[0] != V.shape[0]:
            raise ValueError(f"U and V must be 2-D with the same number of rows, got {U.shape} and {V.shape}")
        if not (np.all(np.isfinite(U)) and np.all(np.isfinite(V))):
            return float("nan")
        Qu, Qv = _span_basis(U), _span_basis(V)
        if Qu.shape[1] != Qv.shape[1]:
            return 1.0
        if Qu.shape[1] == 0:
            return 0.0
        return min(float(np.linalg.norm(Qv - Qu @ (Qu.T @ Qv), 2)), 1.0)
    if rank_deficient != "raise":
        raise ValueError(f"rank_deficient must be 'raise' or 'span', got {rank_deficient!r}")
    Qu = orth(U, name="U")
    Qv = orth(V, name="V")
    if Qu.shape[-2] != Qv.shape[-2]:
        raise ValueError(
            f"U and V must live in the same space (same number of rows), got {Qu.shape} and {Qv.shape}")
    resid = Qv - Qu @ (np.swapaxes(Qu, -1, -2) @ Qv)
    out = np.linalg.norm(resid, ord=2, axis=(-2, -1))
    out = np.minimum(out, 1.0)
    return float(out) if np.ndim(out) == 0 else out


def _span_basis(A: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the numerical column span of a 2-D ``A`` (relative tolerance 1e-12)."""
    if A.size == 0:
        return np.zeros((A.shape[0], 0))
    U, s, _ = np.linalg.svd(A, full_matrices=False)
    keep = s > 1e-12 * max(s[0], np.finfo(float).tiny) if s[0] > 0 else np.zeros_like(s, bool)
    return U[:, keep]


def projector_distance(P, Q) -> float:
    """Operator-norm distance ``||P - Q||_2`` between two projectors (shape (p, p))."""
    P = as_float_array(P, "P", ndim=2)
    Q = as_float_array(Q, "Q", shape=P.shape)
    return float(np.linalg.norm(P - Q, 2))


def thin_svd(M, *, name: str = "M"):
    """Thin SVD ``M = U diag(s) Vt`` of an (m, n) matrix with LAPACK (``gesdd``).

    For tall ``M`` LAPACK reduces to an ``n x n`` problem by QR first, so the cost is
    ``O(m n^2)`` and memory ``O(m n)``. Returns ``U`` (m, r), ``s`` (r,), ``Vt`` (r, n) with
    ``r = min(m, n)``, singular values in decreasing order.
    """
    M = as_float_array(M, name, ndim=2)
    try:
        return np.linalg.svd(M, full_matrices=False)
    except np.linalg.LinAlgError:  # gesdd occasionally fails to converge; gesvd is slower but robust
        import scipy.linalg

        return scipy.linalg.svd(M, full_matrices=False, lapack_driver="gesvd")


def truncated_svd(M, rank: int, *, name: str = "M"):
    """Best rank-``rank`` approximation factors (Eckart–Young).

    Returns ``U`` (m, rank), ``s`` (rank,), ``Vt`` (rank, n); ``U @ diag(s) @ Vt`` is the best
    rank-``rank`` approximation of ``M`` in every unitarily invariant norm.
    """
    M = as_float_array(M, name, ndim=2)
    rank = check_int(rank, "rank", minimum=1, maximum=min(M.shape))
    U, s, Vt = thin_svd(M, name=name)
    return U[:, :rank], s[:rank], Vt[:rank]


def svt(M, tau: float, *, name: str = "M"):
    """Singular value thresholding ``SVT(M; tau) = U diag((s - tau)_+) V^T``.

    This is the proximal operator of ``tau * ||.||_*``.

    Returns
    -------
    X : ndarray, same shape as M
    s : ndarray
        The thresholded singular values ``(s - tau)_+`` (so ``||X||_* = s.sum()`` and
        ``rank(X) = count_nonzero(s)`` without another decomposition).
    """
    tau = check_positive(tau, "tau", strict=False)
    U, s, Vt = thin_svd(M, name=name)
    s = np.maximum(s - tau, 0.0)
    r = int(np.count_nonzero(s))
    X = (U[:, :r] * s[:r]) @ Vt[:r]
    return X, s


def block_norms(M, *, name: str = "M") -> np.ndarray:
    """Frobenius norm of each block of a (G, q, p) array → (G,). ``M`` must be finite."""
    M = as_float_array(M, name, ndim=3)
    return np.sqrt(np.einsum("gij,gij->g", M, M))


def block_soft_threshold(M, tau) -> np.ndarray:
    """Block soft thresholding ``(1 - tau_g / ||M_g||_F)_+ M_g`` on a (G, q, p) view.

    The proximal operator of ``sum_g tau_g ||M_g||_F``. ``tau`` is a scalar or a (G,) array of
    finite non-negative thresholds. Pass ``D.reshape(G, q, p)`` for a stacked (G*q, p) matrix
    (a view, no copy). Returns an array of ``M``'s shape.
    """
    M = as_float_array(M, "M", ndim=3)
    norms = block_norms(M)
    tau = as_float_array(tau, "tau", ndim=(0, 1))
    if tau.ndim == 1 and tau.shape != norms.shape:
        raise ValueError(f"tau must be a scalar or have shape ({M.shape[0]},) (one per block), "
                         f"got shape {tau.shape}")
    if np.any(tau < 0):
        raise ValueError(f"tau must be non-negative, got minimum {float(np.min(tau))}")
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(norms > tau, 1.0 - tau / np.where(norms > 0, norms, 1.0), 0.0)
    return M * factor[:, None, None]


def spectral_norm(M, *, name: str = "M") -> float:
    """Largest singular value of a finite 2-D array ``M`` (m, n) (0 for an empty one)."""
    M = as_float_array(M, name, ndim=2)
    return float(np.linalg.norm(M, 2)) if M.size else 0.0


def nuclear_norm(M, *, name: str = "M") -> float:
    """Sum of singular values of a finite 2-D array ``M`` (m, n) (thin SVD, safe for tall
    matrices)."""
    M = as_float_array(M, name, ndim=2)
    return float(np.linalg.svd(M, compute_uv=False).sum()) if M.size else 0.0
