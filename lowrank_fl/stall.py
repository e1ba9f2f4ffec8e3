"""The stall rule of the certified iterative solvers: stop a solve whose duality gap stopped falling.

A solver that reports a certified duality gap (FISTA and Algorithm 1 for CLAIR's program (7), the
factored FISTA of the adapters, FISTA for nuclear-norm least squares) knows how fast a healthy
solve closes it. FISTA's suboptimality bound falls like ``1/k^2`` and proximal gradient's
(Algorithm 1) like ``1/k``: from iteration ``k / c`` to ``k`` a healthy solve gains about ``c^2``
resp. ``c`` (in practice more: these programs converge linearly once the rank and the support
are identified). A wrong solver (a step, a threshold, a gradient off by a factor) converges to the
wrong point, where its certificate plateaus far above the tolerance, and used to run to
``max_iter``.

**Rule.** At a gap check at iteration ``k`` with ``k / c >= START`` (``c`` the window,
``stall_window=``), ``k'`` the last check at or before ``k / c``, the solve stops with status
``"stalled"`` when the best certified relative gap so far, ``g(k)``, is above ``MARGIN * tol``
and over the window

* the gap has not fallen by the factor ``FACTOR``: ``g(k) > g(k') / FACTOR``, and
* the objective has stopped falling: ``F(k') - F(k) <= DESCENT * g(k)`` (relative objective
  ``F``, the program's at the iterate).

The second condition is what tells a broken solver from a slow one. These methods decrease the
objective at every step unless the iterate is a fixed point of the iteration, and a fixed point
of a correct iteration is an optimum (gap 0): an objective that stopped moving while the gap
stays far above ``tol`` means the iteration converged to a point that is not the optimum (a wrong
step, threshold or gradient). A healthy but ill-conditioned solve (a noiseless program at a tiny
``lam``, whose gap sits still for hundreds of iterations before it falls) keeps lowering its
objective and is not stopped.
Constants: ``FACTOR = 2``, ``DESCENT = 1e-4``, ``START = 25`` iterations (the first iterations
may plateau while the rank and the support are found), ``MARGIN = 2`` (a plateau within twice
``tol``, e.g. at the certificate's rounding floor, runs to ``max_iter`` as before). Default
windows (:data:`DEFAULT_WINDOWS`): 4 for FISTA (a healthy solve gains ~16 over the window where
the rule asks for 2) and 8 for proximal gradient (~8 where the rule asks for 2). A stalled solve
is not converged, exactly like one at ``max_iter``: it warns (:class:`~lowrank_fl.results.StalledWarning`,
a :class:`~lowrank_fl.results.ConvergenceWarning`) and its ``message`` states the gap reached,
the iteration and the window. ``stall_window=None`` turns the rule off; a run of a fixed number
of iterations (``tol=None``) never stalls.
"""
from __future__ import annotations

import bisect
import numbers
import warnings

from .results import ConvergenceWarning, StalledWarning

__all__ = ["StallRule", "FACTOR", "DESCENT", "START", "MARGIN", "DEFAULT_WINDOWS",
           "check_stall_window", "INACCURATE"]

#: a solve goes on while, over each window, its best gap falls by this factor ...
FACTOR = 2.0
#: ... or its objective falls by more than this fraction of the best gap
DESCENT = 1e-4
#: the rule applies once the window's start ``k / c`` is at least this iteration
START = 25
#: a plateau within this factor of ``tol`` is not a stall (it runs to ``max_iter``)
MARGIN = 2.0
#: status of a solve whose certificate broke (:meth:`StallRule.broken`): not converged
INACCURATE = "inaccurate"
#: default window ``c`` per method family: FISTA (rate 1/k^2) and proximal gradient (rate 1/k)
DEFAULT_WINDOWS = {"fista": 4.0, "proxgrad": 8.0}


