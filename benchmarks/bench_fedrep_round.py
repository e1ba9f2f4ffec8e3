"""One FedRep round (Algorithm 2): batched over clients vs a per-client Python loop.

n = 1000 clients, d = 100, k = 5, m = 10 (fresh Gaussian batch, noiseless). Checks that both give
the same iterate (max abs difference <= 1e-12; exits with status 1 otherwise, after writing the
JSON) and reports the speed ratio (goal >= 20x).

Run:  python benchmarks/bench_fedrep_round.py   (writes benchmarks/results/bench_fedrep_round.json)
"""
from __future__ import annotations

import os

# single-threaded BLAS for both implementations: on a shared 2-core machine a multi-threaded BLAS
# spends most of its time spin-waiting (measured: a (10000 x 100) @ (100 x 5) product 6x slower)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json
import platform
import sys
import timeit
from pathlib import Path

import numpy as np

from lowrank_fl.algorithms.fedrep import fedrep_round
from lowrank_fl.problems.multitask import multitask_linear


def loop_round(B, X, y, eta):
    """The same round written plainly: one client at a time."""
    n, m, _ = X.shape
    Bbar = np.zeros_like(B)
    W = np.empty((n, B.shape[1]))
    for i in range(n):
        A = X[i] @ B
        w = np.linalg.solve(A.T @ A, A.T @ y[i])
        Bbar += B - eta * (X[i].T @ (A @ w - y[i]))[:, None] * w[None, :] / m
        W[i] = w
    Q, R = np.linalg.qr(Bbar / n)
    return Q, W


def main(n=1000, d=100, k=5, m=10, eta=0.1, repeat=15):
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=0)
    X, y = p.sample(m, seed=1)
    B = np.linalg.qr(np.random.default_rng(2).standard_normal((d, k)))[0]
    fast = fedrep_round(B, X, y, eta)
    Q, W = loop_round(B, X, y, eta)
    diff_B = float(np.max(np.abs(fast.B - Q)))
    diff_W = float(np.max(np.abs(fast.heads - W)))
    t_fast = min(timeit.repeat(lambda: fedrep_round(B, X, y, eta), number=5, repeat=repeat)) / 5
    t_loop = min(timeit.repeat(lambda: loop_round(B, X, y, eta), number=1, repeat=repeat))
    out = {"n": n, "d": d, "k": k, "m": m, "batched_seconds": t_fast, "loop_seconds": t_loop,
           "speedup": t_loop / t_fast, "max_abs_diff_B": diff_B, "max_abs_diff_heads": diff_W,
           "identical_to_1e-12": diff_B <= 1e-12 and diff_W <= 1e-12,
           "load_average_1min": os.getloadavg()[0], "numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine()}
    print(f"{'implementation':<16}{'seconds/round':>15}")
    print(f"{'batched':<16}{t_fast:>15.5f}")
    print(f"{'per-client loop':<16}{t_loop:>15.5f}")
    print(f"speedup {out['speedup']:.1f}x   max|dB| {diff_B:.1e}   max|dW| {diff_W:.1e}")
    path = Path(__file__).resolve().parent / "results" / "bench_fedrep_round.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    result = main()
    if not result["identical_to_1e-12"]:
        print("FAIL: batched and per-client rounds differ by more than 1e-12", file=sys.stderr)
        sys.exit(1)
