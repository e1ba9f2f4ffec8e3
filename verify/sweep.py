"""Grids × seeds on joblib, cached on disk and resumable.

``Sweep(backend, n_jobs, cache_dir, scheduler, progress).map(task, grid, seeds, label)`` runs
``task(seed=seeds[i][j], **grid[i])`` for every ``i, j`` and returns ``out[i][j]``.

Backends
--------
``"sequential"``
    In-process loop (the default of :class:`verify.claim.Context`).
``"loky"``
    joblib's process pool; ``n_jobs=-1`` uses every core (the CLI's default). Its workers end
    when this process dies, even by SIGKILL (:mod:`lowrank_fl.parent_watch`).
``"dask"``
    joblib's dask backend on a ``distributed.Client``: connected to ``scheduler="tcp://HOST:PORT"``,
    or to an in-process ``distributed.LocalCluster`` started on first use (``cluster_options`` are
    passed to it) when no scheduler is given; an existing client can be passed as ``client=``.

:meth:`Sweep.prepare` checks what a run needs before its first task (the backend's packages, the
scheduler connection, a writable cache) and raises :class:`SetupError` otherwise.

Reproducibility
---------------
Seeds are fixed by the caller (``SeedSequence`` in :mod:`verify.claim`), and every task runs with
one BLAS/OpenMP thread (threadpoolctl) on every backend, in the main process as in workers. So on
one machine and one build of the numerical stack every backend returns the same numbers, bit for
bit. A different BLAS build or CPU (another SIMD kernel) may change results at rounding level;
the cache key contains the numerical stack's versions, not the CPU.

A worker of a process backend (loky, dask) computes the code version itself (:func:`code_version`)
before it runs a task; a worker that imported other code than this process (a persistent dask
cluster started before the sources were edited) is refused with :class:`StaleWorkerError`, so old
code's numbers are never stored under the new code's key.

Cache and resume
----------------
With ``cache_dir`` set, every finished task is stored as soon as its result reaches the parent
(:mod:`verify.cache`: JSON and arrays in an ``.npz``, read with ``allow_pickle=False``, validated
on load, written atomically), so an interrupted sweep loses at most the tasks in flight, and the
next run recomputes only what is missing or invalid. The key is ``joblib.hash`` of the label
(claim id), the task's module and qualname, its parameters, its seed and a code version
(:func:`code_version`): ``lowrank_fl.__version__``, the versions of Python, numpy, scipy, cvxpy,
clarabel, scs and joblib, a hash of every ``lowrank_fl`` source file, of every ``verify`` source
file except the report writers and the command line, and of the task's own module (editing the
library or any experiment, or upgrading the numerical stack, invalidates the cache; override with
``code_version=``). Tasks whose parameters cannot be hashed (e.g. a lambda passed as an option) or
whose result the format cannot hold are run without caching. ``refresh=True`` recomputes every
task and overwrites its entry.

Two runs sharing a cache compute each task once: a task is computed under a per-task lock
(:class:`verify.cache.TaskLocks`); a run that finds a task locked computes its other tasks first,
then waits for the lock and reads the other run's result.

Errors
------
A task that raises stops the sweep (results that finished are already cached) and raises
:class:`SweepTaskError` whose message names the label (claim id), the task, its parameters and
seed, and the original exception type and message; the original exception is its ``__cause__``
when it could be transported back from the worker.
"""
from __future__ import annotations

import logging
import os
import pickle
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import joblib

from lowrank_fl.parent_watch import exit_with_parent

from . import cache as _cache
from .budgets import check_deadline
from .convergence import attach_records, capture_convergence
from .versioning import NUMERICAL_STACK, code_version, dependency_versions, warm_digests

__all__ = ["Sweep", "SweepTaskError", "SetupError", "StaleWorkerError", "BACKENDS",
           "NUMERICAL_STACK", "code_version", "dependency_versions"]

log = logging.getLogger("verify.sweep")

BACKENDS = ("sequential", "loky", "dask")


class SweepTaskError(RuntimeError):
    """A task of a sweep raised; the message names the claim, task, parameters and seed."""


class SetupError(RuntimeError):
    """The run cannot start or go on as configured (backend, scheduler, cache): not evidence."""


class StaleWorkerError(SetupError):
    """A worker imported other code than this process (e.g. a dask cluster older than an edit)."""


# ----------------------------------------------------------------------------- worker side
_CONTROLLER: list = [None, -1]  # [threadpoolctl controller, len(sys.modules) when it was built]


