"""A user's files are never lost, second round: ``--cache`` on a user's folder and ``cache clear``,
files added to ``--out`` during a run, ``adapters inspect --figure``, and the compare solve of a
killed ``lowrank-fl``. Real directories, every pre-existing file compared byte for byte."""
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

import pytest

from verify import cli as vcli
from verify.cache import MARKER as CACHE_MARKER
from verify.cache import clear_cache, is_cache_dir, store_entry


def snapshot(root: Path) -> dict:
    """Every file under ``root`` (hidden ones included): relative path -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _user_folder(root: Path) -> Path:
    """A report folder: adapters ``adcopy/client_*/`` and ``figures/``, files at the top."""
    for i in range(3):
        d = root / "adcopy" / f"client_{i:02d}"
        d.mkdir(parents=True)
        (d / "adapter_model.safetensors").write_bytes(bytes(range(i, i + 50)))
        (d / "adapter_config.json").write_text('{"r": 4}')
    (root / "figures").mkdir()
    (root / "figures" / "fig1.png").write_bytes(b"\x89PNG fake")
    (root / "figures" / "tmpx.tmp").write_bytes(b"a user's file named like a temp")
    (root / "report.md").write_text("# report\n")
    return root


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lowrank-fl: error:"), err
    return err[0]


# ----------------------------------------------------------------------------- 1. the cache
def test_verify_refuses_a_user_folder_as_cache_and_marks_nothing(dummy_registry, tmp_path, capsys):
    user = _user_folder(tmp_path / "work")
    before = snapshot(user)
    argv = ["verify", "--scale", "smoke", "--backend", "sequential", "--no-progress", "--claim",
            "fedrep.dummy.mean", "--cache", str(user), "--out", str(tmp_path / "o")]
    assert vcli.lowrank_fl_main(argv) == 2
    line = _err_line(capsys)
    assert f"--cache {user} is not empty and is not a lowrank_fl task cache" in line
    assert snapshot(user) == before and not (user / CACHE_MARKER).exists()
    assert not (tmp_path / "o").exists()
    # the library path (Sweep.prepare) refuses it too
    from verify.sweep import SetupError, Sweep
    with pytest.raises(SetupError, match="is not a lowrank_fl task cache"):
        Sweep(backend="sequential", cache_dir=user).prepare()
    assert snapshot(user) == before
    # `cache clear` on it deletes nothing
    assert vcli.lowrank_fl_main(["cache", "clear", "--cache", str(user)]) == 2
    assert "does not look like a lowrank_fl task cache" in _err_line(capsys)
    assert snapshot(user) == before


def test_cache_clear_removes_only_entries_even_where_a_marker_was_written(dummy_registry, tmp_path,
                                                                         capsys):
    # an earlier version wrote CACHEDIR.TAG into the user's folder and cached entries there
    user = _user_folder(tmp_path / "work")
    cache = tmp_path / "cache"
    argv = ["verify", "--scale", "smoke", "--backend", "sequential", "--no-progress", "--claim",
            "fedrep.dummy.mean", "--cache", str(cache), "--out", str(tmp_path / "o")]
    assert vcli.lowrank_fl_main(argv) == 0
    before = snapshot(user)
    for p in cache.rglob("*"):                       # the entries, lock files and the marker
        if p.is_file():
            (user / p.relative_to(cache)).parent.mkdir(parents=True, exist_ok=True)
            (user / p.relative_to(cache)).write_bytes(p.read_bytes())
    n_entries = len(list(cache.rglob("*.npz")))
    assert n_entries == 6 and (user / CACHE_MARKER).is_file()
    # a user's file with an entry's name but not an entry, inside a task directory: kept
    task_dir = next(user.rglob("*.npz")).parent
    (task_dir / ("ab" * 16 + ".npz")).write_bytes(b"my own archive")
    before = {**before, **{k: v for k, v in snapshot(user).items() if k.endswith("ab" * 16 + ".npz")}}
    capsys.readouterr()
    assert vcli.lowrank_fl_main(["cache", "clear", "--cache", str(user)]) == 0
    assert capsys.readouterr().out == f"cache clear: removed {n_entries} entries from {user}\n"
    after = snapshot(user)
    assert {k: v for k, v in after.items() if k != CACHE_MARKER} == before
    # the real cache: everything goes but the marker, and it is still a cache
    assert vcli.lowrank_fl_main(["cache", "clear", "--cache", str(cache)]) == 0
    assert sorted(p.name for p in cache.iterdir()) == [CACHE_MARKER] and is_cache_dir(cache)


def test_cache_dir_rules(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert is_cache_dir(empty)
    legacy = tmp_path / "legacy"                      # entries but no marker (written before it)
    store_entry(legacy / "claim" / "task" / ("0" * 32 + ".npz"), [1.0], {"label": "claim"})
    (legacy / "claim" / "task" / ".lock").write_bytes(b"")
    assert is_cache_dir(legacy)
    assert clear_cache(legacy) == 1 and list(legacy.iterdir()) == []
    foreign = tmp_path / "foreign"
    (foreign / "a" / "b").mkdir(parents=True)
    (foreign / "a" / "b" / ".lock").write_bytes(b"")   # name alone does not make it a cache...
    (foreign / "a" / "b" / ("1" * 32 + ".npz")).write_bytes(b"not an entry")
    assert not is_cache_dir(foreign)                   # ...its content is checked
    older = tmp_path / "older"                         # marked by an earlier version
    (older / "notes").mkdir(parents=True)
    (older / CACHE_MARKER).write_text("Signature: 8a477f597d28d172789f06886806bc55\n# lowrank_fl "
                                      "verifier task cache (lowrank-fl cache clear removes it).\n")
    assert is_cache_dir(older) and clear_cache(older) == 0 and (older / "notes").is_dir()
    other_tag = tmp_path / "other"                     # another tool's CACHEDIR.TAG
    other_tag.mkdir()
    (other_tag / CACHE_MARKER).write_text("Signature: 8a477f597d28d172789f06886806bc55\n# pip\n")
    (other_tag / "wheels").mkdir()
    (other_tag / "wheels" / "x.whl").write_bytes(b"w")
    assert not is_cache_dir(other_tag)
    with pytest.raises(ValueError, match="does not look like"):
        clear_cache(other_tag)
    assert (other_tag / "wheels" / "x.whl").read_bytes() == b"w"


# ----------------------------------------------------------------------------- 2. files added to OUT
@pytest.mark.parametrize("previous", [False, True])
def test_files_added_to_out_during_a_run_are_never_deleted(tmp_path, capsys, monkeypatch, previous):
    import lowrank_fl.adapters.run as run
    from lowrank_fl.cli import main
    from lowrank_fl.outdir import MARKER
    from test_output_safety import _adapters

    src = _adapters(tmp_path / "in")
    out = tmp_path / "out"
    args = ["adapters", "aggregate", *map(str, src), "--quiet", "--jobs", "1", "--out", str(out)]
    if previous:
        assert main(args) == 0
        args.append("--overwrite")
        (out / "summary.json").write_text("edited by hand")   # edits before the run are fine
    real, calls = run._OutputWriters.write, []

    def write(self, *a, **kw):             # the writer is paused: the user adds a file to OUT
        real(self, *a, **kw)
        calls.append(1)
        if len(calls) == 1:
            out.mkdir(exist_ok=True)
            (out / "notes.txt").write_text("my notes\n")

    monkeypatch.setattr(run._OutputWriters, "write", write)
    before_in = snapshot(tmp_path / "in")
    capsys.readouterr()
    assert main(args) == 2
    line = _err_line(capsys)
    kept = tmp_path / f"out.lowrank-fl-result.{os.getpid()}"
    assert line == (f"lowrank-fl: error: --out {out} changed while this run was writing (files "
                    f"added, removed or modified there); left it as it is; the result is in {kept}")
    after = snapshot(out)
    assert after["notes.txt"] == b"my notes\n"
    if previous:
        assert after["summary.json"] == b"edited by hand" and MARKER in after
    else:
        assert sorted(after) == ["notes.txt"]
    result = snapshot(kept)
    assert MARKER in result and "summary.json" in result and json.loads(result["summary.json"])
    assert snapshot(tmp_path / "in") == before_in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out", kept.name]
    # nothing changed meanwhile: the swap happens as before
    monkeypatch.setattr(run._OutputWriters, "write", real)
    (out / "notes.txt").unlink()
    if not previous:
        out.rmdir()
    assert main(args) == 0 and "summary.json" in snapshot(out)


def test_compare_result_is_kept_when_out_changes(tmp_path, capsys, monkeypatch):
    import numpy as np

    from lowrank_fl.clair.simulate import generate
    from lowrank_fl.compare import output
    from test_output_safety import _cmp

    inst = generate(n_clients=4, p=4, q=4, rank=2, contaminated=1, noise=1e-3, seed=3)
    w = tmp_path / "in" / "W.npz"
    w.parent.mkdir()
    np.savez(w, W_hat=inst.W_hat)
    out = tmp_path / "cmp"
    assert _cmp(w, out) == 0
    real = output.plot_comparison

    def plot(comparison, path):
        (out / "extra").mkdir()
        (out / "extra" / "keep.txt").write_text("mine")
        real(comparison, path)

    monkeypatch.setattr(output, "plot_comparison", plot)
    before = snapshot(out)
    capsys.readouterr()
    assert _cmp(w, out, "--overwrite") == 2
    assert "changed while this run was writing" in _err_line(capsys)
    assert snapshot(out) == {**before, "extra/keep.txt": b"mine"}
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("cmp.lowrank-fl-result.")]
    assert len(kept) == 1 and (kept[0] / "compare.json").is_file()


# ----------------------------------------------------------------------------- 3. inspect --figure
def test_inspect_figure_never_replaces_a_file_unless_overwrite_nor_an_input(tmp_path, capsys,
                                                                            monkeypatch):
    from lowrank_fl.adapters import cli as acli
    from lowrank_fl.cli import main
    from test_output_safety import _adapters

    src = _adapters(tmp_path / "in")
    (tmp_path / "in" / "notes.txt").write_text("my notes\n")
    agg = tmp_path / "agg"
    assert main(["adapters", "aggregate", *map(str, src), "--quiet", "--out", str(agg)]) == 0
    keep = tmp_path / "keep.png"
    keep.write_bytes(b"\x89PNG my figure")
    inspect = ["adapters", "inspect", *map(str, src), "--summary", str(agg / "summary.json")]
    before = snapshot(tmp_path)
    cases = [(keep, f"--figure {keep} exists; pass --overwrite to replace it"),
             (agg / "summary.json", f"--figure {agg / 'summary.json'} is the input "),
             (src[0] / "adapter_model.safetensors", "is inside the input"),
             (src[1] / "new.png", "is inside the input"),
             (tmp_path / "in", "is a directory"),
             (tmp_path / "nowhere" / "f.png", "does not exist")]
    for figure, words in cases:
        capsys.readouterr()
        for extra in ([], ["--overwrite"]):
            if figure == keep and extra:
                continue
            assert main(inspect + ["--figure", str(figure), *extra]) == 2, figure
            assert words in _err_line(capsys)
            assert snapshot(tmp_path) == before
    # a failed plot leaves the existing file whole and no temporary file behind
    real = acli._heatmap

    def broken(flags, clients, modules, path, title):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(acli, "_heatmap", broken)
    assert main(inspect + ["--figure", str(keep), "--overwrite"]) == 2
    assert "No space left on device" in _err_line(capsys)
    assert snapshot(tmp_path) == before
    monkeypatch.setattr(acli, "_heatmap", real)
    # --overwrite replaces it with a real PNG; a new name needs no flag
    assert main(inspect + ["--figure", str(keep), "--overwrite"]) == 0
    assert keep.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(inspect + ["--figure", str(tmp_path / "new.png")]) == 0
    assert (tmp_path / "new.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k not in ("keep.png", "new.png")} == \
        {k: v for k, v in before.items() if k != "keep.png"}


# ----------------------------------------------------------------------------- 4. killed compare
_COMPARE_CHILD_HOLDS_THE_GIL = textwrap.dedent("""
    import sys
    import lowrank_fl.compare.child as child
    from lowrank_fl.cli import main

    def solve(fn, args, measure):          # in the solve process: native code holding the GIL
        print("SOLVING", flush=True)
        return sum(range(1 << 62))         # one C call, years long; no Python thread runs

    child._measure_and_run = solve
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_killed_compare_stops_a_solve_that_holds_the_gil(tmp_path):
    import numpy as np

    from lowrank_fl.clair.simulate import generate
    from test_output_safety import _children, _env, _gone

    inst = generate(n_clients=4, p=4, q=4, rank=2, contaminated=1, noise=1e-3, seed=3)
    w = tmp_path / "W.npz"
    np.savez(w, W_hat=inst.W_hat)
    args = ["compare", "clair", str(w), "--lam-L", "0.01", "--lam-S", "0.005", "--methods",
            "fista", "--out", str(tmp_path / "cmp")]
    with tempfile.TemporaryFile("w+") as errfile:
        proc = subprocess.Popen([sys.executable, "-c", _COMPARE_CHILD_HOLDS_THE_GIL, *args],
                                env=_env(), stdout=subprocess.PIPE, stderr=errfile, text=True)
        try:
            assert proc.stdout.readline().strip() == "SOLVING"
            children = _children(proc.pid)
            assert len(children) == 1
            time.sleep(0.3)                      # the solve is under way
            proc.kill()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            # (a solve left running would never end: stop it so the test run does not leak it)
            ok = _gone(children, timeout=5)
            for pid in children:
                if not ok:
                    os.kill(pid, signal.SIGKILL)
    assert ok, "the solve outlived its parent"


