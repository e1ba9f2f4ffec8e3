"""One FedAvg round (tau = 5 local steps) on n = 1000 clients, d = 100, k = 5, m = 10 samples per
client: the batched implementation against a straightforward per-client Python loop.

Checks the iterates agree (max abs difference <= 1e-12; exits non-zero otherwise) and reports the
speed ratio (goal >= 20x), for the finite-sample mode (the benchmark's m = 10 samples) and the
population mode. The timed call is exactly the checked call. In the finite-sample mode the round is
checked and timed twice: computing the clients' Gram matrices X_i X_i^T itself, and given them
precomputed (what fedavg() does: once per run, fixed data); the one-off Gram cost is reported
separately. The per-client reference loop is shared with the tests (tests/_fedavg_reference.py).
Run:  python benchmarks/bench_fedavg_round.py   (prints a table, writes benchmarks/results/*.json)
"""
from __future__ import annotations

import json
import os
import platform
import sys
import timeit
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # one core each side: no BLAS threading in
os.environ.setdefault("OMP_NUM_THREADS", "1")        # the comparison (set before numpy loads)

import numpy as np  # noqa: E402

from lowrank_fl.algorithms.fedavg import fedavg_round  # noqa: E402
from lowrank_fl.problems.fedavg_ft import paper_instance  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _fedavg_reference import loop_round  # noqa: E402  (the tests' reference, one definition)

N_CLIENTS, D, K, M_SAMPLES, TAU, ALPHA = 1000, 100, 5, 10, 5, 0.05


def best_time(fn, repeat=5):
    return min(timeit.repeat(fn, number=1, repeat=repeat))


def main():
    inst = paper_instance(d=D, rank=K, n_clients=N_CLIENTS, step_size=ALPHA,
                          samples_per_client=M_SAMPLES,
                          noise=0.1, seed=0)
    p = inst.problem
    rng = np.random.default_rng(1)
    B = inst.B0
    w = 0.1 * rng.standard_normal(K)          # a generic state (w = 0 makes the first step trivial)
    rows = []
    make_gram = lambda: np.einsum("mad,mbd->mab", p.X, p.X)       # noqa: E731
    gram = make_gram()
    gram_s = best_time(make_gram, repeat=5)
    cases = (("empirical (Gram in round)", dict(X=p.X, y=p.y), dict(X=p.X, y=p.y)),
             ("empirical (Gram given)", dict(X=p.X, y=p.y, gram=gram), dict(X=p.X, y=p.y)),
             ("population", dict(targets=p.theta), dict(targets=p.theta)))
    for mode, kwb, kwl in cases:
        Bb, wb, _ = fedavg_round(B, w, ALPHA, local_steps=TAU, **kwb)   # the call timed below
        Bl, wl = loop_round(B, w, TAU, ALPHA, **kwl)
        diff = max(float(np.max(np.abs(Bb - Bl))), float(np.max(np.abs(wb - wl))))
        tb = best_time(lambda: fedavg_round(B, w, ALPHA, local_steps=TAU, **kwb), repeat=15)
        tl = best_time(lambda: loop_round(B, w, TAU, ALPHA, **kwl), repeat=3)
        rows.append({"mode": mode, "batched_s": tb, "loop_s": tl, "speedup": tl / tb,
                     "max_abs_diff": diff, "identical": bool(diff <= 1e-12)})
    print(f"FedAvg round: n={N_CLIENTS} clients, d={D}, k={K}, m={M_SAMPLES} samples, tau={TAU}")
    print(f"{'mode':<26} {'batched [ms]':>13} {'loop [ms]':>10} {'speedup':>8} {'max|diff|':>10}")
    for r in rows:
        print(f"{r['mode']:<26} {1e3 * r['batched_s']:>13.2f} {1e3 * r['loop_s']:>10.1f} "
              f"{r['speedup']:>7.1f}x {r['max_abs_diff']:>10.1e}")
    print(f"one-off Gram matrices X_i X_i^T (once per fedavg() run): {1e3 * gram_s:.2f} ms")
    out = Path(__file__).parent / "results" / "bench_fedavg_round.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "fedavg_round", "n_clients": N_CLIENTS, "d": D, "k": K,
        "samples_per_client": M_SAMPLES, "local_steps": TAU, "step_size": ALPHA,
        "gram_once_s": gram_s, "numpy": np.__version__, "python": platform.python_version(),
        "results": rows}, indent=2))
    print(f"wrote {out.name}")
    bad = [r["mode"] for r in rows if not r["identical"]]
    if bad:
        print(f"MISMATCH: batched and loop rounds differ by more than 1e-12 in: {', '.join(bad)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
