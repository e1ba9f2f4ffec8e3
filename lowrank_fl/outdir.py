"""Output directories that never cost a user a file: marker, input checks, lock, staging, swap.

Every command that writes a directory (``clair fit``, ``compare``, ``adapters aggregate``,
``verify``) goes through :class:`OutputDir`; the rules, in one place:

* **Marker.** Every output directory gets :data:`MARKER` (``.lowrank-fl-output``, JSON: tool,
  command, version, time, and the ``files`` the run wrote). ``overwrite`` replaces a non-empty
  directory only when it holds that marker and nothing the marker does not list: a directory
  this tool did not write is never cleared, nor a file a user put into one it wrote
  (:func:`foreign_files`; a marker of a version before the list proves the directory only).
* **Inputs.** An output equal to, containing, or inside an input (symlinks, ``.`` and ``..``
  resolved), the current directory or one of its parents, and an empty name are refused, with or
  without ``overwrite``.
* **Lock.** The output is locked for the whole run (a ``.NAME.lowrank-fl-lock`` file beside it,
  :mod:`.filelock`); a second writer of the same output stops with one line.
* **Staging.** Files are written into ``.NAME.lowrank-fl-staging.HOST.PID`` beside the output and
  swapped in by two renames when everything succeeded; a failure, Ctrl-C or SIGTERM removes the
  staging and leaves the output as it was. A run killed with SIGKILL leaves its staging behind:
  the next run on the same output removes staging of dead processes of this host (and restores an
  output caught between the two renames), and names any other leftovers on stderr.
* **Unchanged.** The swap happens only if ``out`` is still what it was when the run started
  (absent, or the same names, sizes and times); files added there during the run are never
  deleted: ``out`` is left alone and the result kept in ``NAME.lowrank-fl-result.PID`` beside it.

Errors are ``ValueError`` with one line naming the option (the CLI prints it, exit status 2).
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable

from .filelock import FileLock, LockHeld

__all__ = ["MARKER", "OutputDir", "TerminatedAfterCommit", "check_output_dir", "is_output_dir",
           "check_output_file", "write_file", "foreign_files"]

#: File written into every output directory; ``--overwrite`` replaces only directories holding it.
MARKER = ".lowrank-fl-output"
_TOOL = "lowrank-fl"
_TAG = ".lowrank-fl-"          # hidden siblings: .NAME.lowrank-fl-{lock,staging.H.P,old.H.P}


def _resolve(path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def is_output_dir(path) -> bool:
    """Whether ``path`` is a directory holding this tool's :data:`MARKER`."""
    marker = Path(path) / MARKER
    try:
        return marker.is_file() and json.loads(marker.read_text()).get("tool") == _TOOL
    except (OSError, ValueError, AttributeError):
        return False


#: what file browsers drop into any folder they show (never a user's work): not counted as foreign
_DESKTOP_FILES = (".DS_Store", "Thumbs.db", "desktop.ini")


def _written_files(directory: Path) -> list[str]:
    """Every file (and link) under ``directory``, relative, ``/``-separated, sorted; the marker
    aside (:func:`_listing`'s entries that are not directories)."""
    return sorted(rel.replace(os.sep, "/") for rel, (mode, _, _) in (_listing(directory) or {}).items()
                  if not stat.S_ISDIR(mode) and rel != MARKER)