_LOCK_THEN_FORK = textwrap.dedent("""
    import os, sys, time
    from lowrank_fl.filelock import FileLock

    lock = FileLock(sys.argv[1])
    lock.try_acquire()
    if os.fork() == 0:                     # a child that outlives its parent (a solve, a worker)
        print("CHILD", lock.held, flush=True)
        time.sleep(30)
        os._exit(0)
    time.sleep(30)
""")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_forked_child_does_not_keep_the_output_lock(tmp_path):
    from lowrank_fl.filelock import FileLock
    from test_output_safety import _children, _env

    path = tmp_path / ".out.lowrank-fl-lock"
    proc = subprocess.Popen([sys.executable, "-c", _LOCK_THEN_FORK, str(path)], env=_env(),
                            stdout=subprocess.PIPE, text=True)
    children = []
    try:
        assert proc.stdout.readline().split() == ["CHILD", "False"]
        children = _children(proc.pid)
        assert len(children) == 1
        proc.kill()
        proc.wait(timeout=30)
        assert Path(f"/proc/{children[0]}").exists()   # the child still runs...
        with FileLock(path):                           # ...and the lock went with its owner
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_single_output_file_gets_the_mode_open_would_give(tmp_path, umask):
    """write_file stages through mkstemp (0600): the file it leaves has 0666 less the umask."""
    from lowrank_fl.outdir import write_file

    old = os.umask(umask)
    try:
        path = write_file(tmp_path / "fig.png", lambda p: p.write_bytes(b"x"))
        with open(tmp_path / "plain.png", "wb") as fh:                  # the reference: open()
            fh.write(b"x")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"x"
    assert (path.stat().st_mode & 0o777) == (tmp_path / "plain.png").stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "plain.png"]       # no staging left
    # replacing a file keeps its mode, as open("wb") on it would
    os.chmod(path, 0o640)
    write_file(path, lambda p: p.write_bytes(b"y"), overwrite=True)
    assert path.read_bytes() == b"y" and (path.stat().st_mode & 0o777) == 0o640


