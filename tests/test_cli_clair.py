"""Tests of ``lowrank-fl clair fit`` through ``lowrank_fl.cli.main``."""
import json

import numpy as np
import pytest

from lowrank_fl.clair.cli import EXIT_UNCONVERGED
from lowrank_fl.cli import main
from lowrank_fl.clair.pipeline import fit
from lowrank_fl.clair.simulate import generate

LAM_L = 1e-3


@pytest.fixture(scope="module")
def instance():
    return generate(n_clients=6, p=5, q=4, rank=2, contaminated=1, noise=1e-3, seed=2)


@pytest.fixture
def npz(tmp_path, instance):
    path = tmp_path / "local.npz"
    np.savez(path, W_hat=instance.W_hat)
    return path


def _lam_S(instance):
    return float(LAM_L / np.sqrt(instance.s))


def test_round_trip(tmp_path, npz, instance, capsys):
    out = tmp_path / "out"
    lam_S = _lam_S(instance)
    code = main(["clair", "fit", str(npz), "--rank", "2", "--lam-L", str(LAM_L),
                 "--lam-S", repr(lam_S), "--out", str(out)])
    assert code == 0
    assert "kept" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    ref = fit(instance.W_hat, LAM_L, lam_S, rank=2)
    assert summary["benign"] == [int(k) for k in np.flatnonzero(ref.benign)]
    assert summary["excluded"] == [int(k) for k in np.flatnonzero(~ref.benign)]
    assert summary["benign"] == [int(k) for k in np.flatnonzero(instance.benign)]
    assert (summary["K"], summary["q"], summary["p"]) == (6, 4, 5)
    assert summary["rank"] == 2 and summary["status"] == ref.solution.status
    assert summary["objective"] == pytest.approx(ref.solution.objective, rel=1e-12)
    assert summary["gap"] == pytest.approx(ref.solution.gap, rel=1e-9, abs=1e-15)
    # the relative gap is the one --tol (default 1e-8) applies to
    assert summary["relative_gap"] == pytest.approx(ref.solution.relative_gap, rel=1e-9, abs=1e-15)
    assert summary["relative_gap"] <= 1e-8 and summary["tol"] == 1e-8           # the default it was judged by
    assert summary["tau"] == pytest.approx(ref.tau, rel=1e-12)
    assert summary["tau_rule"] == "largest-gap" and summary["solver"] == "fista"
    with np.load(out / "refined.npz") as data:
        assert set(data.files) == {"W_tilde", "benign", "projector"}
        assert np.array_equal(data["W_tilde"], ref.refined)       # same deterministic run
        assert np.array_equal(data["benign"], ref.benign)
        assert np.array_equal(data["projector"], ref.projector)


