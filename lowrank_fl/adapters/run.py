"""Run an aggregator over every module (sequential, joblib or dask) and write PEFT outputs.

Modules are independent. Each module task reads its own factors from the client files (lazy,
one module at a time), reduces, solves and returns a compact :class:`ModuleResult`; the results
are collected in module order. Every task runs with one BLAS thread, so the numbers do not
depend on the backend (sequential, joblib processes, dask workers): identical results.

:func:`aggregate_to_dir` (what the CLI runs) writes each module's outputs into every output
adapter as soon as the module is solved (:mod:`.stream`), so writing overlaps the other modules'
solves and a module's output state is released once written; with ``client_rule`` "majority" or
"any" the outputs depend on every module's set (8), so they are written after the last solve.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..outdir import OutputDir
from ..parent_watch import exit_with_parent
from .aggregate import (CLIENT_RULES, DEFAULT_CLIENT_RULE, ModuleOptions, ModuleResult, aggregate_module, apply_robust,
                        check_rank, client_decision, refit_without)
from .decision import detection_summary
from .io import AdapterSet, input_fingerprints
from .robust import ROBUST_METHODS
from .stream import AdapterStreamWriter

__all__ = ["Aggregation", "aggregate_adapters", "aggregate_to_dir", "write_outputs",
           "available_cores", "worker_count"]


@dataclass
class Aggregation:
    """All modules' results, in the adapter set's module order."""

    adapters: AdapterSet
    options: ModuleOptions
    results: list
    seconds: float
    workers: int = 1
    #: robust methods: ``{"f", "selected", "weights", "coordinates", "iterations"}``
    robust: dict | None = None

    def summary(self, client_rule: str = DEFAULT_CLIENT_RULE, rank_out_errors=None) -> dict:
        names = self.adapters.names
        out = {"method": self.options.method, "clients": names,
               "client_rule": client_rule if self.options.method == "clair" else None,
               "seconds": self.seconds, "workers": self.workers,
               "modules": {r.name: r.summary() for r in self.results}}
        if self.options.method == "clair":
            flags = np.array([r.benign for r in self.results], bool)
            out["client_benign"] = {
                "modules_benign": dict(zip(names, flags.sum(axis=0).tolist())),
                "n_modules": len(self.results),
                "majority": dict(zip(names, client_decision(self.results, "majority").tolist())),
                "any": dict(zip(names, client_decision(self.results, "any").tolist())),
            }
            # each module's "benign" is its own set (8); the set its refinement used:
            decided = client_decision(self.results, client_rule)
            for r in self.results:
                out["modules"][r.name]["benign_scope"] = "per-module (8)"
                out["modules"][r.name]["benign_applied"] = (
                    list(r.benign) if decided is None else decided.tolist())
            out["detection"] = detection_summary(self.results, names, client_rule)
        if self.robust is not None:
            out["robust"] = self.robust
        if rank_out_errors is not None:
            out["rank_out"] = self.options.rank_out
            out["rank_out_relative_error"] = rank_out_errors
        return out


def _task(adapters: AdapterSet, module: str, options: ModuleOptions) -> ModuleResult:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return aggregate_module(adapters.factors(module), options)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def worker_count(jobs: int | None, n_tasks: int, cores: int | None = None) -> int:
    """Processes to start: ``min(jobs, n_tasks, cores)``, at least 1.

    ``jobs`` None or -1 means every available core (``cores``, default :func:`available_cores`);
    more processes than tasks or cores only cost memory and start-up time.
    """
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int)
                             or jobs == 0 or jobs < -1):
        raise ValueError(f"jobs must be an int >= 1, or -1 or None (all cores), got {jobs!r}")
    cores = available_cores() if cores is None else cores
    want = cores if jobs in (None, -1) else jobs
    return max(1, min(want, n_tasks, cores))


def _named_task(adapters, module, options):
    return module, _task(adapters, module, options)


def aggregate_adapters(adapters: AdapterSet, options: ModuleOptions, *, jobs: int = 1,
                       scheduler: str | None = None, progress: bool = True,
                       on_result=None) -> Aggregation:
    """Aggregate every module of ``adapters``.

    Parameters
    ----------
    jobs : int or None
        joblib processes, capped by :func:`worker_count` at the number of modules and of
        available cores (1: in this process; None or -1: all available cores).
    scheduler : str, optional
        Address of a dask distributed scheduler (``tcp://host:port``); overrides ``jobs``.
    progress : bool
        tqdm progress bar over modules (stderr).
    on_result : callable, optional
        Called in this process with each :class:`ModuleResult` as it arrives (in completion
        order), e.g. to write it while the other modules solve.
    """
    from tqdm.auto import tqdm

    check_rank(options, adapters.shapes)              # before any module is read
    mods = adapters.modules
    workers = worker_count(jobs, len(mods))
    t0 = time.perf_counter()
    bar = tqdm(total=len(mods), desc=f"{options.method} modules", unit="module",
               disable=not progress)
    results: dict = {}

    def arrived(m, r):
        results[m] = r
        if on_result is not None:
            on_result(r)
        bar.update()

    if scheduler is not None:
        from distributed import Client, as_completed

        with Client(scheduler) as client:
            futs = {client.submit(_task, adapters, m, options, pure=False): m for m in mods}
            for fut in as_completed(futs):
                arrived(futs[fut], fut.result())
    elif workers == 1:
        for m in mods:
            arrived(m, _task(adapters, m, options))
    else:
        from joblib import Parallel, delayed, parallel_config

        # workers end with this process, even when it is killed (lowrank_fl.parent_watch)
        with parallel_config(backend="loky", initializer=exit_with_parent,
                             initargs=(os.getpid(),)), warnings.catch_warnings():
            # an error (in a task or in on_result) cancels the other tasks on purpose: the error
            # is the message, not joblib's warning about the cancelled tasks
            warnings.filterwarnings("ignore", message=r".*tasks which were still being processed",
                                    category=UserWarning)
            gen = Parallel(n_jobs=workers, return_as="generator_unordered")(
                delayed(_named_task)(adapters, m, options) for m in mods)
            try:
                for m, r in gen:
                    arrived(m, r)
            finally:
                gen.close()
    bar.close()
    ordered = [results[m] for m in mods]
    robust = None
    if options.method in ROBUST_METHODS:      # combines the whole updates: after every module
        comb = apply_robust(ordered, options)
        names = adapters.names
        robust = {"coordinates": "exact" if options.method in ("krum", "multikrum", "geomed")
                  else "reduced (coordinate-wise in each module's joint bases U, V)",
                  "f": comb.f,
                  "selected": None if comb.selected is None else
                  [n for n, s in zip(names, comb.selected) if s],
                  "weights": None if comb.weights is None else dict(zip(names, comb.weights.tolist())),
                  "iterations": comb.iterations}
    return Aggregation(adapters=adapters, options=options, results=ordered,
                       seconds=time.perf_counter() - t0,
                       workers=1 if scheduler is not None else workers, robust=robust)


class _OutputWriters:
    """One :class:`AdapterStreamWriter` per output adapter (CLAIR: per client; else one)."""

    def __init__(self, adapters: AdapterSet, options: ModuleOptions, root: Path, dtype: str):
        self.clair = options.method == "clair"
        self.names = adapters.names if self.clair else ["aggregated"]
        self.rank_out = options.rank_out
        self.errors: dict = {}
        self.writers = [AdapterStreamWriter(root / name, adapters.clients[k if self.clair else 0].config,
                                            adapters.modules, dtype=dtype,
                                            label=f"client {name!r}" if self.clair else "aggregated output")
                        for k, name in enumerate(self.names)]

    def write(self, r: ModuleResult, benign=None, release: bool = False) -> None:
        for k, (name, w) in enumerate(zip(self.names, self.writers)):
            B, A, err = r.outputs(k, benign=benign, rank_out=self.rank_out)
            w.add(r.name, B, A)
            if self.rank_out is not None:
                self.errors.setdefault(name, {})[r.name] = err
        if release:
            r.release()

    def close(self) -> None:
        for w in self.writers:
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:          # close the open files; OutputDir removes them
            for w in self.writers:
                w.abort()
        return False


def _finish(agg: Aggregation, writers: _OutputWriters, staged: OutputDir, client_rule: str,
            dtype: str) -> dict:
    writers.close()
    summary = agg.summary(client_rule, writers.errors if writers.rank_out is not None else None)
    summary["outputs"] = writers.names
    summary["dtype"] = dtype
    fingerprints = input_fingerprints(agg.adapters)
    if fingerprints is not None:              # inspect --summary checks it is these inputs' run
        summary["input_sha256"] = fingerprints
    (staged.dir / "summary.json").write_text(json.dumps(summary, indent=1))
    staged.commit()
    return summary


def _output_dir(out, overwrite: bool, adapters: AdapterSet) -> OutputDir:
    return OutputDir(out, command="adapters aggregate", overwrite=overwrite,
                     inputs=[c.path for c in adapters.clients])


def aggregate_to_dir(adapters: AdapterSet, options: ModuleOptions, out, *,
                     client_rule: str = DEFAULT_CLIENT_RULE, dtype: str = "float32",
                     overwrite: bool = False, jobs: int = 1, scheduler: str | None = None,
                     progress: bool = True) -> tuple[Aggregation, dict]:
    """:func:`aggregate_adapters` and :func:`write_outputs` in one pass, writing while solving.

    Same outputs, summary and arguments as the two calls; ``out`` is written through
    :class:`lowrank_fl.outdir.OutputDir` (locked, staged beside it and swapped in only when every
    module succeeded; with ``overwrite`` only a previous lowrank-fl output is replaced; an ``out``
    overlapping a client directory is refused). The returned :class:`Aggregation`'s results keep
    their summary fields, but their output factors are released once written.
    """
    if client_rule not in CLIENT_RULES:
        raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {client_rule!r}")
    stream = options.method not in ROBUST_METHODS and (options.method != "clair"
                                                         or client_rule == "per-module")
    with _output_dir(out, overwrite, adapters) as staged, \
            _OutputWriters(adapters, options, staged.dir, dtype) as writers:
        agg = aggregate_adapters(adapters, options, jobs=jobs, scheduler=scheduler, progress=progress,
                                 on_result=(lambda r: writers.write(r, release=True)) if stream else None)
        if not stream:
            decided = client_decision(agg.results, client_rule) if options.method == "clair" else None
            refit_without(agg.results, decided, options)
            for r in agg.results:
                writers.write(r, benign=decided, release=True)
        return agg, _finish(agg, writers, staged, client_rule, dtype)


def write_outputs(agg: Aggregation, out, *, client_rule: str = DEFAULT_CLIENT_RULE,
                  dtype: str = "float32", overwrite: bool = False) -> dict:
    """Write ``OUT/<client>/`` (CLAIR) or ``OUT/aggregated/`` and ``OUT/summary.json``.

    Returns the summary dict. With ``options.rank_out`` every output is truncated by SVD and
    the relative Frobenius error of each (output, module) is in the summary. ``out`` is written
    as in :func:`aggregate_to_dir`.
    """
    if client_rule not in CLIENT_RULES:
        raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {client_rule!r}")
    decided = client_decision(agg.results, client_rule) if agg.options.method == "clair" else None
    refit_without(agg.results, decided, agg.options)
    with _output_dir(out, overwrite, agg.adapters) as staged, \
            _OutputWriters(agg.adapters, agg.options, staged.dir, dtype) as writers:
        for r in agg.results:
            writers.write(r, benign=decided)
        return _finish(agg, writers, staged, client_rule, dtype)
