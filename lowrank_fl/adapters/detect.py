r"""Client-level detection that pools the evidence of every module (our extension of (8)).

Per module, (8) is the paper's rule: a client is benign if at least a fraction ``α`` of its pair
block norms ``||D″_g (I - P′)||_F`` lie below the largest-gap ``τ``. On adapters people train
the per-module evidence is weak (the benign clients' own variation is large and the largest gap
rarely splits benign from contaminated pairs), while a contaminated client tends to stand out a
little in *many* modules. The pooled rule (``client_rule="pooled"``; the paper reports
client-level sets in §8 but never pools modules — this is ours) adds those small excesses up:

1. per module ``m`` and client ``k``, the median of ``k``'s ``K - 1`` pair block norms,
   ``s_mk = median_{j≠k} ||D″_(j,k) (I - P′)||_F`` (a contaminated client is far from most others;
   a benign client is far only from the contaminated ones, a minority);
2. standardised robustly across clients per module (so modules of every scale count alike),
   ``z_mk = (s_mk - median_k s_mk) / (1.4826 MAD_k s_mk)``;
3. averaged over modules, ``S_k = mean_m z_mk``;
4. re-standardised across clients, the modified z-score of Iglewicz & Hoaglin (1993),
   ``M_k = 0.6745 (S_k - median S) / MAD(S)``, and client ``k`` is flagged iff ``M_k > c_K``.

The cutoff is derived from a null model, not tuned on any adapter set. Iglewicz & Hoaglin's 3.5
is a per-observation cutoff; taken over all ``K`` clients with a MAD from ``K`` values it flags
someone in 7-12 % of federations of ``K = 5..10`` i.i.d. normal scores. Under no contamination
``S_k`` is an average of per-module scores, close to normal, so ``c_K`` is the ``1 - α``
quantile (``α = 0.01``, :data:`POOLED_ALPHA`) of ``max_k M_k`` for ``K`` i.i.d. normal ``S_k``
(Monte Carlo, 20 000 draws, fixed seed: deterministic), and never below 3.5:
``c_K ≈ 7.9, 6.4, 5.9, 4.6`` at ``K = 6, 8, 10, 20``. A federation without contamination then
keeps every client with probability about 99 % where the normal model holds. It does not hold
for a benign client whose task differs consistently across modules (an outlier of this very
statistic): on PEFT-trained sets (``benchmarks/bench_trained_detection.py``, reporting seeds) the
rule flagged a benign client in 1 of 4 federations without contamination, and found 9 of 24
contaminated clients where the per-module sets (8) found 2 (README, "Client-level detection").

Where a MAD is 0 (more than half of the values tie) the mean absolute deviation takes its place
with Iglewicz & Hoaglin's constant, ``(x - median) / (1.2533 · MeanAD)``; where both are 0 the
scores are 0 (nothing stands out). The median step makes the rule flag at most half of the
clients minus one, and a federation whose clients' scores are one homogeneous group keeps
everyone unless a client is c_K robust standard deviations out.
"""
from __future__ import annotations

import functools

import numpy as np

from ..clair import pairs

__all__ = ["POOLED_CUTOFF", "POOLED_ALPHA", "pooled_threshold", "robust_z", "pair_matrix", "client_medians", "pooled_scores",
           "pooled_flags"]

#: Iglewicz & Hoaglin's cutoff of the modified z-score (How to Detect and Handle Outliers, 1993):
#: the floor of the pooled rule's cutoff
POOLED_CUTOFF = 3.5
#: familywise false-flag level of the pooled rule under its null model (module docstring)
POOLED_ALPHA = 0.01
_NULL_DRAWS = 20000
_MAD_TO_SD = 1.4826            # 1 / Φ^{-1}(3/4): MAD of a normal sample -> its standard deviation
_MEANAD_TO_SD = 1.253314       # sqrt(π/2): mean absolute deviation -> standard deviation


def robust_z(x, axis: int = -1) -> np.ndarray:
    """``(x - median) / (1.4826 MAD)`` along ``axis`` (the modified z-score; MeanAD fallback and
    zeros where the spread is 0, module docstring)."""
    x = np.asarray(x, dtype=float)
    med = np.median(x, axis=axis, keepdims=True)
    dev = np.abs(x - med)
    mad = _MAD_TO_SD * np.median(dev, axis=axis, keepdims=True)
    meanad = _MEANAD_TO_SD * np.mean(dev, axis=axis, keepdims=True)
    scale = np.where(mad > 0, mad, meanad)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(scale > 0, (x - med) / np.where(scale > 0, scale, 1.0), 0.0)
    return z


def pair_matrix(norms, K: int) -> np.ndarray:
    """Symmetric (..., K, K) matrix of pair values (..., G) in eq. (6) order; NaN diagonal."""
    norms = np.asarray(norms, dtype=float)
    P = pairs(K)
    if norms.shape[-1] != len(P):
        raise ValueError(f"norms must have K(K-1)/2 = {len(P)} values per module, got {norms.shape[-1]}")
    out = np.full(norms.shape[:-1] + (K, K), np.nan)
    out[..., P[:, 0], P[:, 1]] = norms
    out[..., P[:, 1], P[:, 0]] = norms
    return out


def client_medians(norms, K: int) -> np.ndarray:
    """``s_mk = median_{j≠k}`` of client ``k``'s pair norms: (modules, K) from (modules, G)."""
    return np.nanmedian(pair_matrix(norms, K), axis=-1)


def pooled_scores(norms, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Pooled scores of the module docstring from block norms (modules, G).

    Returns ``(M, S)``: the modified z-scores ``M_k`` (K,) compared with :data:`POOLED_CUTOFF`,
    and the module-averaged standardised medians ``S_k`` (K,).
    """
    norms = np.atleast_2d(np.asarray(norms, dtype=float))
    if not np.all(np.isfinite(norms)) or np.any(norms < 0):
        raise ValueError("norms must be finite and non-negative")
    S = robust_z(client_medians(norms, K), axis=-1).mean(axis=0)
    return robust_z(S), S


@functools.lru_cache(maxsize=64)
def pooled_threshold(K: int, alpha: float = POOLED_ALPHA) -> float:
    """``c_K``: the ``1 - alpha`` quantile of the largest modified z-score of ``K`` i.i.d.
    normal values (Monte Carlo, :data:`_NULL_DRAWS` draws, seed 0), at least 3.5."""
    if int(K) != K or K < 3:
        raise ValueError(f"K must be an integer >= 3, got {K}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    x = np.random.default_rng(0).standard_normal((_NULL_DRAWS, int(K)))
    q = float(np.quantile(robust_z(x, axis=1).max(axis=1), 1.0 - alpha))
    return max(q, POOLED_CUTOFF)


def pooled_flags(norms, K: int, cutoff: float | None = None) -> np.ndarray:
    """Bool (K,): client flagged (contaminated) by the pooled rule (``cutoff`` default
    :func:`pooled_threshold` of ``K``)."""
    if cutoff is None:
        cutoff = pooled_threshold(K) if K >= 3 else np.inf
    return pooled_scores(norms, K)[0] > cutoff
