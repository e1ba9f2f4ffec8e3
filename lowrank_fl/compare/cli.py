"""``lowrank-fl compare``: exact versus iterative solvers on the user's own instance.

::

    lowrank-fl compare clair W_hat.npz --lam-L X --lam-S Y [--weights w.npy] [--methods M ...]
                       [--tol T] [--max-iter N] [--time-limit S] [--memory-limit GB] [--rank R]
                       [--tau T] [--alpha A] --out DIR [--overwrite]
    lowrank-fl compare nuclear data.npz --mu MU [...] --out DIR      (arrays X (n, m, d), y (n, m))
    lowrank-fl compare noiseless W.npz --lam-L X --lam-S Y [...] --out DIR   (array W or W_hat)

Writes ``DIR/compare.json`` (schema: ``lowrank_fl/compare/compare.schema.json``),
``DIR/compare.md`` (the table, also printed) and ``DIR/compare.png`` (suboptimality vs time),
together at the end; ``DIR`` is locked while the comparison runs (:mod:`lowrank_fl.outdir`).

Exit status: 0 when the comparison was written (methods that could not run or hit the time limit
are rows with their reason); 3 when no method returned a point; 2 on bad input.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from ..clair.cli import tau_argument
from ..files import load_npy, load_npz
from .engine import TAU_RULES, compare_clair, compare_noiseless, compare_nuclear
from .output import check_out_dir, open_out_dir, write_files

__all__ = ["add_parser", "load_arrays", "EXIT_NOTHING_RAN"]

#: Exit status when no method returned a point.
EXIT_NOTHING_RAN = 3


def load_arrays(path, keys, *, alternatives=None, option: str = "input", ndim=None) -> dict:
    """Arrays ``keys`` of an ``.npz``; ``ValueError`` naming a missing key and the keys found.

    ``alternatives``: optional mapping ``key -> other accepted name``. ``ndim``: optional
    mapping ``key -> (dimensions, shape words)``; another ``ndim`` is refused naming the file. ``option`` names the
    argument in the messages of :func:`lowrank_fl.files.load_npz` (missing, empty, truncated or
    non-``.npz`` file, a directory).
    """
    data = load_npz(path, option=option)
    out = {}
    for key in keys:
        alt = (alternatives or {}).get(key)
        name = key if key in data else (alt if alt in data else None)
        if name is None:
            also = f" (or {alt!r})" if alt else ""
            raise ValueError(f"{option} {path} has no array named {key!r}{also}; keys found: "
                             f"{sorted(data) or 'none'}")
        out[key] = np.array(data[name])
        want = (ndim or {}).get(key)
        if want is not None and out[key].ndim != want[0]:
            raise ValueError(f"{option} {path}: array {name!r} must have {want[0]} dimensions "
                             f"{want[1]}, got shape {out[key].shape}")
    return out


def _methods(values):
    if values is None:
        return None
    return [m for v in values for m in v.split(",") if m]


def _common(p, *, iterative=True, clair=True):
    p.add_argument("--methods", nargs="+", default=None, metavar="M",
                   help="methods to compare (space or comma separated; default: every iterative "
                        "method and cvxpy:<SOLVER> for each installed SDP solver)")
    if iterative:
        p.add_argument("--tol", type=float, default=1e-8,
                       help="relative duality-gap tolerance of the iterative methods")
        p.add_argument("--max-iter", dest="max_iter", type=int, default=100_000,
                       help="iteration cap of the iterative methods")
        p.add_argument("--memory-measure", dest="memory_measure", default="rss_growth",
                       choices=("rss_growth", "tracemalloc"),
                       help="peak memory of the iterative methods (tracemalloc slows them)")
    p.add_argument("--time-limit", dest="time_limit", type=float, default=300.0,
                   help="seconds per method; a solve still running is stopped (default 300)")
    p.add_argument("--memory-limit", dest="memory_limit", type=float, default=None,
                   help="GB; methods estimated above it are not run (default: half the RAM)")
    p.add_argument("--rank", type=int, default=None,
                   help="r of the top-r projectors (default: numerical rank of the best solution)")
    if clair:
        p.add_argument("--tau", type=tau_argument, default="largest-gap",
                       help=f"threshold of (8): a number >= 0 or {', '.join(TAU_RULES)}")
        p.add_argument("--alpha", type=float, default=0.5, help="majority fraction of (8)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (created; never an input or a folder holding one)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it holds a previous lowrank-fl output (its "
                        ".lowrank-fl-output marker); any other directory is refused")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``compare`` (sub-commands ``clair``, ``nuclear``, ``noiseless``)."""
    cmp_ = subparsers.add_parser("compare", help="compare exact and iterative solvers",
                                 description=__doc__.split("\n\n")[0])
    sub = cmp_.add_subparsers(dest="compare_command", required=True)
    epilog = (f"exit status: 0 comparison written; {EXIT_NOTHING_RAN} no method returned a "
              "point; 2 bad input")
    p = sub.add_parser("clair", help="program (7): FISTA, Algorithm 1, CVXPY solvers",
                       epilog=epilog)
    p.add_argument("W_hat", type=Path, help=".npz holding an array W_hat of shape (K, q, p)")
    p.add_argument("--lam-L", dest="lam_L", type=float, required=True, help="nuclear penalty > 0")
    p.add_argument("--lam-S", dest="lam_S", type=float, required=True, help="block penalty > 0")
    p.add_argument("--weights", type=Path, default=None,
                   help=".npy of pair weights, shape (K(K-1)/2,); default 1/K")
    _common(p)
    p.set_defaults(handler=run_compare_clair)
    p = sub.add_parser("nuclear", help="nuclear-norm multi-task least squares: proximal "
                                       "gradient vs CVXPY", epilog=epilog)
    p.add_argument("data", type=Path, help=".npz holding X (n, m, d) and y (n, m)")
    p.add_argument("--mu", type=float, required=True, help="nuclear penalty > 0")
    _common(p, clair=False)
    p.set_defaults(handler=run_compare_nuclear)
    p = sub.add_parser("noiseless", help="program (24): CVXPY solvers", epilog=epilog)
    p.add_argument("W", type=Path, help=".npz holding W (or W_hat) of shape (K, q, p)")
    p.add_argument("--lam-L", dest="lam_L", type=float, required=True, help="nuclear penalty > 0")
    p.add_argument("--lam-S", dest="lam_S", type=float, required=True, help="block penalty > 0")
    _common(p, iterative=False)
    p.set_defaults(handler=run_compare_noiseless)
    return cmp_


