"""The small-federation guard on collaborative sets: a set that is not a strict majority decides
nothing.

CLAIR's set (8) assumes a benign majority: with ``α = 1/2`` the smallest set it can recover has
``⌊K/2⌋ + 1`` clients (Remark 3, :func:`lowrank_fl.clair.majority_pairs`). With few clients a
module's votes can still return a smaller set — at ``K = 4``, one client close to two others
whose mutual pairs are far collects two votes of three while nobody else does, and (8) returns
that client alone — and a client-level rule can spread such a set to every module (``"any"``),
flagging the majority and making one client's update everyone's mean. The guard refuses both:

* a set is **admissible** iff it holds a strict majority, ``|Ĉ| >= ⌊K/2⌋ + 1`` (so never a single
  client, and never a flagged majority);
* an inadmissible set becomes the **undecided** set, all False: every client keeps its own
  adapter there (:meth:`lowrank_fl.adapters.aggregate.ModuleResult.outputs` returns a client's own
  update outside the set) and nobody is flagged for it — an all-False set is how "the evidence
  cannot decide" is written, since no admissible set is empty;
* client-level rules read an undecided module as no evidence against anyone (it abstains).
"""
from __future__ import annotations

import numpy as np

__all__ = ["majority_size", "admissible", "guard_set", "is_undecided", "abstain", "decided_modules"]


def majority_size(K: int) -> int:
    """The smallest admissible collaborative set of ``K`` clients, ``⌊K/2⌋ + 1``."""
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K must be an int >= 1 (clients), got {K!r}")
    return int(K) // 2 + 1


def _flags(benign, name: str = "benign") -> np.ndarray:
    b = np.asarray(benign)
    if b.dtype != bool or b.ndim != 1 or b.size < 1:
        raise ValueError(f"{name} must be a non-empty 1-D bool array (one flag per client), got "
                         f"dtype {b.dtype}, shape {b.shape}")
    return b


def admissible(benign) -> bool:
    """Whether a collaborative set (bool per client) holds a strict majority of the clients."""
    b = _flags(benign)
    return int(b.sum()) >= majority_size(b.size)


def guard_set(benign) -> np.ndarray:
    """``benign`` where it is :func:`admissible`, else the undecided set (all False: every client
    keeps its own adapter)."""
    b = _flags(benign)
    return b.copy() if admissible(b) else np.zeros(b.size, bool)


def is_undecided(benign) -> bool:
    """Whether a (guarded) set is the undecided one (no client in it)."""
    return not _flags(benign).any()


def abstain(flags) -> np.ndarray:
    """Per-module sets ``(modules, K)`` for a client-level vote: an undecided module's row (all
    False) counts as no evidence against anyone (all True)."""
    f = np.asarray(flags, bool)
    if f.ndim != 2:
        raise ValueError(f"flags must be (modules, K) bool, got shape {f.shape}")
    out = f.copy()
    out[~f.any(axis=1)] = True
    return out


def decided_modules(sets: dict) -> dict:
    """``{module: set}`` without the undecided sets."""
    return {m: b for m, b in sets.items() if not is_undecided(np.asarray(b, bool))}
