"""Run an aggregator over every module (sequential, joblib or dask) and write PEFT outputs.

Modules are independent. Each module task reads its own factors from the client files (lazy,
one module at a time), reduces, solves and returns a compact :class:`ModuleResult`; the results
are collected in module order. Every task runs with one BLAS thread, so the numbers do not
depend on the backend (sequential, joblib processes, dask workers): identical results.

:func:`aggregate_to_dir` (what the CLI runs) writes each module's outputs into every output
adapter as soon as the module is solved (:mod:`.stream`), so writing overlaps the other modules'
solves and a module's output state is released once written; with ``client_rule`` "majority" or
"any" (or "pooled") the outputs depend on every module's set (8), so they are written after the
last solve; the split layout keeps only a few hundred kB per module until then.
"""
from __future__ import annotations

import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..jsontext import finite_json, strict_dumps
from ..outdir import OutputDir
from ..parent_watch import exit_with_parent
from .aggregate import (CLIENT_RULES, DEFAULT_CLIENT_RULE, ModuleOptions, ModuleResult, aggregate_module, apply_robust,
                        check_rank, client_decision)
from .plan import apply_refinement, refinement_summary, resolve_refine
from .decision import detection_summary
from .io import AdapterSet, input_dtype, input_fingerprints
from .robust import ROBUST_METHODS
from .io import AdapterError
from .split import (DEFAULT_LAYOUT, LAYOUTS, SHARED, client_part, fold_weights, keep_split_state,
                    shared_part, shared_used, shared_weights, write_manifest)
from .stream import AdapterStreamWriter

