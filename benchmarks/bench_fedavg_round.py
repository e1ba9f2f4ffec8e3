"""One FedAvg round (tau = 5 local steps) on n = 1000 clients, d = 100, k = 5, m = 10 samples per
client: the batched implementation against a straightforward per-client Python loop.

Checks the iterates agree (max abs difference <= 1e-12) and reports the speed ratio (goal >= 20x),
for the finite-sample mode (the benchmark's m = 10 samples) and the population mode.
Run:  python benchmarks/bench_fedavg_round.py   (prints a table, writes benchmarks/results/*.json)
"""
from __future__ import annotations

import json
import os
import platform
import timeit
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # one core each side: no BLAS threading in
os.environ.setdefault("OMP_NUM_THREADS", "1")        # the comparison (set before numpy loads)

import numpy as np  # noqa: E402

from lowrank_fl.algorithms.fedavg import fedavg_round
from lowrank_fl.problems.fedavg_ft import paper_instance

N_CLIENTS, D, K, M_SAMPLES, TAU, ALPHA = 1000, 100, 5, 10, 5, 0.05


def loop_round(B, w, tau, alpha, *, targets=None, X=None, y=None):
    """Per-client reference: copy (B, w), run tau simultaneous GD steps, average."""
    n = len(targets) if targets is not None else len(X)
    B_sum, w_sum = np.zeros_like(B), np.zeros_like(w)
    for i in range(n):
        Bi, wi = B.copy(), w.copy()
        for _ in range(tau):
            if targets is not None:
                e = Bi @ wi - targets[i]
            else:
                e = X[i].T @ (X[i] @ (Bi @ wi) - y[i]) / X[i].shape[0]
            Bi, wi = Bi - alpha * np.outer(e, wi), wi - alpha * Bi.T @ e
        B_sum += Bi
        w_sum += wi
    return B_sum / n, w_sum / n


def best_time(fn, repeat=5):
    return min(timeit.repeat(fn, number=1, repeat=repeat))


def main():
    inst = paper_instance(D, K, N_CLIENTS, step_size=ALPHA, samples_per_client=M_SAMPLES,
                          noise=0.1, seed=0)
    p = inst.problem
    rng = np.random.default_rng(1)
    B = inst.B0
    w = 0.1 * rng.standard_normal(K)          # a generic state (w = 0 makes the first step trivial)
    rows = []
    # fedavg() computes the clients' Gram matrices X_i X_i^T once per run (fixed data); a round
    # uses them, so the timed batched round gets them precomputed too
    gram = np.einsum("mad,mbd->mab", p.X, p.X)
    for mode, kw in (("empirical", dict(X=p.X, y=p.y)), ("population", dict(targets=p.theta))):
        Bb, wb = fedavg_round(B, w, TAU, ALPHA, **kw)
        Bl, wl = loop_round(B, w, TAU, ALPHA, **kw)
        diff = max(float(np.max(np.abs(Bb - Bl))), float(np.max(np.abs(wb - wl))))
        kwb = dict(kw, gram=gram) if mode == "empirical" else kw
        tb = best_time(lambda: fedavg_round(B, w, TAU, ALPHA, **kwb), repeat=15)
        tl = best_time(lambda: loop_round(B, w, TAU, ALPHA, **kw), repeat=3)
        rows.append({"mode": mode, "batched_s": tb, "loop_s": tl, "speedup": tl / tb,
                     "max_abs_diff": diff, "identical": diff <= 1e-12})
    print(f"FedAvg round: n={N_CLIENTS} clients, d={D}, k={K}, m={M_SAMPLES} samples, tau={TAU}")
    print(f"{'mode':<11} {'batched [ms]':>13} {'loop [ms]':>10} {'speedup':>8} {'max|diff|':>10}")
    for r in rows:
        print(f"{r['mode']:<11} {1e3 * r['batched_s']:>13.2f} {1e3 * r['loop_s']:>10.1f} "
              f"{r['speedup']:>7.1f}x {r['max_abs_diff']:>10.1e}")
    out = Path(__file__).parent / "results" / "bench_fedavg_round.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "fedavg_round", "n_clients": N_CLIENTS, "d": D, "k": K,
        "samples_per_client": M_SAMPLES, "local_steps": TAU, "step_size": ALPHA,
        "numpy": np.__version__, "python": platform.python_version(), "results": rows}, indent=2))
    print(f"wrote {out.name}")


if __name__ == "__main__":
    main()
