"""Time budgets per claim: derived from measured runtimes, enforced by stopping the claim.

A regression that makes a solver crawl to its iteration caps must end in a verdict, not in hours
of waiting. Every claim therefore has a budget at each scale, in :data:`BUDGETS_PATH`
(``verify/budgets.json``), generated from the runtimes of committed reports by::

    python -m verify.budgets reports/full/results.json [OTHER/results.json ...] [--out FILE]

Derivation (one rule, stated in the file it writes)
---------------------------------------------------
``budget = max(FLOORS[scale], FACTOR * measured)`` with ``FACTOR = 10`` and floors of 60 s
(smoke), 120 s (quick) and 300 s (full). ``measured`` is the claim's ``seconds`` in a report of
that scale; a scale with no report of its own takes the measurement of the next larger scale that
has one (a smaller scale runs the same experiment on less work, so this is an upper bound). The
factor absorbs a slower or busier machine, fewer workers and a cold cache. A claim that reuses
another's runs through the cache (their reports share seeds) reads them in a second once they
are cached but recomputes them under ``--no-cache``: claims whose seeds overlap in a report are
measured together, each at the largest runtime among them. A claim that no report
measured gets :data:`UNMEASURED` (generous, so a new claim never fails on its budget before it is
measured).

Enforcement (:func:`time_limit`)
--------------------------------
The claim's body runs in the main process; at its deadline a ``SIGALRM`` timer raises
:class:`BudgetExceeded` there. It is a ``BaseException``, so an experiment's ``except Exception``
cannot swallow it; it interrupts pure-Python iteration (every iterative solver of the library
loops in Python) and the sweep's wait for its workers, after which the sweep kills the workers
(:meth:`verify.sweep.Sweep.stop_workers`). A single native call (one long LAPACK or CVXPY call in
the claim's own process) cannot be interrupted: the claim stops when that call returns. Where no
``SIGALRM`` exists (Windows, or a run outside the main thread) the sweep checks the deadline after
each task instead.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

__all__ = ["BudgetExceeded", "BUDGETS_PATH", "FACTOR", "FLOORS", "UNMEASURED", "derive_budgets", "shared_runtimes",
           "load_budgets", "parse_time_budget", "budget_for", "time_limit", "active_deadline",
           "check_deadline", "main"]

BUDGETS_PATH = Path(__file__).with_name("budgets.json")
#: multiple of the measured runtime a claim may take
FACTOR = 10.0
#: least budget per scale, seconds (start-up of workers, imports, a loaded machine)
FLOORS = {"smoke": 60.0, "quick": 120.0, "full": 300.0}
#: budget of a claim no report measured, seconds
UNMEASURED = {"smoke": 300.0, "quick": 900.0, "full": 3600.0}
_SCALES = ("smoke", "quick", "full")
_MAX_TIMER = 1e9   # seconds (31 years): setitimer overflows its time_t a little above 9e9


class BudgetExceeded(BaseException):
    """Raised in the claim's process when its time budget runs out (not an ``Exception``: an
    experiment's ``except Exception`` must not turn the stop into a verdict of its own)."""

    def __init__(self, limit: float):
        super().__init__(f"time budget of {limit:g} s exceeded")
        self.limit = float(limit)


# ----------------------------------------------------------------------------- derivation
def derive_budgets(reports: Sequence[Mapping], *, factor: float = FACTOR,
                   floors: Mapping[str, float] = FLOORS) -> dict:
    """Budgets ``{claim_id: {"smoke": s, "quick": s, "full": s}}`` from report documents.

    Parameters
    ----------
    reports : sequence of dict
        Parsed ``results.json`` documents (``scale`` and ``claims[*].seconds`` are read); two
        reports of one scale keep the larger runtime of each claim.
    factor, floors
        ``budget = max(floors[scale], factor * measured)``, rounded up to a whole second.
    """
    measured: dict[str, dict[str, float]] = {}
    for doc in reports:
        scale = doc.get("scale")
        if scale not in _SCALES:
            raise ValueError(f"report scale must be one of {_SCALES}, got {scale!r}")
        entries = doc.get("claims", [])
        shared = shared_runtimes(entries)
        for entry in entries:
            seconds = shared[entry["id"]]
            per = measured.setdefault(entry["id"], {})
            per[scale] = max(seconds, per.get(scale, 0.0))
    out = {}
    for cid in sorted(measured):
        per, row = measured[cid], {}
        for k, scale in enumerate(_SCALES):
            source = next((s for s in _SCALES[k:] if s in per), None)
            if source is None:
                row[scale] = UNMEASURED[scale]
            else:
                row[scale] = float(math.ceil(max(floors[scale], factor * per[source])))
        out[cid] = row
    return out


