"""Where a report comes from: code version, git commit, command line, dependencies, machine."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

__all__ = ["collect", "versions", "git_state", "command_line", "EXTRA_PACKAGES"]

#: Packages that do not enter the cache key but shape the report or the run (figures, progress).
EXTRA_PACKAGES = ("matplotlib", "tqdm", "dask", "distributed")


def versions() -> dict:
    """Versions of the interpreter, the numerical stack, the toolkit, and the platform.

    Keys: python, numpy, scipy, cvxpy, clarabel, scs, joblib (those of the cache key,
    :func:`verify.sweep.dependency_versions`), lowrank_fl, platform.
    """
    import lowrank_fl

    from ..sweep import dependency_versions

    return {**dependency_versions(), "lowrank_fl": lowrank_fl.__version__, "platform": platform.platform()}


def _git(args, cwd) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(exclude=None) -> dict:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding this package.

    ``dirty`` counts modified tracked files only, outside ``exclude`` (the report directory, which
    the run itself rewrites). An installed copy (not a git checkout) gives ``None`` for both.
    """
    here = Path(__file__).resolve().parent.parent.parent  # the directory holding verify/
    top = _git(["rev-parse", "--show-toplevel"], here)
    if top is None or Path(top).resolve() != here:
        return {"commit": None, "dirty": None}
    commit = _git(["rev-parse", "HEAD"], here)
    spec = ["--", "."]
    if exclude is not None:
        try:
            rel = Path(exclude).resolve().relative_to(here)
            spec.append(f":(exclude){rel.as_posix()}")
        except ValueError:
            pass
    status = _git(["status", "--porcelain", "--untracked-files=no", *spec], here)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def command_line(argv=None) -> str:
    """The command that is running, as a user would type it (``lowrank-fl verify ...``)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    prog = Path(argv[0])
    if prog.name == "__main__.py":
        head = f"python -m {prog.parent.name}"
    elif prog.name in ("-c", ""):
        head = "python -c ..."
    else:
        head = prog.name
    return " ".join([head, *map(shlex.quote, argv[1:])])


def collect(out_dir=None) -> dict:
    """Provenance of a report written now into ``out_dir``.

    Keys: ``lowrank_fl`` (version), ``git`` (commit, dirty), ``command``, ``created`` (UTC),
    ``dependencies`` ({name: version}: the numerical stack and :data:`EXTRA_PACKAGES`),
    ``machine`` (platform, processor architecture, cpu_count, python implementation).
    """
    import lowrank_fl

    from ..sweep import dependency_versions

    deps = dependency_versions()
    for name in EXTRA_PACKAGES:
        try:
            deps[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {
        "lowrank_fl": lowrank_fl.__version__,
        "git": git_state(out_dir),
        "command": command_line(),
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "dependencies": deps,
        "machine": {"platform": platform.platform(), "architecture": platform.machine(),
                    "cpu_count": os.cpu_count(), "python": platform.python_implementation()
                    + " " + platform.python_version()},
    }
