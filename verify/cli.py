"""The ``lowrank-fl`` command: the library's sub-commands plus the verifier's ``verify | claims |
conditions``.

The console script lives here, above the library: :func:`build_parser` adds the library's own
sub-commands (:func:`lowrank_fl.cli.add_library_parsers`) and the verifier's (:func:`add_parsers`),
so ``lowrank_fl`` never imports ``verify``. ``python -m verify ARGS`` is the same as
``lowrank-fl verify ARGS``.

Defaults of ``verify``: scale ``quick``, backend ``loky`` on all cores (``dask`` when
``--scheduler`` is given), base seed 0, and the task cache in ``$LOWRANK_FL_CACHE`` if set, else
``$XDG_CACHE_HOME/lowrank_fl/verify`` (``~/.cache/lowrank_fl/verify``). The cache is keyed by claim,
task, parameters, seed and code version, so one cache serves every report directory and an
interrupted run resumes where it stopped; ``--no-cache`` turns it off, ``--refresh`` recomputes
and ``lowrank-fl cache clear`` empties it.

Before the first claim, ``verify`` checks its set-up (backend, scheduler, cache, ``--out``) and
stops with exit status 2 on a problem. The report is written into a staging directory next to
``--out`` and swapped in at the end: ``--out`` must be new or empty, or hold a previous lowrank-fl
output (its ``.lowrank-fl-output`` marker) and ``--overwrite`` be given (its old contents are then
replaced, stale figures included); ``--out`` is locked while the run lasts
(:mod:`lowrank_fl.outdir`). Exit status: 0; 1 when an experiment raised or a claim exceeded its
time budget, or with ``--strict`` when a claim fails; 2 for a set-up error; 130 after Ctrl-C
(rerunning the same command resumes from the cache).

Time budgets (:mod:`verify.budgets`): each claim is stopped at its budget for the scale (from
``verify/budgets.json``: its measured runtime times 10, with a floor), gets the verdict "exceeded
time budget" and the run goes on; ``--time-budget`` sets every claim's budget in seconds
(``90``, ``90s``, ``1e4``), scales the table's (``3x``), keeps it (``auto``, the default) or turns
budgets off (``off``).

Progress: with a terminal on stdout and stderr, tqdm bars per map of tasks; otherwise one log line
per claim on stderr.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import json
import logging
import os
import re
import signal
import sys
import time
import warnings
from pathlib import Path

from .claim import BUDGET_VERDICT, OMITTED, PAPERS, REGISTRY, REQUIRES_VERDICT, SCALES, Context
from .convergence import STALLED_STATUSES
from .sweep import BACKENDS, SetupError, Sweep

log = logging.getLogger("verify")

__all__ = ["add_parsers", "main", "lowrank_fl_main", "build_parser", "default_cache_dir",
           "build_verify_parser", "EXIT_EXPERIMENT"]

#: Exit status of ``verify`` when an experiment raised or a claim exceeded its time budget (or,
#: with ``--strict``, a claim fails).
EXIT_EXPERIMENT = 1


def default_cache_dir() -> Path:
    """``$LOWRANK_FL_CACHE``, else ``$XDG_CACHE_HOME/lowrank_fl/verify``, else ``~/.cache/...``."""
    if os.environ.get("LOWRANK_FL_CACHE"):
        return Path(os.environ["LOWRANK_FL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lowrank_fl" / "verify"


# ----------------------------------------------------------------------------- parsers
def _add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--paper", action="append", type=_paper_name, choices=list(PAPERS), metavar="PAPER",
                   help=f"only this paper's claims (repeatable; one of {', '.join(PAPERS)}; any case, - for _)")
    p.add_argument("--claim", action="append", metavar="ID",
                   help="only claims whose id matches (exact or glob like 'clair.thm*'; repeatable)")
    p.add_argument("--scale", choices=SCALES, default="quick", help="experiment size (default: quick)")
    p.add_argument("--jobs", type=int, default=-1, help="workers (default: -1, all cores)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="sequential | loky | dask (default: loky; dask when --scheduler is given)")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="dask scheduler address (implies --backend dask); without it the dask "
                        "backend starts a local cluster")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=_directory, metavar="DIR",
                       help=f"task cache directory (default: {default_cache_dir()})")
    cache.add_argument("--no-cache", action="store_true", help="do not cache (nor resume) tasks")
    p.add_argument("--refresh", action="store_true",
                   help="recompute every task of the selected claims and overwrite its cache entry")
    p.add_argument("--seed", type=_seed, default=0, help="base seed, an int >= 0 (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--strict", action="store_true",
                   help="also exit with status 1 when a claim fails (an experiment that raises "
                        "always does)")
    p.add_argument("--time-budget", type=_time_budget, default=("auto", None), metavar="BUDGET",
                   help="time budget per claim: 'auto' (default: the claim's measured runtime at "
                        "this scale x 10, at least 60/120/300 s for smoke/quick/full; "
                        "verify/budgets.json), N or Ns (N seconds for every claim, e.g. 90, 90s, "
                        "1e4), Nx (N times "
                        "the auto budget) or 'off'. A claim past its budget is stopped with its "
                        "workers, gets the verdict 'exceeded time budget' and the exit status is 1")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="report directory (README.md, index.html, figures/, results.json); new "
                        "or empty unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the previous report in --out (only a directory holding a lowrank-fl "
                        "output marker and only the files that run wrote: one holding other files is "
                        "refused)")
    p.set_defaults(handler=cmd_verify)


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {value}")
    return value


def _time_budget(text: str) -> tuple:
    from .budgets import parse_time_budget

    try:
        return parse_time_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--time-budget must be", "must be")) from None


def _directory(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a directory, got ''")
    return Path(text)


def _check_cache_apart(cache, out) -> None:
    """The cache must not be ``--out`` or inside it: ``--out`` is replaced as a whole (``--overwrite``),
    which would take the cache with it. (A report inside the cache is safe: ``cache clear`` removes only
    the entries it wrote.)"""
    if cache is None or out is None or str(out) == "":
        return
    c, o = Path(cache).expanduser().resolve(), Path(out).expanduser().resolve()
    if c == o or o in c.parents:
        raise ValueError(f"--cache {cache} is --out {out} or inside it: the report directory is replaced as a "
                         "whole, which would take the cache with it; keep the cache outside it")


def _check_cache_option(path, *, create: bool) -> None:
    """``--cache DIR``: a directory (created when ``create``); errors name the option."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise ValueError(f"--cache {path} is a file, not a directory")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--cache {path} is not usable: {exc.strerror or exc}") from None
        from .cache import is_cache_dir, not_a_cache_message

        if not is_cache_dir(path):       # a user's folder is never marked (nor later cleared)
            raise ValueError(f"--cache {not_a_cache_message(path)}")


