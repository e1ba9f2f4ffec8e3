r"""The clients' raw updates of one module seen through their Gram matrix, exactly and cheaply.

Everything the update-level detection (:mod:`.detect_updates`) and the do-no-harm refinement
(:mod:`.noharm`) need is an inner product of two clients' updates,
``<ΔW_j, ΔW_k>_F = tr((s_j B_j)^T (s_k B_k) · A_k A_j^T)``: an (r_j × r_k) product on each side,
never an out × in matrix. In the reduced coordinates of :mod:`.reduce` (``ΔW_k = U M_k V^T``,
``M_k = Y_k X_k``, ``U`` and ``V`` isometries) the same numbers come from ``Y`` and ``X``.

Shapes: ``Y`` (K, q′, r), ``X`` (K, r, p′) (zero-padded ranks are fine); ``gram`` (K, K).
"""
from __future__ import annotations

import numpy as np

from ..clair import pairs
from ..validation import as_float_array

__all__ = ["update_gram", "update_norms", "unit_gram", "direction_distances", "raw_distances",
           "check_gram", "outside_shares", "update_sq_norms", "ZERO_RELATIVE", "DISTANCE_ROUNDING", "zero_updates",
           "zero_floor", "zero_module_counts",
           "module_grams"]

#: an update norm at most this fraction of the module's typical one (:func:`zero_floor`) is zero
#: (the Gram's rounding: a factor multiplied by 0 leaves about 1e-16 of the others' norms through
#: the cross products)
ZERO_RELATIVE = 1e-12
#: a squared distance at most this fraction of the two squared norms' sum is 0 (:func:`raw_distances`,
#: :func:`direction_distances`): the cancellation in ||a||² + ||b||² - 2<a, b> leaves about 1e-16 of
#: the sum for identical updates; 1e-13 keeps every distance above 3e-7 of the norms
DISTANCE_ROUNDING = 1e-13


def update_gram(Y, X) -> np.ndarray:
    """``G[j, k] = <Y_j X_j, Y_k X_k>_F`` (K, K) from reduced factors ``Y`` (K, q′, r) and ``X``
    (K, r, p′): ``sum((Y_j^T Y_k) ∘ (X_j X_k^T))``, two (K r)-square GEMMs,
    ``K^2 r^2 (q′ + p′)`` flops."""
    Y = np.asarray(Y, float)
    X = np.asarray(X, float)
    if Y.ndim != 3 or X.ndim != 3 or Y.shape[0] != X.shape[0] or Y.shape[2] != X.shape[1]:
        raise ValueError(f"Y (K, q', r) and X (K, r, p') must agree, got {Y.shape} and {X.shape}")
    K, _, r = Y.shape
    Yf = np.ascontiguousarray(Y.transpose(0, 2, 1)).reshape(K * r, -1)     # rows (client, a)
    Xf = X.reshape(K * r, -1)
    prod = ((Yf @ Yf.T) * (Xf @ Xf.T)).reshape(K, r, K, r)
    G = prod.sum(axis=(1, 3))
    return (G + G.T) / 2                                    # exactly symmetric


