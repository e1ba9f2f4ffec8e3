"""One checked CVXPY solve for the whole library.

Every exact reference (CLAIR's programs, the nuclear-norm least squares of
:mod:`lowrank_fl.exact.nuclear`) goes through :func:`solve_scaled` and then :func:`decide`:

1. **Rescale.** Interior-point and first-order conic solvers stop on *absolute* tolerances
   (Clarabel: about 1e-8), so data of size 1e-6 are solved to a relative accuracy of 1e-2 and data
   of size 1e9 overflow their feasibility tests (measured on CLAIR's (7): relative gap 7e-4 at
   scale 1e-6, 0.19 at 1e-9, "infeasible" at 1e9). The caller builds its problem on
   ``data / scale`` with every penalty ``lam / scale`` — for the programs here every primal and
   dual output is then ``output / scale`` (homogeneous of degree 1 in (data, penalties)) — and
   :func:`solve_scaled` multiplies the outputs back. :func:`data_scale` picks a power of two near
   the data's largest entry, so dividing and multiplying back are exact.
2. **Decide by the certificate, not by the status string.** The caller evaluates its own
   certified relative duality gap at the returned point; :func:`decide` returns ``"optimal"``
   when it is within ``tol`` (even when CVXPY said ``optimal_inaccurate``) and ``"inaccurate"``
   otherwise, with a :class:`~lowrank_fl.results.ConvergenceWarning` (or a
   :class:`~lowrank_fl.results.SolverError` with ``on_inaccurate="raise"``), even when CVXPY said
   ``optimal``. Programs without a certificate (``relative_gap=None``) fall back to the status.

Statuses CVXPY uses for "no solution" (infeasible, unbounded, solver error) always raise
:class:`~lowrank_fl.results.SolverError`.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import Callable, Mapping, NamedTuple

import numpy as np

from .results import ConvergenceWarning, SolverError
from .validation import check_choice

__all__ = ["SOLVERS", "ON_INACCURATE", "SCS_DEFAULTS", "SAFE_RANGE", "ConicSolution", "Decision",
           "check_solver", "data_scale", "safe_scale", "solve_scaled", "decide"]

SOLVERS = ("CLARABEL", "SCS")
ON_INACCURATE = ("warn", "raise")
#: SCS is first order: its default eps (1e-4) blurs rank decisions; these are its defaults here.
SCS_DEFAULTS = {"eps_abs": 1e-9, "eps_rel": 1e-9, "max_iters": 200_000}


class ConicSolution(NamedTuple):
    """Raw outcome of :func:`solve_scaled`.

    ``values`` maps each requested output name to its value in the caller's units (already
    multiplied back by the scale); ``status`` is CVXPY's own status string.
    """

    values: dict
    status: str
    iterations: int
    seconds: float
    solver: str
    scale: float


class Decision(NamedTuple):
    """Outcome of :func:`decide`: the library's status and a one-sentence message."""

    status: str
    message: str


def check_solver(solver, solver_options) -> tuple[str, dict]:
    """Validate a CVXPY backend name and its options; returns ``(solver, options)`` with the
    library's SCS defaults filled in (the user's options win)."""
    solver = check_choice(solver, "solver", SOLVERS)
    if solver_options is None:
        solver_options = {}
    if not isinstance(solver_options, Mapping):
        raise TypeError(f"solver_options must be a mapping of keyword arguments for "
                        f"cvxpy.Problem.solve (or None), got {type(solver_options).__name__}")
    opts = dict(SCS_DEFAULTS) if solver == "SCS" else {}
    opts.update(solver_options)
    for key in ("solver", "verbose"):
        if key in opts:
            raise ValueError(f"solver_options must not contain {key!r}: pass {key}= directly")
    return solver, opts


def data_scale(*arrays) -> float:
    """A power of two near the largest absolute entry of ``arrays`` (1.0 when all are zero or
    empty), so ``data / scale`` has entries of order one and the rescaling is exact."""
    m = 0.0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        if a.size:
            m = max(m, float(np.max(np.abs(a))))
    if not (m > 0.0 and math.isfinite(m)):
        return 1.0
    return math.ldexp(1.0, math.frexp(m)[1])


#: Largest entries in this range need no normalisation for float64 arithmetic that squares the
#: data (Gram matrices, quadratic objectives stay within 1e-200..1e200).
SAFE_RANGE = (1e-100, 1e100)