def _paper_name(text: str) -> str:
    """A paper as the user may write it (``FedAvg-FT``, ``CLAIR``) in the registry's spelling."""
    return text.strip().lower().replace("-", "_")


def add_parsers(subparsers) -> None:
    """Add ``verify``, ``claims``, ``conditions`` and ``cache`` to the ``lowrank-fl`` sub-commands."""
    _add_verify_arguments(subparsers.add_parser(
        "verify", help="run the papers' claims and write a report",
        description="Run the verifier's claims and write README.md, index.html, figures/ and "
                    "results.json into --out."))
    p = subparsers.add_parser("claims", help="list the registered (and omitted) claims")
    p.add_argument("--paper", action="append", type=_paper_name, choices=list(PAPERS), metavar="PAPER",
                   help=f"only this paper (repeatable; one of {', '.join(PAPERS)}; any case, - for _)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=cmd_claims)
    p = subparsers.add_parser("conditions", help="evaluate a paper's theorem conditions on an instance")
    # papers with a conditions module (the adapters' extension states no theorem conditions)
    p.add_argument("paper", help=f"one of {', '.join(_with_conditions())}")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--instance", metavar="FILE.npz",
                     help="instance arrays (npz), named as the paper's generate() names them (clair: W_hat, and "
                          "optionally W, A, benign, r, lam_L, lam_S, a, b, alpha, w, tau, or noise where tau is "
                          "absent); a name the conditions do not read is warned about")
    src.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                     help="parameter of the paper's generate() (repeatable; --list-params lists them)")
    src.add_argument("--list-params", action="store_true",
                     help="list the parameters --param accepts for this paper, with defaults")
    p.add_argument("--seed", type=_seed, default=0, help="seed of generate() (default: 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=cmd_conditions)
    p = subparsers.add_parser("cache", help="manage the verifier's task cache")
    csub = p.add_subparsers(dest="cache_command", required=True)
    clear = csub.add_parser("clear", help="delete cached task results",
                            description="Delete the task cache (or the entries of some claims).")
    clear.add_argument("--cache", type=_directory, metavar="DIR",
                       help=f"task cache directory (default: {default_cache_dir()})")
    clear.add_argument("--claim", action="append", metavar="ID",
                       help="only the entries of this claim id or glob pattern, as verify --claim (repeatable)")
    clear.set_defaults(handler=cmd_cache_clear)

    from .report.diff import add_parser as add_report_parser

    add_report_parser(subparsers)  # lowrank-fl report diff A/results.json B/results.json


def build_verify_parser(prog: str = "python -m verify") -> argparse.ArgumentParser:
    """Parser of ``python -m verify`` (the arguments of ``lowrank-fl verify``)."""
    p = argparse.ArgumentParser(prog=prog, description="Run the verifier's claims and write a report.")
    _add_verify_arguments(p)
    return p


# ----------------------------------------------------------------------------- helpers
def _load_claims(papers) -> None:
    from .runner import load_modules

    status = load_modules("verify.claims", papers, required=bool(papers))
    if status["missing"]:
        print(f"note: no claims module yet for: {', '.join(status['missing'])}", file=sys.stderr)


def _print_table(header, rows, file=None) -> None:
    file = file or sys.stdout
    rows = [[str(c).replace("\n", " ") for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[k]) for r in rows]) for k, h in enumerate(header)]
    widths[-1] = 0  # the last column runs free
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), file=file)
    print("  ".join("-" * max(w, len(h)) for h, w in zip(header, widths)), file=file)
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=file)


