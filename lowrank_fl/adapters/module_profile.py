"""The module profile of the update rule (:mod:`.detect_updates`, where the rule's account of it
is): how each client's update is spread over the modules, blind to its size.

Per client ``k`` and module ``m``: ``p_mk = log ||ΔW_mk||_F - mean_m log ||ΔW_mk||_F`` (its centred
log norms), the residual ``r_mk = p_mk - median_j p_mj`` from the median profile, the distance
``d_k = sqrt(mean_m r_mk^2)`` and the score ``S_k = mean_m (r_mk / s)^2`` with one robust scale
``s = 1.4826 median |r_mk|`` over every residual. And, to tell a client spread unlike everyone from
one of a group that moved alike, the root-mean-square distance from its profile to its
*second*-nearest other client's (:func:`second_nearest_distances`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from scipy import stats

from ..validation import check_int
from .updates import module_grams, update_norms, zero_floor

__all__ = ["ModuleProfile", "nonempty_grams", "relative_logs", "module_profile", "profile_distances",
           "profile_scores", "second_nearest_distances", "profile_null_quantile"]

_PROFILE_DRAWS = 20_000        # null federations per quantile (the pooled rule's count)
_PROFILE_CHUNK = 4_000_000     # normal values per Monte Carlo chunk (memory bound)
_MAD_NORMAL = 1.0 / stats.norm.ppf(0.75)   # a normal's standard deviation per median absolute deviation
_PROFILE_SCALE_FLOOR = 1e-6    # the profile scale's floor, natural-log units (norms equal to 1e-6)


class ModuleProfile(NamedTuple):
    """Arrays are (K,): ``scores`` S, ``ratios`` ``d / median d`` (1 where every ``d`` is 0, inf for
    a ``d > 0`` against a median 0), ``distances`` d, ``second_nearest`` (:func:`second_nearest_distances`);
    ``modules``: how many modules the profile reads."""
    scores: np.ndarray
    ratios: np.ndarray
    distances: np.ndarray
    second_nearest: np.ndarray
    modules: int


def nonempty_grams(grams) -> np.ndarray:
    """:func:`~lowrank_fl.adapters.updates.module_grams` with at least one module."""
    G = module_grams(grams)
    if G.shape[0] == 0:
        raise ValueError(f"grams must be (modules, K, K) with at least one module, got {G.shape}")
    return G


def relative_logs(v, live=None) -> np.ndarray:
    """``log(v_mk / max_j v_mj)`` (live modules, K) for positive-or-zero values (modules, K): all-zero
    modules are left out (or those not in ``live``), zeros elsewhere count at
    :func:`~lowrank_fl.adapters.updates.zero_floor` (1e-12 of the module's median value)."""
    top = v.max(axis=1, keepdims=True)
    live = (top[:, 0] > 0) if live is None else live & (top[:, 0] > 0)
    return np.log(np.maximum(v[live], zero_floor(v)[live]) / top[live])


def _profile_logs(G) -> np.ndarray:
    """The log norms (profile modules, K) the module profile reads: a module where at least half of
    the clients' updates are zero is left out (where most clients left it untrained, the few that
    trained it are not "spread unlike the others")."""
    v = update_norms(G)
    return relative_logs(v, live=np.mean(v <= zero_floor(v), axis=1) < 0.5)


def _residuals(logs) -> np.ndarray:
    """``r_mk = p_mk - median_j p_mj`` (..., modules, K) from log values: each client's centred log
    profile minus the median profile."""
    p = logs - logs.mean(axis=-2, keepdims=True)
    return p - np.median(p, axis=-1, keepdims=True)


def _pooled_scores(r) -> np.ndarray:
    """``S_k = mean_m (r_mk / s)^2`` (..., K) with one robust scale over every (module, client)
    residual of ``r`` (..., modules, K): ``s = 1.4826 median |r_mk|`` (the residuals are deviations
    from the median client, so this is their MAD about 0), at least :data:`_PROFILE_SCALE_FLOOR`
    (identical profiles: a client that departs from them scores far out, whether the others tie
    exactly or up to rounding; every residual 0 gives ``S = 0``)."""
    flat = np.abs(r).reshape(r.shape[:-2] + (-1,))
    s = np.maximum(_MAD_NORMAL * np.median(flat, axis=-1), _PROFILE_SCALE_FLOOR)[..., None, None]
    return np.mean((r / s) ** 2, axis=-2)


def _second_nearest(r) -> np.ndarray:
    """(K,) from residuals (modules, K): each client's rms distance to its second-nearest other
    client's profile (inf below 3 clients)."""
    M, K = r.shape
    if K < 3:
        return np.full(K, np.inf)
    sq = np.einsum("mk,mk->k", r, r)
    D = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (r.T @ r), 0.0) / M)    # (K, K), no (M, K, K)
    np.fill_diagonal(D, np.inf)
    return np.partition(D, 1, axis=1)[:, 1]