def check_gram(gram, name: str = "gram") -> np.ndarray:
    """A Gram matrix as (..., K, K) float64: finite, square, non-negative diagonal. Symmetry and
    Cauchy-Schwarz are not checked: a Gram computed in floating point meets them only up to its
    rounding, which can be large against a small product (factors that nearly cancel). A boolean array
    is refused (a mask passed by mistake would read as a Gram of 0/1)."""
    if np.asarray(gram).dtype == bool:
        raise TypeError(f"{name} must be a numeric Gram matrix of the updates, got a boolean array")
    raw = np.asarray(gram)
    if raw.dtype.kind == "f" and raw.ndim >= 2 and raw.shape[-1] == raw.shape[-2] and not np.all(np.isfinite(raw)):
        # name the clients (input order) whose squared norm is not finite: the updates to look at
        bad = np.flatnonzero(~np.isfinite(np.diagonal(raw, axis1=-2, axis2=-1).reshape(-1, raw.shape[-1]))
                             .all(axis=0)).tolist()
        which = f"; clients at positions {bad} (0-based, input order)" if bad else ""
        raise ValueError(f"{name} must be finite, got {int(np.sum(~np.isfinite(raw)))} non-finite entries (NaN "
                         f"or inf): an update with inf or NaN, or a norm overflowing float64{which}")
    G = as_float_array(gram, name)
    if G.ndim < 2 or G.shape[-1] != G.shape[-2]:
        raise ValueError(f"{name} must be (..., K, K), got shape {G.shape}")
    if np.any(np.diagonal(G, axis1=-2, axis2=-1) < 0):
        raise ValueError(f"{name} must have a non-negative diagonal (squared norms)")
    return G


def module_grams(grams, name: str = "grams") -> np.ndarray:
    """Per-module Grams as (modules, K, K) float64 (:func:`check_gram`; a (K, K) one is one module)."""
    G = check_gram(grams, name)
    G = G[None] if G.ndim == 2 else G
    if G.ndim != 3:
        raise ValueError(f"{name} must be (modules, K, K) or (K, K), got shape {G.shape}")
    return G


def zero_floor(norms) -> np.ndarray:
    """(..., 1): the norm at or below which a client's update of a module is zero, from the norms
    (..., K) of the module's updates: :data:`ZERO_RELATIVE` times the module's lower median norm
    (the ``(K-1)//2``-th smallest), or its largest where that is 0 (most clients left it
    untrained). A median, not the largest: a client whose update is scaled by 1e12 or more would
    otherwise make every other client's update "zero"; the lower one, since the mean of the two
    middle norms of an even K (K = 2: the attacker's and the other's) holds the attacker's."""
    n = np.asarray(norms, float)
    i = (n.shape[-1] - 1) // 2
    low = np.partition(n, i, axis=-1)[..., i:i + 1]
    return ZERO_RELATIVE * np.where(low > 0, low, n.max(axis=-1, keepdims=True))


def zero_updates(grams) -> np.ndarray:
    """(K,) bool: clients whose update is zero in every module of per-module Grams (modules, K, K) or
    (K, K) — a norm at most :func:`zero_floor` (all-zero modules count as zero for everyone)."""
    n = update_norms(grams)
    n = n[None] if n.ndim == 1 else n
    return np.all(n <= zero_floor(n), axis=0)


def update_norms(gram) -> np.ndarray:
    """``||ΔW_k||_F`` (..., K) from the Gram (..., K, K)."""
    G = check_gram(gram)
    return np.sqrt(np.maximum(np.diagonal(G, axis1=-2, axis2=-1), 0.0))


def unit_gram(gram) -> np.ndarray:
    """The Gram of the unit-norm updates ``ΔW_k / ||ΔW_k||_F`` (cosines; a zero update stays
    zero, so its distance to any unit update is 1)."""
    G = check_gram(gram)
    n = update_norms(G)
    inv = np.where(n > 0, 1.0 / np.where(n > 0, n, 1.0), 0.0)
    C = G * inv[..., :, None] * inv[..., None, :]
    return np.clip(C, -1.0, 1.0)


def _pair_values(Sq, K):
    P = pairs(K)
    return np.sqrt(np.maximum(Sq[..., P[:, 0], P[:, 1]], 0.0))


def _dist_sq(G):
    d = np.diagonal(G, axis1=-2, axis2=-1)
    both = d[..., :, None] + d[..., None, :]
    sq = both - 2 * G
    # ||a||² + ||b||² - 2<a, b> cancels for identical updates, leaving the Gram's rounding (a distance
    # near 1e-8 of the norms): read it as 0, or identical clients tie only up to rounding and the
    # robust scales built on these distances shrink to it (scores of 1e7 for a benign client)
    return np.where(sq <= DISTANCE_ROUNDING * both, 0.0, sq)