def shared_runtimes(entries: Sequence[Mapping]) -> dict:
    """``{claim_id: seconds}`` of one report, where claims whose ``seeds`` overlap (one reads the
    other's runs from the cache) all take the largest ``seconds`` among them (transitively)."""
    ids = [e["id"] for e in entries]
    parent = {cid: cid for cid in ids}

    def root(c):
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    owner: dict[int, str] = {}
    for e in entries:
        for seed in e.get("seeds") or ():
            if seed in owner:
                parent[root(e["id"])] = root(owner[seed])
            else:
                owner[seed] = e["id"]
    longest: dict[str, float] = {}
    for e in entries:
        r = root(e["id"])
        longest[r] = max(longest.get(r, 0.0), float(e["seconds"]))
    return {cid: longest[root(cid)] for cid in ids}


def load_budgets(path: str | Path | None = None) -> dict:
    """``{claim_id: {scale: seconds}}`` from a budgets file (default :data:`BUDGETS_PATH`)."""
    path = Path(path) if path is not None else BUDGETS_PATH
    doc = json.loads(path.read_text(encoding="utf-8"))
    return {cid: {s: float(v) for s, v in row.items()} for cid, row in doc["budgets"].items()}


def parse_time_budget(text: str) -> tuple[str, float | None]:
    """``--time-budget`` value: ``"auto"`` (the table), ``"off"``, ``"N"`` / ``"Ns"`` (N seconds for
    every claim) or ``"Nx"`` (N times each claim's table budget); N any positive finite float
    (``1e4`` too). Returns ``(mode, number)``."""
    t = str(text).strip().lower()
    if t in ("auto", "off"):
        return t, None
    m = re.fullmatch(r"(.+?)\s*(s|x)?", t)
    try:
        number = float(m.group(1)) if m else math.nan
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):   # any positive finite float, 1e9 included
        raise ValueError(f"--time-budget must be 'auto', 'off', seconds > 0 (e.g. 90, 90s or 1e4) or "
                         f"a factor > 0 of the table's budgets (e.g. 2x), got {text!r}")
    return ("factor" if m.group(2) == "x" else "seconds"), number


def budget_for(claim_id: str, scale: str, mode: str = "auto", number: float | None = None,
               table: Mapping | None = None) -> tuple[float | None, str]:
    """``(seconds or None, source)`` of one claim's budget under a ``--time-budget`` setting."""
    if mode == "off":
        return None, "off"
    if mode == "seconds":
        return float(number), "--time-budget"
    table = load_budgets() if table is None else table
    row = table.get(claim_id)
    base, source = ((row[scale], "budgets.json") if row and scale in row
                    else (UNMEASURED[scale], "unmeasured default"))
    if mode == "factor":   # (a huge factor stays finite: the report's JSON holds no inf)
        return min(base * float(number), sys.float_info.max), f"{number:g} x {source}"
    return base, source


# ----------------------------------------------------------------------------- enforcement
_STATE = threading.local()   # per thread: deadline (monotonic) and limit of the running claim


def active_deadline() -> float | None:
    """Monotonic time at which this thread's running claim's budget ends, or None."""
    return getattr(_STATE, "deadline", None)


def check_deadline() -> None:
    """Raise :class:`BudgetExceeded` when the running claim is past its deadline (cooperative
    check where no timer signal is available)."""
    deadline = active_deadline()
    if deadline is not None and time.monotonic() > deadline:
        raise BudgetExceeded(_STATE.limit)


