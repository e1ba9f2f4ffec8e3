"""Sweep: backends agree bit for bit, the cache resumes interrupted runs, errors name the task."""
from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import joblib
import numpy as np
import pytest

from _dummy_tasks import (REUSE, TWO_MAPS, blas_threads_task, executions, mixed_task, noisy_task,
                          uncacheable_task)
from verify.claim import Context, _seed_for
from verify import versioning
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


def test_unhashable_parameters_run_uncached(tmp_path):
    def local_variant(seed, x):  # local function: neither hashable nor cacheable
        return seed + x

    out = Sweep(cache_dir=tmp_path).map(lambda seed, f, x: f(seed, x), [{"f": local_variant, "x": 1}], [[2]])
    assert out == [[3]]
    assert not list(tmp_path.rglob("*.npz"))


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
    versioning._library_digest.cache_clear()
    try:
        assert code_version(noisy_task) != before
    finally:
        monkeypatch.setattr(metadata, "version", real)
        versioning._library_digest.cache_clear()
    assert code_version(noisy_task) == before
    # every verify source but the report writers and the command line is hashed
    pkg = tmp_path / "pkg"
    (pkg / "claims").mkdir(parents=True)
    (pkg / "report").mkdir()
    for rel in ("claim.py", "claims/_helpers.py", "report/html.py", "cli.py", "__main__.py"):
        (pkg / rel).write_text("x = 1\n")
    base = versioning._tree_digest(pkg, versioning._VERIFY_EXCLUDED)
    for rel, changes in (("report/html.py", False), ("cli.py", False), ("__main__.py", False),
                         ("claims/_helpers.py", True), ("claim.py", True)):
        (pkg / rel).write_text("x = 2\n")
        assert (versioning._tree_digest(pkg, versioning._VERIFY_EXCLUDED) != base) == changes, rel
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


# ----------------------------------------------------------------------------- cache format
def _entry(tmp_path):
    (entry,) = list(tmp_path.rglob("*.npz"))
    return entry


def test_cache_round_trips_every_supported_value_bitwise(tmp_path):
    first = Sweep(cache_dir=tmp_path).map(mixed_task, [{}], [[3]], label="fedrep.m")
    sweep = Sweep(cache_dir=tmp_path)
    again = sweep.map(mixed_task, [{}], [[3]], label="fedrep.m")
    assert sweep.reused == 1 and sweep.executed == 0
    a, b = first[0][0], again[0][0]
    assert _same(a, b) and list(a) == list(b)
    assert np.isnan(b["nan"]) and np.signbit(b["neg_zero"]) and b[1] == ("tuple", None, True, 3)
    assert type(b["scalar"]) is np.float64 and type(b["int64"]) is np.int64 and type(b["bool"]) is np.bool_
    assert b[(2, "k")].dtype == np.float64 and b["ints"].dtype == np.int32 and b["empty"].shape == (0, 2)
    assert b["text"].tolist() == ["a", "bc"] and b["big"] == 2 ** 70
    # the entry is an npz read without pickle: JSON plus one array per numpy value
    with np.load(_entry(tmp_path), allow_pickle=False) as data:
        assert "__json__" in data.files and len(data.files) == 1 + 9


def test_uncacheable_result_is_returned_and_not_stored(tmp_path, caplog):
    out = Sweep(cache_dir=tmp_path).map(uncacheable_task, [{}], [[1]], label="fedrep.u")
    assert out == [[{"set": {1}}]]
    assert not list(tmp_path.rglob("*.npz"))
    assert "not cached: cannot cache a value of type builtins.set" in caplog.text


class _Planted:
    def __reduce__(self):
        return (Path.touch, (Path(self.target),))