def module_profile(grams) -> ModuleProfile:
    """The module profile (module docstring) of per-module Gram matrices (modules, K, K), in one
    pass over the norms. With one live module every profile is empty: ``S = 0``, ratio 1, ``d = 0``."""
    logs = _profile_logs(nonempty_grams(grams))
    M, K = logs.shape
    if M < 2:
        return ModuleProfile(np.zeros(K), np.ones(K), np.zeros(K), np.full(K, np.inf if K < 3 else 0.0), M)
    r = _residuals(logs)
    d = np.sqrt(np.mean(r ** 2, axis=0))
    med = float(np.median(d))
    ratio = d / med if med > 0 else np.where(d > 0, np.inf, 1.0)
    return ModuleProfile(_pooled_scores(r), ratio, d, _second_nearest(r), M)


def profile_distances(grams) -> np.ndarray:
    """``d_k`` (K,): the root-mean-square distance of client ``k``'s module profile (centred log norms,
    :func:`profile_scores`) from the median profile, in natural-log units (0 with one live module)."""
    return module_profile(grams).distances


def profile_scores(grams) -> tuple[np.ndarray, np.ndarray]:
    """``(S, ratio)`` (K,): the profile score ``S_k = mean_m (r_mk / s)^2`` of client ``k``'s residual
    profile ``r_mk = p_mk - median_j p_mj``, with ``p_mk = log ||ΔW_mk||_F - mean_m log ||ΔW_mk||_F``
    and one robust scale ``s = 1.4826 median |r_mk|`` over every residual (all modules and
    clients; at least 1e-6), and
    ``d_k / median_j d_j`` (1 where every ``d`` is 0; :func:`profile_distances`). Blind to each
    client's overall size. With one live module (all-zero modules left out, zeros elsewhere at
    1e-12 of the module's median norm) every profile is empty: ``S = 0``, ``ratio = 1``."""
    p = module_profile(grams)
    return p.scores, p.ratios


def second_nearest_distances(grams) -> np.ndarray:
    """(K,): the root-mean-square distance, in natural-log units, from client ``k``'s residual profile
    ``r_k`` to its second-nearest other client's, ``min`` over pairs ``j != j'`` of
    ``max(||r_k - r_j||, ||r_k - r_j'||) / sqrt(M)``: small where at least two other clients are
    spread alike (a group that trained alike), about ``d_k`` or more for a client spread unlike
    everyone; inf below 3 clients, 0 with one live module. Blind to each client's overall size."""
    return module_profile(grams).second_nearest


@functools.lru_cache(maxsize=128)
def profile_null_quantile(K: int, M: int, level: float) -> float:
    """The ``level`` quantile of ``max_k S_k`` for ``K`` clients whose log norms over ``M`` modules
    are i.i.d. normal (Monte Carlo, 20 000 federations, seed 0)."""
    K = check_int(K, "K", minimum=3)
    M = check_int(M, "M", minimum=2)
    rng = np.random.default_rng(0)
    per_chunk = max(1, _PROFILE_CHUNK // (K * M))
    tops = []
    for start in range(0, _PROFILE_DRAWS, per_chunk):
        n = min(per_chunk, _PROFILE_DRAWS - start)
        r = _residuals(rng.standard_normal((n, M, K)))
        tops.append(_pooled_scores(r).max(axis=-1))
    return float(np.quantile(np.concatenate(tops), level))
