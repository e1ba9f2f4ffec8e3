"""``lowrank-fl compare`` through ``lowrank_fl.cli.main``: outputs and bad input (exit 2)."""
import json

import jsonschema
import numpy as np
import pytest

from lowrank_fl.clair.simulate import generate
from lowrank_fl.cli import main
from lowrank_fl.compare import load_schema
from lowrank_fl.problems import multitask_linear

LAM = ["--lam-L", "0.01", "--lam-S", "0.005"]
FAST = ["--methods", "fista", "cvxpy:CLARABEL", "--tol", "1e-9"]


@pytest.fixture(scope="module")
def instance():
    return generate(n_clients=5, p=4, q=4, rank=2, contaminated=1, noise=1e-3, seed=3)


@pytest.fixture
def npz(tmp_path, instance):
    path = tmp_path / "local.npz"
    np.savez(path, W_hat=instance.W_hat)
    return path


def _one_error_line(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lowrank-fl: error:"), err
    for w in words:
        assert w in err[0], (w, err[0])


def test_clair_round_trip(tmp_path, npz, instance, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "clair", str(npz), *LAM, *FAST, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "| fista | ok |" in stdout and "| cvxpy:CLARABEL | ok |" in stdout
    d = json.loads((out / "compare.json").read_text())
    jsonschema.validate(d, load_schema())
    assert d["problem"] == "clair" and d["instance"]["K"] == 5
    assert [m["name"] for m in d["methods"]] == ["fista", "cvxpy:CLARABEL"]
    truth = [int(k) for k in np.flatnonzero(instance.benign)]
    assert all(m["collaborative_set"] == truth for m in d["methods"])
    assert d["pairs"][0]["collaborative_sets_agree"] is True
    assert (out / "compare.md").read_text().count("| fista |") == 2
    assert (out / "compare.png").stat().st_size > 1000
    # a second run needs --overwrite
    assert main(["compare", "clair", str(npz), *LAM, *FAST, "--out", str(out)]) == 2
    _one_error_line(capsys, "not empty", "--overwrite")
    assert main(["compare", "clair", str(npz), *LAM, "--methods", "fista", "--out", str(out),
                 "--overwrite"]) == 0


def test_weights_file(tmp_path, npz, instance):
    w = tmp_path / "w.npy"
    np.save(w, np.full(instance.K * (instance.K - 1) // 2, 0.3))
    out = tmp_path / "o"
    assert main(["compare", "clair", str(npz), *LAM, "--weights", str(w), "--methods", "fista",
                 "--out", str(out)]) == 0
    assert json.loads((out / "compare.json").read_text())["instance"]["weights"] == "given"


def test_missing_key(tmp_path, instance, capsys):
    path = tmp_path / "bad.npz"
    np.savez(path, W=instance.W_hat)
    assert main(["compare", "clair", str(path), *LAM, "--out", str(tmp_path / "o")]) == 2
    _one_error_line(capsys, "'W_hat'", "keys found: ['W']")


@pytest.mark.parametrize("flag, value, name", [("--lam-L", "0", "lam_L"),
                                               ("--lam-S", "-0.1", "lam_S")])
def test_nonpositive_lambda(tmp_path, npz, capsys, flag, value, name):
    args = dict(zip(LAM[::2], LAM[1::2]))
    args[flag] = value
    argv = ["compare", "clair", str(npz)] + [x for kv in args.items() for x in kv]
    assert main(argv + ["--methods", "fista", "--out", str(tmp_path / "o")]) == 2
    _one_error_line(capsys, name)
    assert not (tmp_path / "o").exists()


def test_unknown_method(tmp_path, npz, capsys):
    assert main(["compare", "clair", str(npz), *LAM, "--methods", "fista,newton",
                 "--out", str(tmp_path / "o")]) == 2
    _one_error_line(capsys, "unknown method 'newton'")


def test_time_limit_reported(tmp_path, npz, capsys):
    out = tmp_path / "o"
    assert main(["compare", "clair", str(npz), *LAM, "--methods", "fista", "proxgrad",
                 "--tol", "1e-14", "--max-iter", "100000000", "--time-limit", "1",
                 "--out", str(out)]) == 0
    d = json.loads((out / "compare.json").read_text())
    rows = {m["name"]: m for m in d["methods"]}
    assert rows["proxgrad"]["outcome"] == "time_limit"
    assert "time limit of 1 s" in rows["proxgrad"]["reason"]


def test_nuclear(tmp_path, capsys):
    prob = multitask_linear(d=6, k=2, n_clients=8, samples_per_client=10, seed=0)
    path = tmp_path / "xy.npz"
    np.savez(path, X=prob.X, y=prob.y)
    out = tmp_path / "n"
    assert main(["compare", "nuclear", str(path), "--mu", "0.05", "--methods", "prox",
                 "cvxpy:SCS", "--out", str(out)]) == 0
    d = json.loads((out / "compare.json").read_text())
    assert d["problem"] == "nuclear" and d["instance"]["n"] == 8
    assert [m["outcome"] for m in d["methods"]] == ["ok", "ok"]
    np.savez(path, X=prob.X)
    assert main(["compare", "nuclear", str(path), "--mu", "0.05",
                 "--out", str(tmp_path / "n2")]) == 2
    _one_error_line(capsys, "'y'")
    np.savez(path, X=prob.X, y=prob.y)
    assert main(["compare", "nuclear", str(path), "--mu", "0",
                 "--out", str(tmp_path / "n3")]) == 2
    _one_error_line(capsys, "mu")


def test_noiseless(tmp_path, capsys):
    inst = generate(n_clients=5, p=4, q=4, rank=2, contaminated=1, noise=0.0, seed=1)
    path = tmp_path / "w.npz"
    np.savez(path, W=inst.W)
    out = tmp_path / "z"
    assert main(["compare", "noiseless", str(path), "--lam-L", "1", "--lam-S",
                 str(1 / np.sqrt(inst.s)), "--methods", "cvxpy:CLARABEL", "--out", str(out)]) == 0
    d = json.loads((out / "compare.json").read_text())
    assert d["problem"] == "noiseless" and d["methods"][0]["relative_gap"] < 1e-6
    assert main(["compare", "noiseless", str(path), "--lam-L", "1", "--lam-S", "1",
                 "--methods", "fista", "--out", str(tmp_path / "z2")]) == 2
    _one_error_line(capsys, "unknown method 'fista'")


def test_all_zero_W_hat_is_one_error_line_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "zero.npz"
    np.savez(path, W_hat=np.zeros((4, 3, 5)))
    out = tmp_path / "cmp"
    assert main(["compare", "clair", str(path), *LAM, "--methods", "fista", "--out", str(out)]) == 2
    _one_error_line(capsys, "W_hat: all K = 4 clients' matrices are equal", "objective F(0, 0) = 0",
                    "nothing to compare")
    assert not out.exists()


@pytest.mark.parametrize("cmd,key", [("clair", "W_hat"), ("noiseless", "W")])
def test_W_of_the_wrong_dimension_names_the_file(tmp_path, instance, capsys, cmd, key):
    path = tmp_path / "flat.npz"
    np.savez(path, **{key: instance.W_hat[0]})
    out = tmp_path / "o"
    assert main(["compare", cmd, str(path), *LAM, "--out", str(out)]) == 2
    _one_error_line(capsys, str(path), f"array {key!r} must have 3 dimensions (K, q, p)", "(4, 4)")
    assert not out.exists()


def test_readme_npz_snippet_runs(tmp_path, monkeypatch):
    """The README's one-liner that writes a §7 instance for `compare clair` runs as written."""
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    snippet, = re.findall(r"`([^`\n]*W_hat=[^`\n]*simulate\([^`\n]*)`", readme)
    monkeypatch.chdir(tmp_path)
    exec("import numpy as np\n" + snippet, {})
    assert np.load(tmp_path / "W_hat.npz")["W_hat"].shape == (20, 10, 10)


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_memory_limit_error_is_in_the_flags_unit(tmp_path, npz, capsys, value):
    assert main(["compare", "clair", str(npz), *LAM, "--methods", "fista", "--memory-limit", value,
                 "--out", str(tmp_path / "o")]) == 2
    _one_error_line(capsys, f"--memory-limit must be a finite number of GB > 0, got {float(value):g}")
    assert not (tmp_path / "o").exists()


def test_peak_memory_is_shown_in_decimal_megabytes(tmp_path, npz):
    """The table's MB is 1e6 bytes, like the estimates' and --memory-limit's GB (1e9 bytes)."""
    out = tmp_path / "o"
    assert main(["compare", "clair", str(npz), *LAM, "--methods", "fista", "--out", str(out)]) == 0
    peak = json.loads((out / "compare.json").read_text())["methods"][0]["peak_memory_bytes"]
    assert f"{peak / 1e6:.3g} MB" in (out / "compare.md").read_text()


def test_a_stopped_solve_is_noted_once(tmp_path, npz):
    """The result's message and the ConvergenceWarning say the same sentence: the note holds it once."""
    out = tmp_path / "o"
    assert main(["compare", "clair", str(npz), *LAM, "--methods", "fista", "--max-iter", "3", "--out", str(out)]) == 0
    m = json.loads((out / "compare.json").read_text())["methods"][0]
    assert m["status"] == "max_iter"
    note = "solve_penalized(method='fista') stopped at max_iter=3"
    assert m["message"].count(note) == 1 and ".;" not in m["message"]