def _tamper(kind, entry: Path, tmp_path: Path):
    """Damage a valid entry in one of the ways the audit found (or worse)."""
    import json
    import zipfile

    with np.load(entry, allow_pickle=False) as data:
        doc = json.loads(str(data["__json__"][()]))
        arrays = {k: data[k] for k in data.files if k != "__json__"}
    if kind == "garbage":
        entry.write_bytes(b"not an npz")
    elif kind == "empty":
        entry.write_bytes(b"")
    elif kind == "truncated":
        entry.write_bytes(entry.read_bytes()[:200])
    elif kind == "pickle":  # an object array: loading it would unpickle (and run) _Planted
        planted = _Planted()
        planted.target = str(tmp_path / "pwned")
        np.savez(entry, __json__=np.array(json.dumps(doc)), a0=np.array([planted], dtype=object))
    elif kind == "wrong_type":  # the draw became a string
        doc["result"]["dict"][1][1] = "oops"
        np.savez(entry, __json__=np.array(json.dumps(doc)), **arrays)
    elif kind == "wrong_shape":
        arrays["a0"] = arrays["a0"][:2]
        np.savez(entry, __json__=np.array(json.dumps(doc)), **arrays)
    elif kind == "wrong_dtype":
        arrays["a0"] = arrays["a0"].astype(np.float32)
        np.savez(entry, __json__=np.array(json.dumps(doc)), **arrays)
    elif kind == "extra_array":
        np.savez(entry, __json__=np.array(json.dumps(doc)), extra=np.ones(2), **arrays)
    elif kind == "other_seed":
        doc["header"]["seed"] += 1
        np.savez(entry, __json__=np.array(json.dumps(doc)), **arrays)
    elif kind == "old_format":
        doc["header"]["format"] = "lowrank_fl.verify.cache/1"
        np.savez(entry, __json__=np.array(json.dumps(doc)), **arrays)
    elif kind == "no_json":
        np.savez(entry, **arrays)
    elif kind == "bad_json":
        np.savez(entry, __json__=np.array("{"), **arrays)
    elif kind == "zip_of_junk":
        with zipfile.ZipFile(entry, "w") as z:
            z.writestr("__json__.npy", b"junk")


@pytest.mark.parametrize("kind", ["garbage", "empty", "truncated", "pickle", "wrong_type",
                                  "wrong_shape", "wrong_dtype", "extra_array", "other_seed",
                                  "old_format", "no_json", "bad_json", "zip_of_junk"])
def test_a_bad_cache_entry_is_never_trusted_and_is_recomputed(tmp_path, kind):
    cache = tmp_path / "cache"
    ref = Sweep(cache_dir=cache).map(noisy_task, GRID[:1], [[5]], label="fedrep.x")
    entry = _entry(cache)
    _tamper(kind, entry, tmp_path)
    again = Sweep(cache_dir=cache)
    assert _same(again.map(noisy_task, GRID[:1], [[5]], label="fedrep.x"), ref)
    assert (again.executed, again.reused, again.invalid) == (1, 0, 1)
    assert not (tmp_path / "pwned").exists()  # nothing was unpickled
    third = Sweep(cache_dir=cache)  # the rewritten entry is valid again
    assert _same(third.map(noisy_task, GRID[:1], [[5]], label="fedrep.x"), ref) and third.reused == 1


