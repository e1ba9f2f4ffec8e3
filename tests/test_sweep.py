"""Sweep: backends agree bit for bit, the cache resumes interrupted runs, errors name the task."""
from __future__ import annotations

import pickle
from collections import Counter

import joblib
import numpy as np
import pytest

from _dummy_tasks import executions, noisy_task
from verify.claim import Context
from verify.sweep import Sweep, SweepTaskError, code_version

GRID = [{"x": x} for x in range(4)]
SEEDS = [[101 + 10 * i + j for j in range(3)] for i in range(4)]


def _reference():
    return [[noisy_task(seed=s, **g) for s in row] for g, row in zip(GRID, SEEDS)]


def _same(a, b) -> bool:
    """Bitwise equality of nested results (joblib.hash pickles the float64 buffers)."""
    return joblib.hash(a) == joblib.hash(b)


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                       protocol="tcp", dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    yield cluster, client
    client.close()
    cluster.close()


# ----------------------------------------------------------------------------- backends
def test_sequential_matches_direct_calls():
    out = Sweep().map(noisy_task, GRID, SEEDS, label="fedrep.test")
    assert _same(out, _reference())
    assert [[r["x"] for r in row] for row in out] == [[x] * 3 for x in range(4)]


def test_loky_and_dask_match_sequential_bitwise(dask_cluster, tmp_path):
    cluster, client = dask_cluster
    ref = Sweep("sequential").map(noisy_task, GRID, SEEDS, label="fedrep.test")
    loky = Sweep("loky", n_jobs=2).map(noisy_task, GRID, SEEDS, label="fedrep.test")
    with Sweep("dask", client=client) as sweep:
        dask_client = sweep.map(noisy_task, GRID, SEEDS, label="fedrep.test")
    # through a scheduler address, as `--scheduler tcp://HOST:PORT` does
    with Sweep("dask", scheduler=cluster.scheduler_address) as sweep:
        dask_tcp = sweep.map(noisy_task, GRID, SEEDS, label="fedrep.test")
        assert sweep._own_client is not None
    assert sweep._own_client is None  # closed on exit
    for other in (loky, dask_client, dask_tcp):
        assert _same(ref, other)


def test_dask_local_cluster_started_on_demand():
    with Sweep("dask", n_jobs=1, cluster_options={"processes": False}) as sweep:
        out = sweep.map(noisy_task, GRID[:2], SEEDS[:2], label="fedrep.test")
        assert sweep._own_cluster is not None
    assert sweep._own_cluster is None
    assert _same(out, _reference()[:2])


def test_ragged_seed_rows_and_empty_grid():
    out = Sweep().map(noisy_task, GRID[:2], [[1], [2, 3]])
    assert [len(r) for r in out] == [1, 2]
    assert _same(out[1][1], noisy_task(seed=3, x=1))
    assert Sweep().map(noisy_task, [], []) == []


