"""The verifier's CLI (verify / claims / conditions), the runner and module loading."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import functools
from dataclasses import replace

from _dummy_tasks import _mean_experiment, dummy_claims, noisy_task
from verify import cli as vcli
from verify.claim import REGISTRY, Claim, Context
from verify.conditions import Condition
from verify.runner import load_modules, run_claims, select_claims
from verify.sweep import Sweep


def lowrank_fl(argv) -> int:
    """``lowrank-fl ARGV``: the console script's function (parser, handler, error handling)."""
    return vcli.lowrank_fl_main(argv)


# ----------------------------------------------------------------------------- verify
def test_verify_writes_the_report(dummy_registry, tmp_path, capsys):
    out = tmp_path / "rep"
    code = lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                       "--no-progress", "--out", str(out)])
    assert code == 1  # flute.dummy.raises raised: the report is written, the status says so
    said = capsys.readouterr()
    err = said.err
    # what was written, figures included
    n_fig = len(list((out / "figures").glob("*.png")))
    assert said.out.splitlines() == [str(out / "README.md"), str(out / "index.html"), str(out / "results.json"),
                                     f"{out / 'figures'}/ ({n_fig} figure{'s' if n_fig != 1 else ''})"]
    assert "[1/4] clair.dummy.table: holds" in err
    assert "flute.dummy.raises: inconclusive" in err and "ZeroDivisionError" in err
    assert (out / "README.md").is_file() and (out / "figures" / "fedrep.dummy.mean.png").is_file()
    page = (out / "index.html").read_text()
    assert not re.search(r"https?://", page)
    assert all(s.startswith("data:image/svg+xml;base64,") for s in re.findall(r'src="([^"]*)"', page))
    doc = json.loads((out / "results.json").read_text())
    assert doc["scale"] == "smoke" and doc["backend"] == "sequential"
    assert {"python", "numpy", "scipy", "cvxpy", "clarabel", "scs", "joblib", "lowrank_fl",
            "platform"} <= set(doc["versions"])
    assert [c["id"] for c in doc["claims"]] == ["clair.dummy.table", "fedrep.dummy.mean",
                                                "flute.dummy.raises", "rolora.dummy.erratum"]
    for c in doc["claims"]:
        assert {"id", "paper", "reference", "kind", "verdict", "measured", "predicted", "seeds",
                "seconds", "statement", "summary", "notes", "figure", "table"} <= set(c)
    assert [o["id"] for o in doc["omitted"]] == ["clair.prop9.gap"]
    assert doc["totals"]["errors"] == 1 and doc["tasks"] == {"executed": 6, "from_cache": 0}
    # --strict also turns a failing claim into exit status 1
    argv = ["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache", "--overwrite",
            "--claim", "rolora.*", "--out", str(out)]
    assert lowrank_fl(argv) == 0 and lowrank_fl(argv + ["--strict"]) == 0
    # --claim alone: the omitted claims of the chosen claims' papers only (CLAIR's is not listed)
    doc = json.loads((out / "results.json").read_text())
    assert doc["omitted"] == [] and set(doc["totals_by_paper"]) == {"rolora"}, doc["totals_by_paper"]
    assert lowrank_fl(argv[:-4] + ["--claim", "fedrep.dummy.mean", "--out", str(out)]) == 0
    REGISTRY["fedrep.dummy.mean"] = replace(REGISTRY["fedrep.dummy.mean"],
                                            experiment=functools.partial(_mean_experiment, shift=5.0))
    assert lowrank_fl(argv[:-4] + ["--claim", "fedrep.dummy.mean", "--out", str(out)]) == 0
    assert lowrank_fl(argv[:-4] + ["--claim", "fedrep.dummy.mean", "--strict", "--out", str(out)]) == 1


def test_verify_loky_cache_resumes(dummy_registry, tmp_path):
    argv = ["verify", "--scale", "smoke", "--backend", "loky", "--jobs", "2", "--cache",
            str(tmp_path / "cache"), "--claim", "fedrep.dummy.mean", "--out", str(tmp_path / "a")]
    assert lowrank_fl(argv) == 0
    argv[-1] = str(tmp_path / "b")
    assert lowrank_fl(argv) == 0
    a = json.loads((tmp_path / "a" / "results.json").read_text())
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert a["tasks"] == {"executed": 6, "from_cache": 0}
    assert b["tasks"] == {"executed": 0, "from_cache": 6}
    assert a["claims"][0]["measured"] == b["claims"][0]["measured"]
    assert a["claims"][0]["seeds"] == b["claims"][0]["seeds"]