def test_refresh_recomputes_and_rewrites(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    grid = [{"x": 0, "log_dir": str(log)}]
    Sweep(cache_dir=tmp_path / "c").map(noisy_task, grid, [[1, 2]], label="fedrep.r")
    sweep = Sweep(cache_dir=tmp_path / "c", refresh=True)
    sweep.map(noisy_task, grid, [[1, 2]], label="fedrep.r")
    assert (sweep.executed, sweep.reused) == (2, 0) and len(executions(log)) == 4
    after = Sweep(cache_dir=tmp_path / "c")
    after.map(noisy_task, grid, [[1, 2]], label="fedrep.r")
    assert after.reused == 2


# ----------------------------------------------------------------------------- two runs, one cache
_CONCURRENT = """
import json, sys
sys.path[:0] = {paths!r}
from _dummy_tasks import noisy_task
from verify.sweep import Sweep
grid = [{{"x": x, "log_dir": {log!r}, "sleep": 0.3}} for x in range(3)]
with Sweep(cache_dir={cache!r}) as sweep:
    out = sweep.map(noisy_task, grid, [[1, 2]] * 3, label="fedrep.lock")
print(json.dumps({{"executed": sweep.executed, "reused": sweep.reused,
                   "sums": [[r["sum"] for r in row] for row in out]}}))
"""


def test_two_runs_on_one_cache_compute_each_task_once(tmp_path):
    import json
    import os
    import subprocess
    import sys

    log = tmp_path / "log"
    log.mkdir()
    here = os.path.dirname(__file__)
    script = _CONCURRENT.format(paths=[here, os.path.dirname(here)], log=str(log),
                                cache=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        docs.append(json.loads(out))
    assert len(executions(log)) == 6  # 3 points x 2 seeds, each computed by one run only
    assert sorted(d["executed"] for d in docs) == sorted(6 - d["reused"] for d in docs)
    assert sum(d["executed"] for d in docs) == 6
    assert docs[0]["sums"] == docs[1]["sums"]


def test_a_lock_held_by_a_dead_run_does_not_block(tmp_path):
    """Record locks die with their process: a run killed mid-task leaves nothing stale."""
    import subprocess
    import sys

    from verify import cache as cache_mod

    sweep = Sweep(cache_dir=tmp_path)
    path = sweep._path(noisy_task, "fedrep.dead", {"x": 0}, 1)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from verify.cache import TaskLocks\n"
        f"locks = TaskLocks(); assert locks.try_acquire(Path({str(path)!r})); print('held', flush=True)\n"
        "time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    locks = cache_mod.TaskLocks()
    assert not locks.try_acquire(path)  # held by the other process
    holder.kill()
    holder.wait()
    assert locks.try_acquire(path)
    locks.close()
    out = sweep.map(noisy_task, [{"x": 0}], [[1]], label="fedrep.dead")
    assert _same(out, [[noisy_task(seed=1, x=0)]])


# ----------------------------------------------------------------------------- setup, workers, threads
def test_prepare_rejects_an_unwritable_cache(tmp_path):
    from verify.sweep import SetupError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SetupError, match=r"cache directory .*file/cache is not usable"):
        Sweep(cache_dir=blocker / "cache").prepare()
    Sweep(cache_dir=tmp_path / "ok").prepare()
    assert (tmp_path / "ok" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")


def test_prepare_without_distributed_is_a_setup_error(monkeypatch):
    import builtins

    from verify.sweep import SetupError

    real = builtins.__import__

    def no_distributed(name, *args, **kwargs):
        if name == "distributed" or name.startswith("distributed."):
            raise ImportError("No module named 'distributed'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    with pytest.raises(SetupError, match=r"backend 'dask' needs dask\[distributed\], which is not installed"):
        Sweep("dask").prepare()


def test_unreachable_scheduler_is_a_setup_error():
    from verify.sweep import SetupError

    with pytest.raises(SetupError, match=r"cannot connect to the dask scheduler at tcp://127.0.0.1:9"):
        Sweep("dask", scheduler="tcp://127.0.0.1:9", connect_timeout=1).prepare()


def test_a_stale_dask_worker_is_refused(tmp_path, monkeypatch):
    """A persistent cluster whose workers imported the code before an edit: nothing is stored."""
    distributed = pytest.importorskip("distributed")
    from verify import sweep as sweep_mod

    # two threads: with one, joblib runs the calls in this process (effective n_jobs 1)
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    try:
        with Sweep("dask", client=client, cache_dir=tmp_path) as sweep:
            ok = sweep.map(noisy_task, GRID[:2], SEEDS[:2], label="fedrep.dask")
        assert _same(ok, _reference()[:2]) and sweep.executed == 6
        # the library changes on disk after the workers imported it (here: this process's view)
        monkeypatch.setattr(versioning, "_library_digest", lambda: "edited-library")
        with Sweep("dask", client=client, cache_dir=tmp_path / "new") as sweep:
            with pytest.raises(sweep_mod.StaleWorkerError, match=r"a dask worker runs code version "
                                                                 r"\S+, this process \S+: its workers imported"):
                sweep.map(noisy_task, GRID[:2], SEEDS[:2], label="fedrep.dask")
        assert not list((tmp_path / "new").rglob("*.npz"))  # old code's numbers are not stored
    finally:
        client.close()
        cluster.close()


@pytest.mark.parametrize("backend", ["sequential", "loky"])
def test_tasks_run_with_one_blas_thread(backend):
    out = Sweep(backend, n_jobs=2).map(blas_threads_task, [{}], [[1, 2]])
    assert all(r["threads"] == [1] for r in out[0])