def _limits(args):
    if args.memory_limit is not None and not (math.isfinite(args.memory_limit) and args.memory_limit > 0):
        raise ValueError(f"--memory-limit must be a finite number of GB > 0, got {args.memory_limit:g}")
    mem = None if args.memory_limit is None else args.memory_limit * 1e9
    return {"time_limit": args.time_limit, "memory_limit": mem, "rank": args.rank,
            "methods": _methods(args.methods)}


def _run(args, problem: str, inputs, solve) -> int:
    """Lock and stage ``--out`` while ``solve()`` runs, then write the comparison into it."""
    inputs = [p for p in inputs if p is not None]
    check_out_dir(args.out, overwrite=args.overwrite, inputs=inputs)     # before reading inputs
    with open_out_dir(args.out, problem=problem, overwrite=args.overwrite, inputs=inputs) as out:
        comparison = solve()
        names = list(write_files(comparison, out.dir))
        out.commit()
    print(comparison.table(), end="")
    print(f"wrote {', '.join(str(Path(args.out) / n) for n in names)}")
    if not any(r.outcome == "ok" for r in comparison.methods):
        return EXIT_NOTHING_RAN
    return 0


def run_compare_clair(args) -> int:
    def solve():
        W = load_arrays(args.W_hat, ["W_hat"], option="W_hat",
                        ndim={"W_hat": (3, "(K, q, p)")})["W_hat"]
        weights = None if args.weights is None else load_npy(args.weights, option="--weights")
        return compare_clair(W, args.lam_L, args.lam_S, weights=weights, tol=args.tol,
                             max_iter=args.max_iter, tau=args.tau, alpha=args.alpha,
                             memory_measure=args.memory_measure, **_limits(args))
    return _run(args, "clair", [args.W_hat, args.weights], solve)


def run_compare_nuclear(args) -> int:
    def solve():
        arrays = load_arrays(args.data, ["X", "y"], option="data")
        return compare_nuclear(arrays["X"], arrays["y"], args.mu, tol=args.tol,
                               max_iter=args.max_iter, memory_measure=args.memory_measure,
                               **_limits(args))
    return _run(args, "nuclear", [args.data], solve)


def run_compare_noiseless(args) -> int:
    def solve():
        W = load_arrays(args.W, ["W"], alternatives={"W": "W_hat"}, option="W",
                        ndim={"W": (3, "(K, q, p)")})["W"]
        return compare_noiseless(W, args.lam_L, args.lam_S, tau=args.tau, alpha=args.alpha,
                                 **_limits(args))
    return _run(args, "noiseless", [args.W], solve)
