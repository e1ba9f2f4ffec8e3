"""Run an aggregator over every module (sequential, joblib or dask) and write PEFT outputs.

Modules are independent. Each module task reads its own factors from the client files (lazy,
one module at a time), reduces, solves and returns a compact :class:`ModuleResult`; the results
are collected in module order. Every task runs with one BLAS thread, so the numbers do not
depend on the backend (sequential, joblib processes, dask workers): identical results.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .aggregate import CLIENT_RULES, ModuleOptions, ModuleResult, aggregate_module, client_decision
from .io import AdapterError, AdapterSet, save_adapter

__all__ = ["Aggregation", "aggregate_adapters", "write_outputs", "check_out_dir"]


@dataclass
class Aggregation:
    """All modules' results, in the adapter set's module order."""

    adapters: AdapterSet
    options: ModuleOptions
    results: list
    seconds: float

    def summary(self, client_rule: str = "per-module", rank_out_errors=None) -> dict:
        names = self.adapters.names
        out = {"method": self.options.method, "clients": names,
               "client_rule": client_rule if self.options.method == "clair" else None,
               "seconds": self.seconds,
               "modules": {r.name: r.summary() for r in self.results}}
        if self.options.method == "clair":
            flags = np.array([r.benign for r in self.results], bool)
            out["client_benign"] = {
                "modules_benign": dict(zip(names, flags.sum(axis=0).tolist())),
                "n_modules": len(self.results),
                "majority": dict(zip(names, client_decision(self.results, "majority").tolist())),
                "any": dict(zip(names, client_decision(self.results, "any").tolist())),
            }
        if rank_out_errors is not None:
            out["rank_out"] = self.options.rank_out
            out["rank_out_relative_error"] = rank_out_errors
        return out


def _task(adapters: AdapterSet, module: str, options: ModuleOptions) -> ModuleResult:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return aggregate_module(adapters.factors(module), options)


def _named_task(adapters, module, options):
    return module, _task(adapters, module, options)


def aggregate_adapters(adapters: AdapterSet, options: ModuleOptions, *, jobs: int = 1,
                       scheduler: str | None = None, progress: bool = True) -> Aggregation:
    """Aggregate every module of ``adapters``.

    Parameters
    ----------
    jobs : int
        joblib processes (1: in this process; -1: all cores).
    scheduler : str, optional
        Address of a dask distributed scheduler (``tcp://host:port``); overrides ``jobs``.
    progress : bool
        tqdm progress bar over modules (stderr).
    """
    from tqdm.auto import tqdm

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs == 0 or jobs < -1:
        raise ValueError(f"jobs must be an int >= 1 or -1 (all cores), got {jobs!r}")
    t0 = time.perf_counter()
    mods = adapters.modules
    bar = tqdm(total=len(mods), desc=f"{options.method} modules", unit="module",
               disable=not progress)
    results: dict = {}
    if scheduler is not None:
        from distributed import Client, as_completed

        with Client(scheduler) as client:
            futs = {client.submit(_task, adapters, m, options, pure=False): m for m in mods}
            for fut in as_completed(futs):
                results[futs[fut]] = fut.result()
                bar.update()
    elif jobs == 1:
        for m in mods:
            results[m] = _task(adapters, m, options)
            bar.update()
    else:
        from joblib import Parallel, delayed

        gen = Parallel(n_jobs=jobs, return_as="generator_unordered")(
            delayed(_named_task)(adapters, m, options) for m in mods)
        for m, r in gen:
            results[m] = r
            bar.update()
    bar.close()
    return Aggregation(adapters=adapters, options=options, results=[results[m] for m in mods],
                       seconds=time.perf_counter() - t0)


def check_out_dir(out, overwrite: bool) -> Path:
    """Refuse a non-empty ``out`` unless ``overwrite`` (then it is emptied at write time)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AdapterError(f"{out}: --out exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise AdapterError(f"{out}: output directory is not empty (pass --overwrite to replace "
                           "its contents)")
    return out


def write_outputs(agg: Aggregation, out, *, client_rule: str = "per-module",
                  dtype: str = "float32", overwrite: bool = False) -> dict:
    """Write ``OUT/<client>/`` (CLAIR) or ``OUT/aggregated/`` and ``OUT/summary.json``.

    Returns the summary dict. With ``options.rank_out`` every output is truncated by SVD and
    the relative Frobenius error of each (output, module) is in the summary.
    """
    if client_rule not in CLIENT_RULES:
        raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {client_rule!r}")
    out = check_out_dir(out, overwrite)
    if out.is_dir() and overwrite:
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    ad, opts = agg.adapters, agg.options
    clair = opts.method == "clair"
    decided = client_decision(agg.results, client_rule) if clair else None
    names = ad.names if clair else ["aggregated"]
    errors = {}
    for k, name in enumerate(names):
        factors = {}
        for r in agg.results:
            B, A, err = r.outputs(k, benign=decided, rank_out=opts.rank_out)
            factors[r.name] = (B, A)
            if opts.rank_out is not None:
                errors.setdefault(name, {})[r.name] = err
        base = ad.clients[k if clair else 0].config
        save_adapter(out / name, base, factors, dtype=dtype)
        del factors
    summary = agg.summary(client_rule, errors if opts.rank_out is not None else None)
    summary["outputs"] = names
    summary["dtype"] = dtype
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