def test_the_python_calls_name_their_own_arguments_not_the_flags(tmp_path):
    # a user of the library passes overwrite=True; "--overwrite" is the command's word
    from lowrank_fl.adapters import (ModuleOptions, aggregate_adapters, aggregate_to_dir, load_adapters,
                                     write_outputs)
    from lowrank_fl.adapters.synthetic import write_synthetic_adapters
    from lowrank_fl.outdir import check_output_dir

    dirs = write_synthetic_adapters(tmp_path / "in", n_clients=4, n_layers=1, modules=("q_proj",),
                                    shape=(12, 10), rank=2, contaminated=0, dtype="float32")
    full = tmp_path / "full"
    (full / "mine.txt").parent.mkdir()
    (full / "mine.txt").write_text("keep")
    adapters, opts = load_adapters(dirs), ModuleOptions(method="fedavg")
    with pytest.raises(ValueError, match=r"^out .*full is not empty and does not hold a previous lowrank-fl output"):
        aggregate_to_dir(adapters, opts, full, progress=False)
    with pytest.raises(ValueError, match=r"^out .*full is not empty and does not hold a previous lowrank-fl output"):
        write_outputs(aggregate_adapters(adapters, opts, progress=False), full)
    with pytest.raises(ValueError, match=r"^--out .*full is not empty and does not hold a previous lowrank-fl output"):
        check_output_dir(full)
    assert (full / "mine.txt").read_text() == "keep"
    done = tmp_path / "done"                      # a previous output: the hint names the library's word
    aggregate_to_dir(adapters, opts, done, progress=False)
    with pytest.raises(ValueError, match=r"^out .*done is not empty; pass overwrite=True to replace"):
        aggregate_to_dir(adapters, opts, done, progress=False)
    with pytest.raises(ValueError, match=r"^--out .*done is not empty; pass --overwrite to replace"):
        check_output_dir(done)


