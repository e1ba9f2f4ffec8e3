"""The ``lowrank-fl`` command.

Sub-commands::

    lowrank-fl clair fit W_hat.npz --rank R --lam-L X --lam-S Y --out DIR     (lowrank_fl.clair.cli)
    lowrank-fl verify [--paper P] [--claim ID ...] [--scale S] --out DIR       (verify.cli)
    lowrank-fl claims                                                          (verify.cli)
    lowrank-fl conditions <paper> [--instance FILE.npz | --param k=v ...]     (verify.cli)

The verifier commands live in the top-level ``verify`` package, which sits above ``lowrank_fl``;
they are imported lazily here so that ``lowrank_fl`` itself never imports ``verify``.
"""
from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lowrank-fl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    from .clair import cli as clair_cli

    clair_cli.add_parser(sub)
    from .adapters import cli as adapters_cli

    adapters_cli.add_parser(sub)
    try:
        from verify import cli as verify_cli
    except ModuleNotFoundError as exc:  # the library installed without the verifier package
        if exc.name != "verify":        # a missing dependency inside verify is a real error
            raise
        verify_cli = None
    if verify_cli is not None:
        verify_cli.add_parsers(sub)
    return parser


def main(argv=None) -> int:
    """Run the command line; returns the exit status (2 on bad input or a failed solve)."""
    from numpy.linalg import LinAlgError

    from .clair.cli import MissingArrayError
    from .results import SolverError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, MissingArrayError, SolverError,
            LinAlgError) as exc:
        print(f"lowrank-fl: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Output piped into a reader that stopped early (``lowrank-fl claims | head``): not an
        # error. Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
