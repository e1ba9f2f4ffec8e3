r"""Robust-FL aggregators (Byzantine-robust baselines) on the clients' exact ``ΔW``, in reduced
coordinates.

Each client's whole update is the vector of its modules' updates. With the joint bases of
:mod:`.reduce`, ``ΔW_k^m = U_m M_k^m V_m^T`` and ``(M ↦ U M V^T)`` is an isometry, so the
concatenation ``x_k = [vec(M_k^1), ..., vec(M_k^n)]`` (K, N) has exactly the pairwise distances
of the full updates, and any affine combination of the ``x_k`` lifts to the same combination of
the ``ΔW_k`` — without an out × in matrix. Definitions follow ByzFL (Allouah et al.,
``byzfl.aggregators``; the tests compare with it), ``f`` the number of tolerated Byzantine clients:

* ``"krum"`` — the client minimising the mean of its ``K - f - 1`` smallest squared distances to
  the others (ByzFL's score; Blanchard et al. 2017 sum ``K - f - 2``), **exact**;
* ``"multikrum"`` — the mean of the ``K - f`` clients with the smallest Krum scores, **exact**;
* ``"geomed"`` — the geometric median by smoothed Weiszfeld iterations (Pillutla et al.'s RFA),
  run to convergence (``nu`` relative to the updates' scale), **exact** (distances only);
* ``"median"``, ``"trimmed-mean"`` — coordinate-wise median / mean after dropping the ``f``
  largest and ``f`` smallest values per coordinate. These are **not** rotation-invariant: here
  they are computed on the coordinates ``M_k^m`` in each module's joint bases ``(U_m, V_m)`` (an
  orthonormal, data-dependent basis of the clients' joint row/column spaces), i.e. they are the
  coordinate-wise median / trimmed mean *in that basis*, lifted back. In the original
  out × in coordinates the result would be a full-rank matrix (not a LoRA adapter) and cost
  ``K · out · in`` memory per module; the reduced version keeps the output's rank at most
  ``min(q′, p′)`` and every client's own update exactly when all clients agree.

The output of every method is one adapter (``OUT/aggregated``); the methods that select clients
(Krum, Multi-Krum) report them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ROBUST_METHODS", "RobustResult", "default_f", "robust_combine", "krum_scores",
           "geometric_median"]

ROBUST_METHODS = ("krum", "multikrum", "median", "trimmed-mean", "geomed")


@dataclass(frozen=True)
class RobustResult:
    """``aggregate`` (N,): the combined vector; ``selected``: bool (K,) for Krum / Multi-Krum
    (None otherwise); ``weights`` (K,): the combination weights where the result is one (Krum,
    Multi-Krum, geometric median), else None; ``iterations``: Weiszfeld steps (geomed)."""

    aggregate: np.ndarray
    selected: np.ndarray | None
    weights: np.ndarray | None
    iterations: int = 0
    f: int | None = None


def default_f(K: int) -> int:
    """``f = ⌊(K - 3) / 2⌋`` (at least 0): the most Byzantine clients Krum's guarantee allows
    (``K > 2 f + 2``)."""
    return max((K - 3) // 2, 0)


def _check_f(f, K, method):
    if isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f < 0 or 2 * f >= K:
        raise ValueError(f"byzantine (f) must be an integer with 0 <= f and 2 f < K = {K} for "
                         f"{method!r}, got {f!r}")
    return int(f)


def _sq_distances(X):
    g = X @ X.T
    d = np.diag(g)
    return np.maximum(d[:, None] + d[None, :] - 2 * g, 0.0)


def krum_scores(X, f: int) -> np.ndarray:
    """Krum scores (K,) of the rows of ``X`` (K, N): mean of the ``K - f - 1`` smallest squared
    distances to the other rows (ByzFL's definition)."""
    K = X.shape[0]
    D = np.sort(_sq_distances(X), axis=1)[:, 1:K - f]
    return D.mean(axis=1)


def geometric_median(X, *, nu: float | None = None, max_iter: int = 1000, tol: float = 1e-10,
                     init=None):
    """Smoothed Weiszfeld iterations ``z ← Σ_k w_k x_k / Σ_k w_k``, ``w_k = 1 / max(||x_k - z||, ν)``.

    ``nu``: smoothing (default ``1e-9`` times the largest norm of ``X - mean``); ``init`` the start
    (default the mean); stops when ``||z_new - z|| <= tol · scale``. Returns
    ``(z, weights (K,) summing to 1, iterations)``.
    """
    X = np.asarray(X, dtype=float)
    z = X.mean(axis=0) if init is None else np.asarray(init, dtype=float).copy()
    scale = float(np.linalg.norm(X - X.mean(axis=0), axis=1).max())
    if nu is None:
        nu = 1e-9 * scale if scale > 0 else 1e-300
    w = np.full(X.shape[0], 1.0 / X.shape[0])
    it = 0
    for it in range(1, max_iter + 1):
        w = 1.0 / np.maximum(np.linalg.norm(X - z, axis=1), nu)
        w = w / w.sum()
        z_new = w @ X
        step = float(np.linalg.norm(z_new - z))
        z = z_new
        if step <= tol * max(scale, np.finfo(float).tiny):
            break
    return z, w, it


def robust_combine(X, method: str, f: int | None = None, *, max_iter: int = 1000,
                   tol: float = 1e-10) -> RobustResult:
    """Combine the clients' reduced update vectors ``X`` (K, N) with ``method`` (module docstring)."""
    if method not in ROBUST_METHODS:
        raise ValueError(f"method must be one of {list(ROBUST_METHODS)}, got {method!r}")
    X = np.asarray(X, dtype=float)
    K = X.shape[0]
    if method == "geomed":
        z, w, it = geometric_median(X, max_iter=max_iter, tol=tol)
        return RobustResult(z, None, w, it)
    if method == "median":
        return RobustResult(np.median(X, axis=0), None, None)
    f = _check_f(default_f(K) if f is None else f, K, method)
    if method == "trimmed-mean":
        return RobustResult(np.sort(X, axis=0)[f:K - f].mean(axis=0), None, None, f=f)
    scores = krum_scores(X, f)
    # stable order: ties go to the lower client index (np.argsort kind="stable")
    order = np.argsort(scores, kind="stable")
    sel = np.zeros(K, bool)
    sel[order[:1] if method == "krum" else order[:K - f]] = True
    w = sel / sel.sum()
    return RobustResult(w @ X, sel, w, f=f)
