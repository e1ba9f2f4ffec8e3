"""examples/flower_clair/deploy.sh: the app on Flower's deployment engine (a SuperLink and
SuperNodes as processes on this machine), at a toy size: it completes, it fails with the run's
own error when the run fails, and no process it started is left either way."""
import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "examples" / "flower_clair" / "deploy.sh"
TOY = ["--nodes", "2", "--rounds", "1", "--set", "pretrain-steps=5", "--set", "n-train=50",
       "--set", "n-test=20", "--set", "contaminated=0"]


def _deploy(out, *args, timeout=600):
    return subprocess.run(["bash", str(DEPLOY), str(out), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _groups_left(out: Path) -> list:
    """The process groups deploy.py started (logs/process_groups.json) that still exist."""
    left = []
    for name, pgid in json.loads((out / "logs" / "process_groups.json").read_text()).items():
        try:
            os.killpg(pgid, 0)
            left.append(name)
        except ProcessLookupError:
            pass
    return left


def test_bad_arguments_are_named(tmp_path):
    for args, message in ((["--nodes", "1"], "--nodes must be >= 2"),
                          (["--kill-node", "1"], "give --kill-node and --kill-after together"),
                          (["--nodes", "2", "--kill-node", "2", "--kill-after", "5"], r"--kill-node must be a SuperNode index in 0..1")):
        proc = _deploy(tmp_path / "out", *args, timeout=120)
        assert proc.returncode == 2 and message.replace("\\", "") in proc.stderr, proc.stderr
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "summary.json").write_text("{}")
    proc = _deploy(tmp_path / "foreign", *TOY, timeout=120)
    assert proc.returncode == 2 and "was not written by flower_clair" in proc.stderr
    assert (tmp_path / "foreign" / "summary.json").read_text() == "{}"


@pytest.mark.slow
def test_a_toy_deployment_completes_and_leaves_no_process(tmp_path):
    out = tmp_path / "out"
    proc = _deploy(out, *TOY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    dep = summary["deployment"]
    assert dep["status"] == "finished:completed" and dep["nodes"] == 2 and dep["processes_left"] == []
    assert [r["round"] for r in summary["rounds"]] == [1]
    assert summary["rounds"][0]["participants"] == [0, 1] and summary["rounds"][0]["lost_nodes"] == []
    assert 0 <= summary["certificate"]["max_relative_gap"] <= 1e-6
    assert "Strategy execution finished" in (out / "logs" / "run.log").read_text()
    assert _groups_left(out) == []


@pytest.mark.slow
def test_a_failing_run_fails_the_deployment_with_its_error(tmp_path):
    """The ServerApp raises (an unknown client rule): the run ends finished:failed and deploy.sh
    exits 1 with the run's own error, whatever `flwr run` returned."""
    out = tmp_path / "out"
    proc = _deploy(out, *TOY, "--set", "client-rule=\"bogus\"")
    assert proc.returncode == 1
    assert "ended 'finished:failed'" in proc.stderr and "client_rule must be one of" in proc.stderr, proc.stderr[-3000:]
    assert not (out / "summary.json").exists()
    assert _groups_left(out) == []