def _generate_parameters(generate) -> dict:
    """``{name: default}`` of the keyword parameters ``--param`` can set (all but ``seed``)."""
    out = {}
    for p in inspect.signature(generate).parameters.values():
        if p.name != "seed" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out[p.name] = "(required)" if p.default is p.empty else repr(p.default)
    return out


def _parse_param(text: str):
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise ValueError(f"--param must look like name=value, got {text!r}")
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        parsed = value.strip()  # a bare word stays a string
    return name.strip(), parsed


# ----------------------------------------------------------------------------- handlers
class _StderrHandler(logging.Handler):
    """Log lines on the current ``sys.stderr``, through tqdm when bars may be on screen."""

    def __init__(self, through_tqdm: bool):
        super().__init__()
        self.through_tqdm = through_tqdm

    def emit(self, record):
        message = self.format(record)
        if self.through_tqdm:
            from tqdm.auto import tqdm

            tqdm.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)


def _interactive() -> bool:
    return all(getattr(f, "isatty", lambda: False)() for f in (sys.stdout, sys.stderr))


def _setup_logging(bars: bool) -> None:
    for handler in [h for h in log.handlers if isinstance(h, _StderrHandler)]:
        log.removeHandler(handler)
    handler = _StderrHandler(through_tqdm=bars)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _setup(args):
    """Every check that can fail before the first claim; returns (claims, backend, staging, sweep)."""
    from lowrank_fl.outdir import OutputDir

    from .runner import select_claims

    backend = args.backend or ("dask" if args.scheduler else "loky")
    if args.scheduler and backend != "dask":
        raise ValueError(f"--scheduler needs --backend dask, got --backend {backend}")
    if args.no_cache and args.refresh:
        raise ValueError("--refresh needs the cache; drop --no-cache")
    if isinstance(args.jobs, bool) or args.jobs == 0 or args.jobs < -1:
        raise ValueError(f"--jobs must be an int >= 1 or -1 (all cores), got {args.jobs}")
    _check_cache_apart(None if args.no_cache else (args.cache or default_cache_dir()), args.out)
    _check_cache_option(args.cache, create=True)
    # --out first: it is the cheapest check and the one most often wrong
    staging = OutputDir(args.out, command="verify", overwrite=args.overwrite).open()
    sweep = None
    try:
        _load_claims(args.paper)
        claims = select_claims(papers=args.paper, ids=args.claim)
        if not claims:
            raise ValueError("no claims selected (is any claims module written yet?)")
        cache_dir = None if args.no_cache else (args.cache or default_cache_dir())
        bars = not args.no_progress and _interactive()
        sweep = Sweep(backend=backend, n_jobs=args.jobs, cache_dir=cache_dir,
                      scheduler=args.scheduler, progress=bars, refresh=args.refresh)
        sweep.prepare()
    except BaseException:
        if sweep is not None:
            sweep.close()
        staging.close()
        raise
    return claims, backend, staging, sweep