# ----------------------------------------------------------------------------- cache & resume
def test_cache_serves_finished_tasks_without_recomputing(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    grid = [{"x": x, "log_dir": str(log)} for x in range(4)]
    first = Sweep(cache_dir=tmp_path / "cache").map(noisy_task, grid, SEEDS, label="fedrep.c")
    assert len(executions(log)) == 12
    sweep = Sweep(cache_dir=tmp_path / "cache")
    second = sweep.map(noisy_task, grid, SEEDS, label="fedrep.c")
    assert len(executions(log)) == 12  # nothing recomputed
    assert (sweep.executed, sweep.reused) == (0, 12)
    assert _same(first, second)
    # the label (claim id), the seed and the code version are part of the key
    Sweep(cache_dir=tmp_path / "cache").map(noisy_task, grid[:1], [[SEEDS[0][0]]], label="fedrep.d")
    Sweep(cache_dir=tmp_path / "cache").map(noisy_task, grid[:1], [[999]], label="fedrep.c")
    Sweep(cache_dir=tmp_path / "cache", code_version="edited").map(
        noisy_task, grid[:1], [[SEEDS[0][0]]], label="fedrep.c")
    assert len(executions(log)) == 15


def test_interrupted_sequential_sweep_resumes(tmp_path):
    """A KeyboardInterrupt on the 3rd grid point: the 6 finished tasks are kept and not rerun."""
    log, poison = tmp_path / "log", tmp_path / "poison"
    log.mkdir()
    poison.touch()
    grid = [{"x": x, "log_dir": str(log), "poison": str(poison), "interrupt_on": 2} for x in range(4)]
    with pytest.raises(KeyboardInterrupt):
        Sweep(cache_dir=tmp_path / "cache").map(noisy_task, grid, SEEDS, label="fedrep.r")
    before = executions(log)
    assert len(before) == 7  # 6 finished + the interrupted one
    poison.unlink()
    resumed = Sweep(cache_dir=tmp_path / "cache").map(noisy_task, grid, SEEDS, label="fedrep.r")
    rerun = Counter(executions(log)) - Counter(before)
    assert rerun == Counter((x, s) for x in (2, 3) for s in SEEDS[x])
    assert _same(resumed, Sweep().map(noisy_task, grid, SEEDS, label="fedrep.r"))


def test_failing_loky_task_keeps_finished_results_and_names_the_task(tmp_path):
    log, poison = tmp_path / "log", tmp_path / "poison"
    log.mkdir()
    poison.touch()
    grid = [{"x": x, "log_dir": str(log), "poison": str(poison), "fail_on": 3} for x in range(4)]
    sweep = Sweep("loky", n_jobs=2, cache_dir=tmp_path / "cache")
    with pytest.raises(SweepTaskError, match=r"claim fedrep\.f: task _dummy_tasks\.noisy_task\(seed=13\d, "
                                             r"\*\*\{'x': 3.*raised ValueError: boom at x=3") as info:
        sweep.map(noisy_task, grid, SEEDS, label="fedrep.f")
    assert isinstance(info.value.__cause__, ValueError)
    mask = sweep.cached(noisy_task, grid, SEEDS, label="fedrep.f")
    assert not any(mask[3])
    assert sum(map(sum, mask)) >= 1  # with 2 workers, at least one task finished before x=3 failed
    first_run = Counter(executions(log))
    poison.unlink()
    out = Sweep("loky", n_jobs=2, cache_dir=tmp_path / "cache").map(noisy_task, grid, SEEDS, label="fedrep.f")
    rerun = Counter(executions(log)) - first_run
    # exactly the tasks missing from the cache are executed again, each once
    assert rerun == Counter((x, s) for x, row in enumerate(SEEDS) for j, s in enumerate(row)
                            if not mask[x][j])
    assert _same(out, Sweep().map(noisy_task, grid, SEEDS, label="fedrep.f"))


def test_corrupt_cache_entry_is_recomputed(tmp_path):
    sweep = Sweep(cache_dir=tmp_path)
    ref = sweep.map(noisy_task, GRID[:1], [[5]], label="fedrep.x")
    (entry,) = list(tmp_path.rglob("*.pkl"))
    entry.write_bytes(b"not a pickle")
    again = Sweep(cache_dir=tmp_path)
    assert _same(again.map(noisy_task, GRID[:1], [[5]], label="fedrep.x"), ref)
    assert again.executed == 1
    assert pickle.loads(entry.read_bytes())["seed"] == 5  # rewritten


def test_unhashable_parameters_run_uncached(tmp_path):
    def local_variant(seed, x):  # local function: neither hashable nor cacheable
        return seed + x

    out = Sweep(cache_dir=tmp_path).map(lambda seed, f, x: f(seed, x), [{"f": local_variant, "x": 1}], [[2]])
    assert out == [[3]]
    assert not list(tmp_path.rglob("*.pkl"))


def test_context_map_goes_through_the_cached_sweep(tmp_path):
    sweep = Sweep(cache_dir=tmp_path)
    ctx = Context(sweep=sweep).for_claim("fedrep.ctx")
    a = ctx.map(noisy_task, GRID[:2], replicates=2)
    b = Context(sweep=sweep).for_claim("fedrep.ctx").map(noisy_task, GRID[:2], replicates=2)
    assert _same(a, b) and sweep.reused == 4
    assert len(set(ctx.seeds_used)) == 4


def test_code_version_tracks_the_task_module():
    v = code_version(noisy_task)
    assert v == code_version(executions)  # same module, same library
    assert v != code_version(np.mean)


def test_progress_is_silent_when_not_a_tty(capsys):
    Sweep(progress=True).map(noisy_task, GRID, SEEDS)
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs, match", [
    ({"backend": "mpi"}, r"backend must be one of .*got 'mpi'"),
    ({"n_jobs": 0}, r"n_jobs must be a positive int or -1 \(all cores\), got 0"),
    ({"n_jobs": 1.5}, r"n_jobs must be .*got 1.5"),
    ({"backend": "loky", "scheduler": "tcp://h:1"}, r"need backend='dask', got backend='loky'"),
    ({"backend": "dask", "scheduler": "localhost"}, r"scheduler must be an address like"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sweep(**kwargs)


def test_bad_map_arguments():
    with pytest.raises(ValueError, match=r"one row per grid point: 2 points, 1 rows"):
        Sweep().map(noisy_task, GRID[:2], [[1]])
    with pytest.raises(TypeError, match=r"task must be callable, got int"):
        Sweep().map(3, GRID[:1], [[1]])