def test_python_m_verify_is_the_verify_command(dummy_registry, tmp_path):
    assert vcli.main(["--scale", "smoke", "--backend", "sequential", "--no-cache", "--paper",
                      "clair", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [c["id"] for c in doc["claims"]] == ["clair.dummy.table"]


def test_python_m_verify_entry_point():
    help_text = subprocess.run([sys.executable, "-m", "verify", "--help"], capture_output=True,
                               text=True, timeout=60)
    assert help_text.returncode == 0
    for option in ("--paper", "--claim", "--scale", "--jobs", "--backend", "--scheduler", "--cache",
                   "--no-cache", "--seed", "--no-progress", "--out"):
        assert option in help_text.stdout
    bad = subprocess.run([sys.executable, "-m", "verify", "--backend", "loky", "--scheduler",
                          "tcp://127.0.0.1:1", "--out", "unused"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2
    assert "--scheduler needs --backend dask, got --backend loky" in bad.stderr


@pytest.mark.parametrize("argv, match", [
    (["--claim", "nope.*"], r"claim pattern 'nope\.\*' matches no registered claim"),
    (["--claim", "clair.prop9.gap"],
     r"claim pattern .clair.prop9.gap. matches no .*; it names an omitted claim: clair\.prop9\.gap \("),
    (["--backend", "sequential", "--scheduler", "tcp://h:1"], r"--scheduler needs --backend dask"),
    (["--jobs", "0", "--backend", "loky"], r"--jobs must be an int >= 1 or -1"),
])
def test_verify_errors(dummy_registry, tmp_path, capsys, argv, match):
    assert lowrank_fl(["verify", "--no-cache", "--out", str(tmp_path)] + argv) == 2
    assert re.search("lowrank-fl: error: " + match, capsys.readouterr().err)


def test_verify_rejects_unknown_paper_and_conflicting_cache_options(tmp_path, capsys):
    with pytest.raises(SystemExit):
        lowrank_fl(["verify", "--paper", "bert", "--out", str(tmp_path)])
    assert "invalid choice: 'bert'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lowrank_fl(["verify", "--cache", "x", "--no-cache", "--out", str(tmp_path)])
    assert "not allowed with argument" in capsys.readouterr().err


def test_verify_refuses_a_cache_inside_out_before_any_work(
        dummy_registry, tmp_path, capsys, monkeypatch):
    """--out is replaced as a whole: the cache may not be it or inside it, refused before anything is
    created (the default cache counts as well)."""
    for cache, out, match in (("same", "same", "--cache .*same is --out .*same or inside it"),
                              ("r/c", "r", "--cache .*r/c is --out .*r or inside it")):
        assert lowrank_fl(["verify", "--cache", str(tmp_path / cache), "--out", str(tmp_path / out)]) == 2
        assert re.search("lowrank-fl: error: " + match, capsys.readouterr().err)
        assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("LOWRANK_FL_CACHE", str(tmp_path / "d" / "cache"))
    assert lowrank_fl(["verify", "--out", str(tmp_path / "d")]) == 2
    assert "is --out" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWRANK_FL_CACHE", str(tmp_path / "c"))
    assert vcli.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LOWRANK_FL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vcli.default_cache_dir() == tmp_path / "lowrank_fl" / "verify"


# ----------------------------------------------------------------------------- claims
def test_claims_lists_registry_and_omitted(dummy_registry, capsys):
    assert lowrank_fl(["claims"]) == 0
    out = capsys.readouterr().out
    for c in dummy_claims():
        line = next(ln for ln in out.splitlines() if ln.startswith(c.id))
        assert c.kind in line and c.reference in line and c.statement in line
    assert "4 claims." in out and "Omitted (1):" in out and "no closed form" in out
    assert lowrank_fl(["claims", "--paper", "rolora", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in doc["claims"]] == ["rolora.dummy.erratum"] and doc["omitted"] == []
    assert doc["claims"][0]["erratum"] is True


# ----------------------------------------------------------------------------- conditions
def _fake_conditions():
    mod = types.ModuleType("verify.conditions.fedrep")

    def generate(seed=0, n=10, kappa=2.0, name="x"):
        rng = np.random.default_rng(seed)
        return {"n": n, "kappa": kappa, "B": rng.standard_normal((3, 2)), "name": name}

    def evaluate(instance):
        return [Condition("Theorem 1", "sample size", instance["n"], ">= 20", instance["n"] >= 20),
                Condition("Theorem 1", "condition number", float(instance["kappa"]), "", None,
                          note=str(instance.get("name", ""))),
                Condition("Lemma 2", "B shape", list(np.shape(instance["B"])), "(3, 2)",
                          np.bool_(np.shape(instance["B"]) == (3, 2)))]

    mod.generate, mod.evaluate = generate, evaluate
    return mod


def test_conditions_table_params_instance_json(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "verify.conditions.fedrep", _fake_conditions())
    assert lowrank_fl(["conditions", "fedrep", "--param", "n=25", "--param", "name=abc"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["theorem", "condition", "value", "required", "holds", "note"]
    assert re.match(r"Theorem 1\s+sample size\s+25\s+>= 20\s+yes", out[2])
    assert re.match(r"Theorem 1\s+condition number\s+2\s+-\s+abc", out[3])
    assert re.match(r"Lemma 2\s+B shape\s+\[3, 2\]\s+\(3, 2\)\s+yes", out[4])
    np.savez(tmp_path / "inst.npz", n=np.int64(5), kappa=np.float64(3.5), B=np.ones((4, 2)))
    assert lowrank_fl(["conditions", "fedrep", "--instance", str(tmp_path / "inst.npz"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {"theorem": "Theorem 1", "name": "sample size", "value": 5, "required": ">= 20",
                       "holds": False, "note": ""}
    assert rows[2]["holds"] is False and rows[1]["value"] == 3.5


@pytest.mark.parametrize("argv, match", [
    (["conditions", "bert"], r"unknown paper 'bert'; expected one of \['clair', 'fedrep'"),
    (["conditions", "adapters"], r"paper 'adapters' states no theorem conditions .*; conditions exist for clair, "
                                 r"fedrep, flute, rolora, fedavg_ft$"),
    (["conditions", "fedrep", "--param", "n"], r"--param must look like name=value, got 'n'"),
    (["conditions", "fedrep", "--instance", "missing.npz"], r"--instance file not found: missing.npz"),
    (["conditions", "fedrep", "--param", "bogus=1"],
     r"unknown --param 'bogus' for fedrep; accepted: n, kappa, name$"),
])
def test_conditions_errors(monkeypatch, capsys, argv, match):
    monkeypatch.setitem(sys.modules, "verify.conditions.fedrep", _fake_conditions())
    assert lowrank_fl(argv) == 2
    assert re.search(match, capsys.readouterr().err)


def test_conditions_missing_module_and_bad_module(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "verify.conditions.flute", None)  # "not written yet"
    assert lowrank_fl(["conditions", "flute"]) == 2
    assert "paper 'flute' has no module verify.conditions.flute" in capsys.readouterr().err
    broken = types.ModuleType("verify.conditions.flute")
    broken.generate = lambda seed=0: {}
    monkeypatch.setitem(sys.modules, "verify.conditions.flute", broken)
    assert lowrank_fl(["conditions", "flute"]) == 2
    assert "verify.conditions.flute has no evaluate() function" in capsys.readouterr().err
    broken.evaluate = lambda instance: [("Theorem", "x", 1)]
    assert lowrank_fl(["conditions", "flute"]) == 2
    assert "evaluate returned tuple, expected Condition" in capsys.readouterr().err


# ----------------------------------------------------------------------------- loading & runner
@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    pkg = tmp_path / "fakeclaims_h8"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "clair.py").write_text("LOADED = True\n")
    (pkg / "fedrep.py").write_text("raise NameError('name bug_here is not defined')\n")
    (pkg / "flute.py").write_text("import a_dependency_that_is_not_installed_h8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakeclaims_h8"
    for name in [m for m in sys.modules if m.startswith("fakeclaims_h8")]:
        del sys.modules[name]


def test_load_modules_missing_vs_broken(fake_package):
    assert load_modules(fake_package, ["clair", "rolora", "fedavg_ft"]) == {
        "loaded": ["clair"], "missing": ["rolora", "fedavg_ft"]}
    with pytest.raises(ImportError, match=r"fakeclaims_h8\.fedrep failed to import: NameError: name bug_here"):
        load_modules(fake_package, ["fedrep"])
    with pytest.raises(ImportError, match=r"fakeclaims_h8\.flute failed to import: ModuleNotFoundError: "
                                          r"No module named 'a_dependency_that_is_not_installed_h8'"):
        load_modules(fake_package, ["flute"])
    with pytest.raises(ValueError, match=r"paper 'rolora' has no module fakeclaims_h8\.rolora"):
        load_modules(fake_package, ["rolora"], required=True)
    with pytest.raises(ValueError, match=r"unknown paper 'bert'"):
        load_modules(fake_package, ["bert"])


def test_select_claims_by_paper_id_and_glob():
    registry = {c.id: c for c in dummy_claims()}
    ids = lambda cs: [c.id for c in cs]  # noqa: E731
    assert ids(select_claims(registry)) == ["clair.dummy.table", "fedrep.dummy.mean",
                                            "flute.dummy.raises", "rolora.dummy.erratum"]
    assert ids(select_claims(registry, papers=["rolora", "fedrep"])) == ["fedrep.dummy.mean",
                                                                         "rolora.dummy.erratum"]
    assert ids(select_claims(registry, ids=["*.dummy.t*", "flute.dummy.raises"])) == [
        "clair.dummy.table", "flute.dummy.raises"]
    with pytest.raises(ValueError, match=r"claim pattern 'fedrep\.\*' matches no registered claim of papers \['clair'\]"):
        select_claims(registry, papers=["clair"], ids=["fedrep.*"])
    with pytest.raises(ValueError, match=r"unknown paper 'x'"):
        select_claims(registry, papers=["x"])


def test_run_claims_continues_after_an_error_and_shows_it():
    seen = []
    results = run_claims(dummy_claims(), Context(scale="smoke"),
                         on_result=lambda k, n, c, e: seen.append((k, n, c.id, e.verdict)))
    assert seen[2] == (3, 4, "flute.dummy.raises", "inconclusive") and len(seen) == 4
    e = results[2][1]
    assert e.summary == "experiment raised ZeroDivisionError: dummy experiment divided by zero"
    assert "Traceback" in e.notes and "_raising_experiment" in e.notes
    assert results[3][1].verdict == "erratum confirmed"
    # a broken variant injected through the options reaches the experiment
    broken = run_claims(dummy_claims()[:1], Context(scale="smoke"), shift=5.0)
    assert broken[0][1].verdict == "fails"


def test_run_claims_reports_a_failing_sweep_task_with_claim_and_params(tmp_path):
    from verify.claim import Claim, Evidence

    from _dummy_tasks import noisy_task

    poison = tmp_path / "poison"
    poison.touch()

    def experiment(ctx):
        ctx.map(noisy_task, [{"x": 1, "poison": str(poison), "fail_on": 1}], replicates=1)
        return Evidence(verdict="holds", summary="unreachable")

    c = Claim(id="fedavg_ft.dummy.task", paper="fedavg_ft", reference="Thm 1", statement="s",
              kind="bound", experiment=experiment)
    (_, e), = run_claims([c])
    assert e.verdict == "inconclusive"
    assert e.summary.startswith("experiment raised SweepTaskError: claim fedavg_ft.dummy.task: "
                                "task _dummy_tasks.noisy_task(seed=")
    assert "raised ValueError: boom at x=1" in e.summary and "'x': 1" in e.summary
    assert "--- worker traceback ---" in e.notes and 'File "verify/sweep.py"' in e.notes


def test_lowrank_fl_command_has_the_verifier_subcommands(capsys):
    from verify.cli import build_parser, lowrank_fl_main as main

    parser = build_parser()
    assert {"clair", "verify", "claims", "conditions"} <= set(parser._subparsers._group_actions[0].choices)
    for command in ("verify", "claims", "conditions"):
        args = parser.parse_args([command, "fedrep"] if command == "conditions"
                                 else [command] + (["--out", "x"] if command == "verify" else []))
        assert args.handler is getattr(vcli, f"cmd_{command}")
    assert main(["conditions", "bert"]) == 2
    assert "lowrank-fl: error: unknown paper 'bert'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- set-up errors, --out, Ctrl-C
@pytest.fixture
def no_claim_runs(monkeypatch):
    """Set-up errors must stop the command before the first claim."""
    import verify.runner

    def forbidden(*args, **kwargs):
        raise AssertionError("a claim ran before the set-up was checked")

    monkeypatch.setattr(verify.runner, "run_claims", forbidden)


def _single_error_line(capsys, pattern):
    err = capsys.readouterr().err.strip().splitlines()
    errors = [ln for ln in err if "error" in ln]
    assert len(errors) == 1 and re.search(pattern, errors[0]), err
    assert not any("Traceback" in ln for ln in err)


@pytest.mark.parametrize("make_argv, pattern", [
    (lambda d: ["--out", ""], r"lowrank-fl: error: --out must name a directory, got ''"),
    (lambda d: ["--out", str(d / "file")], r"--out .*file is a file, not a directory"),
    (lambda d: ["--out", str(d / "file" / "sub")], r"cannot write --out .*file/sub"),
    (lambda d: ["--out", str(d / "full")], r"--out .*full is not empty and does not hold a previous lowrank-fl output"),
    (lambda d: ["--out", str(d / "full"), "--overwrite"],
     r"--out .*full is not empty and does not hold a previous lowrank-fl output \(no \.lowrank-fl-output\); refusing"),
    (lambda d: ["--out", str(d / "o"), "--cache", str(d / "file")],
     r"--cache .*file is a file, not a directory"),
    (lambda d: ["--out", str(d / "o"), "--cache", str(d / "file" / "sub")],
     r"--cache .*file/sub is not usable"),
    (lambda d: ["--out", str(d / "o"), "--no-cache", "--refresh"], r"--refresh needs the cache"),
])
def test_verify_setup_errors_stop_before_the_first_claim(dummy_registry, no_claim_runs, tmp_path,
                                                         capsys, monkeypatch, make_argv, pattern):
    monkeypatch.setenv("LOWRANK_FL_CACHE", str(tmp_path / "c"))
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    assert lowrank_fl(["verify", "--backend", "sequential"] + make_argv(tmp_path)) == 2
    _single_error_line(capsys, pattern)
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "o").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_verify_dask_without_distributed_is_a_setup_error(dummy_registry, no_claim_runs, tmp_path,
                                                          capsys, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_distributed(name, *args, **kwargs):
        if name == "distributed" or name.startswith("distributed."):
            raise ImportError("No module named 'distributed'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    assert lowrank_fl(["verify", "--backend", "dask", "--no-cache", "--out", str(tmp_path / "o")]) == 2
    _single_error_line(capsys, r"backend 'dask' needs dask\[distributed\], which is not installed")


@pytest.mark.parametrize("seed", ["-1", "abc", "1.5"])
def test_verify_bad_seed_is_a_usage_error(tmp_path, capsys, seed):
    with pytest.raises(SystemExit) as exc:
        lowrank_fl(["verify", "--seed", seed, "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "argument --seed: must be an int >= 0" in capsys.readouterr().err


def test_overwrite_replaces_the_report_but_never_a_file_the_user_added(dummy_registry, tmp_path, capsys):
    out = tmp_path / "rep"
    argv = ["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache", "--no-progress",
            "--claim", "fedrep.dummy.mean", "--out", str(out)]
    assert lowrank_fl(argv) == 0
    (out / "figures" / "stale.png").write_bytes(b"old figure")
    (out / "old.txt").write_text("old")
    assert lowrank_fl(argv) == 2  # not empty
    capsys.readouterr()
    assert lowrank_fl(argv + ["--overwrite"]) == 2    # files the report did not write: refused
    assert "did not write (figures/stale.png, old.txt)" in capsys.readouterr().err
    assert (out / "old.txt").read_text() == "old"
    (out / "old.txt").unlink()
    (out / "figures" / "stale.png").unlink()
    assert lowrank_fl(argv + ["--overwrite"]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        ".lowrank-fl-output", "README.md", "figures", "figures/fedrep.dummy.mean.png", "figures/fedrep.dummy.mean.svg",
        "index.html", "results.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no staging or old directory left


@pytest.mark.parametrize("stop, code, how", [(KeyboardInterrupt, 130, "interrupted"),
                                              # SIGTERM unwinds as SystemExit(143) (lowrank_fl.outdir)
                                              (lambda: SystemExit(143), 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_is_one_line_that_says_the_cache_resumes(dummy_registry, tmp_path, capsys, stop, code,
                                                                    how):
    def interrupted(ctx):
        ctx.map(noisy_task, [{"x": 0}], replicates=2)
        raise stop()

    REGISTRY["fedrep.dummy.ctrlc"] = Claim(id="fedrep.dummy.ctrlc", paper="fedrep", reference="r",
                                           statement="s", kind="bound", experiment=interrupted)
    cache = tmp_path / "cache"
    status = lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--cache", str(cache),
                         "--no-progress", "--claim", "fedrep.dummy.ctrlc", "--out", str(tmp_path / "o")])
    assert status == code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err[-1] == f"verify: {how}; no report written; rerun the same command to resume " \
                      f"from the cache ({cache})"
    assert not any("Traceback" in ln for ln in err)
    assert not (tmp_path / "o").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    assert len(list(cache.rglob("*.npz"))) == 2  # the finished tasks are kept


def test_refresh_and_cache_clear(dummy_registry, tmp_path, capsys):
    cache = tmp_path / "cache"
    argv = ["verify", "--scale", "smoke", "--backend", "sequential", "--cache", str(cache),
            "--no-progress", "--claim", "fedrep.dummy.mean", "--overwrite", "--out", str(tmp_path / "o")]
    tasks = lambda: json.loads((tmp_path / "o" / "results.json").read_text())["tasks"]  # noqa: E731
    assert lowrank_fl(argv) == 0 and tasks() == {"executed": 6, "from_cache": 0}
    assert lowrank_fl(argv) == 0 and tasks() == {"executed": 0, "from_cache": 6}
    assert lowrank_fl(argv + ["--refresh"]) == 0 and tasks() == {"executed": 6, "from_cache": 0}
    capsys.readouterr()
    assert lowrank_fl(["cache", "clear", "--cache", str(cache), "--claim", "clair.dummy.table"]) == 0
    assert capsys.readouterr().out == (f"cache clear: removed 0 entries from {cache} (nothing was "
                                       "cached for them)\n")
    assert lowrank_fl(["cache", "clear", "--cache", str(cache), "--claim", "fedrep.dummy.mean"]) == 0
    assert capsys.readouterr().out.startswith("cache clear: removed 6 entries")
    assert lowrank_fl(argv) == 0 and tasks() == {"executed": 6, "from_cache": 0}
    capsys.readouterr()
    # a glob, as verify --claim reads it; one matching nothing is named
    assert lowrank_fl(["cache", "clear", "--cache", str(cache), "--claim", "fedrep.dummy.*"]) == 0
    assert capsys.readouterr().out.startswith("cache clear: removed 6 entries")
    assert lowrank_fl(["cache", "clear", "--cache", str(cache), "--claim", "fedrep.nothing.*"]) == 2
    assert "--claim fedrep.nothing.* matches no claim id" in capsys.readouterr().err
    # a cache folder that does not exist is said to, not "removed 0 entries"
    assert lowrank_fl(["cache", "clear", "--cache", str(tmp_path / "nowhere")]) == 0
    assert capsys.readouterr().out == f"cache clear: {tmp_path / 'nowhere'} does not exist (nothing is cached there)\n"
    assert not (tmp_path / "nowhere").exists()
    assert lowrank_fl(argv) == 0 and tasks() == {"executed": 6, "from_cache": 0}
    assert lowrank_fl(["cache", "clear", "--cache", str(cache)]) == 0
    assert not list(cache.rglob("*.npz"))
    # a directory that is not a cache is never deleted
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "thesis.tex").write_text("precious")
    assert lowrank_fl(["cache", "clear", "--cache", str(tmp_path / "docs")]) == 2
    assert "does not look like a lowrank_fl task cache" in capsys.readouterr().err
    assert (tmp_path / "docs" / "thesis.tex").exists()


def test_cache_clear_of_an_unknown_claim_id_names_it_and_suggests(dummy_registry, tmp_path, capsys):
    cache = tmp_path / "cache"
    argv = ["verify", "--scale", "smoke", "--backend", "sequential", "--cache", str(cache),
            "--no-progress", "--claim", "fedrep.dummy.mean", "--out", str(tmp_path / "o")]
    assert lowrank_fl(argv) == 0
    capsys.readouterr()
    entries = sorted(cache.rglob("*.npz"))
    assert len(entries) == 6
    for ids, close in ((["fedrep.dummy.maen"], "did you mean 'fedrep.dummy.mean'? "),
                       (["no.such.claim"], ""),
                       (["fedrep.dummy.mean", "no.such.claim"], "")):   # nothing removed then
        argv = ["cache", "clear", "--cache", str(cache)] + [a for i in ids for a in ("--claim", i)]
        assert lowrank_fl(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.splitlines() == [
            f"lowrank-fl: error: --claim {ids[-1]} is not a claim id and has no entries in {cache}; "
            f"{close}`lowrank-fl claims` lists the claim ids"]
        assert sorted(cache.rglob("*.npz")) == entries
    # a label with entries but no registered claim (a renamed claim) can still be cleared
    REGISTRY.pop("fedrep.dummy.mean")
    assert lowrank_fl(["cache", "clear", "--cache", str(cache), "--claim", "fedrep.dummy.mean"]) == 0
    assert capsys.readouterr().out.startswith("cache clear: removed 6 entries")
    assert not list(cache.rglob("*.npz"))


def test_one_log_line_per_claim_when_not_a_terminal(dummy_registry, tmp_path, capsys):
    assert lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                       "--paper", "fedrep", "--paper", "clair", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err  # no progress bar
    lines = err.strip().splitlines()
    assert lines[0].startswith("verify: 2 claims at scale smoke")
    assert re.match(r"\[1/2\] clair.dummy.table: holds \(\d+\.\d s\) - table only$", lines[1])
    assert re.match(r"\[2/2\] fedrep.dummy.mean: holds", lines[2])
    assert lines[3].startswith("verify: 2 holds, 0 fails") and len(lines) == 4


def test_version_of_both_entry_points(capsys):
    import lowrank_fl as lib

    for entry in (vcli.lowrank_fl_main, vcli.main):
        with pytest.raises(SystemExit) as exc:
            entry(["--version"])
        assert exc.value.code == 0
        assert f"lowrank_fl {lib.__version__}" in capsys.readouterr().out


def test_conditions_list_params(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "verify.conditions.fedrep", _fake_conditions())
    assert lowrank_fl(["conditions", "fedrep", "--list-params"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["parameter", "default"]
    assert [ln.split()[:2] for ln in out[2:]] == [["n", "10"], ["kappa", "2.0"], ["name", "'x'"]]


@pytest.mark.parametrize("content, pattern", [
    (b"", r"--instance .*inst.npz is empty, expected an .npz archive"),
    (b"garbage", r"--instance .*inst.npz is not an .npz archive \(numpy.savez output\): not a numpy file"),
])
def test_conditions_bad_instance_file(monkeypatch, tmp_path, capsys, content, pattern):
    monkeypatch.setitem(sys.modules, "verify.conditions.fedrep", _fake_conditions())
    (tmp_path / "inst.npz").write_bytes(content)
    assert lowrank_fl(["conditions", "fedrep", "--instance", str(tmp_path / "inst.npz")]) == 2
    _single_error_line(capsys, pattern)


def test_a_cached_value_the_experiment_cannot_use_is_recomputed(tmp_path):
    """A valid entry holding a wrong-type value: the claim reruns with its tasks recomputed."""
    sweep = Sweep(cache_dir=tmp_path)
    claim = dummy_claims()[0]  # fedrep.dummy.mean: sums the tasks' "sum" floats
    first = run_claims([claim], Context(scale="smoke", sweep=sweep))[0][1]
    assert first.verdict == "holds"
    entry = sorted(tmp_path.rglob("*.npz"))[0]
    with np.load(entry, allow_pickle=False) as data:
        doc = json.loads(str(data["__json__"][()]))
        arrays = {k: data[k] for k in data.files if k != "__json__"}
    items = doc["result"]["dict"]
    assert items[2][0] == "sum"
    items[2][1] = "not a float"
    np.savez(entry, __json__=np.array(json.dumps(doc)), **arrays)
    again = Sweep(cache_dir=tmp_path)
    second = run_claims([claim], Context(scale="smoke", sweep=again))[0][1]
    assert second.verdict == "holds" and second.measured == first.measured
    assert again.executed == 6 and again.refresh is False


def test_run_claims_lets_setup_errors_through():
    from verify.sweep import StaleWorkerError

    def stale(ctx):
        raise StaleWorkerError("worker runs other code")

    c = Claim(id="fedrep.dummy.stale", paper="fedrep", reference="r", statement="s", kind="bound",
              experiment=stale)
    with pytest.raises(StaleWorkerError):
        run_claims([c])


def test_claim_bodies_run_with_one_blas_thread(dummy_registry, tmp_path):
    """The main process is pinned like the workers (threadpoolctl), not only the tasks."""
    from threadpoolctl import threadpool_info

    from verify.claim import Evidence

    seen = []

    def body(ctx):
        seen.extend(int(p["num_threads"]) for p in threadpool_info())
        return Evidence(verdict="holds", summary="threads recorded")

    REGISTRY["fedrep.dummy.threads"] = Claim(id="fedrep.dummy.threads", paper="fedrep",
                                             reference="r", statement="s", kind="bound",
                                             experiment=body)
    assert lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                       "--claim", "fedrep.dummy.threads", "--out", str(tmp_path / "o")]) == 0
    assert seen and set(seen) == {1}


def test_interactive_runs_show_bars_and_write_claim_lines_through_tqdm(dummy_registry, tmp_path,
                                                                       monkeypatch, capsys):
    seen = {}
    real_prepare = Sweep.prepare

    def spy(self):
        seen["progress"] = self.progress
        return real_prepare(self)

    monkeypatch.setattr(vcli, "_interactive", lambda: True)
    monkeypatch.setattr(Sweep, "prepare", spy)
    assert lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                       "--claim", "fedrep.dummy.mean", "--out", str(tmp_path / "o")]) == 0
    assert seen["progress"] is True
    handlers = [h for h in vcli.log.handlers if isinstance(h, vcli._StderrHandler)]
    assert len(handlers) == 1 and handlers[0].through_tqdm
    assert "[1/1] fedrep.dummy.mean: holds" in capsys.readouterr().err
    # --no-progress: no bars even on a terminal
    assert lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                       "--no-progress", "--claim", "fedrep.dummy.mean", "--out", str(tmp_path / "p")]) == 0
    assert seen["progress"] is False


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_the_report_directory_has_the_mode_of_a_plain_mkdir(dummy_registry, tmp_path, umask):
    """The report was staged with tempfile.mkdtemp (mode 0700) and renamed: it must get the
    mode ``mkdir`` gives under the user's umask (0755 with umask 022), like its figures/."""
    import stat

    old = os.umask(umask)
    try:
        (tmp_path / "reference").mkdir()
        out = tmp_path / "rep"
        assert lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                           "--no-progress", "--claim", "fedrep.dummy.mean", "--out", str(out)]) == 0
    finally:
        os.umask(old)
    mode = stat.S_IMODE(out.stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "reference").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "figures").stat().st_mode) == mode


def test_conditions_deprecated_param_warns_and_an_alias_beside_its_new_name_is_refused(capsys):
    """``--param K=...`` (the deprecated alias of n_clients) works and says so on stderr; given beside
    ``n_clients`` it is refused, not silently overridden."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lowrank_fl(["conditions", "clair", "--param", "K=8", "--param", "p=6", "--json"]) == 0
    assert any(issubclass(w.category, DeprecationWarning) and "K is deprecated (generate(K=...), --param K=...); "
               "use n_clients" in str(w.message) for w in caught)
    # on stderr, as one line (a fresh process: pytest records warnings instead of printing them)
    script = "import sys; from verify.cli import lowrank_fl_main; sys.exit(lowrank_fl_main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", script, "conditions", "clair", "--param", "K=8", "--param", "p=6",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ("warning: K is deprecated (generate(K=...), --param K=...); "
                                                    "use n_clients (DeprecationWarning)\n"), proc.stderr
    capsys.readouterr()
    assert lowrank_fl(["conditions", "clair", "--param", "K=8", "--param", "n_clients=10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("give n_clients only (K is its deprecated alias), not both") and "deprecated (" not in err



def test_conditions_instance_warns_about_unread_names_and_refuses_a_bad_penalty(tmp_path, capsys):
    """A misspelt array name is warned about (its condition would read "not given" without a word); a
    penalty that is negative or NaN is refused naming it, not printed as a scaling."""
    from verify.conditions.clair import generate
    inst = {k: v for k, v in generate(seed=0).items() if v is not None}
    np.savez(tmp_path / "ok.npz", **inst)
    assert lowrank_fl(["conditions", "clair", "--instance", str(tmp_path / "ok.npz")]) == 0
    assert "warning" not in capsys.readouterr().err
    typo = dict(inst, lam_Ltypo=inst["lam_L"])
    del typo["lam_L"]
    np.savez(tmp_path / "typo.npz", **typo)
    assert lowrank_fl(["conditions", "clair", "--instance", str(tmp_path / "typo.npz")]) == 0
    err = capsys.readouterr().err
    assert "the clair conditions read no array named 'lam_Ltypo'" in err and "'lam_S'" not in err
    for bad in (-1.0, float("nan")):
        np.savez(tmp_path / "bad.npz", **dict(inst, lam_S=bad))
        assert lowrank_fl(["conditions", "clair", "--instance", str(tmp_path / "bad.npz")]) == 2
        assert f"instance['lam_S'] must be a finite number > 0, got {bad:g}" in capsys.readouterr().err


def test_papers_are_named_as_users_write_them(capsys):
    from verify.cli import lowrank_fl_main

    assert lowrank_fl_main(["claims", "--paper", "FedAvg-FT", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["claims"] and {c["paper"] for c in got["claims"]} == {"fedavg_ft"}
    assert lowrank_fl_main(["claims", "--paper", "CLAIR", "--json"]) == 0
    assert {c["paper"] for c in json.loads(capsys.readouterr().out)["claims"]} == {"clair"}
