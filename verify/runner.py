"""Select claims from the registry, load the paper modules, run them and collect Evidence.

A claim whose experiment raises does not stop the run: it becomes Evidence with verdict
"inconclusive", a summary ``"experiment raised <Type>: <message>"`` and the traceback in the notes,
so the report shows it (and the command exits non-zero). Before that, a claim that raised after
reading task results from the cache is run once more with those tasks recomputed (an entry that
passed validation but does not fit the experiment must not make a claim permanently
inconclusive). Setup errors (:class:`verify.sweep.SetupError`: backend, scheduler, cache, stale
workers) are not evidence: they stop the run.

With ``budgets``, each claim runs under its time budget (:mod:`verify.budgets`): a claim past it
is stopped (its in-process work interrupted, the sweep's workers killed), becomes Evidence with
verdict :data:`verify.claim.BUDGET_VERDICT` and the time it ran, and the run goes on. A claim's
clock starts once the sweep's workers are up (:meth:`verify.sweep.Sweep.start_workers`): their
start-up, or restart after a stop, is not charged to the claim.
"""
from __future__ import annotations

import fnmatch
import os
import re
import time
import traceback
from importlib import import_module
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .budgets import BudgetExceeded, time_limit
from .claim import BUDGET_VERDICT, OMITTED, PAPERS, REGISTRY, Claim, Context, Evidence
from .sweep import SetupError

__all__ = ["load_modules", "select_claims", "run_claims", "ERROR_PREFIX"]

ERROR_PREFIX = "experiment raised "
PAPER_ORDER = tuple(PAPERS)


def _check_papers(papers: Iterable[str] | None) -> list[str]:
    if papers is None:
        return list(PAPER_ORDER)
    papers = list(papers)
    unknown = [p for p in papers if p not in PAPERS]
    if unknown:
        raise ValueError(f"unknown paper {unknown[0]!r}; expected one of {list(PAPER_ORDER)}")
    return papers


def load_modules(package: str, papers: Iterable[str] | None = None, *, required: bool = False) -> dict:
    """Import ``<package>.<paper>`` for each paper; return ``{"loaded": [...], "missing": [...]}``.

    A paper whose module does not exist is listed as missing (or raises ``ValueError`` when
    ``required``); a module that exists but fails to import re-raises its error, prefixed with the
    module name, because hiding it would hide a bug.
    """
    loaded, missing = [], []
    for paper in _check_papers(papers):
        name = f"{package}.{paper}"
        try:
            import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists; one of ITS imports is missing
                raise ImportError(f"{name} failed to import: {type(exc).__name__}: {exc}") from exc
            if required:
                raise ValueError(f"paper {paper!r} has no module {name} (not written yet?)") from None
            missing.append(paper)
            continue
        except Exception as exc:
            raise ImportError(f"{name} failed to import: {type(exc).__name__}: {exc}") from exc
        loaded.append(paper)
    return {"loaded": loaded, "missing": missing}


def select_claims(registry: dict[str, Claim] | None = None, *, papers: Sequence[str] | None = None,
                  ids: Sequence[str] | None = None) -> list[Claim]:
    """Claims of the given papers whose id matches one of ``ids`` (exact or glob, e.g. ``"clair.thm*"``).

    Returned in paper order, then registration order. A pattern matching nothing raises
    ``ValueError`` (a typo should not yield an empty report).
    """
    registry = REGISTRY if registry is None else registry
    papers = _check_papers(papers)
    chosen = [c for c in registry.values() if c.paper in papers]
    if ids:
        for pattern in ids:
            if not any(fnmatch.fnmatchcase(c.id, pattern) for c in chosen):
                left = [o for o in OMITTED.values() if fnmatch.fnmatchcase(o.id, pattern)]
                why = (f"; it names an omitted claim: {left[0].id} ({left[0].reference}): {left[0].reason}"
                       if left else "")
                raise ValueError(f"claim pattern {pattern!r} matches no registered claim"
                                 f" of papers {papers}{why}")
        chosen = [c for c in chosen if any(fnmatch.fnmatchcase(c.id, p) for p in ids)]
    return sorted(chosen, key=lambda c: PAPER_ORDER.index(c.paper))


_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent) + os.sep


def _strip_paths(text: str) -> str:
    """Make file names in tracebacks relative (reports are published; no machine paths)."""
    text = text.replace(_PROJECT_ROOT, "")
    return re.sub(r'"[^"\n]*?[/\\](site|dist)-packages[/\\]', '"', text)