def direction_distances(gram) -> np.ndarray:
    """``||ΔW_j/||ΔW_j|| - ΔW_k/||ΔW_k|| ||_F = sqrt(2 - 2 cos)`` per pair (..., G), eq. (6)
    order: how differently two clients moved, whatever the size of their moves; 0 where ``2 - 2 cos``
    is at most ``2`` :data:`DISTANCE_ROUNDING` (rounding)."""
    G = unit_gram(gram)
    return _pair_values(_dist_sq(G), G.shape[-1])


def raw_distances(gram) -> np.ndarray:
    """``||ΔW_j - ΔW_k||_F`` per pair (..., G), eq. (6) order (the raw contrasts' norms); 0 where the
    squared distance is at most :data:`DISTANCE_ROUNDING` of ``||ΔW_j||² + ||ΔW_k||²`` (rounding)."""
    G = check_gram(gram)
    return _pair_values(_dist_sq(G), G.shape[-1])


def outside_shares(Y, X, Z) -> np.ndarray:
    """``||M_k (I - Z Z^T)||_F / ||M_k||_F`` (K,) for ``M_k = Y_k X_k`` (reduced coordinates) and
    an orthonormal ``Z`` (p′, r): the share of each update outside the row space ``col(Z)``
    (0 for a zero update). ``tr(Y_k^T Y_k · X̃_k X̃_k^T)`` with ``X̃_k = X_k (I - Z Z^T)``: r × r
    products only."""
    Y = np.asarray(Y, float)
    X = np.asarray(X, float)
    Z = np.asarray(Z, float)
    Xo = X - (X @ Z) @ Z.T
    YtY = np.einsum("kqa,kqb->kab", Y, Y)
    out = np.einsum("kab,kab->k", YtY, np.einsum("kap,kbp->kab", Xo, Xo))
    tot = np.einsum("kab,kab->k", YtY, np.einsum("kap,kbp->kab", X, X))
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(tot > 0, np.sqrt(np.clip(out / np.where(tot > 0, tot, 1.0), 0.0, 1.0)), 0.0)
    return share


def update_sq_norms(Y, X) -> np.ndarray:
    """``||Y_k X_k||_F^2`` (K,): the diagonal of :func:`update_gram` alone, r × r products."""
    Y = np.asarray(Y, float)
    X = np.asarray(X, float)
    return np.einsum("kab,kab->k", np.einsum("kqa,kqb->kab", Y, Y), np.einsum("kap,kbp->kab", X, X))


def zero_module_counts(grams, names) -> dict:
    """``zero_modules``: per client, the number of modules where its update is zero while another client's
    is not (a norm at most 1e-12 of the module's median, :func:`zero_floor`:
    the Gram's rounding, where the module profile counts it as zero); ``live_modules``: the number of
    modules where some update is not zero."""
    n = update_norms(grams)                                                          # (modules, K)
    live = n.max(axis=1) > 0
    zeros = (n[live] <= zero_floor(n)[live]).sum(axis=0).astype(int).tolist()
    return {"zero_modules": dict(zip(names, zeros)), "live_modules": int(live.sum())}


def untrained_clients(grams) -> np.ndarray:
    """Bool (K,): the clients whose update is zero in every module where some update is not (PEFT's
    initial state; :func:`zero_floor`); all False where no update is. Where they are more than half,
    the update rule abstains (:func:`lowrank_fl.adapters.aggregate.client_decision`): the typical
    update is then zero, and every client that trained stands out against it whatever it learned."""
    n = update_norms(grams)                                                          # (modules, K)
    live = n.max(axis=1) > 0
    if not live.any():
        return np.zeros(n.shape[1], bool)
    return (n[live] <= zero_floor(n)[live]).all(axis=0)
