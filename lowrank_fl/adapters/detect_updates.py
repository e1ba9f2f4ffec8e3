r"""Client-level detection on the clients' raw updates: how *differently* and how *far* each client
moved (``client_rule="updates"``, the default; ours, like the pooled rule of :mod:`.detect`).

Why not the block norms of (8). Federated LoRA starts every client from the server's common
LoRA initialization (PEFT's default: the same ``A``, ``B = 0``), so most of every update — and of
a contaminated client's difference — lies in one shared row space, which the ``(I - P_Â)`` of
(8) removes together with the contamination. And a benign client that trained harder (more
steps, a larger learning rate) moved *farther* in the same direction: a rule on distances flags
it. So the evidence here is taken from the updates themselves (their Gram matrix per module,
:mod:`.updates`), split into the two things that can differ:

* **direction** — per module ``m`` the distance between unit-norm updates,
  ``d_m(j, k) = ||ΔW_mj/||ΔW_mj|| - ΔW_mk/||ΔW_mk|| ||_F = sqrt(2 - 2 cos)``, blind to how far a
  client moved. It enters the pooled statistic of :mod:`.detect` unchanged (median over the
  other clients, robust z across clients per module, averaged over modules, modified z-score
  against the cutoff), with a materiality condition on agreement rather than distance: the
  client's agreement with the others (its median cosine with them, mean over modules) is at most
  ``1/ρ`` (``ρ = 1.2``) of the typical client's. Why not the distance ratio of the pooled rule:
  distances between unit vectors concentrate near ``sqrt(2)`` when updates share little, so a
  client sharing *nothing* with a federation whose clients share 20 % of their direction is only
  1.12 times as far as a typical one; and where they share 90 %, a benign client that trained
  harder and shares 85 % is 1.22 times as far. Agreement measures what matters, the part of the
  federation's direction a client carries: 0 against 0.2 is material, 0.85 against 0.9 is not. A
  sign-flipped update has negative agreement. Where the typical agreement is not positive, there
  is no shared direction to deviate from and direction flags nobody.
* **row-space share** — per module the share of each update outside the module's shared row
  space ``P_Â`` (``||ΔW_k (I - P_Â)|| / ||ΔW_k||``: CLAIR's model (3)-(4) per client, scale-free),
  pooled the same way, with the distance-ratio floor ``ρ`` on it.
* **size** — ``ℓ_k = mean_m log ||ΔW_mk||_F``; flagged where its modified z-score exceeds the
  cutoff *and* the update is at least ``ρ_size`` = :data:`SIZE_RATIO` = 5 times the typical
  client's (``exp(ℓ_k - median ℓ)``). Why 5: under Adam every step moves each coordinate by
  about the learning rate, so an honest client that trains ``f`` times longer or with an ``f``
  times larger learning rate moves at most about ``f`` times as far, and less once its loss
  flattens (1.8-2.0× the median for ``f = 3`` on the benchmark's federations); 5 admits ``f`` up
  to 5 and flags an update scaled by 10 even where the attacker's own update was half the typical
  size. A scaled update (× 10, × 1e3, × 1e6) is flagged; an honest client with three times the
  steps or the learning rate is not. It is a stated policy, not a derived level.

A client is flagged if any of the three holds. The statistics are monotone in how far out a
client is: scaling one client's update up raises its size score and ratio and leaves every
direction unchanged, so a client farther out is never less flagged. Non-finite updates, and
norms overflowing float64, are refused (:func:`lowrank_fl.adapters.updates.check_gram`).

The cutoff of each statistic is the pooled rule's ``c_K`` at level 1 %/3
(:func:`rule_cutoff`: Bonferroni over the three, 1 % familywise for ``K`` exchangeable normal
scores, at least 3.5); like the pooled rule, each flags at most half of the clients minus one,
and the small-federation guard (:mod:`.guard`) keeps every decision a strict majority.
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from ..validation import as_float_array, check_int
from .detect import POOLED_ALPHA, POOLED_MIN_RATIO, pooled_ratios, pooled_scores, pooled_threshold, robust_z
from .updates import check_gram, direction_distances, unit_gram, update_norms

__all__ = ["SIZE_RATIO", "UpdateEvidence", "update_evidence", "update_flags", "size_scores", "rule_cutoff",
           "agreement_shares"]

#: an update at least this many times the typical client's norm (geometric mean over modules)
#: is materially out (module docstring: honest unevenness up to 5x, a tenfold update caught)
SIZE_RATIO = 5.0


class UpdateEvidence(NamedTuple):
    """What the update rule computes, once. Arrays are (K,).

    ``direction_scores``: the pooled statistic on the direction distances; ``agreement_ratios``:
    each client's agreement (median cosine with the others, mean over modules) over the typical
    client's (1 typical, NaN where the typical agreement is not positive); ``outside_scores`` / ``outside_ratios``: the same on the shares outside
    the shared row space (None where not given); ``size_scores``: modified z of ``ℓ_k``;
    ``size_ratios``: ``exp(ℓ_k - median ℓ)``; ``cutoff`` c (``inf`` below 3 clients);
    ``min_ratio`` ρ; ``size_ratio`` ρ_size; ``by_direction``, ``by_outside``, ``by_size``,
    ``flagged`` bool."""
    direction_scores: np.ndarray
    agreement_ratios: np.ndarray
    outside_scores: np.ndarray | None
    outside_ratios: np.ndarray | None
    size_scores: np.ndarray
    size_ratios: np.ndarray
    cutoff: float
    min_ratio: float
    size_ratio: float
    by_direction: np.ndarray
    by_outside: np.ndarray
    by_size: np.ndarray
    flagged: np.ndarray


def _grams(grams) -> np.ndarray:
    G = check_gram(grams, "grams")
    if G.ndim == 2:
        G = G[None]
    if G.ndim != 3 or G.shape[0] == 0:
        raise ValueError(f"grams must be (modules, K, K) with at least one module, got {G.shape}")
    return G


def _log_ratios(v) -> tuple[np.ndarray, np.ndarray]:
    """Modified z of ``mean_m log v_mk`` and ``exp(. - median)`` for positive-or-zero values
    (modules, K); all-zero modules are left out, zeros elsewhere count at 1e-12 of the module's
    largest value."""
    top = v.max(axis=1, keepdims=True)
    live = top[:, 0] > 0
    if not live.any():
        K = v.shape[1]
        return np.zeros(K), np.ones(K)
    v, top = v[live], top[live]
    ell = np.log(np.maximum(v, 1e-12 * top) / top).mean(axis=0)   # scale-free per module
    return robust_z(ell), np.exp(ell - np.median(ell))


def size_scores(grams) -> tuple[np.ndarray, np.ndarray]:
    """``(z, ratio)`` (K,): the modified z-score of ``ℓ_k = mean_m log ||ΔW_mk||_F`` and
    ``exp(ℓ_k - median ℓ)``. Modules where every client's update is zero are left out; a zero
    update elsewhere counts at ``1e-12`` of the module's largest norm (far below everyone)."""
    return _log_ratios(update_norms(_grams(grams)))


