"""Non-converged solves that a claim's experiment let through, captured as solve records.

The library warns with :class:`lowrank_fl.results.ConvergenceWarning` when an iterative solve
stops at its cap before its tolerance. A claim that records its solves (``ctx.record_solve``, or
:data:`SOLVES_KEY` in a task's result) decides what they mean; a warning that reaches the harness
was handled by no one, so the claim's verdict must not rest silently on that solve. The harness
catches these warnings around every task (in the worker, so they travel with the result and its
cache entry) and around the claim's own body, and turns each distinct one into a solve record with
``ok=False`` (:func:`warning_records`). :func:`verify.claim.enforce_rules` then turns a "holds" (or
"erratum confirmed") into "inconclusive" and says why.

A claim that runs a solver to its cap on purpose (a rate measured over a fixed number of rounds, a
divergence that *is* the finding) says so where it calls the solver, with
``with expected_non_convergence():`` (or by ignoring the warning there itself), which documents
the intent at the call. Other warnings pass through untouched.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from lowrank_fl.results import ConvergenceWarning, StalledWarning

__all__ = ["SOLVES_KEY", "WARNED_STATUS", "STALLED_STATUS", "STALLED_STATUSES",
           "capture_convergence", "attach_records", "expected_non_convergence"]

#: reserved key of a task's return dict under which it reports its solve records
SOLVES_KEY = "__solves__"
#: status of a record made from a captured ConvergenceWarning
WARNED_STATUS = "not converged (warning)"
#: status of a record made from a captured StalledWarning (the solver's stall rule stopped it)
STALLED_STATUS = "stalled (warning)"
#: statuses of solve records that a stall stopped (a recorded result's, a captured warning's)
STALLED_STATUSES = ("stalled", STALLED_STATUS)
#: reserved key holding a task's non-dict result when records travel with it
VALUE_KEY = "__value__"


def warning_records(caught) -> list[dict]:
    """One solve record per distinct ConvergenceWarning message (with its ``count``); a
    :class:`~lowrank_fl.results.StalledWarning` gives the status :data:`STALLED_STATUS`."""
    out: dict[str, dict] = {}
    for w in caught:
        text = str(w.message).strip().splitlines()[0][:200] if str(w.message).strip() else "?"
        what = f"{w.category.__name__} ({w.filename.rsplit('/', 1)[-1]}:{w.lineno}): {text}"
        status = STALLED_STATUS if issubclass(w.category, StalledWarning) else WARNED_STATUS
        rec = out.setdefault(what, {"what": what, "status": status, "relative_gap": None,
                                    "tol": None, "ok": False, "count": 0})
        rec["count"] += 1
    return list(out.values())


@contextmanager
def capture_convergence(sink: list) -> Iterator[None]:
    """Collect the ConvergenceWarnings raised inside into ``sink`` as solve records; every other
    warning is re-issued as it was (the outer filters decide whether it shows)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        try:
            yield
        finally:
            mine = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
            others = [w for w in caught if not issubclass(w.category, ConvergenceWarning)]
            sink.extend(warning_records(mine))
    for w in others:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


@contextmanager
def expected_non_convergence() -> Iterator[None]:
    """Around a run whose failure to converge is part of what the claim measures (its criterion
    judges the run's outcome itself): its ConvergenceWarnings are not recorded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def attach_records(result: Any, records: list) -> Any:
    """``result`` carrying ``records`` under :data:`SOLVES_KEY` (a dict result gets the key, any
    other is wrapped as ``{VALUE_KEY: result, SOLVES_KEY: records}``, which
    :meth:`verify.claim.Context.map` unwraps), so the records are cached with it."""
    if not records:
        return result
    if isinstance(result, Mapping) and VALUE_KEY not in result:
        previous = result.get(SOLVES_KEY, [])
        previous = [previous] if isinstance(previous, Mapping) else list(previous)
        return {**result, SOLVES_KEY: previous + records}
    return {VALUE_KEY: result, SOLVES_KEY: records}