def _error_evidence(exc: BaseException, seconds: float) -> Evidence:
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = _strip_paths("".join(frames[-6:]).strip())  # the innermost frames locate the bug
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return Evidence(
        verdict="inconclusive",
        summary=_strip_paths(f"{ERROR_PREFIX}{type(exc).__name__}: {message}")[:300],
        measured={"error": _strip_paths(f"{type(exc).__name__}: {message}")},
        notes=_strip_paths(f"The experiment raised {type(exc).__name__}: {exc}")
        + f"\n\nTraceback (innermost frames):\n{tail}",
        seconds=round(seconds, 3))


def _run_one(c: Claim, ctx: Context, options) -> Evidence:
    """``c.run``; if it raises after tasks came from the cache, once more recomputing them."""
    sweep = ctx.sweep
    reused_before = getattr(sweep, "reused", 0)
    try:
        return c.run(ctx, **options)
    except SetupError:
        raise
    except Exception:
        if getattr(sweep, "reused", 0) == reused_before or getattr(sweep, "refresh", True):
            raise
    sweep.refresh = True
    try:
        return c.run(ctx, **options)
    finally:
        sweep.refresh = False


def _budget_evidence(limit: float, source: str, seconds: float) -> Evidence:
    return Evidence(
        verdict=BUDGET_VERDICT,
        summary=f"exceeded time budget: stopped after {seconds:.1f} s (budget {limit:g} s, {source})",
        measured={"seconds": round(seconds, 3)}, predicted={"seconds": f"<= {limit:g} (time budget)"},
        notes=f"The experiment was stopped when its time budget of {limit:g} s ({source}) ran out, "
              "with its workers. A claim that usually finishes well inside its budget and now does "
              "not points at a solver crawling to its iteration caps (or a far slower machine: "
              "raise the budgets with --time-budget 3x).",
        seconds=round(seconds, 3), budget={"limit_s": limit, "source": source, "exceeded": True})


def run_claims(claims: Sequence[Claim], ctx: Context | None = None, *,
               on_result: Callable[[int, int, Claim, Evidence], None] | None = None,
               budgets: Callable[[Claim], tuple] | None = None,
               **options) -> list[tuple[Claim, Evidence]]:
    """Run each claim under ``ctx`` (scale, sweep, out_dir, base seed).

    Parameters
    ----------
    claims : sequence of Claim
    ctx : Context, optional
        Default: smoke scale, sequential, no cache.
    on_result : callable, optional
        Called as ``on_result(k, total, claim, evidence)`` after each claim (progress output).
    budgets : callable, optional
        ``budgets(claim) -> (seconds or None, source)``: the claim's time budget and where it came
        from (:func:`verify.budgets.budget_for`); ``None`` (default): no budgets.
    **options
        Passed to every claim's experiment (rarely useful outside tests).

    Returns
    -------
    list of (Claim, Evidence)
        In the order given. ``KeyboardInterrupt`` is not caught.
    """
    ctx = ctx or Context()
    results = []
    modules = sorted({m for c in claims   # (a functools.partial names its function's module)
                      for m in [getattr(getattr(c.experiment, "func", c.experiment), "__module__", None)]
                      if m})
    for k, c in enumerate(claims, 1):
        limit, source = budgets(c) if budgets is not None else (None, "")
        start_workers = getattr(ctx.sweep, "start_workers", None)
        if limit is not None and start_workers is not None:
            start_workers(modules)   # worker start-up (or restart after a stop) is not the claim's
        start = time.perf_counter()
        try:
            with time_limit(limit):
                evidence = _run_one(c, ctx, options)
        except SetupError:
            raise
        except BudgetExceeded:
            seconds = time.perf_counter() - start
            stop = getattr(ctx.sweep, "stop_workers", None)   # kill what still runs the claim's tasks
            if stop is not None:
                stop()
            evidence = _budget_evidence(limit, source, seconds)
        except Exception as exc:  # noqa: BLE001 - the run continues, the report shows the error
            evidence = _error_evidence(exc, time.perf_counter() - start)
        if limit is not None and not evidence.budget:
            evidence = replace(evidence, budget={"limit_s": limit, "source": source, "exceeded": False})
        results.append((c, evidence))
        if on_result is not None:
            on_result(k, len(claims), c, evidence)
    return results