def _thread_controller():
    """A ThreadpoolController that knows every BLAS/OpenMP library loaded so far.

    Building one scans the loaded libraries (milliseconds); it is rebuilt only after imports,
    the only way a task's process loads a new native library.
    """
    if _CONTROLLER[1] != len(sys.modules):
        from threadpoolctl import ThreadpoolController

        _CONTROLLER[:] = [ThreadpoolController(), len(sys.modules)]
    return _CONTROLLER[0]


def _execute(task: Callable, params: Mapping, seed: int, index: int, expected: str | None = None):
    """Run one task in a worker; exceptions come back as data so the parent decides.

    ``expected``: the parent's code version; a worker whose own differs does not run the task and
    answers ``(index, None, worker_version)``. The task runs with one BLAS/OpenMP thread; the
    ConvergenceWarnings it lets through come back as solve records in its result
    (:mod:`verify.convergence`).
    """
    if expected is not None:
        mine = code_version(task)
        if mine != expected:
            return index, None, mine
    try:
        records: list = []   # ConvergenceWarnings the task let through travel (and cache) with it
        with _thread_controller().limit(limits=1), capture_convergence(records):
            value = task(seed=seed, **params)
        return index, True, attach_records(value, records)
    except Exception as exc:  # noqa: BLE001 - reported to the parent with its traceback
        try:
            pickle.dumps(exc)
            transported = exc
        except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
            transported = None
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return index, False, (type(exc).__name__, str(exc), tb, transported)


def _warm_up(modules: Sequence[str], dwell: float) -> int:
    """In a worker: import ``modules`` and compute the code versions (what a first task would
    pay), stay ``dwell`` seconds (so the other workers take the other warm-up tasks); its pid."""
    import importlib

    for name in modules:
        importlib.import_module(name)
    warm_digests()
    time.sleep(dwell)
    return os.getpid()


