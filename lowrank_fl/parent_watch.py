"""Worker processes that exit when the process that started them dies.

A ``lowrank-fl`` killed with SIGKILL cannot stop its workers: loky's idle workers wait 300 s for
work, a busy one (or a ``compare`` solve in its child) runs to the end, each holding its memory,
and loky's resource tracker removes the run's ``/dev/shm`` files only once they are gone.
:func:`exit_with_parent`, called in the worker, starts a daemon thread that ends the worker as
soon as its parent is no longer the given process (the kernel re-parents orphans).

The thread needs the GIL, which native code (a conic solver, a long C call) may hold for as long
as it runs; ``kill_with_parent=True`` also asks Linux to SIGKILL the worker when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), which needs nothing from the worker. That signal follows the parent
*thread* that started the worker, so it is only for workers whose starting thread outlives them
(``compare``'s solve, waited for by the thread that started it), not for pool workers.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

__all__ = ["exit_with_parent"]

_watching_pid = None      # the process whose watcher runs (a fork child inherits the value)


_PR_SET_PDEATHSIG = 1     # <linux/prctl.h>


def exit_with_parent(parent: int, *, interval: float = 0.2, kill_with_parent: bool = False) -> None:
    """In a child process: ``os._exit(1)`` once ``parent`` (a PID) is no longer its parent.

    ``parent`` comes from the parent (``os.getpid()`` there), not from ``os.getppid()`` here:
    the parent may die before the child gets to run this. ``kill_with_parent``: on Linux, also be
    killed by the kernel the moment the parent's starting thread ends (see the module docstring).
    Idempotent per process.
    """
    global _watching_pid
    if _watching_pid == os.getpid():
        return
    _watching_pid = os.getpid()
    if kill_with_parent and _set_parent_death_signal() and os.getppid() != parent:
        os._exit(1)           # the parent died before the signal was set

    def watch():
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _set_parent_death_signal() -> bool:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` for this process; False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
