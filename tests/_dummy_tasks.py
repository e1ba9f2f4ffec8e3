"""Module-level tasks and dummy claims for the verifier-infrastructure tests.

Tasks must be importable by worker processes (loky, dask), hence a module of their own. Every
execution leaves a marker file in ``log_dir`` so tests can count executions across processes.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np

from verify.claim import Claim, Evidence, verdict_from


def noisy_task(seed, x, log_dir=None, poison=None, fail_on=None, interrupt_on=None, sleep=0.0):
    """A small random result depending on ``seed`` and ``x``; optionally fails on ``x == fail_on``.

    ``sleep`` seconds of waiting make runs overlap in concurrency tests.

    The failure fires only while the file ``poison`` exists, so a rerun with the same parameters
    (same cache keys) succeeds once the test removes it.
    """
    if log_dir is not None:
        Path(log_dir, f"{x}_{seed}_{uuid.uuid4().hex}.run").touch()
    armed = poison is not None and Path(poison).exists()
    if armed and fail_on is not None and x == fail_on:
        raise ValueError(f"boom at x={x}")
    if armed and interrupt_on is not None and x == interrupt_on:
        raise KeyboardInterrupt
    if sleep:
        time.sleep(sleep)
    rng = np.random.default_rng(seed)
    return {"x": x, "draw": rng.standard_normal(4) * (1 + x), "sum": float(rng.random() + x)}


def blas_threads_task(seed):
    """The thread counts of the BLAS/OpenMP pools the task runs with."""
    from threadpoolctl import threadpool_info

    return {"threads": sorted({int(p["num_threads"]) for p in threadpool_info()})}


def mixed_task(seed):
    """Every kind of value the cache format stores, including the awkward floats."""
    rng = np.random.default_rng(seed)
    return {"nan": float("nan"), "neg_zero": -0.0, "inf": [float("inf"), -float("inf")],
            1: ("tuple", None, True, 3), (2, "k"): rng.standard_normal((2, 3)),
            "scalar": np.float64(rng.random()), "int64": np.int64(7), "bool": np.bool_(False),
            "ints": np.arange(4, dtype=np.int32), "empty": np.zeros((0, 2)),
            "complex": np.array([1 + 2j]), "text": np.array(["a", "bc"]),
            "nested": [[{"a": np.ones(2, dtype=bool)}]], "big": 2 ** 70, "draw": float(rng.random())}


def uncacheable_task(seed):
    """A result the cache format does not hold (a set)."""
    return {"set": {seed}}


def executions(log_dir) -> list[tuple[int, int]]:
    """(x, seed) of every execution logged in ``log_dir``."""
    out = []
    for p in Path(log_dir).glob("*.run"):
        x, seed, _ = p.stem.split("_")
        out.append((int(x), int(seed)))
    return sorted(out)


def _mean_experiment(ctx, *, shift=0.0):
    out = ctx.map(noisy_task, [{"x": x} for x in range(3)], replicates=ctx.pick(2, 3, 4))
    means = [float(np.mean([r["sum"] for r in row])) + shift for row in out]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(means, marker="o")
    path = ctx.save_figure(fig)
    ok = all(abs(m - (x + 0.5)) < 0.5 for x, m in enumerate(means))
    return Evidence(verdict=verdict_from(ok), summary=f"means {np.round(means, 3).tolist()} | x+0.5",
                    measured={"means": means}, predicted={"means": [x + 0.5 for x in range(3)]},
                    figure=path, notes="a dummy claim with a | pipe")


def _table_experiment(ctx):
    return Evidence(verdict="holds", summary="table only",
                    table=[{"method": "paper", "error": 0.125}, {"method": "ours", "error": 0.1251,
                                                                 "time": 2.0}])


def _raising_experiment(ctx):
    raise ZeroDivisionError("dummy experiment divided by zero")


def _erratum_experiment(ctx):
    return Evidence(verdict=verdict_from(True, erratum=True), summary="typo reproduced",
                    measured={"ratio": np.float64(2.0)}, predicted={"ratio": 1.0})


def _two_maps_experiment(ctx):
    """Two maps over the same grid (e.g. a main run and a control) in one claim."""
    first = ctx.map(noisy_task, [{"x": x} for x in range(2)], replicates=2)
    second = ctx.map(noisy_task, [{"x": x} for x in range(2)], replicates=2)
    return Evidence(verdict="holds", summary="two maps",
                    measured={"first": [[r["sum"] for r in row] for row in first],
                              "second": [[r["sum"] for r in row] for row in second]})


def _reuse_experiment(ctx):
    """Reuses the runs of ``fedrep.dummy.two_maps`` through a sub-context, as clair.sec7.table2 does."""
    sub = ctx.for_claim("fedrep.dummy.two_maps")
    ev = _two_maps_experiment(sub)
    ctx.seeds_used.extend(sub.seeds_used)
    return ev


def dummy_claims() -> list[Claim]:
    """Unregistered claims covering every verdict, a figure, a table and a raising experiment."""
    return [
        Claim(id="fedrep.dummy.mean", paper="fedrep", reference="Theorem 0, eq. (0)",
              statement="The mean of U(0,1) + x is x + 1/2.", kind="identity",
              experiment=_mean_experiment),
        Claim(id="clair.dummy.table", paper="clair", reference="Table 1",
              statement="A table is reproduced.", kind="comparison", experiment=_table_experiment),
        Claim(id="flute.dummy.raises", paper="flute", reference="Theorem 9",
              statement="An experiment with a bug.", kind="bound", experiment=_raising_experiment),
        Claim(id="rolora.dummy.erratum", paper="rolora", reference="eq. (99)",
              statement="The paper's constant is off by two.", kind="erratum",
              experiment=_erratum_experiment, erratum=True),
    ]


TWO_MAPS = Claim(id="fedrep.dummy.two_maps", paper="fedrep", reference="eq. (1)",
                 statement="Two maps in one claim.", kind="identity", experiment=_two_maps_experiment)
REUSE = Claim(id="fedrep.dummy.reuse", paper="fedrep", reference="eq. (2)",
              statement="Reuses another claim's runs.", kind="identity", experiment=_reuse_experiment)


def slow_task(seed, log_dir, seconds, busy=False):
    """Runs ``seconds`` (a stand-in for a solver crawling to its caps), leaving ``start_<pid>`` in
    ``log_dir`` when it begins and ``finished_<pid>`` if it ever ends. ``busy``: burn CPU in a
    Python loop of numpy calls instead of sleeping."""
    import os

    pid = os.getpid()
    Path(log_dir, f"start_{pid}").touch()
    end = time.monotonic() + seconds
    a = np.random.default_rng(seed).standard_normal((20, 20))
    while time.monotonic() < end:
        if busy:
            a = np.linalg.qr(a)[0]
        else:
            time.sleep(0.05)
    Path(log_dir, f"finished_{pid}").touch()
    return {"pid": pid}


def _slow_experiment(ctx, *, log_dir, seconds=120.0, busy=False):
    # two tasks: a lone task of a local pool runs in the claim's own process (verify.sweep)
    out = ctx.map(slow_task, [{"log_dir": str(log_dir), "seconds": seconds, "busy": busy}], replicates=2)
    return Evidence(verdict="holds", summary=f"finished in pids {[r['pid'] for r in out[0]]}")


def slow_claim(log_dir, *, seconds=120.0, busy=False, id="flute.dummy.slow") -> Claim:
    """A claim whose only task runs ``seconds`` (it should be stopped at its budget)."""
    import functools

    return Claim(id=id, paper=id.split(".")[0], reference="Theorem 8", kind="bound",
                 statement="A solver that crawls.",
                 experiment=functools.partial(_slow_experiment, log_dir=log_dir, seconds=seconds,
                                              busy=busy))


def penalized_task(seed, max_iter, as_dict=True, silence=False):
    """Solve program (7) on a small random instance (K = 3 clients, q = 2, p = 5) with FISTA capped
    at ``max_iter`` iterations: a small cap is a solve that misses its tolerance."""
    import warnings

    from lowrank_fl.clair.penalized import solve_penalized
    from lowrank_fl.results import ConvergenceWarning

    D = np.random.default_rng(seed).standard_normal((6, 5))
    with warnings.catch_warnings():
        if silence:   # a claim that runs to the cap on purpose says so here
            warnings.simplefilter("ignore", ConvergenceWarning)
        res = solve_penalized(D, 2, 0.3, 0.3, max_iter=max_iter, tol=1e-10)
    return {"objective": float(res.objective)} if as_dict else float(res.objective)


def _lax_experiment(ctx, *, max_iter, in_body=False, as_dict=True, silence=False):
    """A criterion that never looks at the solves' certificates: it passes on any finite objective."""
    if in_body:
        objectives = [penalized_task(ctx.seed(99, 0), max_iter, silence=silence)["objective"]]
    else:
        out = ctx.map(penalized_task, [{"max_iter": max_iter, "as_dict": as_dict, "silence": silence}],
                      replicates=2)
        objectives = [r["objective"] if as_dict else r for r in out[0]]
    ok = all(np.isfinite(objectives))
    return Evidence(verdict=verdict_from(ok), summary=f"objectives {np.round(objectives, 4).tolist()}",
                    measured={"objectives": objectives})


def lax_claim(**options) -> Claim:
    """A claim whose criterion passes whatever its solves' status (options: see _lax_experiment)."""
    import functools

    return Claim(id="clair.dummy.lax", paper="clair", reference="eq. (7)", kind="identity",
                 statement="Program (7) has a finite optimum.",
                 experiment=functools.partial(_lax_experiment, **options))