# ----------------------------------------------------------------------------- the sweep
def _short(params: Mapping, limit: int = 300) -> str:
    text = repr(dict(params))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Sweep:
    """Runs grids × seeds through joblib, with an on-disk cache and progress bars.

    Parameters
    ----------
    backend : {"sequential", "loky", "dask"}
        Execution backend (see module docstring).
    n_jobs : int
        Number of workers for "loky" (-1: all cores) and of the LocalCluster started for "dask"
        (-1: all cores). Ignored by "sequential".
    cache_dir : str or Path, optional
        Directory of the result cache; ``None`` disables caching (and resuming).
    scheduler : str, optional
        Address ``tcp://HOST:PORT`` of a dask scheduler (backend "dask" only).
    progress : bool
        Show a tqdm bar per map (only when stderr is a terminal, and only on runs lasting more
        than a second).
    client : distributed.Client, optional
        Use this client for backend "dask" (not closed by :meth:`close`).
    cluster_options : dict, optional
        Keyword arguments for the ``distributed.LocalCluster`` started when neither ``scheduler``
        nor ``client`` is given.
    code_version : str, optional
        Fixed code version for the cache key instead of the source hash.
    refresh : bool
        Recompute every task (do not read the cache) and overwrite its entry.
    connect_timeout : float
        Seconds to wait for the dask scheduler at ``scheduler``.
    """

    def __init__(self, backend: str = "sequential", n_jobs: int = 1, cache_dir=None,
                 scheduler: str | None = None, progress: bool = False, *, client=None,
                 cluster_options: Mapping | None = None, code_version: str | None = None,
                 refresh: bool = False, connect_timeout: float = 10.0):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0 or n_jobs < -1:
            raise ValueError(f"n_jobs must be a positive int or -1 (all cores), got {n_jobs!r}")
        if (scheduler is not None or client is not None or cluster_options) and backend != "dask":
            raise ValueError(f"scheduler/client/cluster_options need backend='dask', got backend={backend!r}")
        if scheduler is not None and not re.match(r"^[a-z]+://\S+$", str(scheduler)):
            raise ValueError(f"scheduler must be an address like 'tcp://HOST:PORT', got {scheduler!r}")
        if cache_dir is not None and str(cache_dir) == "":
            raise ValueError("cache_dir must be a directory path or None, got ''")
        self.backend = backend
        self.n_jobs = n_jobs
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.scheduler = scheduler
        self.progress = bool(progress)
        self.cluster_options = dict(cluster_options or {})
        self.code_version = code_version
        self.refresh = bool(refresh)
        self.connect_timeout = float(connect_timeout)
        self._client = client
        self._own_client = None
        self._own_cluster = None
        self._locks = _cache.TaskLocks() if self.cache_dir is not None else None
        self._warm_executor = None  # the loky executor whose workers start_workers saw running
        self._dask_restarting = 0   # dask workers to wait for after stop_workers restarted them
        self._dask_warm: set = set()  # addresses of the dask workers start_workers warmed up
        self.executed = 0  # tasks run (not served from cache) by this sweep, for reporting
        self.reused = 0    # tasks served from the cache (including those another run computed)
        self.invalid = 0   # cache entries found but unreadable or not matching (recomputed)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Sweep":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the dask client/cluster this sweep started and drop its task locks."""
        if self._locks is not None:
            self._locks.close()
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None
        if self._own_cluster is not None:
            self._own_cluster.close()
            self._own_cluster = None

    def stop_workers(self) -> None:
        """Kill the workers of a process backend, stopping whatever task they run (a claim past
        its time budget). loky: the reusable executor's processes are killed (joblib starts new
        ones on the next map). dask: the client's workers are restarted by their nannies (every
        task on the cluster is stopped; workers without a nanny cannot be stopped, only their
        queued tasks dropped). Sequential: nothing runs outside this process."""
        if self.backend == "loky":
            from joblib.externals.loky import reusable_executor

            executor = reusable_executor._executor
            if executor is not None:
                executor.shutdown(wait=True, kill_workers=True)
            self._warm_executor = None
        elif self.backend == "dask":
            client = self._client or self._own_client
            if client is None:
                return
            try:
                self._dask_restarting = len(client.scheduler_info().get("workers", {}))
                client.restart(wait_for_workers=False)
            except Exception as exc:  # noqa: BLE001 - e.g. workers without nannies
                log.warning("could not restart the dask workers after a time budget ran out: %s: %s",
                            type(exc).__name__, exc)

    def start_workers(self, modules: Sequence[str] = (), timeout: float = 120.0) -> None:
        """loky: start every worker now and wait until each has imported ``modules`` (the claims'
        modules) and computed the code versions; a no-op while the workers it started still run.
        dask: the same for every worker not seen before, after waiting for the workers
        :meth:`stop_workers` restarted.

        The runner calls it before a claim's clock starts, so a claim's time budget counts its own
        work, not the start-up of workers (or their restart after :meth:`stop_workers`).
        Sequential: nothing to do.
        """
        if self.backend == "dask":
            self._start_dask_workers(modules, timeout)
        if self.backend != "loky":
            return
        from joblib.externals.loky import reusable_executor

        if self._warm_executor is not None and self._warm_executor is reusable_executor._executor:
            return
        n = joblib.effective_n_jobs(self.n_jobs)
        seen: set = set()
        deadline = time.monotonic() + timeout
        try:
            while len(seen) < n and time.monotonic() < deadline:   # until every worker answered
                seen.update(self._loky_parallel(
                    joblib.delayed(_warm_up)(tuple(modules), 0.05) for _ in range(n)))
        except Exception as exc:  # noqa: BLE001 - the claim's own tasks then meet (and report) it
            log.warning("the loky workers did not start: %s: %s", type(exc).__name__, exc)
            return
        self._warm_executor = reusable_executor._executor

    def _start_dask_workers(self, modules: Sequence[str], timeout: float) -> None:
        """dask: wait until the workers :meth:`stop_workers` restarted are back; have every worker
        not seen before import ``modules``."""
        client = self._dask_client()
        try:
            if self._dask_restarting:
                client.wait_for_workers(self._dask_restarting, timeout=timeout)
            workers = set(client.scheduler_info().get("workers", {}))
            if not workers <= self._dask_warm:
                client.run(_warm_up, tuple(modules), 0.0, workers=sorted(workers - self._dask_warm))
                self._dask_warm |= workers
        except Exception as exc:  # noqa: BLE001 - the next claim then pays the rest of the start-up
            log.warning("the dask workers were not all up within %g s: %s: %s",
                        timeout, type(exc).__name__, exc)
        self._dask_restarting = 0

    def _loky_parallel(self, calls):
        """``joblib.Parallel`` on loky (unordered generator); its workers end when this process
        dies, even by SIGKILL (:func:`lowrank_fl.parent_watch.exit_with_parent`)."""
        with joblib.parallel_config(backend="loky", initializer=exit_with_parent,
                                    initargs=(os.getpid(),)):
            return joblib.Parallel(n_jobs=self.n_jobs, return_as="generator_unordered")(calls)

    def __repr__(self) -> str:
        return (f"Sweep(backend={self.backend!r}, n_jobs={self.n_jobs}, cache_dir={self.cache_dir}, "
                f"scheduler={self.scheduler!r})")

    def prepare(self) -> "Sweep":
        """Check everything a run needs before its first task; :class:`SetupError` if not.

        The cache directory is created (with its marker) and must be writable; backend "dask"
        needs ``distributed`` and connects (or starts its local cluster) now.
        """
        if self.cache_dir is not None:
            try:
                _cache.mark_cache_dir(self.cache_dir)
            except OSError as exc:
                raise SetupError(f"cache directory {self.cache_dir} is not usable: "
                                 f"{exc.strerror or exc}") from None
        if self.backend == "dask":
            self._dask_client()
        return self

    def _dask_client(self):
        if self._client is not None:
            return self._client
        if self._own_client is None:
            try:
                from distributed import Client, LocalCluster
            except ImportError:
                raise SetupError("backend 'dask' needs dask[distributed], which is not installed: "
                                 "pip install '.[dask]' from a checkout of lowrank_fl") from None
            try:
                if self.scheduler is not None:
                    self._own_client = Client(self.scheduler, set_as_default=False,
                                             timeout=f"{self.connect_timeout}s")
                else:
                    opts = {"n_workers": os.cpu_count() if self.n_jobs == -1 else self.n_jobs,
                            "threads_per_worker": 1, "dashboard_address": ":0"}
                    opts.update(self.cluster_options)
                    self._own_cluster = LocalCluster(**opts)
                    self._own_client = Client(self._own_cluster, set_as_default=False)
            except (OSError, TimeoutError) as exc:
                where = self.scheduler or "a local cluster"
                raise SetupError(f"cannot connect to the dask scheduler at {where}: "
                                 f"{type(exc).__name__}: {exc}") from None
        return self._own_client

    # -- cache -------------------------------------------------------------------------------
    def _path(self, task: Callable, label: str, params: Mapping, seed: int) -> Path | None:
        if self.cache_dir is None:
            return None
        version = self.code_version or code_version(task)
        name = f"{task.__module__}.{task.__qualname__}"
        try:
            key = joblib.hash((label, name, dict(params), int(seed), version))
        except Exception:  # noqa: BLE001 - unhashable option (lambda, local object): no caching
            return None
        return self.cache_dir / _cache.safe_name(label or "_") / _cache.safe_name(name) / f"{key}.npz"

    @staticmethod
    def _header(task: Callable, label: str, seed: int, path: Path) -> dict:
        return {"label": label, "task": f"{task.__module__}.{task.__qualname__}",
                "seed": int(seed), "key": path.stem}

    def _load(self, task, label, seed, path: Path | None, *, count: bool = True):
        if path is None:
            return False, None
        hit, value = _cache.load_entry(path, self._header(task, label, seed, path))
        if not hit and count and path.is_file():
            self.invalid += 1
            log.warning("cache entry %s is unreadable or does not match its task: recomputing", path)
        return hit, value

    def _store(self, task, label, path: Path | None, result: Any, params: Mapping, seed: int) -> None:
        if path is None:
            return
        try:
            _cache.store_entry(path, result, {**self._header(task, label, seed, path)})
        except _cache.UncacheableResult as exc:
            log.warning("claim %s: result of %s not cached: %s", label or "?", task.__qualname__, exc)

    def cached(self, task: Callable, grid: Sequence[Mapping], seeds: Sequence[Sequence[int]],
               label: str = "") -> list[list[bool]]:
        """Which tasks of a map are in the cache (valid entries), as ``mask[i][j]``."""
        return [[_cache.load_entry(p, self._header(task, label, s, p))[0] if p else False
                 for s in row for p in [self._path(task, label, params, s)]]
                for params, row in zip(grid, seeds)]

    # -- map ---------------------------------------------------------------------------------
    def map(self, task: Callable, grid: Sequence[Mapping], seeds: Sequence[Sequence[int]],
            label: str = "") -> list[list]:
        """Run ``task(seed=seeds[i][j], **grid[i])`` for every ``i, j``; returns ``out[i][j]``.

        Parameters
        ----------
        task : callable
            Module-level function (picklable for process backends).
        grid : sequence of mappings, length G
            Parameters of each grid point.
        seeds : sequence of G sequences of int
            Seeds of each grid point's replicates (rows may differ in length).
        label : str
            Claim id; part of the cache key and of error messages.
        """
        if not callable(task):
            raise TypeError(f"task must be callable, got {type(task).__name__}")
        if len(grid) != len(seeds):
            raise ValueError(f"seeds must have one row per grid point: {len(grid)} points, {len(seeds)} rows")
        jobs = [(i, j, dict(params), int(s)) for i, (params, row) in enumerate(zip(grid, seeds))
                for j, s in enumerate(row)]
        out: list[list] = [[None] * len(row) for row in seeds]
        paths = {}
        todo = []
        for n, (i, j, params, s) in enumerate(jobs):
            path = self._path(task, label, params, s)
            hit, value = (False, None) if self.refresh else self._load(task, label, s, path)
            if hit:
                out[i][j] = value
                self.reused += 1
            else:
                paths[n] = path
                todo.append(n)
        if todo:
            self._run(task, jobs, todo, paths, out, label)
        return out

    def _results(self, task, jobs, todo):
        # one task on a local pool gains nothing from a worker but pays the transfer
        in_process = self.backend == "sequential" or (
            len(todo) == 1 and self.scheduler is None and self._client is None)
        if in_process:  # the deadline is checked before each task (a timer signal may be missing)
            return (_execute(task, jobs[n][2], jobs[n][3], n) for n in todo if check_deadline() is None)
        expected = code_version(task)  # the worker checks its own against it
        calls = (joblib.delayed(_execute)(task, jobs[n][2], jobs[n][3], n, expected) for n in todo)
        if self.backend == "loky":
            return self._loky_parallel(calls)
        client = self._dask_client()

        def run_dask():
            with joblib.parallel_config(backend="dask", client=client):
                yield from joblib.Parallel(n_jobs=-1, return_as="generator_unordered")(calls)

        return run_dask()

    def _claim_locks(self, task, label, jobs, todo, paths, out) -> tuple[list, list]:
        """Split ``todo`` into tasks this run computes (lock held) and tasks another run holds."""
        mine, theirs = [], []
        for n in todo:
            path = paths[n]
            if path is None or self._locks is None:
                mine.append(n)
            elif self._locks.try_acquire(path):
                # another run may have finished it between our cache check and the lock
                hit, value = (False, None) if self.refresh else \
                    self._load(task, label, jobs[n][3], path, count=False)
                if hit:
                    i, j = jobs[n][:2]
                    out[i][j] = value
                    self.reused += 1
                    self._locks.release(path)
                else:
                    mine.append(n)
            else:
                theirs.append(n)
        return mine, theirs

    def _run(self, task, jobs, todo, paths, out, label) -> None:
        from tqdm.auto import tqdm

        name = f"{task.__module__}.{task.__qualname__}"
        bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=label or name, unit="task",
                   leave=False, delay=1.0, disable=(not self.progress) or None, file=sys.stderr)
        try:
            mine, theirs = self._claim_locks(task, label, jobs, todo, paths, out)
            bar.update(len(todo) - len(mine) - len(theirs))
            self._compute(task, jobs, mine, paths, out, label, bar)
            if theirs:
                log.info("claim %s: waiting for %d task(s) another run is computing",
                         label or "?", len(theirs))
            late = []
            for n in theirs:  # the other run releases each lock once the result is stored
                self._locks.acquire(paths[n])
                hit, value = self._load(task, label, jobs[n][3], paths[n])
                if hit:
                    i, j = jobs[n][:2]
                    out[i][j] = value
                    self.reused += 1
                    self._locks.release(paths[n])
                    bar.update(1)
                else:  # the other run stopped without it: compute it here (lock held)
                    late.append(n)
            self._compute(task, jobs, late, paths, out, label, bar)
        finally:
            if self._locks is not None:
                self._locks.release_all()
            bar.close()

    def _compute(self, task, jobs, todo, paths, out, label, bar) -> None:
        if not todo:
            return
        name = f"{task.__module__}.{task.__qualname__}"
        results = self._results(task, jobs, todo)
        try:
            for n, ok, value in results:
                i, j, params, s = jobs[n]
                if ok is None:
                    raise StaleWorkerError(
                        f"a {self.backend} worker runs code version {value}, this process "
                        f"{code_version(task)}: its workers imported lowrank_fl/verify before the "
                        "sources changed; restart them (e.g. Client.restart()) and rerun")
                if not ok:
                    type_name, message, tb, exc = value
                    err = SweepTaskError(
                        f"claim {label or '?'}: task {name}(seed={s}, **{_short(params)}) raised "
                        f"{type_name}: {message}\n--- worker traceback ---\n{tb}")
                    raise err from exc
                self._store(task, label, paths[n], value, params, s)
                if paths[n] is not None and self._locks is not None:
                    self._locks.release(paths[n])
                out[i][j] = value
                self.executed += 1
                bar.update(1)
                check_deadline()
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                with warnings.catch_warnings():  # joblib notes the in-flight results we drop
                    warnings.filterwarnings("ignore", message=r".*successfully executed\s+but not used")
                    warnings.filterwarnings("ignore", message=r".*still being processed by the workers "
                                                              r"have been cancelled")
                    close()  # abort what is still queued when we stop early