_IMPORT_RETRY = 0.05   # seconds: how often a deadline that fell inside an import is retried


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (a module body executed by importlib)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`BudgetExceeded` in this thread after ``seconds`` (``None``: no limit).

    Uses ``SIGALRM`` in the main thread (restoring the previous handler and timer afterwards);
    elsewhere only :func:`check_deadline` enforces it. A deadline that falls inside an import waits
    for the import to finish: a module interrupted half-way (e.g. matplotlib's first import) would
    stay half-initialised in this process and break every later claim that uses it.
    """
    if seconds is None:
        yield
        return
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0 or None, got {seconds!r}")
    use_signal = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    saved = (active_deadline(), getattr(_STATE, "limit", 0.0))
    _STATE.deadline, _STATE.limit = time.monotonic() + seconds, float(seconds)
    previous = None
    if use_signal:
        def on_alarm(signum, frame):
            if _importing(frame):   # a module stopped half-way stays broken for the next claims
                signal.setitimer(signal.ITIMER_REAL, _IMPORT_RETRY)
                return
            raise BudgetExceeded(seconds)

        previous = signal.signal(signal.SIGALRM, on_alarm)
        # the timer holds ~1e9 s at most (a larger budget, e.g. --time-budget 1e12, never ends a run)
        outer = signal.setitimer(signal.ITIMER_REAL, min(seconds, _MAX_TIMER))
        started = time.monotonic()
    try:
        yield
    finally:
        if use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer[0] > 0:   # an enclosing timer (a nested limit) keeps what it had left
                signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - started), 1e-3))
        _STATE.deadline, _STATE.limit = saved


# ----------------------------------------------------------------------------- command
def main(argv=None) -> int:
    """``python -m verify.budgets REPORT.json ... [--out FILE]``: write the budgets file."""
    p = argparse.ArgumentParser(prog="python -m verify.budgets",
                                description="Derive per-claim time budgets from reports' runtimes.")
    p.add_argument("reports", nargs="+", metavar="RESULTS.json",
                   help="results.json of reports (one per scale measured; full at least)")
    p.add_argument("--out", default=str(BUDGETS_PATH), help=f"output file (default: {BUDGETS_PATH.name} "
                                                            "in the verify package)")
    args = p.parse_args(argv)
    docs, sources = [], []
    for name in args.reports:
        try:
            doc = json.loads(Path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"verify.budgets: error: cannot read {name}: {exc}", file=sys.stderr)
            return 2
        docs.append(doc)
        sources.append({"scale": doc.get("scale"), "total_seconds": doc.get("total_seconds"),
                        "backend": doc.get("backend"),
                        "created": doc.get("created") or doc.get("provenance", {}).get("created"),
                        "cpu_count": doc.get("provenance", {}).get("machine", {}).get("cpu_count")})
    try:
        budgets = derive_budgets(docs)
    except (KeyError, ValueError) as exc:
        print(f"verify.budgets: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists():
        try:
            if "budgets" not in json.loads(out.read_text(encoding="utf-8")):
                raise ValueError
        except (OSError, ValueError, TypeError):
            print(f"verify.budgets: error: --out {out} exists and is not a budgets file", file=sys.stderr)
            return 2
    doc = {"rule": f"budget = max(floor[scale], {FACTOR:g} x measured seconds), rounded up; claims whose "
                   "seeds overlap in a report (one reads the other's runs) are measured at the longest of "
                   "them; a scale without its own report uses the next larger measured scale",
           "factor": FACTOR, "floors": FLOORS, "unmeasured": UNMEASURED,
           # absolute paths name a machine: only relative ones are recorded
           "command": "python -m verify.budgets " + " ".join(
               Path(r).as_posix() if not Path(r).is_absolute() else f"<{d.get('scale')} report>"
               for r, d in zip(args.reports, docs)),
           "sources": sources, "budgets": budgets}
    text = json.dumps(doc, indent=1)   # then one line per claim: the file stays diff-friendly
    rows = ",\n".join(f"  {json.dumps(cid)}: {json.dumps(row)}" for cid, row in budgets.items())
    text = text[: text.index('"budgets": {')] + '"budgets": {\n' + rows + "\n }\n}"
    out.write_text(text + "\n", encoding="utf-8")
    print(f"{out}: budgets of {len(budgets)} claims")
    return 0


if __name__ == "__main__":
    sys.exit(main())