__all__ = ["Aggregation", "aggregate_adapters", "aggregate_to_dir", "write_outputs", "resolve_layout",
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
               "clip": self.options.clip if self.options.method == "clair" else None,
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


def _task(adapters: AdapterSet, module: str, options: ModuleOptions,
          state: str = "all") -> ModuleResult:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        res = aggregate_module(adapters.factors(module), options)
    if state == "split" and res.method == "clair":
        keep_split_state(res)                 # a few hundred kB instead of the bases
    return res


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


def _named_task(adapters, module, options, state="all"):
    return module, _task(adapters, module, options, state)


def aggregate_adapters(adapters: AdapterSet, options: ModuleOptions, *, jobs: int = 1,
                       scheduler: str | None = None, progress: bool = True,
                       on_result=None, state: str = "all") -> Aggregation:
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
    state : {"all", "split"}
        What each CLAIR result keeps for its outputs: everything (:meth:`ModuleResult.outputs`,
        the merged layout) or only the split layout's small state
        (:func:`lowrank_fl.adapters.split.keep_split_state`, dropped in the worker).
    """
    if state not in ("all", "split"):
        raise ValueError(f"state must be 'all' or 'split', got {state!r}")
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

    try:     # the bar ends its line before an error is printed (else it redraws after it)
        if scheduler is not None:
            from distributed import Client, as_completed

            try:
                client = Client(scheduler)
            except (OSError, ValueError, TypeError) as exc:     # a bad address, or nobody answers there
                raise ValueError(f"scheduler {scheduler!r} (a dask scheduler's address): cannot connect: "
                                 f"{' '.join(str(exc).split())}") from None
            with client:
                futs = {client.submit(_task, adapters, m, options, state, pure=False): m for m in mods}
                for fut in as_completed(futs):
                    arrived(futs[fut], fut.result())
        elif workers == 1:
            for m in mods:
                arrived(m, _task(adapters, m, options, state))
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
                    delayed(_named_task)(adapters, m, options, state) for m in mods)
                try:
                    for m, r in gen:
                        arrived(m, r)
                finally:
                    gen.close()
    finally:
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


def resolve_layout(output: str | None, options: ModuleOptions) -> str:
    """The output layout (:data:`lowrank_fl.adapters.split.LAYOUTS`): ``output``, or by default
    "split", except with ``options.rank_out`` (a truncation of merged outputs): "merged"."""
    if output is None:
        return "merged" if options.rank_out is not None else DEFAULT_LAYOUT
    if output not in LAYOUTS:
        raise ValueError(f"output must be one of {list(LAYOUTS)}, got {output!r}")
    if output == "split" and options.rank_out is not None and options.method == "clair":
        raise ValueError("rank_out truncates merged outputs; the split layout is exact at the "
                         "inputs' size (use output='merged' with rank_out)")
    return output


class _OutputWriters:
    """One :class:`AdapterStreamWriter` per output adapter (CLAIR: per client, and the shared
    adapter in the split layout; else one)."""

    def __init__(self, adapters: AdapterSet, options: ModuleOptions, root: Path, dtype: str,
                 layout: str = "merged", weights=None):
        self.clair = options.method == "clair"
        self.split = self.clair and layout == "split"
        self.layout = layout if self.clair else None
        self.adapters = adapters
        self.names = adapters.names if self.clair else ["aggregated"]
        if self.split and SHARED in self.names:
            raise AdapterError(f"a client is named {SHARED!r}, the shared adapter's directory in "
                               "the split layout; rename it (--names) or use the merged layout")
        self.weights = shared_weights(weights, adapters.names, adapters.modules) if self.clair else None
        self.applied: dict = {n: {} for n in self.names}
        self.part_dtype = np.dtype(options.output_dtype)
        self.rank_out = options.rank_out
        self.errors: dict = {}
        self.root = root
        self._pending: dict = {}          # results that arrived before an earlier module's
        self._next = 0
        self.writers = [AdapterStreamWriter(root / name, adapters.clients[k if self.clair else 0].config,
                                            adapters.modules, dtype=dtype,
                                            label=f"client {name!r}" if self.clair else "aggregated output")
                        for k, name in enumerate(self.names)]
        if self.split:
            self.writers.append(AdapterStreamWriter(root / SHARED, adapters.clients[0].config,
                                                    adapters.modules, dtype=dtype,
                                                    label="the shared adapter"))

    def write_in_order(self, r: ModuleResult) -> None:
        """Write ``r`` once every module before it (in the inputs' order) is written, holding the
        results that arrive early: the workers finish in any order, and the files' bytes (the
        order of their tensors) must not depend on it. The held results stay in memory until
        then (with ``jobs`` workers taking modules in order, a few; where the first module is by
        far the slowest, up to all the others')."""
        self._pending[r.name] = r
        mods = self.adapters.modules
        while self._next < len(mods) and mods[self._next] in self._pending:
            self.write(self._pending.pop(mods[self._next]), release=True)
            self._next += 1

    @property
    def outputs(self) -> list:
        return self.names + ([SHARED] if self.split and shared_used(self.applied) else [])

    def write(self, r: ModuleResult, benign=None, release: bool = False) -> None:
        if self.split:
            self._write_split(r, benign)
        else:
            for k, (name, w) in enumerate(zip(self.names, self.writers)):
                a = 1.0 if not self.clair else float(self.weights[r.name][k])
                B, A, err = r.outputs(k, benign=benign, rank_out=self.rank_out, weight=a)
                w.add(r.name, B, A)
                if self.clair:
                    self.applied[name][r.name] = a if _in_set(r, benign, k) else 0.0
                if self.rank_out is not None:
                    self.errors.setdefault(name, {})[r.name] = err
        if release:
            r.release()

    def _write_split(self, r: ModuleResult, benign) -> None:
        f = self.adapters.factors(r.name)             # read again: the state keeps no bases
        b = np.asarray(r.benign if benign is None else benign, bool)
        w = self.weights[r.name]
        for k, name in enumerate(self.names):
            a = float(w[k]) if b[k] else 0.0
            self.writers[k].add(r.name, *client_part(r, f, k, b, a, self.part_dtype))
            self.applied[name][r.name] = a
        self.writers[-1].add(r.name, *shared_part(r, f, b, self.part_dtype))

    def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.split:
            used = shared_used(self.applied)
            if not used:          # every client keeps its own adapter: nothing refers to shared/
                shutil.rmtree(self.root / SHARED)
            for name in self.names:
                write_manifest(self.root / name, name, self.applied[name], shared=used)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:          # close the open files; OutputDir removes them
            for w in self.writers:
                w.abort()
        return False


def _in_set(r: ModuleResult, benign, k: int) -> bool:
    return bool((r.benign if benign is None else benign)[k])


def _plan(agg: Aggregation, decided, refine: str, shared_weights, writers) -> dict | None:
    """The refinement (:mod:`.plan`) of a CLAIR aggregation: prepares the modules' states, hands
    the writers their weights (unless ``shared_weights`` were given) and returns the summary's
    ``refinement`` section."""
    if agg.options.method != "clair":
        return None
    weights = apply_refinement(agg.results, decided, agg.options, refine, factors=agg.adapters.factors)
    if shared_weights is None:
        writers.weights = weights
    else:
        weights = writers.weights
    return refinement_summary(agg.results, decided, agg.adapters.names, refine, weights)


def _finish(agg: Aggregation, writers: _OutputWriters, staged: OutputDir, client_rule: str,
            dtype: str, refinement: dict | None = None) -> dict:
    writers.close()
    summary = agg.summary(client_rule, writers.errors if writers.rank_out is not None else None)
    if refinement is not None:
        summary["refinement"] = refinement
    summary["outputs"] = writers.outputs
    summary["dtype"] = dtype
    if writers.clair:
        summary["layout"] = writers.layout
        # a_k per client actually applied (0 where outside a module's set), one number when the
        # same in every module; in the split layout the weight of OUT/shared in the client's sum
        summary["refinement_weights"] = {n: fold_weights(writers.applied[n]) for n in writers.names}
    fingerprints = input_fingerprints(agg.adapters)
    if fingerprints is not None:              # inspect --summary checks it is these inputs' run
        summary["input_sha256"] = fingerprints
    summary = finite_json(summary)            # returned as written: NaN None, inf "inf"
    (staged.dir / "summary.json").write_text(strict_dumps(summary, indent=1))
    staged.commit()
    return summary


def _output_dir(out, overwrite: bool, adapters: AdapterSet, out_name: str) -> OutputDir:
    return OutputDir(out, command="adapters aggregate", overwrite=overwrite,
                     inputs=[c.path for c in adapters.clients], option=out_name)


def aggregate_to_dir(adapters: AdapterSet, options: ModuleOptions, out, *,
                     client_rule: str = DEFAULT_CLIENT_RULE, dtype: str = "float32",
                     overwrite: bool = False, jobs: int = 1, scheduler: str | None = None,
                     progress: bool = True, output: str | None = None,
                     shared_weights=None, refine: str | None = None,
                     out_name: str = "out") -> tuple[Aggregation, dict]:
    """:func:`aggregate_adapters` and :func:`write_outputs` in one pass, writing while solving.

    Same outputs, summary and arguments as the two calls; ``out`` is written through
    :class:`lowrank_fl.outdir.OutputDir` (locked, staged beside it and swapped in only when every
    module succeeded; with ``overwrite`` only a previous lowrank-fl output is replaced; an ``out``
    overlapping a client directory is refused). The returned :class:`Aggregation`'s results keep
    their summary fields, but their output factors are released once written. ``dtype`` is the
    outputs' storage dtype, float32 by default; ``"auto"`` is the inputs' shared dtype
    (:func:`lowrank_fl.adapters.io.input_dtype`, the command line's default). Where a value does not
    fit the dtype this raises :class:`~lowrank_fl.adapters.io.StorageDtypeError`; the command line then
    writes float32 instead. ``out_name``: how errors about ``out`` name it (the command passes
    ``"--out"``, and they then say ``--overwrite`` for ``overwrite=True``).
    """
    if dtype == "auto":
        dtype = input_dtype(adapters)
    if client_rule not in CLIENT_RULES:
        raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {client_rule!r}")
    layout = resolve_layout(output, options)
    refine = resolve_refine(refine, shared_weights, options.method)
    # the agreement weights need every module's Gram, and a client-level rule every module's evidence
    stream = options.method not in ROBUST_METHODS and (options.method != "clair"
                                                         or (client_rule == "per-module"
                                                             and refine not in ("agreement", "exchangeable", "shrink")))
    if stream and options.method == "clair" and shared_weights is None and refine == "own":
        shared_weights = 0.0
    with _output_dir(out, overwrite, adapters, out_name) as staged, \
            _OutputWriters(adapters, options, staged.dir, dtype, layout, shared_weights) as writers:
        agg = aggregate_adapters(adapters, options, jobs=jobs, scheduler=scheduler, progress=progress,
                                 on_result=writers.write_in_order if stream else None,
                                 state="split" if writers.split else "all")
        if not stream:
            decided = client_decision(agg.results, client_rule) if options.method == "clair" else None
            refinement = _plan(agg, decided, refine, shared_weights, writers)
            for r in agg.results:
                writers.write(r, benign=decided, release=True)
        else:                   # per-module sets, weights fixed before the solves
            refinement = None if options.method != "clair" else refinement_summary(
                agg.results, None, adapters.names, refine, writers.weights)
        return agg, _finish(agg, writers, staged, client_rule, dtype, refinement)


def write_outputs(agg: Aggregation, out, *, client_rule: str = DEFAULT_CLIENT_RULE,
                  dtype: str = "float32", overwrite: bool = False, output: str | None = None,
                  shared_weights=None, refine: str | None = None, out_name: str = "out") -> dict:
    """Write ``OUT/<client>/`` (CLAIR) or ``OUT/aggregated/`` and ``OUT/summary.json``.

    Returns the summary dict. CLAIR's ``output`` layout (:data:`lowrank_fl.adapters.split.LAYOUTS`,
    :func:`resolve_layout`): "split" (default) writes ``OUT/shared/`` once and each client's own
    part (:mod:`lowrank_fl.adapters.split`), "merged" one adapter per client holding (9).
    ``refine``: how collaborating clients are refined (:mod:`lowrank_fl.adapters.plan`):
    "exchangeable" (default: toward the collaborative mean by each client's agreement with the
    others, every weight at least
    :data:`lowrank_fl.adapters.noharm.EXCHANGEABLE_WEIGHT` where the collaborating clients look
    exchangeable, :mod:`lowrank_fl.adapters.exchangeable`), "agreement" (the agreement alone),
    "shrink" (every weight at least :data:`lowrank_fl.adapters.noharm.SHRINK_WEIGHT`), "paper" ((9)
    exactly, ``P_Â`` re-estimated
    without flagged clients), "own".
    ``shared_weights``: explicit weights ``a_k`` in [0, 1] instead of ``refine``'s (forms in
    :func:`lowrank_fl.adapters.split.shared_weights`; 1 is the full move to the target). With
    ``options.rank_out`` (merged only) every output is truncated by SVD and the relative Frobenius
    error of each (output, module) is in the summary. ``out``, ``dtype`` (``"auto"`` included) and
    ``out_name`` are as in :func:`aggregate_to_dir`.
    """
    if dtype == "auto":
        dtype = input_dtype(agg.adapters)
    if client_rule not in CLIENT_RULES:
        raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {client_rule!r}")
    layout = resolve_layout(output, agg.options)
    refine = resolve_refine(refine, shared_weights, agg.options.method)
    decided = client_decision(agg.results, client_rule) if agg.options.method == "clair" else None
    with _output_dir(out, overwrite, agg.adapters, out_name) as staged, \
            _OutputWriters(agg.adapters, agg.options, staged.dir, dtype, layout,
                           shared_weights) as writers:
        refinement = _plan(agg, decided, refine, shared_weights, writers)
        for r in agg.results:
            writers.write(r, benign=decided)
        return _finish(agg, writers, staged, client_rule, dtype, refinement)
