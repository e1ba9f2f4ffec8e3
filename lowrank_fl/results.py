"""Result objects and errors shared by every solver and federated algorithm.

* :class:`SolverResult` is the base of every convex-solver result (iterative or CVXPY): objective,
  duality gap, iterations, status. Problem-specific results subclass it and add the solution.
* :class:`Trace` is what every iterative federated method returns: per-round metrics and the final
  parameters.
* :class:`SolverError` is raised when a solver fails; it carries the solver's status.

Status vocabulary (strings, so results serialize to JSON as they are):

``"optimal"``            converged to the requested tolerance (CVXPY: status ``optimal``)
``"inaccurate"``         the library's own certificate (relative duality gap) misses the tolerance;
                         a ``ConvergenceWarning`` is issued (CVXPY's ``optimal_inaccurate`` is
                         re-decided by the certificate: ``"optimal"`` when it meets the tolerance)
``"max_iter"``           the iteration cap was hit before the tolerance (a warning is issued)
``"stalled"``            the certified gap stopped falling far above the tolerance (the stall rule
                         of :mod:`lowrank_fl.stall`; a :class:`StalledWarning` is issued): not
                         converged, exactly like ``"max_iter"``
``"completed"``          a fixed number of iterations/rounds was run as requested (no tolerance)
``"diverged"``           a non-finite value or a blow-up stopped the run; see ``diverged_at``
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

__all__ = ["SolverError", "ConvergenceWarning", "StalledWarning", "SolverResult", "Trace",
           "STATUSES"]

STATUSES = ("optimal", "inaccurate", "max_iter", "stalled", "completed", "diverged")


def _readonly(value):
    """A read-only view of an ndarray (mappings of arrays are frozen one level deep)."""
    if isinstance(value, np.ndarray):
        view = value.view()
        view.flags.writeable = False
        return view
    if isinstance(value, Mapping):
        return MappingProxyType({k: _readonly(v) for k, v in value.items()})
    return value


def freeze_arrays(result) -> None:
    """Make every ndarray field (and arrays inside mapping fields) of a frozen dataclass read-only."""
    for f in fields(result):
        value = getattr(result, f.name)
        frozen = _readonly(value)
        if frozen is not value:
            object.__setattr__(result, f.name, frozen)


class SolverError(RuntimeError):
    """A solver failed or could not certify its answer.

    Attributes
    ----------
    status : str or None
        The solver's own status string (e.g. CVXPY's ``"infeasible"`` or ``"optimal_inaccurate"``).
    """

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message if status is None else f"{message} (status: {status})")
        self.status = status


class ConvergenceWarning(UserWarning):
    """An iterative method stopped at its iteration cap before reaching its tolerance."""


class StalledWarning(ConvergenceWarning):
    """An iterative method stopped because its certified duality gap stalled far above its
    tolerance (status ``"stalled"``, :mod:`lowrank_fl.stall`); a :class:`ConvergenceWarning`, so
    every filter and handler of those treats it as one."""


@dataclass(frozen=True, kw_only=True)
class SolverResult:
    """Outcome of a convex solve.

    Attributes
    ----------
    objective : float
        Primal objective value at the returned point.
    gap : float
        Duality gap (primal minus a feasible dual value; ``nan`` where not available).
    iterations : int
        Iterations performed (CVXPY: the solver's count when reported, else -1).
    status : str
        One of :data:`STATUSES`.
    solver : str
        Which method produced it (``"fista"``, ``"proxgrad"``, ``"cvxpy:CLARABEL"``, ...).
    seconds : float
        Wall-clock time of the solve.
    history : mapping of str to ndarray
        Per-iteration diagnostics (e.g. ``"objective"``, ``"gap"``); may be empty.
    gap_scale : float or None
        The data-dependent scale :attr:`relative_gap` divides by (e.g. the objective at the
        zero point). ``None``: ``|objective|``.
    message : str
        One human-readable sentence on how the solve ended (why it stopped, what was certified).

    Every array of a result is read-only (a result is a record, not a workspace).
    """

    objective: float
    gap: float
    iterations: int
    status: str
    solver: str
    seconds: float = 0.0
    history: Mapping[str, np.ndarray] = field(default_factory=dict)
    gap_scale: float | None = None
    message: str = ""

    def __post_init__(self):
        freeze_arrays(self)

    @property
    def relative_gap(self) -> float:
        """``gap / gap_scale`` (``gap / |objective|`` when no scale was recorded).

        No floor at 1: convex objectives are homogeneous in the data, so a floor would make the
        relative gap (and every stopping rule built on it) depend on the units of the data.
        A zero scale gives 0 for a zero gap and ``inf`` otherwise.
        """
        scale = abs(float(self.objective)) if self.gap_scale is None else float(self.gap_scale)
        gap = float(self.gap)
        if scale > 0:
            return gap / scale
        return 0.0 if gap == 0 else (float("nan") if np.isnan(gap) else float("inf"))

    @property
    def converged(self) -> bool:
        return self.status == "optimal"


@dataclass(frozen=True, kw_only=True)
class Trace:
    """Per-round record of an iterative federated method.

    Attributes
    ----------
    method : str
        Name of the algorithm and variant (e.g. ``"fedrep"``, ``"flute[main]"``).
    distance : ndarray, shape (T+1,), or None
        Subspace distance to the ground truth at rounds 0..T; ``None`` when the problem has no
        ground truth (built from data). Entries not computed (after a divergence, after a
        tolerance stop, between ``record_every`` rounds) are ``nan``.
    loss : ndarray, shape (T+1,)
        Global loss at rounds 0..T (population loss where available, else empirical).
    bytes_up, bytes_down : ndarray, shape (T,)
        Bytes sent client→server and server→client in each round (float64 = 8 bytes per entry,
        summed over participating clients).
    status : str
        ``"completed"`` (the requested rounds were run), ``"optimal"`` (stopped on a tolerance),
        ``"max_iter"`` (a tolerance was requested and not reached) or ``"diverged"``.
    diverged_at : int or None
        The round at which a non-finite value appeared.
    B, heads, a, b : ndarray or None
        Final parameters, as they apply to the method: representation ``B`` (d, k), per-client
        heads (n, k), LoRA factors ``a``/``b``.
    extra : mapping
        Further per-round arrays or final quantities specific to the method.
    config : mapping
        The resolved settings of the run (``data`` regime, ``clients_per_round``, ``local_steps``,
        ``init`` recipe, ...), so a trace says how it was produced.

    Every array of a trace is read-only (a result is a record, not a workspace).
    """

    method: str
    distance: np.ndarray | None
    loss: np.ndarray
    bytes_up: np.ndarray
    bytes_down: np.ndarray
    status: str = "completed"
    diverged_at: int | None = None
    B: np.ndarray | None = None
    heads: np.ndarray | None = None
    a: np.ndarray | None = None
    b: np.ndarray | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        freeze_arrays(self)

    @property
    def rounds(self) -> int:
        """Number of rounds requested (``len(loss) - 1``)."""
        return len(self.loss) - 1

    @property
    def final_distance(self) -> float | None:
        """The distance at the last round that was computed: the round a tolerance stop or a
        divergence ended the run at (the returned ``B``), else round T. ``None`` when the problem
        has no ground truth (``distance is None``); ``nan`` only if no round was computed."""
        if self.distance is None:
            return None
        done = np.flatnonzero(np.isfinite(self.distance))
        return float(self.distance[done[-1]]) if done.size else float("nan")

    @property
    def total_bytes(self) -> float:
        return float(np.sum(self.bytes_up) + np.sum(self.bytes_down))
