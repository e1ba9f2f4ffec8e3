"""Sweep: backends agree bit for bit, the cache resumes interrupted runs, errors name the task."""
from __future__ import annotations

import pickle
import zlib
from collections import Counter

import joblib
import numpy as np
import pytest

from _dummy_tasks import REUSE, TWO_MAPS, executions, noisy_task
from verify.claim import Context, _seed_for
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


# ----------------------------------------------------------------------------- seeds
def test_two_maps_in_one_claim_get_distinct_seeds():
    """Before the map counter, the second map replayed the first one's seeds (and numbers)."""
    ctx = Context().for_claim("fedrep.two")
    a = ctx.map(noisy_task, GRID[:2], replicates=2)
    b = ctx.map(noisy_task, GRID[:2], replicates=2)
    first, second = ctx.seeds_used[:4], ctx.seeds_used[4:]
    assert len(set(first) | set(second)) == 8
    assert all(x["sum"] != y["sum"] for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    assert ctx.map_calls == 2
    # ctx.seed(..., call=k) names the seed of map call k; the default is the first map's
    assert [ctx.seed(i, j, call=1) for i in range(2) for j in range(2)] == second
    assert [ctx.seed(i, j) for i in range(2) for j in range(2)] == first
    # the first map keeps the historical key (crc32(claim), point, replicate)
    crc = zlib.crc32(b"fedrep.two")
    assert first[0] == int(np.random.SeedSequence(0, spawn_key=(crc, 0, 0)).generate_state(1)[0])
    assert second[0] == _seed_for(0, "fedrep.two", 0, 0, call=1) != _seed_for(0, "fedrep.two", 1, 0)


def test_claim_reruns_are_identical_and_depend_on_the_base_seed():
    a, b = TWO_MAPS.run(Context()), TWO_MAPS.run(Context())
    assert a.measured == b.measured and a.seeds == b.seeds and len(a.seeds) == 8
    assert a.measured["first"] != a.measured["second"]
    c = TWO_MAPS.run(Context(base_seed=1))
    assert not set(c.seeds) & set(a.seeds)


def test_for_claim_reproduces_the_other_claims_seeds_and_cache(tmp_path):
    sweep = Sweep(cache_dir=tmp_path)
    ctx = Context(sweep=sweep)
    own = TWO_MAPS.run(ctx)
    assert (sweep.executed, sweep.reused) == (8, 0)
    reused = REUSE.run(ctx)
    assert (sweep.executed, sweep.reused) == (8, 8)  # every task served from the first claim's cache
    assert reused.measured == own.measured and reused.seeds == own.seeds
    # and without a cache: the same numbers
    assert REUSE.run(Context()).measured == own.measured


def test_code_version_tracks_the_task_module():
    v = code_version(noisy_task)
    assert v == code_version(executions)  # same module, same library
    assert v != code_version(np.mean)


def test_code_version_covers_the_numerical_stack_and_the_verify_package(monkeypatch, tmp_path):
    from importlib import metadata

    from verify import sweep as sweep_mod

    assert set(sweep_mod.NUMERICAL_STACK) == {"numpy", "scipy", "cvxpy", "clarabel", "scs", "joblib"}
    versions = sweep_mod.dependency_versions()
    assert versions["numpy"] == np.__version__ and versions["joblib"] == joblib.__version__
    assert versions["scs"] == metadata.version("scs") and versions["clarabel"] == metadata.version("clarabel")
    before = code_version(noisy_task)
    # a different solver version changes the key
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.0-test" if name == "clarabel" else real(name))
    sweep_mod._library_digest.cache_clear()
    try:
        assert code_version(noisy_task) != before
    finally:
        monkeypatch.setattr(metadata, "version", real)
        sweep_mod._library_digest.cache_clear()
    assert code_version(noisy_task) == before
    # every verify source but the report writers and the command line is hashed
    pkg = tmp_path / "pkg"
    (pkg / "claims").mkdir(parents=True)
    (pkg / "report").mkdir()
    for rel in ("claim.py", "claims/_helpers.py", "report/html.py", "cli.py", "__main__.py"):
        (pkg / rel).write_text("x = 1\n")
    base = sweep_mod._tree_digest(pkg, sweep_mod._VERIFY_EXCLUDED)
    for rel, changes in (("report/html.py", False), ("cli.py", False), ("__main__.py", False),
                         ("claims/_helpers.py", True), ("claim.py", True)):
        (pkg / rel).write_text("x = 2\n")
        assert (sweep_mod._tree_digest(pkg, sweep_mod._VERIFY_EXCLUDED) != base) == changes, rel
        (pkg / rel).write_text("x = 1\n")


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
