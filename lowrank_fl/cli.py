"""The library's command-line sub-commands and the dispatcher every ``lowrank-fl`` command shares.

The ``lowrank-fl`` console script itself lives in the verifier (``verify.cli.lowrank_fl_main``),
which sits above the library: it adds the library's sub-commands (:func:`add_library_parsers`)
and its own (``verify``, ``claims``, ``conditions``, ``cache``). The library never imports
``verify``; ``python -m lowrank_fl.cli`` is the library-only command::

    lowrank-fl clair fit W_hat.npz --rank R --lam-L X --lam-S Y --out DIR     (lowrank_fl.clair.cli)
    lowrank-fl compare {clair,nuclear,noiseless} FILE.npz ... --out DIR        (lowrank_fl.compare.cli)

Exit status of :func:`run`: the handler's status; 2 on bad input (one line ``prog: error: ...``,
no traceback); 130 on Ctrl-C (one line); 0 when stdout is a pipe closed by its reader.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from typing import Callable, Sequence

__all__ = ["main", "build_parser", "add_library_parsers", "add_version_argument", "run",
           "version_string", "EXIT_USAGE", "EXIT_INTERRUPTED"]

#: Exit status on bad input or a failed solve (argparse's own usage errors use 2 as well).
EXIT_USAGE = 2
#: Exit status after Ctrl-C (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = 130


def version_string() -> str:
    """``"lowrank_fl X.Y.Z (Python A.B.C, numpy N)"``."""
    import numpy

    import lowrank_fl

    return (f"lowrank_fl {lowrank_fl.__version__} (Python {sys.version.split()[0]}, "
            f"numpy {numpy.__version__})")


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """``--version``: print :func:`version_string` and exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s: {version_string()}")


def add_library_parsers(subparsers) -> None:
    """Register the library's sub-commands (``clair fit``, ``compare``, ``adapters``) on an argparse sub-parser set."""
    from .clair import cli as clair_cli

    clair_cli.add_parser(subparsers)
    from .compare import cli as compare_cli

    compare_cli.add_parser(subparsers)
    from .adapters import cli as adapters_cli

    adapters_cli.add_parser(subparsers)


def build_parser(prog: str = "lowrank-fl") -> argparse.ArgumentParser:
    """Parser of the library-only command (``python -m lowrank_fl.cli``)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_version_argument(parser)
    add_library_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


def _user_errors() -> tuple:
    from numpy.linalg import LinAlgError

    from .clair.cli import MissingArrayError
    from .results import SolverError

    # OSError covers a missing, unreadable or unwritable path (its message names the path)
    return (ValueError, TypeError, OSError, MissingArrayError, SolverError, LinAlgError)


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, *,
        errors: tuple = (), prog: str | None = None,
        before: Callable[[argparse.Namespace], None] | None = None) -> int:
    """Parse ``argv``, call ``args.handler(args)`` and turn failures into one line and a status.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        Its sub-commands set ``handler`` (a function ``args -> int | None``).
    errors : tuple of exception types
        Reported like the library's input errors (exit 2), e.g. the verifier's setup errors.
    prog : str, optional
        Prefix of the error line (default: ``parser.prog``).
    before : callable, optional
        Called with the parsed arguments before the handler (e.g. to set up logging).
    """
    prog = prog or parser.prog
    formatwarning = warnings.formatwarning
    # a warning the command does not catch is one "warning: ..." line like its own, not Python's
    # "file:line: Category: ..." and a source line (pytest's recorders never format, so unaffected)
    warnings.formatwarning = _warning_line
    try:
        args = parser.parse_args(argv)
        if before is not None:
            before(args)
        return int(args.handler(args) or 0)
    except BrokenPipeError:
        # Output piped into a reader that stopped early (``lowrank-fl claims | head``): not an
        # error. Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        # SIGTERM unwinds as SystemExit(143) (lowrank_fl.outdir): say so, as Ctrl-C is said
        if exc.code == 128 + signal.SIGTERM and not isinstance(exc.code, bool):
            from .outdir import TerminatedAfterCommit
            state = ("just after the output was written (it is complete)" if isinstance(exc, TerminatedAfterCommit)
                     else "the output directory was left as it was")
            print(f"\n{prog}: terminated (SIGTERM); {state}", file=sys.stderr)
            return exc.code
        raise
    except _user_errors() + tuple(errors) as exc:
        message = " ".join(str(exc).split("\n")[0].split()) or type(exc).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        warnings.formatwarning = formatwarning


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """One line per warning: ``warning: <message>`` (its category named unless a plain UserWarning)."""
    text = " ".join(str(message).split())
    kind = "" if category is UserWarning else f" ({category.__name__})"
    return f"warning: {text}{kind}\n"


def main(argv=None) -> int:
    """The library-only command line (``clair fit``); returns the exit status."""
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
