"""Shared per-round bookkeeping for the iterative federated methods.

Every algorithm records, per round, the subspace distance to the truth, the global loss and the
bytes communicated, and stops with status ``"diverged"`` at the first non-finite value. This module
holds that logic once::

    rec = TraceRecorder("fedrep", rounds, truth=problem.B_star)
    rec.record(0, B, loss0)
    for t in range(1, rounds + 1):
        ...
        rec.communicate(t, up=n_clients * d * k, down=n_clients * d * k)   # entries, not bytes
        if not rec.record(t, B, loss):      # False once diverged: stop iterating
            break
    return rec.finish(B=B, heads=W)
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np

from ..linalg import subspace_distance
from ..results import ConvergenceWarning, Trace

BYTES_PER_ENTRY = 8  # float64

__all__ = ["TraceRecorder", "BYTES_PER_ENTRY"]


class TraceRecorder:
    """Collects per-round metrics and builds the :class:`~lowrank_fl.results.Trace`.

    Parameters
    ----------
    method : str
        Name stored in the trace.
    rounds : int
        Number of rounds T; arrays have T+1 entries (distance, loss) or T entries (bytes).
    truth : ndarray (d, k) or None
        Ground-truth representation; the distance is ``subspace_distance(truth, B)``. Without a
        truth and without explicit ``record(..., distance=...)`` values the trace's ``distance``
        is ``None`` (a problem built from data has no distance to report).
    divergence_threshold : float
        A loss or parameter norm above this counts as divergence (besides NaN/inf).
    config : mapping, optional
        The run's resolved settings, stored as ``Trace.config``.

    A run that diverges, or that stops at its round cap short of a requested tolerance
    (``finish(status="max_iter")``), issues a :class:`~lowrank_fl.results.ConvergenceWarning`
    here, once for every method: the status alone is too easy to miss.
    """

    def __init__(self, method: str, rounds: int, truth=None, *, divergence_threshold: float = 1e150,
                 config: Mapping[str, Any] | None = None):
        self.method = method
        self.config = dict(config or {})
        self.truth = None if truth is None else np.asarray(truth, dtype=np.float64)
        self.distance = np.full(rounds + 1, np.nan)
        self.loss = np.full(rounds + 1, np.nan)
        self.bytes_up = np.zeros(rounds)
        self.bytes_down = np.zeros(rounds)
        self.threshold = divergence_threshold
        self.diverged_at: int | None = None
        self.extra: dict[str, np.ndarray] = {}
        self._explicit_distance = False

    def communicate(self, t: int, *, up: float, down: float) -> None:
        """Record ``up``/``down`` float64 *entries* sent in round ``t`` (1-based)."""
        self.bytes_up[t - 1] = BYTES_PER_ENTRY * up
        self.bytes_down[t - 1] = BYTES_PER_ENTRY * down

    def record(self, t: int, rep=None, loss: float = np.nan, *, distance: float | None = None,
               **params) -> bool:
        """Record round ``t``; returns False (and marks divergence) on a non-finite or huge value.

        ``rep`` is the current representation (its distance to ``truth`` is computed; a
        rank-deficient ``rep`` is at distance 1, see ``subspace_distance(..., rank_deficient="span")``) unless an
        explicit ``distance`` is given. Extra keyword arrays are checked for finiteness too.
        """
        values = [np.asarray(loss, dtype=float)] + [np.asarray(v, dtype=float) for v in params.values()]
        if rep is not None:
            values.append(np.asarray(rep, dtype=float))
        bad = any(not np.all(np.isfinite(v)) or (v.size and np.max(np.abs(v)) > self.threshold)
                  for v in values)
        if bad:
            self.diverged_at = t
            return False
        self.loss[t] = loss
        if distance is not None:
            self._explicit_distance = True
            self.distance[t] = distance
        elif rep is not None and self.truth is not None:
            self.distance[t] = subspace_distance(self.truth, rep, rank_deficient="span")
        return True

    def record_extra(self, name: str, t: int, value, length: int | None = None) -> None:
        """Store a per-round scalar under ``extra[name]`` (array of T+1 entries by default)."""
        if name not in self.extra:
            self.extra[name] = np.full(length or len(self.distance), np.nan)
        self.extra[name][t] = value

    def finish(self, *, status: str | None = None, **final) -> Trace:
        """Build the trace; ``final`` holds the final parameters (``B``, ``heads``, ``a``, ``b``)
        and any other entries for ``Trace.extra``.

        ``status`` overrides the default (``"completed"``) for a run that stopped on a tolerance
        (``"optimal"``) or at its cap short of one (``"max_iter"``, which warns); a divergence
        always wins and warns.
        """
        known = {k: final.pop(k) for k in ("B", "heads", "a", "b") if k in final}
        extra = {**self.extra, **final}
        if self.diverged_at is not None:
            status = "diverged"
            warnings.warn(f"{self.method} diverged at round {self.diverged_at} (a non-finite value "
                          f"or one above {self.threshold:.0e}); the trace stops there",
                          ConvergenceWarning, stacklevel=3)
        elif status == "max_iter":
            warnings.warn(f"{self.method} reached its round cap before its tolerance",
                          ConvergenceWarning, stacklevel=3)
        distance = self.distance if (self.truth is not None or self._explicit_distance) else None
        return Trace(method=self.method, distance=distance, loss=self.loss,
                     bytes_up=self.bytes_up, bytes_down=self.bytes_down,
                     status=status or "completed", diverged_at=self.diverged_at, extra=extra,
                     config=self.config, **known)