def cmd_verify(args) -> int:
    """Handler of ``lowrank-fl verify``."""
    from threadpoolctl import threadpool_limits

    from .budgets import budget_for, load_budgets
    from .report.write import write_report
    from .runner import ERROR_PREFIX, run_claims

    _setup_logging(bars=not args.no_progress and _interactive())
    claims, backend, staging, sweep = _setup(args)
    cache_dir = sweep.cache_dir
    log.info("verify: %d claim%s at scale %s, backend %s (jobs %s), cache %s%s", len(claims), "s"[:len(claims) != 1],
             args.scale, backend, args.jobs, cache_dir or "off", " (refresh)" if args.refresh else "")

    mode, number = args.time_budget
    table = load_budgets() if mode in ("auto", "factor") else {}

    def budgets(c):
        return budget_for(c.id, args.scale, mode, number, table)

    def on_result(k, n, c, e):
        log.info("[%d/%d] %s: %s (%.1f s) - %s", k, n, c.id, e.verdict, e.seconds, e.summary)

    start = time.perf_counter()
    try:
        # tasks pin their own threads; the claims' own numerics run here, pinned the same way
        with sweep, threadpool_limits(limits=1):
            ctx = Context(scale=args.scale, sweep=sweep, out_dir=staging.dir, base_seed=args.seed)
            results = run_claims(claims, ctx, on_result=on_result, budgets=budgets)
        # the omitted claims of the papers the report covers: --paper's, else those of the claims --claim chose
        papers = set(args.paper or ({c.paper for c in claims} if args.claim else PAPERS))
        omitted = [o for o in OMITTED.values() if o.paper in papers]
        paths = write_report(results, staging.dir, args.scale, omitted, meta={
            "base_seed": args.seed, "backend": backend,
            "total_seconds": round(time.perf_counter() - start, 2),
            "tasks": {"executed": sweep.executed, "from_cache": sweep.reused}})
        out = staging.commit()
    except (KeyboardInterrupt, SystemExit) as exc:      # Ctrl-C, or SIGTERM (outdir raises SystemExit(143))
        if isinstance(exc, SystemExit) and (exc.code != 128 + signal.SIGTERM or staging.committed):
            raise                     # after the commit the report is written (lowrank_fl.cli says so)
        staging.close()
        hint = (f"rerun the same command to resume from the cache ({cache_dir})" if cache_dir
                else "nothing was cached (--no-cache)")
        how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated (SIGTERM)"
        print(f"\nverify: {how}; no report written; {hint}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 128 + signal.SIGTERM
    finally:
        staging.close()
    for key in ("markdown", "html", "json"):
        print(Path(args.out) / Path(paths[key]).resolve().relative_to(staging.dir.resolve()))
    if paths["figures"]:
        n_fig = len(paths["figures"])
        print(f"{Path(args.out) / 'figures'}{os.sep} ({n_fig} figure{'s'[:n_fig != 1]})")
    # as the report counts them: remarks apart from the verdicts of the claims counted as verified
    counts = {v: sum(e.verdict == v for c, e in results if c.counted)
              for v in ("holds", "fails", "inconclusive", "erratum confirmed", REQUIRES_VERDICT,
                        BUDGET_VERDICT)}
    n_remarks = sum(not c.counted for c, _ in results)
    errors = [c.id for c, e in results if e.summary.startswith(ERROR_PREFIX)]
    log.info("verify: %d holds, %d fails, %d inconclusive (%d errors), %d erratum confirmed, "
             "%d %s, %d %s, %d remarks (not counted as verified); %d tasks run, %d from cache%s; "
             "report in %s", counts["holds"],
             counts["fails"], counts["inconclusive"], len(errors), counts["erratum confirmed"],
             counts[REQUIRES_VERDICT], REQUIRES_VERDICT, counts[BUDGET_VERDICT], BUDGET_VERDICT,
             n_remarks, sweep.executed,
             sweep.reused, f", {sweep.invalid} invalid entries recomputed" if sweep.invalid else "",
             out)
    stopped = [c.id for c, e in results if e.verdict == BUDGET_VERDICT]
    if stopped:
        log.info("verify: stopped at their time budget: %s (exit status %d)", ", ".join(stopped),
                 EXIT_EXPERIMENT)
    stalled = [c.id for c, e in results if any(
        (e.solves or {}).get("by_status", {}).get(s, 0) for s in STALLED_STATUSES)]
    if stalled:
        log.info("verify: a solve stalled (lowrank_fl.stall) in: %s", ", ".join(stalled))
    if errors:
        log.info("verify: experiments raised in %s (exit status %d)", ", ".join(errors), EXIT_EXPERIMENT)
    if errors or stopped:
        return EXIT_EXPERIMENT
    if args.strict and any(e.verdict == "fails" for _, e in results):
        return EXIT_EXPERIMENT
    return 0


def _claim_ids(ids, cache_dir: Path) -> list[str]:
    """``--claim`` ids of ``cache clear``, glob patterns (``clair.lemmaS11.*``) replaced by the ids
    they match as ``verify --claim`` reads them: registered claims, or labels that have cache
    entries (a renamed claim's old entries); ``ValueError`` naming an unknown id (a close match)."""
    import difflib
    import fnmatch

    from .cache import safe_name

    _load_claims(None)
    out: list[str] = []
    for cid in ids:
        if re.search(r"[*?\[]", cid):
            hits = sorted(i for i in REGISTRY if fnmatch.fnmatchcase(i, cid))
            if not hits:
                raise ValueError(f"--claim {cid} matches no claim id; `lowrank-fl claims` lists them")
            out += hits
        elif cid in REGISTRY or (cache_dir / safe_name(cid)).is_dir():
            out.append(cid)
        else:
            close = difflib.get_close_matches(cid, list(REGISTRY), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"--claim {cid} is not a claim id and has no entries in {cache_dir}; "
                             f"{hint}`lowrank-fl claims` lists the claim ids")
    return list(dict.fromkeys(out))


def cmd_cache_clear(args) -> int:
    """Handler of ``lowrank-fl cache clear``."""
    from .cache import clear_cache, safe_name

    _check_cache_option(args.cache, create=False)
    cache_dir = Path(args.cache or default_cache_dir())
    labels = None if not args.claim else [safe_name(c) for c in _claim_ids(args.claim, cache_dir)]
    if not cache_dir.is_dir():            # nothing to clear: say so rather than "removed 0"
        print(f"cache clear: {cache_dir} does not exist (nothing is cached there)")
        return 0
    removed = clear_cache(cache_dir, labels)
    none = " (nothing was cached for them)" if args.claim and not removed else ""
    print(f"cache clear: removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache_dir}{none}")
    return 0


def cmd_claims(args) -> int:
    """Handler of ``lowrank-fl claims``."""
    _load_claims(args.paper)
    papers = list(args.paper or PAPERS)
    claims = [c for c in REGISTRY.values() if c.paper in papers]
    claims.sort(key=lambda c: papers.index(c.paper))
    omitted = sorted((o for o in OMITTED.values() if o.paper in papers),
                     key=lambda o: (papers.index(o.paper), o.id))
    if args.json:
        print(json.dumps({
            "claims": [{"id": c.id, "paper": c.paper, "kind": c.kind, "reference": c.reference,
                        "statement": c.statement, "erratum": c.erratum} for c in claims],
            "omitted": [{"id": o.id, "paper": o.paper, "reference": o.reference,
                         "statement": o.statement, "reason": o.reason} for o in omitted]}, indent=1))
        return 0
    _print_table(["id", "kind", "reference", "statement"],
                 [[c.id, c.kind + (" (erratum)" if c.erratum and c.kind != "erratum" else ""),
                   c.reference, c.statement]
                  for c in claims])
    print(f"\n{len(claims)} claims.")
    if omitted:
        print(f"\nOmitted ({len(omitted)}):")
        _print_table(["id", "reference", "reason"], [[o.id, o.reference, o.reason] for o in omitted])
    return 0


class _ReadKeys(dict):
    """An instance that records which keys the conditions looked up."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def _with_conditions() -> list:
    """The papers with a conditions module (the adapters' extension states no theorem conditions)."""
    import pkgutil

    from . import conditions
    have = {m.name for m in pkgutil.iter_modules(conditions.__path__)}      # source or compiled
    return [x for x in PAPERS if x in have]


def cmd_conditions(args) -> int:
    """Handler of ``lowrank-fl conditions``."""
    import importlib

    from .conditions import Condition
    from .report.values import fmt
    from .runner import load_modules

    if args.paper not in PAPERS:
        raise ValueError(f"unknown paper {args.paper!r}; expected one of {_with_conditions()}")
    if args.paper not in _with_conditions():
        raise ValueError(f"paper {args.paper!r} states no theorem conditions (its claims are measurements); "
                         f"conditions exist for {', '.join(_with_conditions())}")
    load_modules("verify.conditions", [args.paper], required=True)
    module = importlib.import_module(f"verify.conditions.{args.paper}")
    for fn in ("generate", "evaluate"):
        if not callable(getattr(module, fn, None)):
            raise ValueError(f"verify.conditions.{args.paper} has no {fn}() function")
    accepted = _generate_parameters(module.generate)
    if args.list_params:
        _print_table(["parameter", "default"], [[k, v] for k, v in accepted.items()])
        return 0
    if args.instance is not None:
        from lowrank_fl.files import load_npz

        data = load_npz(args.instance, option="--instance")
        instance = _ReadKeys({k: (v.item() if v.ndim == 0 else v) for k, v in data.items()})
    else:
        params = dict(_parse_param(t) for t in args.param)
        unknown = sorted(set(params) - set(accepted))
        if unknown and not any(p.kind == p.VAR_KEYWORD
                               for p in inspect.signature(module.generate).parameters.values()):
            raise ValueError(f"unknown --param {unknown[0]!r} for {args.paper}; accepted: "
                             f"{', '.join(accepted) or 'none'}")
        with warnings.catch_warnings():      # a deprecated --param name is shown (as one warning line)
            warnings.simplefilter("always", DeprecationWarning)
            instance = module.generate(seed=args.seed, **params)
    try:
        conditions = list(module.evaluate(instance))
    except KeyError as exc:
        if args.instance is None:   # generate() output lacking a key is a bug, not bad input
            raise
        raise ValueError(f"--instance {args.instance} has no array named {exc.args[0]!r} (the "
                         f"{args.paper} conditions need it); keys found: {sorted(instance) or 'none'}"
                         ) from None
    bad = [type(c).__name__ for c in conditions if not isinstance(c, Condition)]
    if bad:
        raise TypeError(f"verify.conditions.{args.paper}.evaluate returned {bad[0]}, expected Condition")
    unread = sorted(set(instance) - instance.read) if isinstance(instance, _ReadKeys) else []
    if unread:                       # a misspelt key would otherwise leave its condition "not given"
        print(f"warning: --instance {args.instance}: the {args.paper} conditions read no array named "
              f"{', '.join(map(repr, unread))} (misspelt, or read only where another array is absent or present?)",
              file=sys.stderr)
    if args.json:
        from .claim import jsonable

        print(json.dumps([jsonable(vars(c)) for c in conditions], indent=1))
        return 0
    holds = {True: "yes", False: "NO", None: "-"}
    _print_table(["theorem", "condition", "value", "required", "holds", "note"],
                 [[c.theorem, c.name, fmt(c.value), c.required, holds[None if c.holds is None else bool(c.holds)], c.note]
                  for c in conditions])
    return 0


def build_parser(prog: str = "lowrank-fl") -> argparse.ArgumentParser:
    """Parser of the ``lowrank-fl`` command: the library's sub-commands and the verifier's."""
    from lowrank_fl.cli import add_library_parsers, add_version_argument

    parser = argparse.ArgumentParser(
        prog=prog, description="Federated low-rank learning: CLAIR fits and the papers' verifier.")
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    add_library_parsers(sub)
    add_parsers(sub)
    return parser


def lowrank_fl_main(argv=None) -> int:
    """The ``lowrank-fl`` console script; returns the exit status."""
    from lowrank_fl.cli import run

    return run(build_parser(), argv, errors=(KeyError, SetupError))


def main(argv=None) -> int:
    """``python -m verify`` entry point (the ``lowrank-fl verify`` command)."""
    from lowrank_fl.cli import add_version_argument, run

    parser = build_verify_parser()
    add_version_argument(parser)
    return run(parser, argv, errors=(KeyError, SetupError))