def safe_scale(*arrays) -> float:
    """1.0 when the largest absolute entry lies in :data:`SAFE_RANGE` (or all are zero), else
    :func:`data_scale`: the normalisation of iterative solvers, which only need their squares
    representable (keeping ``c = 1`` for ordinary data keeps their results bit-identical)."""
    m = 0.0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        if a.size:
            m = max(m, float(np.max(np.abs(a))))
    if m == 0.0 or SAFE_RANGE[0] <= m <= SAFE_RANGE[1]:
        return 1.0
    return data_scale(*arrays)


def solve_scaled(build: Callable, scale: float, *, solver: str = "CLARABEL",
                 solver_options: Mapping | None = None, verbose: bool = False) -> ConicSolution:
    """Build a CVXPY problem on rescaled data, solve it, and scale the outputs back.

    Parameters
    ----------
    build : callable
        ``build(scale) -> (problem, outputs)``: a ``cvxpy.Problem`` built on ``data / scale``
        with penalties ``lam / scale``, and a mapping from names to cvxpy expressions (their
        ``value`` is read) or constraints (their ``dual_value`` is read).
    scale : float, > 0
        E.g. :func:`data_scale` of the data.
    solver : {"CLARABEL", "SCS"}
    solver_options : mapping, optional
        Keyword arguments for ``cvxpy.Problem.solve``.
    verbose : bool

    Returns
    -------
    ConicSolution
        Outputs multiplied by ``scale``; CVXPY's raw status (``optimal`` or
        ``optimal_inaccurate``: anything else raises).

    Raises
    ------
    SolverError
        The backend failed or reported no solution (infeasible, unbounded, ...).
    """
    import cvxpy as cp

    solver, opts = check_solver(solver, solver_options)
    scale = float(scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    problem, outputs = build(scale)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # CVXPY's own "Solution may be inaccurate" warning: the caller's certificate decides
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            problem.solve(solver=solver, verbose=verbose, **opts)
    except cp.error.SolverError as exc:
        raise SolverError(f"CVXPY/{solver} failed: {exc}", status="solver_error") from exc
    seconds = time.perf_counter() - t0
    status = str(problem.status)
    if status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise SolverError(f"CVXPY/{solver} returned no solution (data rescaled by {scale:.3g})",
                          status=status)
    values = {}
    for name, obj in outputs.items():
        raw = obj.dual_value if isinstance(obj, cp.constraints.constraint.Constraint) \
            else obj.value
        if raw is None:
            raise SolverError(f"CVXPY/{solver} returned no value for {name!r}", status=status)
        values[name] = np.asarray(raw, dtype=np.float64) * scale
    stats = problem.solver_stats
    iters = -1 if stats is None or stats.num_iters is None else int(stats.num_iters)
    return ConicSolution(values=values, status=status, iterations=iters, seconds=seconds,
                         solver=f"cvxpy:{solver}", scale=scale)


def decide(relative_gap: float | None, tol: float, raw_status: str, *, what: str,
           solver: str, on_inaccurate: str = "warn", stacklevel: int = 3) -> Decision:
    """The library's status for a CVXPY answer, from its certified relative duality gap.

    Parameters
    ----------
    relative_gap : float or None
        The caller's certified relative duality gap at the returned point; ``None`` for
        programs without a certificate (the raw status decides).
    tol : float
        Certificate tolerance.
    raw_status : str
        CVXPY's status.
    what : str
        The program's name for the message (e.g. ``"program (7)"``).
    solver : str
    on_inaccurate : {"warn", "raise"}
        What an uncertified answer does: a :class:`ConvergenceWarning` (status
        ``"inaccurate"``) or a :class:`SolverError`.

    Returns
    -------
    Decision
    """
    on_inaccurate = check_choice(on_inaccurate, "on_inaccurate", ON_INACCURATE)
    if relative_gap is None:
        ok = raw_status == "optimal"
        how = f"{solver} status {raw_status} (no duality certificate for this program)"
    else:
        ok = bool(np.isfinite(relative_gap) and relative_gap <= tol)
        how = (f"{solver} status {raw_status}; certified relative duality gap "
               f"{relative_gap:.2e} {'<=' if ok else '>'} tol={tol:.1e}")
    if ok:
        return Decision("optimal", f"{what} solved: {how}.")
    message = f"{what} not solved to the tolerance: {how}."
    if on_inaccurate == "raise":
        raise SolverError(message, status=raw_status)
    warnings.warn(message, ConvergenceWarning, stacklevel=stacklevel)
    return Decision("inaccurate", message)
