"""``python -m verify.mutants --scale smoke|quick --out DIR``: the mutation table.

Runs every mutant of the catalogue (or those named with ``--mutant``) against the claims of the
papers whose code it breaks, prints which claims caught it, and writes ``DIR/mutants.json``: a
list of objects with ``mutant``, ``target``, ``description``, ``papers``, ``caught_by`` (claim ids
whose verdict changed), ``errored_in`` (the subset whose experiment raised), ``claims_run``,
``escaped``, ``seconds`` (the mutant's run time), ``stopped_by_budget`` (claims stopped at their
time budget, not counted in ``caught_by``) and ``caught_by_budget`` (all of them were). Exit status 0; 1 with ``--strict`` when a mutant escapes every
claim; 2 on bad input.

``--target tests`` runs each mutant that names covering test files against those files instead
(:mod:`verify.mutants.pytest_mode`; table in ``DIR/mutants_tests.json``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..claim import SCALES


def _run_one(mutant_id: str, baseline: dict, scale: str, seed: int,
             time_budget: tuple = ("auto", None)) -> dict:
    from .catalogue import CATALOGUE
    from .harness import run_mutant

    return run_mutant(CATALOGUE[mutant_id], baseline, scale, seed, time_budget=time_budget).to_dict()


def _baseline_chunk(paper: str, ids: list, scale: str, seed: int,
                    time_budget: tuple = ("auto", None)) -> dict:
    from .harness import baseline_verdicts

    return baseline_verdicts([paper], scale, seed, ids=ids, time_budget=time_budget)


def main(argv=None) -> int:
    from joblib import Parallel, delayed

    from .catalogue import CATALOGUE
    from .harness import claims_for

    parser = argparse.ArgumentParser(prog="python -m verify.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=SCALES[:2], default="smoke")
    parser.add_argument("--out", required=True, help="output directory (refused if not empty)")
    parser.add_argument("--mutant", action="append", default=[], metavar="ID",
                        help=f"run only these (repeatable); known: {', '.join(CATALOGUE)}")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run in parallel processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a mutant escapes")
    # --target tests (verify.mutants.pytest_mode): the covering test files, not the claims
    parser.add_argument("--target", choices=("claims", "tests"), default="claims",
                        help="what must catch each mutant: the claims (default) or the tests "
                             "covering its module")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="--target tests: seconds per pytest run (default 900)")
    parser.add_argument("--root", default=".", help="--target tests: repository root (default .)")
    parser.add_argument("--time-budget", default="auto", metavar="BUDGET",
                        help="per-claim time budget as in `lowrank-fl verify --time-budget` "
                             "(auto, off, N seconds, Nx)")
    args = parser.parse_args(argv)
    if args.target == "tests":
        return _tests_target(args)

    unknown = [m for m in args.mutant if m not in CATALOGUE]
    if unknown:
        print(f"verify.mutants: error: unknown --mutant {unknown[0]!r}", file=sys.stderr)
        return 2
    from ..budgets import parse_time_budget

    try:
        budget = parse_time_budget(args.time_budget)
    except ValueError as exc:
        print(f"verify.mutants: error: {exc}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("verify.mutants: error: --jobs must be >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    if not args.out or (out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite):
        print(f"verify.mutants: error: --out {args.out!r} is not an empty directory "
              f"(use --overwrite)", file=sys.stderr)
        return 2
    chosen = [CATALOGUE[m] for m in (args.mutant or CATALOGUE)]
    # the baseline covers exactly the claims some chosen mutant runs, one task per paper
    needed: dict[str, set] = {}
    for m in chosen:
        for c in claims_for(m):
            needed.setdefault(c.paper, set()).add(c.id)
    print(f"baseline: {sum(map(len, needed.values()))} claims of {', '.join(sorted(needed))} at "
          f"{args.scale} scale ...", flush=True)
    parallel = Parallel(n_jobs=args.jobs, backend="loky" if args.jobs > 1 else "sequential")
    baseline = {}
    for chunk in parallel(delayed(_baseline_chunk)(paper, sorted(ids), args.scale, args.seed, budget)
                          for paper, ids in sorted(needed.items())):
        baseline.update(chunk)
    rows = parallel(delayed(_run_one)(m.id, baseline, args.scale, args.seed, budget) for m in chosen)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutants.json").write_text(json.dumps(rows, indent=2) + "\n")
    width = max(len(r["mutant"]) for r in rows)
    for r in rows:
        caught = ", ".join(r["caught_by"]) if r["caught_by"] else "" if r["stopped_by_budget"] else "ESCAPED"
        budget_note = (f"  [stopped at their time budget: {', '.join(r['stopped_by_budget'])}"
                       + ("; caught by the budget]" if r["caught_by_budget"] else "]")
                       if r["stopped_by_budget"] else "")
        print(f"{r['mutant']:<{width}}  {len(r['caught_by']):>3}/{r['claims_run']:<3}  {r['seconds']:7.1f} s  "
              f"{caught}{budget_note}")
    escaped = [r["mutant"] for r in rows if r["escaped"]]
    by_budget = [r["mutant"] for r in rows if r["caught_by_budget"]]
    print(f"{len(rows) - len(escaped)}/{len(rows)} mutants caught"
          + (f" ({len(by_budget)} by the time budget alone: {', '.join(by_budget)})" if by_budget else "")
          + (f"; escaped: {', '.join(escaped)}" if escaped else ""))
    return 1 if (args.strict and escaped) else 0


def _tests_target(args) -> int:
    from .pytest_mode import tests_main

    if args.jobs < 1 or not args.timeout > 0:
        print("verify.mutants: error: --jobs must be >= 1 and --timeout > 0", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite:
        print(f"verify.mutants: error: --out {args.out!r} is not an empty directory "
              f"(use --overwrite)", file=sys.stderr)
        return 2
    return tests_main(args)


if __name__ == "__main__":
    sys.exit(main())