def test_overwrite_never_deletes_a_file_the_user_added_to_a_previous_output(tmp_path):
    import json as _json

    from lowrank_fl.adapters.synthetic import write_synthetic_adapters
    from lowrank_fl.cli import main
    from lowrank_fl.outdir import MARKER, OutputDir, foreign_files

    out = tmp_path / "out"
    with OutputDir(out, command="test") as o:
        (o.dir / "a.txt").write_text("a")
        (o.dir / "sub").mkdir()
        (o.dir / "sub" / "b.txt").write_text("b")
        o.commit()
    assert _json.loads((out / MARKER).read_text())["files"] == ["a.txt", "sub/b.txt"]
    assert foreign_files(out) == []
    (out / ".DS_Store").write_bytes(b"\0")                 # a file browser's, not the user's work
    assert foreign_files(out) == []
    (out / ".DS_Store").unlink()
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "data.csv").write_text("mine too")
    with pytest.raises(ValueError, match=r"holds files the lowrank-fl run that wrote it did not write "
                                         r"\(notes.txt, sub/data.csv\); refusing to replace them"):
        OutputDir(out, command="test", overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "data.csv").read_text() == "mine too"
    # a command refuses it the same way, before any work
    dirs = write_synthetic_adapters(tmp_path / "in", n_clients=3, n_layers=1, modules=("q_proj",),
                                    shape=(8, 6), rank=2, contaminated=0, dtype="float32")
    args = ["adapters", "aggregate", *map(str, dirs), "--method", "fedavg", "--quiet", "--out", str(out)]
    assert main(args + ["--overwrite"]) == 2
    assert (out / "notes.txt").read_text() == "mine" and (out / "a.txt").read_text() == "a"
    # moved out, the previous output is replaced, and the new marker lists the new files
    (out / "notes.txt").unlink()
    (out / "sub" / "data.csv").unlink()
    assert main(args + ["--overwrite"]) == 0
    listed = _json.loads((out / MARKER).read_text())["files"]
    assert "summary.json" in listed and "aggregated/adapter_model.safetensors" in listed
    assert not (out / "a.txt").exists() and foreign_files(out) == []
    # a marker of a version before the list proves the directory only: replaced as before
    info = _json.loads((out / MARKER).read_text())
    del info["files"]
    (out / MARKER).write_text(_json.dumps(info))
    (out / "extra.txt").write_text("x")
    assert foreign_files(out) is None
    assert main(args + ["--overwrite"]) == 0 and not (out / "extra.txt").exists()
