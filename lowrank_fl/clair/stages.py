"""The building blocks of CLAIR's pipeline after the convex program (§3.1, §4): the subspace
``P_Â`` of ``L̂``, the largest-gap threshold (never defined by the paper; our reading is
documented in :func:`largest_gap_split`), the collaborative set (8) and the refinement (9) with its
closed form (S4.3). :mod:`lowrank_fl.clair.pipeline` chains them in ``fit``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..linalg import thin_svd
from ..validation import as_float_array, check_in_interval, check_int, check_positive
from .contrasts import contrasts, incidence, pair_values_to_matrix

__all__ = ["numerical_rank", "Subspace", "Votes", "subspace_projector", "GapSplit", "MIN_GAP_RATIO",
           "majority_pairs", "largest_gap_split", "largest_gap_threshold", "collaborative_set", "refine",
           "refine_closed_form"]


# ---------------------------------------------------------------------------------------------
# validation shared with the pipeline
def check_w_hat(W_hat) -> np.ndarray:
    W = as_float_array(W_hat, "W_hat", ndim=3)
    if W.shape[0] < 2:
        raise ValueError(f"W_hat must hold at least K = 2 clients (shape (K, q, p)), "
                         f"got shape {W.shape}")
    return W



def check_benign(benign, K: int, name: str = "benign") -> np.ndarray:
    b = np.asarray(benign)
    if b.dtype != bool:
        raise TypeError(f"{name} must be a boolean array of shape ({K},), got dtype {b.dtype}")
    if b.shape != (K,):
        raise ValueError(f"{name} must have shape ({K},) (one flag per client), got {b.shape}")
    return b


def _check_projector(projector, p: int) -> np.ndarray:
    return as_float_array(projector, "projector", shape=(p, p))


def numerical_rank(singular_values, reference: float, threshold: float = 1e-6) -> int:
    """Number of singular values ``> threshold * reference``.

    Pass ``reference = ||D̂||_op``: a threshold relative to ``σ_1(L̂)`` reports
    "full rank" on pure noise when ``L̂ ≈ 0``.
    """
    s = as_float_array(singular_values, "singular_values", ndim=1)
    threshold = check_positive(threshold, "threshold")
    reference = check_positive(reference, "reference", strict=False)
    return int(np.count_nonzero(s > threshold * reference))


class Subspace(NamedTuple):
    """``projector`` (p, p) onto a right singular subspace and all ``singular_values``."""

    projector: np.ndarray
    singular_values: np.ndarray


class Votes(NamedTuple):
    """Collaborative set (8): ``benign`` (K,) bool and the vote fractions ``votes`` (K,)."""

    benign: np.ndarray
    votes: np.ndarray


def subspace_projector(L, dim: int) -> Subspace:
    """``P_Â = Â Â^T`` from the top-``dim`` right singular vectors of ``L`` (Alg. 1 / Thm 2).

    Parameters
    ----------
    L : array_like, shape (m, p)
    dim : int
        ``0 <= dim <= p``; ``dim = 0`` gives the zero projector.

    Returns
    -------
    Subspace
        ``projector`` (p, p) and ``singular_values`` (min(m, p),).
    """
    L = as_float_array(L, "L", ndim=2)
    dim = check_int(dim, "dim", minimum=0, maximum=min(L.shape))
    _, s, Vt = thin_svd(L, name="L")
    V = Vt[:dim].T
    return Subspace(V @ V.T, s)


class GapSplit(NamedTuple):
    """Outcome of :func:`largest_gap_split`.

    ``threshold`` is ``τ_n``; ``separated`` says whether the largest gap is an admissible split
    (else ``threshold`` is the largest norm: every pair counts as collaborative); ``n_below``
    pairs are ``<= threshold``; ``gap_ratio`` is the gap divided by the spread (standard
    deviation) of the norms below it (``nan`` without a split).
    """

    threshold: float
    separated: bool
    n_below: int
    gap_ratio: float


#: Default of ``min_gap_ratio`` in :func:`largest_gap_split`.
MIN_GAP_RATIO = 6.0


def majority_pairs(K: int, alpha: float = 0.5) -> int:
    """Fewest pairs inside any collaborative set that (8) with fraction ``alpha`` can return.

    A client is kept by (8) only if at least ``alpha (K - 1)`` of its pairs are below ``τ``, so a
    non-empty set the rule can recover has ``m >= m_min = ceil(alpha (K - 1)) + 1`` clients
    (Remark 3: ``alpha <= (|C| - 1)/(K - 1)``), whose ``C(m_min, 2)`` pairs are all below ``τ``.
    """
    K = check_int(K, "K", minimum=2)
    alpha = check_in_interval(alpha, "alpha", 0.5, 1.0, closed="left")
    m = int(np.ceil(alpha * (K - 1) - 1e-12)) + 1
    return m * (m - 1) // 2


def largest_gap_split(norms, *, log: bool = False, min_below: int = 1,
                      min_gap_ratio: float | None = MIN_GAP_RATIO,
                      zero_level: float = 0.0) -> GapSplit:
    """The "largest-gap" threshold ``τ_n`` of §7 (our reading; the paper never defines it), with a
    way to say "no separation".

    Sort the block norms, find the largest gap between consecutive sorted values and take its
    midpoint. With ``log=True`` the gap is located on a log scale (largest ratio between
    consecutive values) and the geometric midpoint is taken; values below
    ``1e-12 * max(norms)`` are floored there so exact zeros (noiseless benign pairs) work.
    Ties go to the smallest gap position.

    The largest gap always splits the norms in two, even when they form one group (every client
    benign), and (8) then excludes benign clients. A split is admissible only if

    1. at least ``min_below`` pairs lie below it (:func:`fit` passes
       ``C(m_min, 2)``, the pairs of the smallest set (8) can return, :func:`majority_pairs`):
       a split in the bottom tail of one group (the usual place of its largest spacing) leaves
       one or two pairs below ``τ`` and (8) excludes every client; and
    2. the gap is at least ``min_gap_ratio`` times the standard deviation of the norms below it
       (the candidate benign pairs, one homogeneous group under the model). Under one group of
       ``G`` roughly normal norms with spread ``σ``, the spacing above the ``i``-th largest is
       about ``σ E_i / (i sqrt(2 ln G))`` with ``E_i`` standard exponential (Rényi's
       representation of extreme order statistics), so a gap of ``6 σ`` has probability about
       ``exp(-6 sqrt(2 ln G)) < 1e-5`` for ``G >= 3``; the default 6 also covers the noisy
       spread estimate from a few pairs. Measured on §7 instances (30 seeds each): one benign
       group gives ratios up to 1.7 (K = 10, 20) and 4.6 (K = 5); 1 or 40 % contaminated
       clients give at least 8.3, at (p, q) = (10, 10), (20, 20), K = 5, 10, 20.

    Norms ``<= zero_level`` count as exact zeros (pass a rounding level, e.g. ``1e-9`` times the
    largest contrast block norm); when every norm is a zero there is nothing to separate either.
    Without an admissible split ``τ`` is the largest norm and every pair counts as
    collaborative. With fewer than two distinct values there is no gap.

    Parameters
    ----------
    norms : array_like, shape (G,)
        Non-negative block norms ``||Ŝ_{A⊥}^{(g)}||_F``.
    log : bool
    min_below : int, >= 1
        Fewest pairs below an admissible split.
    min_gap_ratio : float > 0 or None
        Smallest admissible gap, in standard deviations of the norms below it; None accepts
        every gap (the plain largest-gap rule).
    zero_level : float >= 0

    Returns
    -------
    GapSplit
    """
    x = as_float_array(norms, "norms", ndim=1)
    if x.size == 0:
        raise ValueError("norms must contain at least one value, got an empty array")
    if np.any(x < 0):
        raise ValueError(f"norms must be non-negative, got minimum {x.min()}")
    min_below = check_int(min_below, "min_below", minimum=1)
    if min_gap_ratio is not None:
        min_gap_ratio = check_positive(min_gap_ratio, "min_gap_ratio")
    zero_level = check_positive(zero_level, "zero_level", strict=False)
    x = np.sort(np.where(x <= zero_level, 0.0, x))
    no_split = GapSplit(float(x[-1]), False, int(x.size), float("nan"))
    if x.size < 2 or x[-1] == x[0]:
        return no_split
    if log:
        y = np.log(np.maximum(x, 1e-12 * x[-1]))
        i = int(np.argmax(np.diff(y)))
        tau = float(np.exp(0.5 * (y[i] + y[i + 1])))
    else:
        i = int(np.argmax(np.diff(x)))
        tau = float(0.5 * (x[i] + x[i + 1]))
    spread = float(np.std(x[:i + 1]))
    gap = float(x[i + 1] - x[i])
    ratio = gap / spread if spread > 0 else float("inf")
    if i + 1 < min_below or (min_gap_ratio is not None and ratio < min_gap_ratio):
        return no_split._replace(gap_ratio=ratio)
    return GapSplit(tau, True, i + 1, ratio)


def largest_gap_threshold(norms, *, log: bool = False, min_below: int = 1,
                          min_gap_ratio: float | None = None, zero_level: float = 0.0) -> float:
    """``τ_n`` of :func:`largest_gap_split` (its ``threshold``). The defaults here accept every
    split (the plain largest-gap rule); :func:`fit` uses the guarded split."""
    return largest_gap_split(norms, log=log, min_below=min_below, min_gap_ratio=min_gap_ratio,
                             zero_level=zero_level).threshold


def collaborative_set(block_norms, K: int, tau: float, alpha: float = 0.5):
    """Majority-vote collaborative set (8).

    ``Ĉ_α = {k : (1/(K-1)) Σ_{j≠k} 1{||Ŝ_{A⊥}^{(j,k)}||_F <= τ} >= α}``.

    Parameters
    ----------
    block_norms : array_like, shape (G,)
        Pair block norms in eq. (6) order, ``G = K(K-1)/2``.
    K : int
    tau : float
        ``τ_n >= 0``.
    alpha : float in [0.5, 1)

    Returns
    -------
    Votes
        ``benign`` bool (K,) and ``votes`` (K,), the fractions compared with ``α``.
    """
    K = check_int(K, "K", minimum=2)
    G = K * (K - 1) // 2
    norms = as_float_array(block_norms, "block_norms", shape=(G,))
    tau = check_positive(tau, "tau", strict=False)
    alpha = check_in_interval(alpha, "alpha", 0.5, 1.0, closed="left")
    close = pair_values_to_matrix((norms <= tau).astype(np.float64), K, fill=0.0)
    votes = close.sum(axis=1) / (K - 1)
    return Votes(votes >= alpha, votes)


def refine(W_hat, projector, benign) -> np.ndarray:
    """Refined estimates, eq. (9), written as the paper writes them.

    For ``k in Ĉ``: ``W̃^(k) = (1/|Ĉ|) Σ_{j in Ĉ} (Ŵ^(j) - L̂_A^{(j,k)})`` with the antisymmetric
    corrections ``L̂_A^{(j,k)} = (D̂ P_Â)^{(j,k)}`` for ``j < k``, ``-(D̂ P_Â)^{(k,j)}`` for
    ``j > k`` and 0 for ``j = k`` (blocks of ``D̂ P_Â`` in eq. (6) order). Clients outside ``Ĉ``
    keep their local estimate (the paper leaves them undefined; Table 1, which averages over all
    K clients, is consistent with this).

    The sum ``Σ_{j in Ĉ} L̂_A^{(j,k)}`` is ``-(E_Ĉ^T (D̂ P_Â))^{(k)}`` with ``E_Ĉ`` the signed
    client-pair incidence (:func:`~lowrank_fl.clair.contrasts.incidence`) restricted to pairs
    inside ``Ĉ``: a sparse product, memory ``O(G q p)`` (no ``|Ĉ| x |Ĉ|`` array of blocks).
    :func:`refine_closed_form` is the cheaper equivalent (S4.3).

    Parameters
    ----------
    W_hat : array_like, shape (K, q, p)
    projector : array_like, shape (p, p)
        ``P_Â`` (any p x p matrix is accepted; (9) is linear in it).
    benign : array_like of bool, shape (K,)
        ``Ĉ``.

    Returns
    -------
    ndarray, shape (K, q, p)
    """
    W = check_w_hat(W_hat)
    K, q, p = W.shape
    P = _check_projector(projector, p)
    b = check_benign(benign, K)
    C = np.flatnonzero(b)
    out = W.copy()
    if C.size == 0:
        return out
    DP = (contrasts(W) @ P).reshape(-1, q * p)              # (G, qp): (D̂ P_Â)^(j,k), j < k
    E = incidence(K, signed=True)                           # +1 at j, -1 at k for pair (j, k)
    inside = np.asarray(abs(E) @ b.astype(np.float64)).ravel() == 2     # both ends in Ĉ
    corr = np.asarray(E[inside].T @ DP[inside]).reshape(K, q, p)        # = -Σ_j L̂_A^{(j,k)}
    # W̃^(k) = mean_j Ŵ^(j) - mean_j L̂_A^{(j,k)}   (j over Ĉ)
    out[C] = W[C].mean(axis=0) + corr[C] / C.size
    return out


def refine_closed_form(W_hat, projector, benign) -> np.ndarray:
    """Closed form (S4.3) of (9): ``W̃^(k) = Ŵ^(k) P_Â + W̄_Ĉ (I - P_Â)`` for ``k in Ĉ``.

    Same arguments and result as :func:`refine` (excluded clients keep ``Ŵ^(k)``); cost
    ``O(K q p^2)``.
    """
    W = check_w_hat(W_hat)
    K, q, p = W.shape
    P = _check_projector(projector, p)
    b = check_benign(benign, K)
    out = W.copy()
    if not np.any(b):
        return out
    mean = W[b].mean(axis=0)
    out[b] = W[b] @ P + mean - mean @ P
    return out
