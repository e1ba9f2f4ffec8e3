"""The benchopt benchmark ``benchmarks/benchopt_clair`` runs at a tiny size and its results are
the library's certified values (CI installs the ``benchopt`` extra; importorskip only guards a
bare install)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("benchopt")
pd = pytest.importorskip("pandas")          # a benchopt dependency (results are parquet)

from lowrank_fl.clair import contrasts, penalized_objective, solve_penalized  # noqa: E402
from lowrank_fl.clair.simulate import generate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks" / "benchopt_clair"


def _benchopt():
    exe = Path(sys.executable).with_name("benchopt")
    return [str(exe)] if exe.exists() else [shutil.which("benchopt") or "benchopt"]


@pytest.mark.slow
def test_benchopt_benchmark_tiny(tmp_path):
    inst = generate(n_clients=4, p=4, q=3, rank=2, contaminated=1, noise=1e-2, seed=5)
    npz = tmp_path / "mine.npz"
    np.savez(npz, W_hat=inst.W_hat)
    out = tmp_path / "res.parquet"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]), OPENBLAS_NUM_THREADS="1")
    cmd = _benchopt() + ["run", str(BENCH), "-d", "clair-simulation[K=4,p=4,q=4,n=50]",
                         "-d", f"npz[path={npz}]", "-n", "6", "--timeout", "120",
                         "--no-plot", "--no-cache", "--output", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    df = pd.read_parquet(out)
    assert set(df["solver_name"]) >= {"fista", "algorithm1", "cvxpy[solver=CLARABEL]",
                                      "cvxpy[solver=SCS]"}
    assert set(df["dataset_name"]) == {"clair-simulation[K=4,n=50,p=4,q=4]",
                                       f"npz[path={npz}]"}
    assert (df["objective_duality_gap"] >= -1e-12).all()
    # the user's npz: the conic solves reach the optimum certified by the library's gap, and
    # every iterate's objective lies above it
    mine = df[df["dataset_name"] == f"npz[path={npz}]"]
    D = contrasts(inst.W_hat)
    K = 4
    lam_L, lam_S = 1.0 / np.sqrt(K), 3.0 / K ** 1.5             # the objective's c_L, c_S
    ref = solve_penalized(D, 3, lam_L, lam_S, tol=1e-10, max_iter=100_000)
    cvx = mine[mine["solver_name"] == "cvxpy[solver=CLARABEL]"]
    assert cvx["objective_relative_gap"].iloc[-1] < 1e-6
    assert cvx["objective_value"].iloc[-1] == pytest.approx(ref.objective, rel=1e-6)
    assert (mine["objective_value"] >= ref.objective - ref.gap - 1e-12).all()
    fista = mine[mine["solver_name"] == "fista"].sort_values("stop_val")
    Z = np.zeros_like(D)
    assert fista["objective_value"].iloc[0] == pytest.approx(
        penalized_objective(D, 3, Z, Z, lam_L, lam_S), rel=1e-12)   # n_iter = 0: L = S = 0
    assert fista["objective_value"].iloc[-1] < fista["objective_value"].iloc[0]
