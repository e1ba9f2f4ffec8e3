"""A user's files are never lost: ``--out``/``--overwrite`` of every command (lowrank_fl.outdir).

Each data-loss case runs the real command line (``lowrank_fl.cli.main`` in this process, or
``python -m lowrank_fl.cli`` in a child process where a second process, a kill or a signal is
the point) on real directories, and compares every pre-existing file byte for byte.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from lowrank_fl.adapters.run import available_cores, worker_count
from lowrank_fl.adapters.synthetic import write_synthetic_adapters
from lowrank_fl.cli import main
from lowrank_fl.clair.simulate import generate
from lowrank_fl.filelock import FileLock, LockHeld
from lowrank_fl.outdir import MARKER, OutputDir, check_output_dir, is_output_dir

ROOT = Path(__file__).resolve().parent.parent
N_MODULES = 4


# ----------------------------------------------------------------------------- helpers
def snapshot(root: Path) -> dict:
    """Every file under ``root`` (hidden ones included): relative path -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _adapters(root: Path, n_clients: int = 4, **kw) -> list[Path]:
    opts = dict(n_layers=2, modules=("q_proj", "v_proj"), shape=(24, 20), rank=3,
                contaminated=1, dtype="float32", seed=0)
    opts.update(kw)
    return write_synthetic_adapters(root, n_clients=n_clients, **opts)


@pytest.fixture
def tree(tmp_path):
    """``D/client_00..03`` (inputs) and ``D/notes.txt``; returns D."""
    d = tmp_path / "D"
    _adapters(d)
    (d / "notes.txt").write_text("my notes\n")
    return d


def _agg(dirs, *args, jobs: str | None = "1") -> int:
    """``adapters aggregate`` (fedavg, in this process unless ``jobs``) through the CLI main."""
    return main(["adapters", "aggregate", *map(str, dirs), "--quiet", "--method", "fedavg",
                 *(["--jobs", jobs] if jobs else []), *map(str, args)])


def _env():
    # plain fork: the scripts below patch the solve process's function before forking it
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "LOWRANK_FL_START_METHOD": "fork"}