def foreign_files(path) -> list[str] | None:
    """The files in the output directory ``path`` that the run which wrote it did not write (its
    :data:`MARKER` lists what it wrote); ``None`` where the marker lists nothing (written by a
    version before the list: only the marker proves the directory is this tool's)."""
    try:
        listed = json.loads((Path(path) / MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(listed, list):
        return None
    return sorted(f for f in set(_written_files(Path(path))) - set(listed)
                  if f.rsplit("/", 1)[-1] not in _DESKTOP_FILES)


def _overwrite_hint(option: str) -> str:
    """How the caller asks to replace: the command's flag, or the Python argument where ``option``
    names an argument (no leading dashes)."""
    return "--overwrite" if option.startswith("-") else "overwrite=True"


def check_output_dir(out, *, overwrite: bool = False, inputs: Iterable = (),
                     option: str = "--out") -> Path:
    """The resolved output path, after every check that can be made before writing.

    Parameters
    ----------
    out : path-like
        The output directory (need not exist).
    overwrite : bool
        Allow replacing a non-empty ``out`` that holds :data:`MARKER`.
    inputs : iterable of path-like
        Input files or directories: ``out`` may not equal, contain or lie inside any of them.
    option : str
        How the messages name ``out``: a command's flag (``"--out"``; they then say ``--overwrite``)
        or a Python argument (``"out"``; they then say ``overwrite=True``).

    Raises ``ValueError`` (one line naming ``option``) when ``out`` may not be written.
    """
    if out is None or str(out) == "":
        raise ValueError(f"{option} must name a directory, got ''")
    target = _resolve(out)
    cwd = Path.cwd().resolve()
    if cwd == target or cwd.is_relative_to(target):
        raise ValueError(f"{option} {out} is the current directory or one of its parents; name a "
                         "directory of its own")
    for item in inputs:
        src = _resolve(item)
        if src == target or src.is_relative_to(target) or target.is_relative_to(src):
            how = ("is the input" if src == target else "contains the input"
                   if src.is_relative_to(target) else "is inside the input")
            raise ValueError(f"{option} {out} {how} {item}; write the output to a directory of "
                             "its own, outside every input")
    if target.exists() and not target.is_dir():
        raise ValueError(f"{option} {out} is a file, not a directory")
    if target.is_dir() and any(target.iterdir()):
        if not is_output_dir(target):          # checked first: --overwrite would not help here
            raise ValueError(f"{option} {out} is not empty and does not hold a previous lowrank-fl output "
                             f"(no {MARKER}); refusing to replace it: remove it yourself or choose "
                             "another directory")
        if not overwrite:
            raise ValueError(f"{option} {out} is not empty; pass {_overwrite_hint(option)} to replace a previous "
                             "lowrank-fl output")
        foreign = foreign_files(target)
        if foreign:
            more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
            raise ValueError(f"{option} {out} holds files the lowrank-fl run that wrote it did not write "
                             f"({', '.join(foreign[:5])}{more}); refusing to replace them: move them out "
                             "or choose another directory")
    return target


def _listing(path: Path) -> dict | None:
    """``None`` when ``path`` does not exist, else relative name -> (mode, size, mtime) of
    everything under it (symlinks not followed): what :meth:`OutputDir.commit` may replace."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return None
    found = {".": (top.st_mode, 0, 0)}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.lstat(full)
            found[os.path.relpath(full, path)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def check_output_file(out, *, overwrite: bool = False, inputs: Iterable = (),
                      option: str = "--figure") -> Path:
    """The resolved path of a single output file, after the checks :func:`check_output_dir`
    makes for directories: never an input or a file inside one, never an existing file unless
    ``overwrite``, never a directory. ``ValueError`` (one line naming ``option``) otherwise."""
    if out is None or str(out) == "":
        raise ValueError(f"{option} must name a file, got ''")
    target = _resolve(out)
    for item in inputs:
        src = _resolve(item)
        if src == target or target.is_relative_to(src):
            how = "is the input" if src == target else "is inside the input"
            raise ValueError(f"{option} {out} {how} {item}; write it outside every input")
    if target.is_dir():
        raise ValueError(f"{option} {out} is a directory; name a file")
    if not target.parent.is_dir():
        raise ValueError(f"{option} {out}: its folder {target.parent} does not exist")
    if os.path.lexists(out) and not overwrite:
        raise ValueError(f"{option} {out} exists; pass {_overwrite_hint(option)} to replace it")
    return target


def _umask() -> int:
    """The process's umask (read by setting it and restoring it at once: POSIX has no plain read)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(path, write: Callable[[Path], None], *, overwrite: bool = False,
               option: str = "--figure") -> Path:
    """``write(tmp)`` into a temporary file beside ``path`` (same suffix), then move it to
    ``path``: a failed write leaves ``path`` as it was; without ``overwrite`` a file that appeared
    meanwhile is not replaced (hard link, which fails on an existing name)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp creates it 0600: give it the mode a plain open() would (an existing file's own
        # mode when it is replaced, else 0666 less the umask)
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.is_file() else 0o666 & ~_umask())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise ValueError(f"{option} {path} appeared while writing; not replacing it (the "
                                 "new file was discarded)") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stderr(message: str) -> None:
    print(f"lowrank-fl: {message}", file=sys.stderr)


class OutputDir:
    """Write an output directory through a locked staging directory (see the module docstring).

    ::

        with OutputDir(out, command="compare clair", overwrite=True, inputs=[W_file]) as o:
            ...write files into o.dir...
            o.commit()          # swaps o.dir in as ``out``; without it ``out`` is left as it was

    ``open()``/``close()`` do what entering/leaving the ``with`` block does. ``note`` receives the
    one-line notices about leftovers of other runs (default: printed on stderr).
    """

    def __init__(self, out, *, command: str, overwrite: bool = False, inputs: Iterable = (),
                 option: str = "--out", note: Callable[[str], None] | None = None):
        self.out, self.command, self.overwrite = out, command, overwrite
        self.inputs, self.option = list(inputs), option
        self.note = note or _stderr
        self.path = check_output_dir(out, overwrite=overwrite, inputs=self.inputs, option=option)
        self.dir: Path | None = None
        self.committed = False
        self._listing: dict | None = None
        self._host = socket.gethostname().replace("/", "_")
        self._lock = FileLock(self._sibling("lock"))
        self._old_handler = None

    def _sibling(self, kind: str, pid: int | None = None) -> Path:
        name = f".{self.path.name}{_TAG}{kind}"
        if kind != "lock":
            name += f".{self._host}.{os.getpid() if pid is None else pid}"
        return self.path.parent / name

    # ------------------------------------------------------------------ open / close
    def open(self) -> "OutputDir":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock.try_acquire()
        except LockHeld as exc:
            raise ValueError(f"{self.option} {self.out} is being written by another lowrank-fl "
                             f"process (pid {exc.holder}); wait for it or choose another "
                             "directory") from None
        except OSError as exc:
            raise ValueError(f"cannot write {self.option} {self.out}: {exc.strerror or exc}") from None
        try:
            self._clean_leftovers()
            # checked again under the lock: another run, or a restore above, may have changed it
            check_output_dir(self.out, overwrite=self.overwrite, inputs=self.inputs,
                             option=self.option)
            self._listing = _listing(self.path)      # compared again before the swap
            self.dir = self._sibling("staging")
            if self.dir.exists():        # this PID's own leftover (the lock is ours now)
                shutil.rmtree(self.dir)
            self.dir.mkdir()
            self._write_marker(self.dir)
            self._catch_sigterm()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Remove the staging directory unless committed; release the lock and SIGTERM."""
        if self.dir is not None and not self.committed:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._restore_sigterm()
        self._lock.release()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ commit
    def commit(self) -> Path:
        """Replace ``out`` by the staging directory (two renames; the old output is removed)."""
        if self.dir is None or self.committed:
            raise RuntimeError("OutputDir.commit needs an open, uncommitted output")
        self._write_marker(self.dir, files=_written_files(self.dir))    # what --overwrite may replace
        if _listing(self.path) != self._listing:
            self._keep_result()
        # a SIGTERM during the two renames is held until they are done (a handler that records it: a
        # signal mask would not do, another thread of the process can take a process-directed signal)
        pending: list = []
        held = self._old_handler is not None and threading.current_thread() is threading.main_thread()
        if held:
            signal.signal(signal.SIGTERM, lambda signum, frame: pending.append(signum))
        try:
            old = None
            if self.path.exists():
                old = self._sibling("old")
                if old.exists():
                    shutil.rmtree(old)
                os.replace(self.path, old)
            try:
                os.replace(self.dir, self.path)
            except BaseException:
                if old is not None:
                    os.replace(old, self.path)
                raise
            self.committed = True
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if held:      # from now on a SIGTERM comes after the output is in place, or before it
                signal.signal(signal.SIGTERM, _raise_terminated_after_commit if self.committed
                              else _raise_terminated)
        if pending:
            raise (TerminatedAfterCommit if self.committed else SystemExit)(128 + signal.SIGTERM)
        return self.path

    def _keep_result(self) -> None:
        """``out`` changed during the run (someone added, removed or edited files): leave it as
        it is, move the finished output beside it under a visible name, and say where."""
        kept = self.path.parent / f"{self.path.name}.lowrank-fl-result.{os.getpid()}"
        k = 1
        while kept.exists():
            kept, k = self.path.parent / f"{self.path.name}.lowrank-fl-result.{os.getpid()}.{k}", k + 1
        os.replace(self.dir, kept)
        self.dir, self.committed = kept, True      # close() must not remove it
        raise ValueError(f"{self.option} {self.out} changed while this run was writing (files "
                         f"added, removed or modified there); left it as it is; the result is in "
                         f"{kept}")

    # ------------------------------------------------------------------ helpers
    def _write_marker(self, directory: Path, files: list | None = None) -> None:
        from . import __version__

        info = {"tool": _TOOL, "command": self.command, "version": __version__,
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "host": self._host, "pid": os.getpid()}
        if files is not None:
            info["files"] = files
        (directory / MARKER).write_text(json.dumps(info, indent=1) + "\n")

    def _clean_leftovers(self) -> None:
        """Staging (and old outputs) of dead runs on this output; called with the lock held."""
        prefix = f".{self.path.name}"
        for entry in sorted(p for p in self.path.parent.iterdir() if p.name.startswith(prefix)):
            rest = entry.name[len(prefix):]
            if rest.startswith(_TAG):
                kind, _, owner = rest[len(_TAG):].partition(".")
                if kind not in ("staging", "old"):
                    continue
                host, _, pid = owner.rpartition(".")
                if not pid.isdigit() or not entry.is_dir():
                    continue
                if host != self._host or _pid_alive(int(pid)):
                    self.note(f"{entry} was left by process {pid} on {host} (still running?); "
                              "remove it if no lowrank-fl run is writing there")
                elif kind == "old" and not self.path.exists():
                    os.replace(entry, self.path)     # killed between the two renames: restore
                    self.note(f"restored {self.out} from {entry.name}, left by killed process {pid}")
                elif is_output_dir(entry) or not any(entry.iterdir()):
                    shutil.rmtree(entry, ignore_errors=True)
                    self.note(f"removed {entry.name}, left by killed process {pid}")
                else:
                    self.note(f"{entry} was left by killed process {pid} but holds no "
                              f"{MARKER}; not removing it")
            elif rest.startswith((".incomplete-", ".partial-", ".old-")) and entry.is_dir():
                self.note(f"{entry} was left by an interrupted run of an earlier lowrank-fl; "
                          "remove it if no run is writing there")

    def _catch_sigterm(self) -> None:
        # SIGTERM unwinds like Ctrl-C (staging removed, lock released); exit status 143
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGTERM, _raise_terminated)

    def _restore_sigterm(self) -> None:
        if self._old_handler is not None:
            signal.signal(signal.SIGTERM, self._old_handler)
            self._old_handler = None


class TerminatedAfterCommit(SystemExit):
    """SIGTERM (exit status 143) after the output was swapped in: the output is complete."""


def _raise_terminated(signum, frame):
    raise SystemExit(128 + signum)


def _raise_terminated_after_commit(signum, frame):
    raise TerminatedAfterCommit(128 + signum)