def agreement_shares(grams) -> np.ndarray:
    """``m_k / median_k m_k`` (K,) with ``m_k`` the mean over modules of client ``k``'s median
    cosine with the other clients' updates: how much of the typical client's agreement with the
    federation a client has (1 typical, 0 none, negative: it points away). NaN everywhere when
    the typical agreement is not positive (no shared direction to deviate from)."""
    C = unit_gram(_grams(grams))                          # (modules, K, K) cosines
    K = C.shape[-1]
    off = np.where(np.eye(K, dtype=bool), np.nan, C)
    m = np.nanmedian(off, axis=-1).mean(axis=0)           # (K,)
    typical = float(np.median(m))
    if not typical > 0:
        return np.full(K, np.nan)
    return m / typical


def _positive(v, name):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite real number >= 0, got {v!r}")
    return float(v)


def rule_cutoff(K: int) -> float:
    """The cutoff of each of the three statistics: ``c_K`` at level ``POOLED_ALPHA / 3``
    (Bonferroni over direction, row space and size: 1 % familywise under the null)."""
    return pooled_threshold(K, POOLED_ALPHA / 3) if K >= 3 else np.inf


def update_evidence(grams, outside=None, cutoff: float | None = None,
                    min_ratio: float = POOLED_MIN_RATIO, size_ratio: float = SIZE_RATIO) -> UpdateEvidence:
    """The update rule (module docstring) on per-module Gram matrices ``grams`` (modules, K, K)
    of the clients' updates (:func:`lowrank_fl.adapters.updates.update_gram`) and, optionally,
    each update's share outside the module's shared row space ``outside`` (modules, K)
    (:func:`lowrank_fl.adapters.updates.outside_shares`).

    ``cutoff``: the modified z-score a flag needs (default :func:`rule_cutoff`; ``inf`` flags
    nobody); ``min_ratio`` ρ and ``size_ratio`` ρ_size: the materiality floors (0 turns one off)."""
    G = _grams(grams)
    K = check_int(G.shape[-1], "K", minimum=2)
    min_ratio = _positive(min_ratio, "min_ratio")
    size_ratio = _positive(size_ratio, "size_ratio")
    if cutoff is None:
        cutoff = rule_cutoff(K)
    elif isinstance(cutoff, bool) or not isinstance(cutoff, numbers.Real) or np.isnan(cutoff):
        raise ValueError(f"cutoff must be a real number (or None: the rule's cutoff), got {cutoff!r}")
    d = direction_distances(G)                            # (modules, G)
    Md, _ = pooled_scores(d, K)
    Rd = agreement_shares(G)
    Ms, Rs = size_scores(G)
    # materially out: it agrees with the others at most 1/ρ as much as the typical client does
    by_dir = (Md > cutoff) & (np.nan_to_num(Rd, nan=np.inf) <= (1.0 / min_ratio if min_ratio > 0 else np.inf))
    by_size = (Ms > cutoff) & (Rs >= size_ratio)
    Mo = Ro = None
    by_out = np.zeros(K, bool)
    if outside is not None:
        o = as_float_array(outside, "outside", ndim=(1, 2))
        o = np.atleast_2d(o)
        if o.shape != (G.shape[0], K) or np.any(o < 0) or np.any(o > 1 + 1e-9):
            raise ValueError(f"outside must be (modules, K) = {(G.shape[0], K)} shares in [0, 1], "
                             f"got shape {o.shape}")
        Mo = robust_z(robust_z(o, axis=-1).mean(axis=0))
        _, Ro = _log_ratios(o)
        by_out = (Mo > cutoff) & (Ro >= min_ratio)
    return UpdateEvidence(Md, Rd, Mo, Ro, Ms, Rs, float(cutoff), min_ratio, size_ratio, by_dir, by_out,
                          by_size, by_dir | by_out | by_size)


def update_flags(grams, outside=None, **kwargs) -> np.ndarray:
    """Bool (K,): clients flagged by the update rule (:func:`update_evidence`)."""
    return update_evidence(grams, outside, **kwargs).flagged
