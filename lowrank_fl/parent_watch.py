"""Worker processes that exit when the process that started them dies.

A ``lowrank-fl`` killed with SIGKILL cannot stop its workers: loky's idle workers wait 300 s for
work, a busy one (or a ``compare`` solve in its child) runs to the end, each holding its memory,
and loky's resource tracker removes the run's ``/dev/shm`` files only once they are gone.
:func:`exit_with_parent`, called in the worker, starts a daemon thread that ends the worker as
soon as its parent is no longer the given process (the kernel re-parents orphans).
"""
from __future__ import annotations

import os
import threading
import time

__all__ = ["exit_with_parent"]

_watching_pid = None      # the process whose watcher runs (a fork child inherits the value)


def exit_with_parent(parent: int, *, interval: float = 0.2) -> None:
    """In a child process: ``os._exit(1)`` once ``parent`` (a PID) is no longer its parent.

    ``parent`` comes from the parent (``os.getpid()`` there), not from ``os.getppid()`` here:
    the parent may die before the child gets to run this. Idempotent per process.
    """
    global _watching_pid
    if _watching_pid == os.getpid():
        return
    _watching_pid = os.getpid()

    def watch():
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
