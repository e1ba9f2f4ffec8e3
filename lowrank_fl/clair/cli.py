"""``lowrank-fl clair fit``: run the CLAIR pipeline on local estimates stored in an ``.npz``.

::

    lowrank-fl clair fit W_hat.npz --rank R --lam-L X --lam-S Y [--alpha A] [--tau T]
                         [--method M] [--weights FILE.npy] [--tol T] [--max-iter N]
                         --out DIR [--overwrite]

Input: an ``.npz`` with an array ``W_hat`` of shape (K, q, p). Output in ``DIR``:
``summary.json`` (benign set, rank, objective, duality gap and the relative gap ``--tol`` applies
to, status, tau, solver, ...) and ``refined.npz`` (``W_tilde`` (K, q, p), ``benign`` (K,),
``projector`` (p, p)). ``DIR`` is checked before the fit: it must be new or empty, or hold a
previous lowrank-fl output and ``--overwrite`` be given; both files appear together at the end
(nothing is half-written when the fit fails or is interrupted; see :mod:`lowrank_fl.outdir`).

Exit status: 0 when the solve of (7) is ``optimal`` (or ``completed``); 3 when it stopped
unconverged (``max_iter``, ``stalled`` or ``inaccurate``: outputs are still written, from the inexact
solution); 2 on bad input or a failed solve (``diverged``, CVXPY error).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

from ..files import load_npy, load_npz
from ..jsontext import strict_dumps
from ..outdir import OutputDir
from .penalized import ITERATIVE_TOL
from .pipeline import TAU_RULES, fit
from .programs import DEFAULT_TOL

__all__ = ["add_parser", "run_fit", "load_W_hat", "tau_argument", "MissingArrayError", "EXIT_UNCONVERGED"]

#: Exit status when the solve stopped before its tolerance (outputs written nonetheless).
EXIT_UNCONVERGED = 3
_CONVERGED = ("optimal", "completed")


class MissingArrayError(KeyError):
    """An input ``.npz`` lacks a required array (a KeyError whose message prints unquoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def tau_argument(text: str):
    """argparse ``type`` of ``--tau``: a rule name of :data:`~lowrank_fl.clair.pipeline.TAU_RULES`
    or a number."""
    if text in TAU_RULES:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--tau must be a number >= 0 or one of {', '.join(TAU_RULES)}, got {text!r}") from None


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``clair`` command (with its ``fit`` sub-command) to an argparse sub-parser set."""
    clair = subparsers.add_parser("clair", help="CLAIR: collaborative alignment of local estimates")
    sub = clair.add_subparsers(dest="clair_command", required=True)
    p = sub.add_parser("fit", help="detect the collaborative set and refine local estimates",
                       description=__doc__.split("\n\n")[0],
                       epilog=f"exit status: 0 converged; {EXIT_UNCONVERGED} solver stopped "
                              "unconverged (max_iter / stalled / inaccurate; outputs still "
                              "written); 2 bad input or failed solve")
    p.add_argument("W_hat", type=Path, help=".npz file holding an array W_hat of shape (K, q, p)")
    p.add_argument("--rank", type=int, required=True, help="shared rank r, 1 <= r < min(p, q)")
    p.add_argument("--lam-L", dest="lam_L", type=float, required=True, help="nuclear penalty > 0")
    p.add_argument("--lam-S", dest="lam_S", type=float, required=True, help="block penalty > 0")
    p.add_argument("--alpha", type=float, default=0.5, help="majority fraction in [0.5, 1)")
    p.add_argument("--tau", type=tau_argument, default="largest-gap",
                   help=f"block-norm threshold >= 0 or a rule ({', '.join(TAU_RULES)})")
    p.add_argument("--method", default="fista",
                   help="solver for (7): fista, proxgrad or cvxpy (--max-iter applies to fista and "
                        "proxgrad only; --tol to all three, judged by the certified relative gap)")
    p.add_argument("--weights", type=Path, default=None,
                   help=".npy file of pair weights, shape (K(K-1)/2,); default 1/K")
    p.add_argument("--tol", type=float, default=None,
                   help="relative duality-gap tolerance (default 1e-8 for fista and proxgrad, 1e-7 for "
                        "cvxpy's certificate)")
    p.add_argument("--max-iter", dest="max_iter", type=int, default=None,
                   help="iteration cap of the iterative solvers (default 10000)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (created; must be new or empty unless --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an --out directory holding a previous lowrank-fl output (its "
                        ".lowrank-fl-output marker); never another directory")
    p.set_defaults(handler=run_fit)
    return p


def load_W_hat(path) -> np.ndarray:
    """Read the array ``W_hat`` from an ``.npz``; every failure is one clear message.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        A directory, an empty, truncated or non-``.npz`` file (e.g. a bare ``.npy`` array).
    MissingArrayError
        The archive has no ``W_hat``.
    """
    data = load_npz(path, option="W_hat")
    if "W_hat" not in data:
        raise MissingArrayError(f"{path} has no array named 'W_hat' (shape (K, q, p)); "
                                f"keys found: {sorted(data) or 'none'}")
    return np.array(data["W_hat"])


def run_fit(args) -> int:
    """Handler of ``clair fit``: check the output, fit, then write ``summary.json`` and
    ``refined.npz`` together."""
    W_hat = load_W_hat(args.W_hat)
    weights = None if args.weights is None else load_npy(args.weights, option="--weights")
    inputs = [args.W_hat] + ([args.weights] if args.weights is not None else [])
    with OutputDir(args.out, command="clair fit", overwrite=args.overwrite, inputs=inputs) as out:
        code = _fit_and_write(args, W_hat, weights, out.dir)
        out.commit()
    print(f"wrote {Path(args.out) / 'summary.json'} and {Path(args.out) / 'refined.npz'}")
    return code


def _fit_and_write(args, W_hat, weights, out: Path) -> int:
    # only options the user gave are forwarded (cvxpy refuses iterative-only options)
    opts = {k: v for k, v in (("tol", args.tol), ("max_iter", args.max_iter)) if v is not None}
    with warnings.catch_warnings(record=True) as caught:   # one stderr line each, no source line
        warnings.simplefilter("always")
        res = fit(W_hat, args.lam_L, args.lam_S, rank=args.rank, alpha=args.alpha, tau=args.tau,
                  weights=weights, method=args.method, **opts)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    sol = res.solution
    K, q, p = W_hat.shape
    summary = {
        "K": K, "q": q, "p": p,
        "benign": [int(k) for k in np.flatnonzero(res.benign)],
        "excluded": [int(k) for k in np.flatnonzero(~res.benign)],
        "rank": res.rank,
        "numerical_rank": res.numerical_rank,
        "objective": float(sol.objective),
        "gap": float(sol.gap),
        "relative_gap": float(sol.relative_gap),
        # the tolerance the certificate was judged against (the method's default where none was given)
        "tol": args.tol if args.tol is not None else (DEFAULT_TOL if args.method == "cvxpy" else ITERATIVE_TOL),
        "status": str(sol.status),
        "iterations": int(sol.iterations),
        "tau": float(res.tau),
        "tau_rule": res.tau_rule,
        "alpha": res.alpha,
        "lam_L": float(args.lam_L),
        "lam_S": float(args.lam_S),
        "solver": str(sol.solver),
        "votes": [float(v) for v in res.votes],
    }
    (out / "summary.json").write_text(strict_dumps(summary, indent=2) + "\n")
    np.savez(out / "refined.npz", W_tilde=res.refined, benign=res.benign,
             projector=res.projector)
    print(f"CLAIR: kept {len(summary['benign'])} of {K} clients "
          f"(tau={res.tau:.4g}, status={sol.status}, relative gap {summary['relative_gap']:.2e})")
    if str(sol.status) not in _CONVERGED:
        print(f"lowrank-fl: warning: the solve of (7) did not converge (status {sol.status}); "
              f"exit status {EXIT_UNCONVERGED}", file=sys.stderr)
        return EXIT_UNCONVERGED
    return 0
