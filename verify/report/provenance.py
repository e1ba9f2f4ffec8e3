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

__all__ = ["collect", "versions", "git_state", "git_text", "read_head", "command_line",
           "build_record", "EXTRA_PACKAGES", "BUILD_RECORD"]

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


_ROOT = Path(__file__).resolve().parent.parent.parent  # the directory holding verify/

#: Written into ``verify/`` when a wheel or sdist is built (``setup.py``): the commit the package
#: was built from, for a non-editable install that has no ``.git`` to read.
BUILD_RECORD = "_build_commit.json"


def build_record(root=None) -> dict | None:
    """The git state recorded when the installed copy at ``root`` was built (``verify/``
    :data:`BUILD_RECORD`, see ``setup.py``): ``{"commit", "dirty", "source": "build"[, "reason"]}``;
    ``None`` when there is no readable record (a checkout, or a copy built before records existed)."""
    import json

    path = (_ROOT if root is None else Path(root)) / "verify" / BUILD_RECORD
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    commit = doc.get("commit") if isinstance(doc, dict) else ""
    if not (commit is None or (isinstance(commit, str) and _is_sha(commit))):
        return None
    out = {"commit": commit, "dirty": doc.get("dirty") if isinstance(doc.get("dirty"), bool) else None,
           "source": "build"}
    if doc.get("reason"):
        out["reason"] = str(doc["reason"])
    return out


def _git(args, cwd) -> tuple[int, str, str] | None:
    """``(returncode, stdout, first line of stderr)`` of ``git args`` in ``cwd``; ``None`` when
    git cannot be run (not installed)."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    err = next((ln.strip() for ln in out.stderr.splitlines() if ln.strip()), "")
    return out.returncode, out.stdout.strip(), err.removeprefix("fatal: ")


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)


def read_head(checkout) -> str | None:
    """The commit ``HEAD`` of the git checkout ``checkout`` points to, read from its ``.git``
    without running git (for when git is missing or refuses the checkout); ``None`` if unreadable.

    Handles a ``.git`` directory or file (worktrees, submodules: ``gitdir: ...`` and
    ``commondir``), symbolic refs, loose and packed refs; only reads files.
    """
    try:
        dotgit = Path(checkout) / ".git"
        gitdir = dotgit
        if dotgit.is_file():
            text = dotgit.read_text(encoding="utf-8").strip()
            if not text.startswith("gitdir:"):
                return None
            gitdir = (dotgit.parent / text[len("gitdir:"):].strip()).resolve()
        common = gitdir
        if (gitdir / "commondir").is_file():
            common = (gitdir / (gitdir / "commondir").read_text(encoding="utf-8").strip()).resolve()
        value = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
        for _ in range(5):                                   # symbolic refs, at most 5 deep
            if _is_sha(value):
                return value
            if not value.startswith("ref:"):
                return None
            ref = value[len("ref:"):].strip()
            loose = [b / ref for b in (gitdir, common) if (b / ref).is_file()]
            if loose:
                value = loose[0].read_text(encoding="utf-8").strip()
                continue
            packed = common / "packed-refs"
            lines = packed.read_text(encoding="utf-8").splitlines() if packed.is_file() else []
            value = next((ln.split()[0] for ln in lines
                          if ln[:1] not in ("#", "^") and ln.split()[1:2] == [ref]), "")
            if not value:
                return None
    except (OSError, UnicodeDecodeError, IndexError):
        return None
    return None


def git_state(exclude=None, *, root=None) -> dict:
    """``{"commit": sha or None, "dirty": bool or None, "reason": str}`` of the checkout holding
    this package (``root``: another directory, for tests).

    ``dirty`` counts modified tracked files only, outside ``exclude`` (the report directory, which
    the run itself rewrites). ``reason`` (present when ``commit`` or ``dirty`` is ``None``) says
    why: an installed copy (no ``.git`` beside ``verify/``), git not installed, git refusing a
    checkout owned by another user (its ``safe.directory`` check), a checkout without commits.
    Where git cannot run or refuses, the commit is read from ``.git`` (:func:`read_head`); git's
    ``safe.directory`` check is not bypassed, since ``git status`` may run a checkout's hooks. An
    installed copy (``pip install .``, no ``.git``) gives the state recorded when it was built
    (:func:`build_record`, with ``"source": "build"``).
    """
    here = _ROOT if root is None else Path(root).resolve()
    if not (here / ".git").exists():
        recorded = build_record(here)
        if recorded is not None:
            return recorded
        return {"commit": None, "dirty": None,
                "reason": f"lowrank_fl runs from {here}, which is not a git checkout (an "
                          "installed package or an unpacked archive; run from a clone, e.g. "
                          "after `pip install -e .`, to record the commit)"}
    head = _git(["rev-parse", "HEAD"], here)
    unchecked = "uncommitted changes were not checked"
    if head is None:
        commit = read_head(here)
        return {"commit": commit, "dirty": None,
                "reason": f"git is not installed: the commit was read from {here / '.git'}, "
                          + unchecked if commit else
                          f"git is not installed and {here / '.git'} has no readable HEAD"}
    code, out, err = head
    if code != 0:
        commit = read_head(here)
        if "dubious ownership" in err:
            why = (f"git refuses the checkout {here}: it is owned by another user (git's "
                   "safe.directory check); `git config --global --add safe.directory "
                   f"{here}` lets the report check it")
        elif commit is None and "HEAD" in err:
            why = f"the git checkout {here} has no commit yet"
        else:
            why = f"git rev-parse HEAD failed in {here}: {err or f'exit status {code}'}"
        return {"commit": commit, "dirty": None,
                "reason": why + (f"; the commit was read from .git, {unchecked}" if commit else "")}
    spec = ["--", "."]
    if exclude is not None:
        try:
            rel = Path(exclude).resolve().relative_to(here)
            spec.append(f":(exclude){rel.as_posix()}")
        except ValueError:
            pass
    status = _git(["status", "--porcelain", "--untracked-files=no", *spec], here)
    if status is None or status[0] != 0:
        why = "git status failed" + (f": {status[2]}" if status and status[2] else "")
        return {"commit": out, "dirty": None, "reason": f"{why}; {unchecked}"}
    return {"commit": out, "dirty": bool(status[1])}


def git_text(git: dict) -> str:
    """The provenance's git line in words: the commit and whether it was clean, or why not."""
    commit, dirty, reason = git.get("commit"), git.get("dirty"), git.get("reason")
    if git.get("source") == "build" and commit is not None:
        state = {True: "with uncommitted changes", False: "clean"}.get(dirty, "changes not checked")
        return f"{commit} (recorded when this installed copy was built: {state})"
    if commit is None:
        return f"not recorded: {reason}" if reason else "not a git checkout"
    if dirty is None:
        return f"{commit} ({reason})" if reason else commit
    return commit + (" (dirty: uncommitted changes)" if dirty else " (clean)")


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
