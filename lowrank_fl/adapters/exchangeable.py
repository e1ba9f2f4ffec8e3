r"""Do the collaborating clients differ by noise alone? The pair pattern across modules.

Averaging pays where the clients' updates are noisy draws of one thing (a client's own update
and the others' differ by independent noise, which the mean removes) and hurts where each client
learned a task of its own. One update per client cannot separate a client's task from its noise
in general (a task orthogonal to everyone else's looks like noise to every second moment), but one
consequence of "noise alone" can be tested: the clients are then *exchangeable*, and which of
them resemble each other is chance — it does not repeat from one module to the next, because
each module's noise is drawn afresh. Where clients have tasks of their own (or share a
contamination, or a variant of the task with a few others), the same pairs agree more in every
module.

The statistic, per module ``m`` over the ``n`` collaborating clients: the pairwise cosines
``c_m(j, k)`` of their updates, minus the least-squares one-factor fit ``v_mj v_mk`` over the pairs
(a shared direction that clients carry in different amounts — uneven training, noisier clients —
gives cosines ``ρ_j ρ_k`` in every module: a *client* effect, not a pair pattern), each divided by
``sqrt((1 - v_mj²)(1 - v_mk²))`` (a client whose update is mostly the shared part has smaller cosine
noise with everyone, in every module alike), are the pair residuals ``e_m``
(:func:`pair_residuals`, length ``n(n-1)/2``); ``T = mean_{m ≠ m'} cos(e_m, e_m')``
(:func:`pattern_statistic`), about 0 where the pattern is chance and up to 1 where it repeats.
Its p-value is a permutation test (client labels permuted independently in each module,
:data:`N_PERMUTATIONS` = 999, seed 0, stopped early once 20 permuted statistics reach ``T``: exact
where the modules' residual patterns are unrelated, and close to calibrated for exchangeable
clients, whose fitted residuals are nearly so; on simulated exchangeable federations whose
clients carry a shared direction in amounts from 0.3 to 3, 3.5-7.5 % below 0.05 over 200
federations each, against 20-45 % for an additive client fit in place of the one-factor one).

The set is called *exchangeable* unless the pattern repeats significantly: ``p`` below
:data:`ALPHA` = 1 %. With fewer than :data:`MIN_CLIENTS` clients, or fewer than two modules where
every member's update is non-zero, nothing is decided and the set is not called exchangeable (the
refinement keeps the agreement alone). Why 1 %: on the trained families' batches of seeds
500-1503 (:mod:`lowrank_fl.nn.trained_families`) every ``*-personal`` set (each client a task of
its own, where averaging costs 0.07-0.21 of accuracy) had ``p`` at most 0.003, while 3 of the 88
``*-collab`` sets (clients fitting a few noisy examples of one shared task, where averaging pays)
fell below 1 % and 7 below 5 %; chosen there, a stated level. It cannot see clients whose tasks are
all different *and* unrelated to each other: no pair agrees more than another, and the set looks
exchangeable (module docstring of :mod:`.noharm`: the weight this licenses is chosen for that).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..validation import check_in_interval, check_int
from .updates import module_grams, zero_floor, zero_updates

__all__ = ["ALPHA", "MIN_CLIENTS", "N_PERMUTATIONS", "Exchangeability", "pair_residuals",
           "pattern_statistic", "exchangeability"]

#: the pair pattern repeats significantly below this permutation p-value (module docstring)
ALPHA = 0.01
#: fewer collaborating clients decide nothing (5 residual degrees of freedom per module at 5)
MIN_CLIENTS = 5
#: permutations of the p-value (resolution 0.001)
N_PERMUTATIONS = 999


@dataclass(frozen=True)
class Exchangeability:
    """The pair-pattern evidence of a collaborative set: ``statistic`` ``T`` (NaN where undecided),
    its permutation ``p_value`` (NaN where undecided), the ``modules`` and
    ``clients`` it read, the level ``alpha``, ``exchangeable`` (``p`` at least ``alpha``; False where
    undecided, None in :meth:`as_dict`: a reader of the summary's boolean alone must not take an
    undecided set for a structured one) and ``reason`` in words."""
    statistic: float
    p_value: float
    modules: int
    clients: int
    alpha: float
    exchangeable: bool
    reason: str

    def as_dict(self) -> dict:
        nan = np.isnan(self.statistic)
        return {"statistic": None if nan else float(self.statistic),
                "p_value": None if np.isnan(self.p_value) else float(self.p_value),
                "modules": self.modules, "clients": self.clients, "alpha": self.alpha,
                "exchangeable": None if nan else bool(self.exchangeable), "reason": self.reason}


_FIT_ITERATIONS = 500             # least-squares sweeps of the one-factor fit (tens in practice)
_FIT_TOLERANCE = 1e-9


def _one_factor(C) -> np.ndarray:
    """``v`` (modules, n) minimising ``sum_{j != k} (c_jk - v_j v_k)^2`` per module (the one-factor fit
    of the off-diagonal cosines): from the leading eigenpair of ``C`` (diagonal 0), damped Jacobi
    sweeps of the exact coordinate update ``v_j = sum_{k != j} c_jk v_k / sum_{k != j} v_k^2``."""
    n = C.shape[-1]
    Co = C * (1.0 - np.eye(n))
    w, V = np.linalg.eigh(Co)
    v = V[:, :, -1] * np.sqrt(np.maximum(w[:, -1], 0.0))[:, None]
    for _ in range(_FIT_ITERATIONS):
        num = np.einsum("mjk,mk->mj", Co, v)
        den = (v ** 2).sum(axis=1, keepdims=True) - v ** 2
        new = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
        new = 0.5 * (v + new)
        if np.max(np.abs(new - v), initial=0.0) < _FIT_TOLERANCE:
            return new
        v = new
    return v


def pair_residuals(grams, members=None) -> np.ndarray:
    """The pair residuals ``e_m`` (modules read, P) of the members' pairwise cosines per module
    after the one-factor fit ``c_mjk ≈ v_mj v_mk`` (module docstring); pairs ``j < k`` of the
    members in order. Modules where a member's update is zero (at most 1e-12 of the module's median
    norm) are not read."""
    G = _check_grams(grams)
    b = _check_members(members, G.shape[-1])
    G = G[:, b][:, :, b]
    n = int(b.sum())
    if n < 3:
        return np.zeros((0, max(n * (n - 1) // 2, 0)))
    d = np.sqrt(np.maximum(np.diagonal(G, axis1=1, axis2=2), 0.0))
    live = (d > zero_floor(d)).all(axis=1)                                 # every member trained it
    d = d[live]
    C = G[live] / (d[:, :, None] * d[:, None, :])
    v = _one_factor(C)
    j, k = np.triu_indices(n, 1)
    # a client whose update is mostly the shared part has smaller cosine noise with everyone, in
    # every module alike: standardise by the unshared fractions so that no variance pattern repeats
    q = np.sqrt(np.clip(1.0 - v ** 2, 1e-6, None))
    return (C[:, j, k] - v[:, j] * v[:, k]) / (q[:, j] * q[:, k])


def _check_grams(grams) -> np.ndarray:
    """Per-module Grams as (modules, K, K) (a (K, K) one is one module), symmetric."""
    G = module_grams(grams)
    scale = np.abs(G).max(initial=0.0)
    if not np.allclose(G, G.transpose(0, 2, 1), rtol=0.0, atol=1e-10 * scale):
        raise ValueError("grams must be symmetric (Gram matrices of the updates)")
    return G


def _check_members(members, K: int) -> np.ndarray:
    if members is None:
        return np.ones(K, bool)
    b = np.asarray(members)
    if b.shape != (K,) or not (b.dtype == bool or np.isin(b, (0, 1)).all()):
        raise ValueError(f"members must be a bool array of length K = {K}, got {b.dtype} of shape {b.shape}")
    return b.astype(bool)


def _unit_rows(E) -> np.ndarray:
    norm = np.linalg.norm(E, axis=-1, keepdims=True)
    return np.where(norm > 0, E / np.where(norm > 0, norm, 1.0), 0.0)


def _mean_pair_correlation(U) -> np.ndarray:
    """``mean_{m ≠ m'} <u_m, u_m'>`` (...,) of unit rows ``U`` (..., M, P): ``(|Σ u|² - Σ|u|²) / (M(M-1))``."""
    M = U.shape[-2]
    s = U.sum(axis=-2)
    return ((s * s).sum(axis=-1) - (U * U).sum(axis=(-2, -1))) / (M * (M - 1))


def pattern_statistic(residuals) -> float:
    """``T``: the mean over pairs of modules of the cosine between their pair residuals
    (:func:`pair_residuals`); NaN below two modules."""
    E = np.asarray(residuals, float)
    if E.ndim != 2 or E.shape[0] < 2:
        return float("nan")
    return float(_mean_pair_correlation(_unit_rows(E)))


def _permutation_p(E, n: int, T: float, n_permutations: int, seed: int) -> float:
    """The permutation p-value of ``T`` (client labels permuted independently per module): exact
    under "the modules' pair patterns are unrelated". Sequential (Besag and Clifford 1991): it
    stops at :data:`_STOP_HITS` permuted statistics at least ``T`` (``p = hits / permutations``,
    well above any usual level), else ``(hits + 1) / (n_permutations + 1)``."""
    U = _unit_rows(E)
    M = U.shape[0]
    j, k = np.triu_indices(n, 1)
    index = np.zeros((n, n), int)
    index[j, k] = np.arange(j.size)
    index[k, j] = np.arange(j.size)
    rng = np.random.default_rng(seed)
    hits = 0
    for done in range(1, n_permutations + 1):
        perm = np.argsort(rng.random((M, n)), axis=1)              # one relabelling per module
        cols = index[perm[:, j], perm[:, k]]                        # (M, P): pair (j, k) -> (π j, π k)
        hits += bool(_mean_pair_correlation(np.take_along_axis(U, cols, axis=1)) >= T - 1e-12)
        if hits >= _STOP_HITS:
            return hits / done
    return (hits + 1) / (n_permutations + 1)


_STOP_HITS = 20


def exchangeability(grams, members=None, *, alpha: float = ALPHA, n_permutations: int = N_PERMUTATIONS,
                    seed: int = 0) -> Exchangeability:
    """Whether the ``members`` (default: every client; clients whose update is zero to rounding are
    left out) of per-module Grams (modules, K, K) look exchangeable: the permutation p-value of ``T`` (:func:`pattern_statistic`) at least ``alpha``
    (module docstring). Deterministic given ``seed``; measured on one core: 0.06 s at ``n = 10``,
    8 modules; at ``n = 100``, 128 modules 2.5 s where the set is exchangeable (the permutations stop
    early) and up to about 20 s where it is not. Computed once per Gram and members (cached)."""
    n_permutations = check_int(n_permutations, "n_permutations", minimum=1)
    alpha = check_in_interval(alpha, "alpha", 0.0, 1.0)
    seed = check_int(seed, "seed", minimum=0)
    G = _check_grams(grams)
    # a client whose update is zero (to rounding) resembles nobody: it neither decides nor cancels
    b = _check_members(members, G.shape[-1]) & ~zero_updates(G)
    key = (hashlib.sha1(np.ascontiguousarray(G, float).tobytes()).hexdigest(), G.shape,
           b.tobytes(), float(alpha), int(n_permutations), int(seed))
    if key not in _CACHE:
        if len(_CACHE) >= 16:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _exchangeability(G, b, alpha, n_permutations, seed)
    return _CACHE[key]


_CACHE: dict = {}      # the refinement reads one test for its weights and again for its summary


def _exchangeability(grams, members, alpha, n_permutations, seed) -> Exchangeability:
    E = pair_residuals(grams, members)
    M = E.shape[0]
    n = int(members.sum())
    if n < MIN_CLIENTS or M < 2:
        why = (f"undecided: {n} collaborating clients with a non-zero update, at least {MIN_CLIENTS} needed"
               if n < MIN_CLIENTS else
               f"undecided: {M} module(s) where every collaborating client's update is non-zero, 2 needed")
        return Exchangeability(float("nan"), float("nan"), M, n, alpha, False, why)
    T = pattern_statistic(E)
    p = _permutation_p(E, n, T, n_permutations, seed)
    if p >= alpha:
        why = (f"which clients resemble each other does not repeat across modules (T = {T:.3f}, permutation "
               f"p = {p:.3g} >= {alpha:g}): their differences look like noise")
    else:
        why = (f"the same clients resemble each other across modules (T = {T:.3f}, permutation p = {p:.3g} "
               f"< {alpha:g}): clients have tasks, variants or contamination of their own")
    return Exchangeability(T, p, M, n, alpha, bool(p >= alpha), why)