def check_stall_window(value, name: str = "stall_window"):
    """``None`` (rule off) or a float ``> 1``; a clear error naming ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number > 1 or None (rule off), got {type(value).__name__}")
    value = float(value)
    if not value > 1.0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 1 (the window runs from k / "
                         f"{name} to k) or None (rule off), got {value!r}")
    return value


class StallRule:
    """The rule of the module docstring for one solve: feed it every gap check with
    :meth:`check`; ``None`` window or tolerance: never stalls."""

    def __init__(self, window: float | None, tol: float | None):
        self.window = window
        self.tol = tol
        self._its: list[int] = []
        self._best: list[float] = []
        self._obj: list[float] = []
        self.since: int | None = None      # the window's start when the rule fired
        #: the objective where the iterates started (absolute, as the solver computes it): a solve
        #: that stalls above it has moved away from every optimum, and its solver reports it
        #: "diverged" (a step too large), not "stalled"; ``inf``: not told
        self.start_objective = float("inf")

    @property
    def active(self) -> bool:
        return self.window is not None and self.tol is not None

    @property
    def best(self) -> float:
        """Best relative gap recorded so far (``inf`` before the first check)."""
        return self._best[-1] if self._best else float("inf")

    def check(self, it: int, relative_gap: float, relative_objective: float) -> bool:
        """Record the certified relative gap and the relative objective (both divided by the
        same scale) at iteration ``it``; True when the solve stalled."""
        if not self.active:
            return False
        g = float(relative_gap)
        best = min(self.best, g) if g == g else self.best
        self._its.append(int(it))
        self._best.append(best)
        self._obj.append(float(relative_objective))
        start = it / self.window
        if start < START or not best > MARGIN * self.tol:
            return False
        i = bisect.bisect_right(self._its, start) - 1
        if i < 0 or best * FACTOR < self._best[i]:
            return False
        if self._obj[i] - self._obj[-1] > DESCENT * best:     # still descending: slow, not stuck
            return False
        self.since = self._its[i]
        return True

    def above_start(self, objective: float) -> bool:
        """True when ``objective`` (absolute) is above :attr:`start_objective` by more than 1e-9 of
        it: a stalled solve there has moved away from every optimum (a warm start at the optimum
        whose certificate stalls is not taken for it by rounding)."""
        return objective > self.start_objective + 1e-9 * abs(self.start_objective)

    def broken(self, relative_gap: float) -> bool:
        """True when the certified relative gap is below ``-tol``: weak duality makes every gap
        non-negative, so the certificate is rounding (data far smaller than the numbers they were
        computed from), it cannot certify the point, and more iterations do not mend it. Checked
        whatever the window (``tol=None``: never)."""
        return self.tol is not None and float(relative_gap) < -self.tol

    def warn_broken(self, what: str, it: int, relative_gap: float) -> str:
        """Issue the :class:`~lowrank_fl.results.ConvergenceWarning` of a solve stopped by
        :meth:`broken` at iteration ``it``; returns the message."""
        message = (f"{what} stopped at iteration {it}: its relative duality gap {relative_gap:.3e} "
                   f"is below -tol={-self.tol:.1e}, which weak duality forbids: the certificate is "
                   "rounding (the data are far smaller than the numbers they were computed from) and "
                   "certifies nothing")
        warnings.warn(message, ConvergenceWarning, stacklevel=3)
        return message

    def warn(self, what: str, it: int, relative_gap: float, cause: str = "") -> str:
        """Issue the :class:`~lowrank_fl.results.StalledWarning` of a solve that stalled at
        iteration ``it`` with ``relative_gap`` (its returned point's); returns the message.
        ``cause``: a likely cause the caller knows of (appended)."""
        message = (f"{what} stalled at iteration {it} with relative duality gap "
                   f"{relative_gap:.3e} > tol={self.tol:.1e}: the best certified relative gap "
                   f"{self.best:.3e} fell by less than {FACTOR:g}x and the objective by less than "
                   f"{DESCENT:g} of it since iteration {self.since} (stall rule, window "
                   f"k/{self.window:g} to k: lowrank_fl.stall)" + cause)
        warnings.warn(message, StalledWarning, stacklevel=3)
        return message