def _cli(args, cwd=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lowrank_fl.cli", *map(str, args)], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=300, **kw)


def _one_error_line(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lowrank-fl: error:"), err
    for w in words:
        assert w in err[0], (w, err[0])


def _clients(d: Path) -> list[Path]:
    return sorted(d.glob("client_*"))


# ----------------------------------------------------------------------------- the cases
def test_out_dot_in_the_folder_of_the_inputs_deletes_nothing(tree, capsys, monkeypatch):
    """``cd D && lowrank-fl adapters aggregate client_0{0..3} --out . --overwrite``."""
    (tree / MARKER).write_text(json.dumps({"tool": "lowrank-fl"}))  # even with a marker planted
    before = snapshot(tree)
    names = [c.name for c in _clients(tree)]
    r = _cli(["adapters", "aggregate", *names, "--out", ".", "--overwrite", "--quiet"], cwd=tree)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "lowrank-fl: error: --out . is the current directory or one of its parents; name a "
        "directory of its own"]
    assert snapshot(tree) == before
    monkeypatch.chdir(tree)
    for out in ("./", "client_00/..", str(tree), "../D"):
        assert _agg(names, "--out", out, "--overwrite") == 2
        _one_error_line(capsys, f"--out {out} ")
        assert snapshot(tree) == before
    monkeypatch.chdir(tree.parent)                   # not the current directory: still refused
    assert _agg([f"D/{n}" for n in names], "--out", "D", "--overwrite") == 2
    _one_error_line(capsys, "--out D contains the input D/client_00")
    assert snapshot(tree) == before
    assert sorted(p.name for p in tree.parent.iterdir()) == ["D"]     # no staging left either


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_out_overlapping_an_input_is_refused(tree, tmp_path, capsys, overwrite):
    clients = _clients(tree)
    (tree / MARKER).write_text(json.dumps({"tool": "lowrank-fl"}))
    (clients[1] / MARKER).write_text(json.dumps({"tool": "lowrank-fl"}))
    link = tmp_path / "link"
    link.symlink_to(clients[1], target_is_directory=True)
    before = snapshot(tmp_path)
    cases = [(clients[1], "is the input"),                      # an input directory
             (tree, "contains the input"),                      # the folder holding the inputs
             (clients[0] / "sub", "is inside the input"),       # inside an input
             (link, "is the input"),                            # a symlink to an input
             (clients[2] / ".." / clients[1].name, "is the input")]   # a path with ..
    for out, words in cases:
        assert _agg(clients, "--out", out, *overwrite) == 2
        _one_error_line(capsys, "--out", words)
        assert snapshot(tmp_path) == before
    assert not (clients[0] / "sub").exists()


def test_overwrite_refuses_a_directory_without_the_marker(tree, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("\\documentclass{article}\n")
    (other / "summary.json").write_text("{}")      # an output's file name is no proof
    before = snapshot(tmp_path)
    assert _agg(_clients(tree), "--out", other, "--overwrite") == 2
    _one_error_line(capsys, "--out", "does not hold a previous lowrank-fl output", MARKER)
    assert snapshot(tmp_path) == before
    (other / MARKER).write_text("not json")        # a marker this tool did not write
    assert _agg(_clients(tree), "--out", other, "--overwrite") == 2
    _one_error_line(capsys, "does not hold a previous lowrank-fl output")
    assert (other / "thesis.tex").is_file()


def test_empty_out_is_refused(tree, capsys):
    assert _agg(_clients(tree), "--out", "") == 2
    _one_error_line(capsys, "--out must name a directory, got ''")
    assert main(["compare", "clair", "x.npz", "--lam-L", "1", "--lam-S", "1", "--out", ""]) == 2
    _one_error_line(capsys, "--out must name a directory, got ''")


def test_marker_is_written_and_only_marked_outputs_are_replaced(tree, tmp_path, capsys):
    import lowrank_fl

    out = tmp_path / "out"
    assert _agg(_clients(tree), "--out", out) == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["tool"] == "lowrank-fl" and marker["command"] == "adapters aggregate"
    assert marker["version"] == lowrank_fl.__version__ and marker["pid"] == os.getpid()
    assert is_output_dir(out)
    first = snapshot(out)
    assert _agg(_clients(tree), "--out", out) == 2            # not empty, no --overwrite
    _one_error_line(capsys, "not empty", "--overwrite")
    assert snapshot(out) == first
    (out / "stale.txt").write_text("x")                      # a file the run did not write
    assert _agg(_clients(tree), "--out", out, "--overwrite") == 2
    _one_error_line(capsys, "holds files the lowrank-fl run that wrote it did not write (stale.txt)")
    assert (out / "stale.txt").read_text() == "x"
    (out / "stale.txt").unlink()
    assert _agg(_clients(tree), "--out", out, "--overwrite") == 0
    assert (out / "summary.json").is_file()
    # nothing beside OUT: no staging, no old copy, no lock file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["D", "out"]


# ----------------------------------------------------------------------------- leftovers of dead runs
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_of_dead_processes_is_removed_and_others_named(tree, tmp_path, capsys):
    import socket

    host = socket.gethostname()
    out = tmp_path / "out"
    dead = _dead_pid()
    stale = tmp_path / f".out.lowrank-fl-staging.{host}.{dead}"
    stale.mkdir()
    (stale / MARKER).write_text(json.dumps({"tool": "lowrank-fl"}))
    (stale / "big.bin").write_bytes(b"\0" * 1000)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    alive = tmp_path / f".out.lowrank-fl-staging.{host}.{sleeper.pid}"
    alive.mkdir()
    (alive / MARKER).write_text(json.dumps({"tool": "lowrank-fl"}))
    foreign = tmp_path / f".out.lowrank-fl-staging.{host}.{_dead_pid()}"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("no marker: not ours to delete")
    other_host = tmp_path / f".out.lowrank-fl-staging.elsewhere.{dead}"
    other_host.mkdir()
    legacy = tmp_path / f".out.incomplete-{dead}"
    legacy.mkdir()
    keep = {p: snapshot(p) for p in (foreign, other_host, legacy, alive)}
    try:
        assert _agg(_clients(tree), "--out", out) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    err = capsys.readouterr().err
    assert not stale.exists()
    assert f"removed {stale.name}, left by killed process {dead}" in err
    assert str(foreign) in err and "holds no .lowrank-fl-output; not removing it" in err
    assert str(other_host) in err and f"{alive} was left by process {sleeper.pid}" in err
    assert "still running?" in err
    assert str(legacy) in err and "earlier lowrank-fl" in err
    assert {p: snapshot(p) for p in keep} == keep


def test_an_output_caught_between_the_two_renames_is_restored(tree, tmp_path, capsys):
    import socket

    out = tmp_path / "out"
    assert _agg(_clients(tree), "--out", out) == 0
    before = snapshot(out)
    dead = _dead_pid()
    old = tmp_path / f".out.lowrank-fl-old.{socket.gethostname()}.{dead}"
    out.rename(old)                                # as a kill -9 between the renames leaves it
    assert _agg(_clients(tree), "--out", out) == 2           # restored, so not empty
    err = capsys.readouterr().err
    assert f"restored {out} from {old.name}" in err
    assert snapshot(out) == before and not old.exists()


# ----------------------------------------------------------------------------- concurrency
_SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import lowrank_fl.adapters.run as run
    from lowrank_fl.cli import main

    go = Path(sys.argv[1])
    real = run._OutputWriters.write

    def write(self, *args, **kwargs):          # holds the lock until the test says go
        while not go.exists():
            time.sleep(0.05)
        return real(self, *args, **kwargs)

    run._OutputWriters.write = write
    sys.exit(main(sys.argv[2:]))
""")


def test_two_writers_of_one_out_the_second_fails_with_one_line(tree, tmp_path):
    out, go = tmp_path / "out", tmp_path / "go"
    args = ["adapters", "aggregate", *map(str, _clients(tree)), "--out", str(out), "--quiet",
            "--method", "fedavg", "--jobs", "1"]
    first = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(go), *args], env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / ".out.lowrank-fl-lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        second = _cli(args + ["--overwrite"])
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert lines == [f"lowrank-fl: error: --out {out} is being written by another lowrank-fl "
                         f"process (pid {first.pid}); wait for it or choose another directory"]
        assert not out.exists()
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert json.loads((out / "summary.json").read_text())["method"] == "fedavg"
    assert is_output_dir(out) and not lock.exists()
    # the lock is free again: the next run with --overwrite succeeds
    assert _cli(args + ["--overwrite"]).returncode == 0


def test_file_lock_is_exclusive_and_released(tmp_path):
    path = tmp_path / "x.lock"
    with FileLock(path):
        assert path.read_text().strip() == str(os.getpid())
        with pytest.raises(LockHeld) as exc:
            FileLock(path).try_acquire()                    # a second holder, even in-process
        assert exc.value.holder == str(os.getpid())
    assert not path.exists()
    with FileLock(path):
        pass


# ----------------------------------------------------------------------------- compare
@pytest.fixture
def w_hat(tmp_path):
    inst = generate(n_clients=4, p=4, q=4, rank=2, contaminated=1, noise=1e-3, seed=3)
    path = tmp_path / "in" / "W.npz"
    path.parent.mkdir()
    np.savez(path, W_hat=inst.W_hat)
    return path


def _cmp(w, out, *extra) -> int:
    return main(["compare", "clair", str(w), "--lam-L", "0.01", "--lam-S", "0.005",
                 "--methods", "fista", "--out", str(out), *extra])


def test_compare_failure_while_writing_keeps_the_old_output_whole(w_hat, tmp_path, capsys,
                                                                  monkeypatch):
    import errno

    from lowrank_fl.compare import output

    out = tmp_path / "cmp"
    assert _cmp(w_hat, out) == 0
    before = snapshot(out)
    assert {"compare.json", "compare.md", "compare.png", MARKER} <= set(before)

    def full_disk(comparison, path):                # after compare.json and .md were written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output, "plot_comparison", full_disk)
    capsys.readouterr()
    assert _cmp(w_hat, out, "--overwrite") == 2
    _one_error_line(capsys, "No space left on device")
    assert snapshot(out) == before
    new = tmp_path / "new"
    assert _cmp(w_hat, new) == 2
    assert not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "in"]


def test_compare_refuses_outputs_holding_its_input_and_unmarked_dirs(w_hat, tmp_path, capsys):
    before = snapshot(tmp_path)
    assert _cmp(w_hat, w_hat.parent, "--overwrite") == 2
    _one_error_line(capsys, "contains the input")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "compare.json").write_text("{}")
    before = snapshot(tmp_path)
    assert _cmp(w_hat, mine, "--overwrite") == 2
    _one_error_line(capsys, "does not hold a previous lowrank-fl output")
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------- kill -9 and SIGTERM
_BLOCKED_AFTER_FIRST_MODULE = textwrap.dedent("""
    import sys, time
    import lowrank_fl.adapters.run as run
    from lowrank_fl.cli import main

    real = run._OutputWriters.write
    count = [0]

    def write(self, *args, **kwargs):    # one module written, then wait to be killed
        real(self, *args, **kwargs)
        count[0] += 1
        if count[0] == 1:
            print("BLOCKED", flush=True)
            while True:
                time.sleep(0.1)

    run._OutputWriters.write = write
    sys.exit(main(sys.argv[1:]))
""")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _gone(pids, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(not Path(f"/proc/{p}").exists()
               or Path(f"/proc/{p}/status").read_text().find("State:\tZ") >= 0 for p in pids):
            return True
        time.sleep(0.1)
    return False


def _shm(pid: int) -> list[str]:
    shm = Path("/dev/shm")
    return [p.name for p in shm.iterdir() if f"_{pid}_" in p.name or f"-{pid}-" in p.name] \
        if shm.is_dir() else []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_run_leaves_inputs_and_out_and_no_workers(tmp_path, capsys, sig):
    src = _adapters(tmp_path / "in", n_clients=4, n_layers=4, shape=(96, 80), rank=4)
    out = tmp_path / "out"
    args = ["adapters", "aggregate", *map(str, src), "--out", str(out), "--quiet"]
    assert main(args + ["--jobs", "1"]) == 0           # a previous output to keep
    before_in, before_out = snapshot(tmp_path / "in"), snapshot(out)
    # stderr to an unnamed file: orphaned workers would hold a pipe open
    with tempfile.TemporaryFile("w+") as errfile:
        proc = subprocess.Popen([sys.executable, "-c", _BLOCKED_AFTER_FIRST_MODULE, *args,
                                 "--overwrite", "--jobs", "2"], env=_env(),
                                stdout=subprocess.PIPE, stderr=errfile, text=True)
        try:
            assert proc.stdout.readline().strip() == "BLOCKED"
            staging = [p for p in tmp_path.iterdir() if ".lowrank-fl-staging." in p.name]
            assert len(staging) == 1 and any(staging[0].rglob("*.safetensors"))
            children = _children(proc.pid)
            assert len(children) >= 2                  # loky workers (and its trackers)
            proc.send_signal(sig)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
        errfile.seek(0)
        err = errfile.read()
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert err.strip().endswith("lowrank-fl: terminated (SIGTERM); the output directory was left as it was"), err
        assert not staging[0].exists()                 # cleaned by the handler
    else:
        assert proc.returncode == -signal.SIGKILL
        assert staging[0].exists()                     # only the next run can clean it
    assert _gone(children), "worker processes outlived their parent"
    assert _shm(proc.pid) == []
    assert snapshot(tmp_path / "in") == before_in
    assert snapshot(out) == before_out
    capsys.readouterr()
    assert main(args + ["--overwrite", "--jobs", "1"]) == 0
    if sig == signal.SIGKILL:
        assert f"removed {staging[0].name}, left by killed process {proc.pid}" in \
            capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


# ----------------------------------------------------------------------------- --jobs
@pytest.mark.parametrize("jobs, n, cores, expected", [
    (1000, 4, 16, 4), (1000, 100, 16, 16), (3, 100, 16, 3), (None, 4, 16, 4), (None, 100, 2, 2),
    (-1, 100, 8, 8), (-1, 3, 8, 3), (1, 10, 8, 1), (5, 0, 8, 1), (None, 1, 1, 1)])
def test_worker_count_caps_at_tasks_and_cores(jobs, n, cores, expected):
    assert worker_count(jobs, n, cores) == expected


@pytest.mark.parametrize("jobs", [0, -2, 1.5, True, "2"])
def test_worker_count_rejects_bad_jobs(jobs):
    with pytest.raises(ValueError, match="jobs must be"):
        worker_count(jobs, 4, 4)


def test_available_cores_follows_the_affinity_mask():
    if hasattr(os, "sched_getaffinity"):
        assert available_cores() == len(os.sched_getaffinity(0))
    assert available_cores() >= 1


def test_cli_caps_jobs_and_defaults_to_the_cores(tree, tmp_path, capsys, monkeypatch):
    import joblib

    started = []
    real = joblib.Parallel

    class Recording(real):
        def __init__(self, *a, n_jobs=None, **kw):
            started.append(n_jobs)
            super().__init__(*a, n_jobs=n_jobs, **kw)

    monkeypatch.setattr(joblib, "Parallel", Recording)
    expected = min(N_MODULES, available_cores())
    for jobs, name in (("1000", "a"), ("-1", "b")):
        assert _agg(_clients(tree), "--out", tmp_path / name, jobs=jobs) == 0
        assert json.loads((tmp_path / name / "summary.json").read_text())["workers"] == expected
    assert started == ([expected] * 2 if expected > 1 else [])
    # the default on inputs this small (under IN_PROCESS_BYTES): this process, no workers started
    assert _agg(_clients(tree), "--out", tmp_path / "d", jobs=None) == 0
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["workers"] == 1
    assert started == ([expected] * 2 if expected > 1 else [])
    assert _agg(_clients(tree), "--out", tmp_path / "c", jobs="0") == 2
    _one_error_line(capsys, "--jobs must be >= 1")
    with pytest.raises(SystemExit):
        main(["adapters", "aggregate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "at most the number of modules and of available cores (default, or -1: the available cores" \
        in text


# ----------------------------------------------------------------------------- the module itself
def test_check_output_dir_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="current directory"):
        check_output_dir(tmp_path)
    with pytest.raises(ValueError, match="current directory"):
        check_output_dir("..")
    assert check_output_dir("new", inputs=["a"]) == (tmp_path / "new").resolve()
    with pytest.raises(ValueError, match="--x a is the input a"):
        check_output_dir("a", inputs=["a"], option="--x")


def test_sigterm_handler_is_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with OutputDir(tmp_path / "o", command="test") as o:
        assert signal.getsignal(signal.SIGTERM) is not before
        o.commit()
    assert signal.getsignal(signal.SIGTERM) is before


_COMPARE_CHILD_HANGS = textwrap.dedent("""
    import sys, time
    import lowrank_fl.compare.child as child
    from lowrank_fl.cli import main

    def hang(fn, args, measure):          # runs in the forked solve process
        print("SOLVING", flush=True)
        while True:
            time.sleep(0.1)

    child._measure_and_run = hang
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_killed_compare_leaves_no_solve_running(w_hat, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "clair", str(w_hat), "--lam-L", "0.01", "--lam-S", "0.005", "--methods",
            "fista", "--out", str(out)]
    with tempfile.TemporaryFile("w+") as errfile:
        proc = subprocess.Popen([sys.executable, "-c", _COMPARE_CHILD_HANGS, *args], env=_env(),
                                stdout=subprocess.PIPE, stderr=errfile, text=True)
        try:
            assert proc.stdout.readline().strip() == "SOLVING"
            children = _children(proc.pid)
            assert children
            proc.kill()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
    assert _gone(children, timeout=10), "the solve outlived its parent"
    assert not out.exists()
    staging = [p.name for p in tmp_path.iterdir() if ".lowrank-fl-staging." in p.name]
    assert len(staging) == 1
    assert _cmp(w_hat, out) == 0                     # and the next run removes the staging
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "in"]


def test_sigterm_pending_during_the_swap_is_raised_as_after_the_commit(tmp_path):
    """A SIGTERM that arrives while commit() blocks it is delivered once the output is in place: it is
    TerminatedAfterCommit (the message then says the output is complete), and no old folder is left."""
    from lowrank_fl.outdir import OutputDir, TerminatedAfterCommit
    out = tmp_path / "out"
    with OutputDir(out, command="test") as first:
        (first.dir / "a.txt").write_text("1")
        first.commit()
    staged = OutputDir(out, command="test", overwrite=True).open()
    (staged.dir / "a.txt").write_text("2")
    real = os.replace
    def replace_then_signal(src, dst):                 # SIGTERM lands inside the blocked swap
        real(src, dst)
        if Path(dst) == out:
            os.kill(os.getpid(), signal.SIGTERM)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "replace", replace_then_signal)
            with pytest.raises(TerminatedAfterCommit) as exc:
                staged.commit()
    finally:
        staged.close()
    assert exc.value.code == 143 and staged.committed
    assert (out / "a.txt").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
