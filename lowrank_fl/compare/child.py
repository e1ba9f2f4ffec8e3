"""Run one solve in a child process: a time limit that can stop it, and its peak memory.

Every method runs in its own process, so a solve past ``time_limit`` is terminated (conic solvers cannot be interrupted from Python), a solver that
crashes the interpreter (a failed huge allocation) is reported, and memory is measured in
isolation:

* ``"tracemalloc"`` (iterative numpy methods): peak of Python-visible allocations, which include
  numpy arrays;
* ``"rss_growth"`` (conic solvers, whose native code bypasses tracemalloc): peak resident set
  size during the solve minus the resident size before it (Linux ``VmHWM`` after resetting it
  through ``/proc/self/clear_refs``; elsewhere ``ru_maxrss``, which cannot be reset, so the
  growth is counted from the larger of the two baselines).

How the process starts (:data:`START_METHOD_ENV`, default ``"forkserver"``, ``"spawn"`` where
there is no fork): a plain ``fork`` of a process that has already run a threaded native library
hangs the child — a Clarabel solve in the parent leaves rayon's global pool behind, and the
forked child waits forever for pool threads it does not have (seen in a verifier worker that ran
Clarabel before a compare). The fork server forks from a clean single-threaded process.
``LOWRANK_FL_START_METHOD=fork`` restores plain ``fork`` (faster; a parent's monkeypatches reach
the child, which tests of the child use), for a process that has not run such a library.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
import tracemalloc

from ..parent_watch import exit_with_parent

__all__ = ["run_in_child", "MEMORY_MEASURES", "START_METHOD_ENV", "START_METHODS"]

MEMORY_MEASURES = ("tracemalloc", "rss_growth")
#: environment variable naming the start method of the solve processes (module docstring)
START_METHOD_ENV = "LOWRANK_FL_START_METHOD"
START_METHODS = ("forkserver", "fork", "spawn")
#: longest wait for a solve process to start (imports included) before it counts as hung
_STARTUP_SECONDS = 300.0


def _status_kb(field: str):
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _maxrss_bytes() -> float:
    import resource
    import sys

    v = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return v if sys.platform == "darwin" else v * 1024.0


def _measure_and_run(fn, args, measure):
    if measure == "tracemalloc":
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        out = fn(*args)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        return out, seconds, float(peak)
    before = _status_kb("VmRSS")
    reset = _reset_peak() if before is not None else False
    base = before if reset else max(before or 0.0, _maxrss_bytes())
    t0 = time.perf_counter()
    out = fn(*args)
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM") if reset else _maxrss_bytes()
    return out, seconds, max(0.0, float(peak) - base)


def _release_fork_server() -> None:
    """Close this child's copy of the fork server's "alive" pipe. multiprocessing hands every child
    of the server that pipe's write end, so the server (and with it this child's parent-death signal)
    outlived a killed lowrank-fl for as long as the solve ran; without the copy the server sees EOF
    and exits when lowrank-fl dies, and the kernel kills this child at once."""
    from multiprocessing import forkserver
    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return
    try:
        os.close(fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None


def _child(conn, fn, args, measure, parent):
    # a killed lowrank-fl must not leave its solve running, even one in native code holding the GIL.
    # Under the fork server the parent is the server, which exits when lowrank-fl does: watch it
    watched = parent if os.getppid() == parent else os.getppid()
    if watched != parent:
        _release_fork_server()
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        os._exit(1)
    exit_with_parent(watched, kill_with_parent=True)
    conn.send({"started": True})          # the time limit counts from here, not from the start-up
    try:
        out, seconds, peak = _measure_and_run(fn, args, measure)
        conn.send({"ok": True, "result": out, "seconds": seconds, "peak_bytes": peak})
    except BaseException as exc:  # reported to the parent, never hidden
        conn.send({"ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=3)})
    finally:
        conn.close()


def _context():
    method = os.environ.get(START_METHOD_ENV, "") or "forkserver"
    if method not in START_METHODS:
        raise ValueError(f"{START_METHOD_ENV} must be one of {START_METHODS}, got {method!r}")
    if method not in mp.get_all_start_methods():
        method = "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        # the server imports the solvers once; each solve process is forked from it
        ctx.set_forkserver_preload(["lowrank_fl.compare.runners"])
    return ctx


def _start(proc, method: str) -> None:
    """``proc.start()``. A child started by spawn or the fork server re-applies the parent's
    global start method, which must be one it knows: inside a loky worker that is ``"loky"``, so
    the parent's is set to ``method`` for the start and restored after."""
    current = mp.get_start_method(allow_none=True)
    if current is None or current in mp.get_all_start_methods() or method == "fork":
        proc.start()
        return
    mp.set_start_method(method, force=True)
    try:
        proc.start()
    finally:
        mp.set_start_method(current, force=True)


def run_in_child(fn, args: tuple, *, time_limit: float | None, measure: str) -> dict:
    """Call ``fn(*args)`` in a child process.

    Returns
    -------
    dict
        ``outcome``: ``"ok"`` (with ``result``, ``seconds`` (the solve, measured in the child),
        ``peak_bytes``), ``"error"`` (``error``: the exception, one line), ``"time_limit"`` (the
        child was terminated after ``time_limit`` seconds) or ``"crashed"`` (the child died,
        ``error`` gives its exit code). ``wall_seconds`` always.
    """
    if measure not in MEMORY_MEASURES:
        raise ValueError(f"measure must be one of {MEMORY_MEASURES}, got {measure!r}")
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, measure, os.getpid()), daemon=True)
    t0 = time.perf_counter()
    _start(proc, ctx.get_start_method())
    child.close()                         # a dead child then shows up as EOF, not a timeout
    msg = None
    try:
        # start-up (imports under spawn / the fork server) is not the solve's time
        if parent.poll(_STARTUP_SECONDS):
            msg = parent.recv()
            if msg.get("started"):
                msg = parent.recv() if parent.poll(time_limit) else None
    except EOFError:
        msg = {"crashed": True}
    wall = time.perf_counter() - t0
    if msg is None:
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    proc.join()
    parent.close()
    if msg is None:
        return {"outcome": "time_limit", "wall_seconds": wall}
    if msg.get("crashed"):
        # exit code 1 is a Python exception before the solve reported: in a script without the
        # __main__ guard every child fails so, re-importing the script (multiprocessing's rule)
        hint = ("; from a script, call compare under `if __name__ == \"__main__\":` (each solve's "
                "process imports the script again)" if proc.exitcode == 1 else "")
        return {"outcome": "crashed", "wall_seconds": wall,
                "error": f"the solver process died (exit code {proc.exitcode}){hint}"}
    if not msg["ok"]:
        return {"outcome": "error", "wall_seconds": wall, "error": msg["error"]}
    return {"outcome": "ok", "wall_seconds": wall, "result": msg["result"],
            "seconds": msg["seconds"], "peak_bytes": msg["peak_bytes"]}


