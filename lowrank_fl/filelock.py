"""An exclusive lock held by one process through a small lock file (POSIX ``flock``).

The kernel drops the lock when its holder exits, killed or not, so a crash never leaves a stale
lock. The file holds the holder's PID (for the message of whoever finds it taken) and is removed by
the holder on release; a process that locked a file just unlinked by its previous holder notices
(the path no longer names the file it locked) and tries again, so two processes never both hold it.
"""
from __future__ import annotations

import os
import weakref
from pathlib import Path

try:  # POSIX only; without it concurrent writers are not detected (nothing else changes)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["FileLock", "LockHeld"]


class LockHeld(OSError):
    """The lock is held by another process (``holder``: its PID as written, or ``"?"``)."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is locked by process {holder}")
        self.path, self.holder = path, holder


_HELD: "weakref.WeakSet[FileLock]" = weakref.WeakSet()


def _drop_in_child() -> None:
    # a forked child (a compare solve) shares the lock's open file: closing it there means the
    # lock goes exactly when its owner dies, and the child can never release (unlink) it
    for lock in list(_HELD):
        if lock._fd is not None:
            os.close(lock._fd)
            lock._fd = None
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


class FileLock:
    """``try_acquire()`` the lock of ``path`` without waiting (``LockHeld`` if taken), ``release()``.

    Usable as a context manager (acquire on entry, release on exit).
    """

    def __init__(self, path):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: lock already held by this object")
        for _ in range(20):      # each retry means a holder released it between open and lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is None:  # pragma: no cover
                self._fd = fd
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except (BlockingIOError, PermissionError):
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise LockHeld(self.path, holder) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self._fd = fd
                _HELD.add(self)
                return
            os.close(fd)
        raise LockHeld(self.path, "?")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)   # while still held: no one can lock it meanwhile
        finally:
            os.close(self._fd)                  # closing drops the flock
            self._fd = None
            _HELD.discard(self)

    def __enter__(self):
        self.try_acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False