def test_options_tau_alpha_weights(tmp_path, npz, instance):
    out = tmp_path / "o2"
    w = np.full(instance.G, 0.2)
    wfile = tmp_path / "w.npy"
    np.save(wfile, w)
    code = main(["clair", "fit", str(npz), "--rank", "2", "--lam-L", "0.1",
                 "--lam-S", "0.05", "--alpha", "0.7", "--tau", "0.5",
                 "--method", "proxgrad", "--weights", str(wfile), "--tol", "1e-6",
                 "--max-iter", "5000", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    ref = fit(instance.W_hat, 0.1, 0.05, rank=2, alpha=0.7, tau=0.5, weights=w,
              method="proxgrad", tol=1e-6, max_iter=5000)
    assert summary["tau"] == 0.5 and summary["tau_rule"] == "fixed" and summary["alpha"] == 0.7
    assert summary["solver"] == "proxgrad" and summary["status"] == "optimal"
    assert summary["iterations"] == ref.solution.iterations
    with np.load(out / "refined.npz") as data:
        assert np.array_equal(data["W_tilde"], ref.refined)


def test_missing_W_hat_array(tmp_path, capsys):
    path = tmp_path / "bad.npz"
    np.savez(path, X=np.zeros((3, 2, 2)), Y=np.ones(2))
    code = main(["clair", "fit", str(path), "--rank", "1", "--lam-L", "1", "--lam-S", "1",
                 "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "no array named 'W_hat'" in err and "['X', 'Y']" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, match", [
    (["--rank", "4"], "rank must satisfy"),
    (["--rank", "2", "--alpha", "1.0"], "alpha must lie in"),
    (["--rank", "2", "--lam-L", "-1"], "lam_L must be finite and > 0"),
    (["--rank", "2", "--tau", "-1"], "tau must be finite and >= 0"),
    (["--rank", "2", "--method", "newton"], "method must be one of"),
])
def test_bad_arguments_exit_2(tmp_path, npz, capsys, extra, match):
    args = ["clair", "fit", str(npz), "--lam-L", "1", "--lam-S", "1", "--out",
            str(tmp_path / "o")]
    # later flags override earlier ones in argparse
    code = main(args + extra)
    assert code == 2
    assert match in capsys.readouterr().err


def test_missing_files_exit_2(tmp_path, npz, capsys):
    code = main(["clair", "fit", str(tmp_path / "nope.npz"), "--rank", "1", "--lam-L", "1",
                 "--lam-S", "1", "--out", str(tmp_path / "o")])
    assert code == 2 and "W_hat file not found" in capsys.readouterr().err
    code = main(["clair", "fit", str(npz), "--rank", "1", "--lam-L", "1", "--lam-S", "1",
                 "--weights", str(tmp_path / "w.npy"), "--out", str(tmp_path / "o")])
    assert code == 2 and "weights file not found" in capsys.readouterr().err


def test_wrong_weights_length_exit_2(tmp_path, npz, capsys):
    wfile = tmp_path / "w.npy"
    np.save(wfile, np.ones(3))
    code = main(["clair", "fit", str(npz), "--rank", "1", "--lam-L", "1", "--lam-S", "1",
                 "--weights", str(wfile), "--out", str(tmp_path / "o")])
    assert code == 2 and "weights must have shape (15,)" in capsys.readouterr().err


def test_bad_tau_string_is_an_argparse_error(npz, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["clair", "fit", str(npz), "--rank", "1", "--lam-L", "1", "--lam-S", "1",
              "--tau", "gap", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "--tau must be a number >= 0 or one of largest-gap" in capsys.readouterr().err


def test_unconverged_solve_exits_3_with_outputs(tmp_path, npz, instance, capsys):
    out = tmp_path / "o3"
    code = main(["clair", "fit", str(npz), "--rank", "2", "--lam-L", str(LAM_L),
                 "--lam-S", repr(_lam_S(instance)), "--max-iter", "2", "--out", str(out)])
    assert code == EXIT_UNCONVERGED == 3
    err = capsys.readouterr().err
    assert "did not converge (status max_iter)" in err
    # the fit's ConvergenceWarning, as one line without a source line
    assert any(line.startswith("warning: CLAIR fit:") and "max_iter=2" in line for line in err.splitlines())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "max_iter" and summary["iterations"] == 2
    assert (out / "refined.npz").is_file()


def test_iterative_options_with_cvxpy_exit_2(tmp_path, npz, capsys):
    code = main(["clair", "fit", str(npz), "--rank", "2", "--lam-L", "1", "--lam-S", "1",
                 "--method", "cvxpy", "--max-iter", "2", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "max_iter is only used with iterative methods" in capsys.readouterr().err


def test_npy_input_is_explained(tmp_path, instance, capsys):
    path = tmp_path / "W.npy"
    np.save(path, instance.W_hat)
    code = main(["clair", "fit", str(path), "--rank", "1", "--lam-L", "1", "--lam-S", "1",
                 "--out", str(tmp_path / "o")])
    assert code == 2
    assert "W.npy is a single array (ndarray), not an .npz archive: save it with numpy.savez" in \
        capsys.readouterr().err


def test_help_documents_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["clair", "fit", "--help"])
    assert "exit status: 0 converged; 3 solver stopped unconverged" in capsys.readouterr().out


def test_library_command_has_only_the_library_subcommands(capsys):
    """``python -m lowrank_fl.cli``: the library's own command, without the verifier's."""
    from lowrank_fl.cli import build_parser

    parser = build_parser()
    assert set(parser._subparsers._group_actions[0].choices) == {"clair", "compare", "adapters"}
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--out", "x"])
    assert exc.value.code == 2 and "invalid choice: 'verify'" in capsys.readouterr().err


def test_cli_survives_a_closed_pipe():
    # ``lowrank-fl claims | head -1`` must not end in a BrokenPipeError traceback.
    import subprocess
    import sys
    proc = subprocess.run(f"{sys.executable} -c 'import sys; from verify.cli import lowrank_fl_main; "
                          f"sys.exit(lowrank_fl_main([\"claims\"]))' | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("id")
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- bad files, --out, Ctrl-C
def _fit_args(w_hat, out, *extra):
    return ["clair", "fit", str(w_hat), "--rank", "2", "--lam-L", "0.1", "--lam-S", "0.05",
            "--out", str(out), *extra]


def _one_error_line(capsys, expected):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lowrank-fl: error: "), err
    assert expected in err[0], err[0]
    assert "Traceback" not in err[0]


@pytest.mark.parametrize("content, expected", [
    (b"", "is empty, expected an .npz archive"),
    (b"PK\x03\x04 truncated", "is not an .npz archive (numpy.savez output)"),
    (b"hello, not numpy\n", "is not an .npz archive (numpy.savez output): not a numpy file"),
])
def test_bad_input_files_are_one_line(tmp_path, capsys, content, expected):
    path = tmp_path / "in.npz"
    path.write_bytes(content)
    assert main(_fit_args(path, tmp_path / "o")) == 2
    _one_error_line(capsys, expected)
    assert not (tmp_path / "o").exists()


def test_truncated_npz_is_one_line(tmp_path, npz, capsys):
    cut = tmp_path / "cut.npz"
    cut.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    assert main(_fit_args(cut, tmp_path / "o")) == 2
    _one_error_line(capsys, "cut.npz is")
    assert "allow_pickle" not in capsys.readouterr().err


def test_a_directory_as_W_hat_is_named_as_such(tmp_path, capsys):
    assert main(_fit_args(tmp_path, tmp_path / "o")) == 2
    _one_error_line(capsys, "is a directory, expected a file")


@pytest.fixture
def no_fit(monkeypatch):
    """The fit must not start: the output is checked first."""
    from lowrank_fl.clair import cli as clair_cli

    def forbidden(*args, **kwargs):
        raise AssertionError("fit ran before --out was checked")

    monkeypatch.setattr(clair_cli, "fit", forbidden)


@pytest.mark.parametrize("make, expected", [
    (lambda d: "", "--out must name a directory, got ''"),
    (lambda d: (d / "file").write_text("x") and d / "file", "is a file, not a directory"),
    (lambda d: (d / "file").write_text("x") and d / "file" / "sub", "cannot write --out"),
    (lambda d: (d / "full").mkdir() or (d / "full" / "x.txt").write_text("x") and d / "full",
     "is not empty and does not hold a previous lowrank-fl output (no .lowrank-fl-output); refusing"),
])
def test_bad_out_is_checked_before_the_fit(tmp_path, npz, capsys, no_fit, make, expected):
    out = make(tmp_path)
    assert main(_fit_args(npz, out)) == 2
    _one_error_line(capsys, expected)


def test_overwrite_needs_a_previous_fit_and_replaces_it(tmp_path, npz, capsys):
    out = tmp_path / "o"
    assert main(_fit_args(npz, out)) == 0
    (out / "stale.txt").write_text("old")
    assert main(_fit_args(npz, out)) == 2  # not empty, but a previous output: --overwrite is the way
    assert "is not empty; pass --overwrite to replace a previous lowrank-fl output" in capsys.readouterr().err
    assert main(_fit_args(npz, out, "--overwrite")) == 2  # a file the fit did not write: refused
    assert "did not write (stale.txt)" in capsys.readouterr().err
    (out / "stale.txt").unlink()
    assert main(_fit_args(npz, out, "--overwrite")) == 0
    assert sorted(p.name for p in out.iterdir()) == [".lowrank-fl-output", "refined.npz", "summary.json"]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    assert main(_fit_args(npz, other, "--overwrite")) == 2
    assert "does not hold a previous lowrank-fl output (no .lowrank-fl-output)" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "keep"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_ctrl_c_during_the_fit_is_one_line_and_writes_nothing(tmp_path, npz, capsys, monkeypatch):
    from lowrank_fl.clair import cli as clair_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(clair_cli, "fit", interrupted)
    assert main(_fit_args(npz, tmp_path / "o")) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lowrank-fl: interrupted"]
    assert list(tmp_path.iterdir()) == [npz]  # no output, no staging directory


def test_a_failed_fit_leaves_the_previous_output(tmp_path, npz, capsys, monkeypatch):
    from lowrank_fl.clair import cli as clair_cli

    out = tmp_path / "o"
    assert main(_fit_args(npz, out)) == 0
    before = (out / "summary.json").read_text()
    monkeypatch.setattr(clair_cli, "fit", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad lam")))
    assert main(_fit_args(npz, out, "--overwrite")) == 2
    assert (out / "summary.json").read_text() == before


def test_version(capsys):
    import lowrank_fl

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"lowrank-fl: lowrank_fl {lowrank_fl.__version__} (Python ")


def test_equal_clients_say_there_is_nothing_to_detect(tmp_path, capsys):
    """All-zero (or all-equal) estimates: every contrast is zero; every client is kept, (9)
    returns the inputs, and the one warning says why instead of blaming lam_S/lam_L."""
    W = np.tile(np.arange(12.0).reshape(1, 4, 3), (5, 1, 1))
    for data in (np.zeros((5, 4, 3)), W):
        path = tmp_path / "w.npz"
        np.savez(path, W_hat=data)
        out = tmp_path / f"o{int(data.any())}"
        assert main(["clair", "fit", str(path), "--rank", "1", "--lam-L", "0.3", "--lam-S", "0.1",
                     "--out", str(out)]) == 0
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["warning: every contrast is zero (the clients' estimates are all equal): there "
                       "is nothing to detect; every client is kept and (9) returns the estimates "
                       "unchanged"]
        s = json.loads((out / "summary.json").read_text())
        assert s["benign"] == [0, 1, 2, 3, 4] and s["excluded"] == []
        with np.load(out / "refined.npz") as z:
            assert np.array_equal(z[z.files[0]], data)


def test_an_uncaught_warning_is_one_line_on_stderr_and_the_format_is_restored():
    """A warning a command does not catch prints as ``warning: <message> (<Category>)``, not Python's
    ``file:line: Category: message`` plus a source line; :func:`lowrank_fl.cli.run` restores the
    process's format when it returns."""
    import subprocess
    import sys
    code = ("import argparse, warnings, sys; from lowrank_fl.cli import run\n"
            "p = argparse.ArgumentParser(prog='t')\n"
            "def h(a):\n"
            "    warnings.warn('two\\n  lines', RuntimeWarning); warnings.warn('plain')\n"
            "p.set_defaults(handler=h)\n"
            "before = warnings.formatwarning\n"
            "status = run(p, [])\n"
            "print(warnings.formatwarning is before, status)\n")
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stderr == "warning: two lines (RuntimeWarning)\nwarning: plain\n"
    assert proc.stdout == "True 0\n"


def test_summary_tol_is_the_tolerance_each_method_was_judged_by(tmp_path):
    """``summary.json["tol"]``: the given --tol, else the method's default (1e-8 iterative, the CVXPY
    certificate's 1e-7), never null."""
    from lowrank_fl.clair.programs import DEFAULT_TOL
    instance = generate(n_clients=6, p=5, q=4, rank=2, contaminated=1, noise=1e-3, seed=3)
    np.savez(tmp_path / "w.npz", W_hat=instance.W_hat)
    for method, tol, want in (("fista", None, 1e-8), ("cvxpy", None, DEFAULT_TOL), ("proxgrad", "1e-6", 1e-6)):
        out = tmp_path / f"{method}{tol}"
        extra = [] if tol is None else ["--tol", tol]
        assert main(["clair", "fit", str(tmp_path / "w.npz"), "--rank", "2", "--lam-L", "0.3", "--lam-S", "0.1",
                     "--method", method, "--out", str(out), *extra]) == 0
        assert json.loads((out / "summary.json").read_text())["tol"] == want


def test_object_arrays_are_named_as_such_and_never_unpickled(tmp_path, capsys):
    """An object array (in an .npz, or as the --weights .npy) is refused as one, not as a damaged file;
    a text file named .npy stays "not a numpy file" (numpy calls both "pickled")."""
    W = np.zeros((6, 4, 5)).astype(object)
    np.savez(tmp_path / "obj.npz", W_hat=W)
    assert main(_fit_args(tmp_path / "obj.npz", tmp_path / "o")) == 2
    _one_error_line(capsys, "obj.npz: it holds an object array, which is never loaded")
    np.savez(tmp_path / "ok.npz", W_hat=np.random.default_rng(0).standard_normal((6, 4, 5)))
    np.save(tmp_path / "w.npy", np.full(15, 1 / 6).astype(object))
    assert main([*_fit_args(tmp_path / "ok.npz", tmp_path / "o"), "--weights", str(tmp_path / "w.npy")]) == 2
    _one_error_line(capsys, "w.npy: it holds an object array")
    (tmp_path / "t.npy").write_bytes(b"hello, not numpy\n")
    assert main([*_fit_args(tmp_path / "ok.npz", tmp_path / "o"), "--weights", str(tmp_path / "t.npy")]) == 2
    _one_error_line(capsys, "t.npy is not an .npy array file (numpy.save output): not a numpy file")
    assert not (tmp_path / "o").exists()
