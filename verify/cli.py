"""Command-line interface of the verifier: ``lowrank-fl verify | claims | conditions``.

``python -m verify ARGS`` is the same as ``lowrank-fl verify ARGS``.

Defaults of ``verify``: scale ``quick``, backend ``loky`` on all cores (``dask`` when
``--scheduler`` is given), base seed 0, and the task cache in ``$LOWRANK_FL_CACHE`` if set, else
``$XDG_CACHE_HOME/lowrank_fl/verify`` (``~/.cache/lowrank_fl/verify``). The cache is keyed by claim,
task, parameters, seed and code version, so one cache serves every report directory and an
interrupted run resumes where it stopped; ``--no-cache`` turns it off.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from pathlib import Path

from .claim import OMITTED, PAPERS, REGISTRY, SCALES, Context
from .sweep import BACKENDS, Sweep

__all__ = ["add_parsers", "main", "default_cache_dir", "build_verify_parser"]


def default_cache_dir() -> Path:
    """``$LOWRANK_FL_CACHE``, else ``$XDG_CACHE_HOME/lowrank_fl/verify``, else ``~/.cache/...``."""
    if os.environ.get("LOWRANK_FL_CACHE"):
        return Path(os.environ["LOWRANK_FL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lowrank_fl" / "verify"


# ----------------------------------------------------------------------------- parsers
def _add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--paper", action="append", choices=list(PAPERS), metavar="PAPER",
                   help=f"only this paper's claims (repeatable; one of {', '.join(PAPERS)})")
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
    cache.add_argument("--cache", type=Path, metavar="DIR",
                       help=f"task cache directory (default: {default_cache_dir()})")
    cache.add_argument("--no-cache", action="store_true", help="do not cache (nor resume) tasks")
    p.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 if a claim fails or its experiment raises")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="report directory (README.md, index.html, figures/, results.json)")
    p.set_defaults(handler=cmd_verify)


def add_parsers(subparsers) -> None:
    """Add ``verify``, ``claims`` and ``conditions`` to the ``lowrank-fl`` sub-command parsers."""
    _add_verify_arguments(subparsers.add_parser(
        "verify", help="run the papers' claims and write a report",
        description="Run the verifier's claims and write README.md, index.html, figures/ and "
                    "results.json into --out."))
    p = subparsers.add_parser("claims", help="list the registered (and omitted) claims")
    p.add_argument("--paper", action="append", choices=list(PAPERS), metavar="PAPER",
                   help="only this paper (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=cmd_claims)
    p = subparsers.add_parser("conditions", help="evaluate a paper's theorem conditions on an instance")
    p.add_argument("paper", help=f"one of {', '.join(PAPERS)}")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--instance", type=Path, metavar="FILE.npz", help="instance arrays (npz)")
    src.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                     help="parameter of the module's generate() (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of generate() (default: 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=cmd_conditions)


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
def cmd_verify(args) -> int:
    """Handler of ``lowrank-fl verify``."""
    from .report.write import write_report
    from .runner import run_claims, select_claims

    backend = args.backend or ("dask" if args.scheduler else "loky")
    if args.scheduler and backend != "dask":
        raise ValueError(f"--scheduler needs --backend dask, got --backend {backend}")
    _load_claims(args.paper)
    claims = select_claims(papers=args.paper, ids=args.claim)
    if not claims:
        raise ValueError("no claims selected (is any claims module written yet?)")
    cache_dir = None if args.no_cache else (args.cache or default_cache_dir())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"verify: {len(claims)} claims at scale {args.scale}, backend {backend}"
          f" (jobs {args.jobs}), cache {cache_dir or 'off'}", file=sys.stderr)

    def log(k, n, c, e):
        print(f"[{k}/{n}] {c.id}: {e.verdict} ({e.seconds:.1f} s) - {e.summary}", file=sys.stderr)

    start = time.perf_counter()
    with Sweep(backend=backend, n_jobs=args.jobs, cache_dir=cache_dir, scheduler=args.scheduler,
               progress=not args.no_progress) as sweep:
        ctx = Context(scale=args.scale, sweep=sweep, out_dir=out, base_seed=args.seed)
        results = run_claims(claims, ctx, on_result=log)
        executed, reused = sweep.executed, sweep.reused
    papers = set(args.paper or PAPERS)
    omitted = [o for o in OMITTED.values() if o.paper in papers]
    paths = write_report(results, out, args.scale, omitted, meta={
        "base_seed": args.seed, "backend": backend,
        "total_seconds": round(time.perf_counter() - start, 2),
        "tasks": {"executed": executed, "from_cache": reused}})
    for key in ("markdown", "html", "json"):
        print(paths[key])
    verdicts = [e.verdict for _, e in results]
    from .report._common import totals

    t = totals(results)
    print(f"verify: {t['holds']} holds, {t['fails']} fails, {t['inconclusive']} inconclusive "
          f"({t['errors']} errors), {t['erratum confirmed']} erratum confirmed, "
          f"{t['requires torch']} requires torch; "
          f"{executed} tasks run, {reused} from cache", file=sys.stderr)
    if args.strict and ("fails" in verdicts or t["errors"]):
        return 1
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


def cmd_conditions(args) -> int:
    """Handler of ``lowrank-fl conditions``."""
    import importlib

    import numpy as np

    from .conditions import Condition
    from .report._common import fmt
    from .runner import load_modules

    if args.paper not in PAPERS:
        raise ValueError(f"unknown paper {args.paper!r}; expected one of {list(PAPERS)}")
    load_modules("verify.conditions", [args.paper], required=True)
    module = importlib.import_module(f"verify.conditions.{args.paper}")
    for fn in ("generate", "evaluate"):
        if not callable(getattr(module, fn, None)):
            raise ValueError(f"verify.conditions.{args.paper} has no {fn}() function")
    if args.instance is not None:
        if not Path(args.instance).is_file():
            raise FileNotFoundError(f"--instance file {args.instance} does not exist")
        with np.load(args.instance, allow_pickle=False) as data:
            instance = {k: (data[k].item() if data[k].ndim == 0 else data[k]) for k in data.files}
    else:
        instance = module.generate(seed=args.seed, **dict(_parse_param(t) for t in args.param))
    conditions = list(module.evaluate(instance))
    bad = [type(c).__name__ for c in conditions if not isinstance(c, Condition)]
    if bad:
        raise TypeError(f"verify.conditions.{args.paper}.evaluate returned {bad[0]}, expected Condition")
    if args.json:
        from .claim import _jsonable

        print(json.dumps([_jsonable(vars(c)) for c in conditions], indent=1))
        return 0
    holds = {True: "yes", False: "NO", None: "-"}
    _print_table(["theorem", "condition", "value", "required", "holds", "note"],
                 [[c.theorem, c.name, fmt(c.value), c.required, holds[None if c.holds is None else bool(c.holds)], c.note]
                  for c in conditions])
    return 0


def main(argv=None) -> int:
    """``python -m verify`` entry point (the ``lowrank-fl verify`` command)."""
    args = build_verify_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, KeyError) as exc:
        print(f"python -m verify: error: {exc}", file=sys.stderr)
        return 2
