"""CLAIR's cost as the number of clients K grows (issue 21), on the adapters path: one LoRA module
(2048 × 2048 by default), r = 8, automatic λ, exact reduction, ``aggregate_module`` with the
factored solver (``contrasts="factored"``, :mod:`lowrank_fl.clair.factored`) beside the dense one
it replaces (``contrasts="dense"``: FISTA on the (G·2r × K r) stacked pair contrasts).

    python benchmarks/bench_k_scaling.py [--K 10 20 40 80 160] [--dense-max-K 40] [--n 2048]
                                         [--no-7b]

Each (K, solver) runs in its own child process with BLAS limited to one thread
(threadpoolctl): CPU seconds of the module (``time.process_time``: on a shared machine the
contention-free number), peak traced memory (tracemalloc) and the child's max RSS, the
iterations of the final solve and of all solves (λ path included), the certified relative
duality gap, λ and the collaborative set (8). Growth exponents are least-squares slopes of
log CPU time against log K. A last part times one 4096 × 4096 module with 10 clients, r = 16
(the 7B-shaped CLI's module) both ways in one process (best of 3). ``--k100``: one 4096 × 4096
module with K = 100 clients, r = 16 (10 contaminated), the factored solver with its default SVT
(the warm-started block route, :mod:`lowrank_fl.clair.subspace`) beside the Lanczos route it
falls back to, in one process: CPU seconds, iterations, certified gap, the collaborative set.

Data: benign clients ``A_k = A_0 + 0.05 E_k`` (relative), unrelated ``A`` for the last
``max(1, K // 10)`` clients, ``B_k`` Gaussian (0.02), scaling 2. Writes
``results/bench_k_scaling.json``.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib
import json
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_module(K: int, n: int, r: int, seed: int = 0):
    from lowrank_fl.adapters.io import ModuleFactors

    rng = np.random.default_rng(seed)
    c = max(1, K // 10)
    A0 = np.linalg.qr(rng.standard_normal((n, r)))[0].T
    A = [A0 + 0.05 * np.sqrt(r / n) * rng.standard_normal((r, n)) for _ in range(K - c)]
    A += [np.linalg.qr(rng.standard_normal((n, r)))[0].T for _ in range(c)]
    B = [0.02 * rng.standard_normal((n, r)) for _ in range(K)]
    return ModuleFactors(name="m", A=A, B=B, scaling=np.full(K, 2.0))


def _counting_solves():
    """Count iterations of every solve of (7) inside aggregate_module (λ path + final)."""
    from lowrank_fl.adapters import aggregate as agg, tuning

    calls = []
    orig = tuning.solve_module

    def counted(*a, **k):
        sol = orig(*a, **k)
        calls.append(int(sol.iterations))
        return sol

    tuning.solve_module = agg.solve_module = counted
    return calls


def one(K: int, contrasts: str, n: int, r: int) -> dict:
    from threadpoolctl import threadpool_limits

    from lowrank_fl.adapters import ModuleOptions, aggregate_module

    f = make_module(K, n, r)
    calls = _counting_solves()
    opts = ModuleOptions(contrasts=contrasts, output_dtype="float64")
    with threadpool_limits(1):
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        c0, t0 = time.process_time(), time.perf_counter()
        res = aggregate_module(f, opts)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    return {"K": K, "contrasts": contrasts, "cpu_seconds": cpu, "wall_seconds": wall,
            "tracemalloc_peak_gb": peak / 2**30,
            "max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "iterations_final": res.iterations, "iterations_all_solves": calls,
            "relative_gap": res.relative_gap, "status": res.status, "lam_L": res.lam_L,
            "lam_S": res.lam_S, "lam_rule": res.lam_rule, "reduced_dims": list(res.reduced_dims),
            "pair_height": res.pair_height, "numerical_rank": res.numerical_rank,
            "excluded": [k for k, b in enumerate(res.benign) if not b],
            "objective": res.state["objective"], "load_avg": os.getloadavg()}


def module_7b(repeats: int = 3) -> dict:
    """One 4096² module, 10 clients, r = 16 (1 contaminated), both solvers in one process."""
    from threadpoolctl import threadpool_limits

    from lowrank_fl.adapters import ModuleOptions, aggregate_module
    from lowrank_fl.adapters.io import ModuleFactors

    rng = np.random.default_rng(0)
    n, K, r = 4096, 10, 16
    A0 = np.linalg.qr(rng.standard_normal((n, r)))[0].T
    A = [A0 + 0.05 * np.sqrt(r / n) * rng.standard_normal((r, n)) for _ in range(K - 1)]
    A.append(np.linalg.qr(rng.standard_normal((n, r)))[0].T)
    B = [0.02 * rng.standard_normal((n, r)) for _ in range(K)]
    f = ModuleFactors(name="m", A=A, B=B, scaling=np.full(K, 2.0))
    out = {}
    with threadpool_limits(1):
        for _ in range(repeats):
            for c in ("dense", "factored"):
                c0 = time.process_time()
                res = aggregate_module(f, ModuleOptions(contrasts=c))
                cpu = time.process_time() - c0
                prev = out.get(c)
                if prev is None or cpu < prev["cpu_seconds"]:
                    out[c] = {"cpu_seconds": cpu, "iterations": res.iterations,
                              "relative_gap": res.relative_gap, "lam_L": res.lam_L,
                              "excluded": [k for k, b in enumerate(res.benign) if not b]}
    out["ratio_dense_over_factored"] = out["dense"]["cpu_seconds"] / out["factored"]["cpu_seconds"]
    return out


def module_k100(K: int = 100, n: int = 4096, r: int = 16) -> dict:
    """One n² module, K clients, rank r: the default SVT (block) and the Lanczos route."""
    from unittest import mock

    from threadpoolctl import threadpool_limits

    from lowrank_fl.adapters import ModuleOptions, aggregate_module
    from lowrank_fl.clair import factored

    f = make_module(K, n, r)
    out = {"K": K, "n": n, "r": r}
    with threadpool_limits(1):
        for route in ("lanczos", "block"):
            # the Lanczos route: the block route declines every time (what it falls back to)
            patch = (mock.patch.object(factored, "_svt_block", lambda *a: None)
                     if route == "lanczos" else contextlib.nullcontext())
            with patch:
                c0, t0 = time.process_time(), time.perf_counter()
                res = aggregate_module(f, ModuleOptions(output_dtype="float64"))
                cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            out[route] = {"cpu_seconds": cpu, "wall_seconds": wall,
                          "iterations_final": res.iterations, "relative_gap": res.relative_gap,
                          "status": res.status, "lam_L": res.lam_L, "lam_S": res.lam_S,
                          "reduced_dims": list(res.reduced_dims),
                          "excluded": [k for k, b in enumerate(res.benign) if not b],
                          "load_avg": os.getloadavg()}
            print(f"K={K} {n}² r={r} {route:8s} {cpu:7.1f} CPU-s  its {res.iterations}  "
                  f"gap {res.relative_gap:.2e}  excluded {out[route]['excluded']}", flush=True)
    out["ratio_lanczos_over_block"] = out["lanczos"]["cpu_seconds"] / out["block"]["cpu_seconds"]
    out["same_collaborative_set"] = out["lanczos"]["excluded"] == out["block"]["excluded"]
    return out


def _slope(rows):
    if len(rows) < 2:
        return None
    x = np.log([r["K"] for r in rows])
    y = np.log([r["cpu_seconds"] for r in rows])
    return float(np.polyfit(x, y, 1)[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--K", type=int, nargs="*", default=[10, 20, 40, 80, 160])
    ap.add_argument("--dense-max-K", type=int, default=40)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--no-7b", action="store_true")
    ap.add_argument("--k100", action="store_true",
                    help="only the K = 100, 4096², r = 16 module (block vs Lanczos SVT)")
    ap.add_argument("--extra", type=Path, nargs="*", default=[],
                    help="JSON rows of earlier single runs (--one K CONTRASTS) to include, "
                         "marked separate_run (e.g. the dense solver at K = 80, ~4 CPU-minutes)")
    ap.add_argument("--one", nargs=2, metavar=("K", "CONTRASTS"), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results"
                    / "bench_k_scaling.json")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1], args.n, args.r)))
        return 0
    if args.k100:
        res = {"module_k100": module_k100()}
        old = json.loads(args.out.read_text()) if args.out.exists() else {}
        old.update(res)
        args.out.write_text(json.dumps(old, indent=1, default=str))
        return 0
    rows = []
    for K in args.K:
        for c in (("dense", "factored") if K <= args.dense_max_K else ("factored",)):
            cmd = [sys.executable, __file__, "--one", str(K), c, "--n", str(args.n),
                   "--r", str(args.r)]
            out = subprocess.run(cmd, capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
            if out.returncode:
                raise RuntimeError(f"K={K} {c} failed: {out.stderr[-2000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"K={K:4d} {c:9s} {row['cpu_seconds']:9.2f} CPU-s  "
                  f"peak {row['tracemalloc_peak_gb']:.3f} GB  rss {row['max_rss_gb']:.3f} GB  "
                  f"its {row['iterations_final']:4d} (all {sum(row['iterations_all_solves'])})  "
                  f"gap {row['relative_gap']:.1e}  excluded {row['excluded']}", flush=True)
    for path in args.extra:
        row = json.loads(path.read_text().strip().splitlines()[-1])
        row["separate_run"] = True
        rows.append(row)
        print(f"K={row['K']:4d} {row['contrasts']:9s} {row['cpu_seconds']:9.2f} CPU-s  "
              f"(separate run)  its {row['iterations_final']}  excluded {row['excluded']}")
    rows.sort(key=lambda r: (r["contrasts"], r["K"]))
    res = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
           "n": args.n, "r": args.r, "runs": rows}
    by = {c: [r for r in rows if r["contrasts"] == c] for c in ("dense", "factored")}
    res["growth_exponent"] = {c: _slope(v) for c, v in by.items()}
    common = sorted({r["K"] for r in by["dense"]} & {r["K"] for r in by["factored"]})
    res["speedup"] = {}
    for K in common:
        d = next(r for r in by["dense"] if r["K"] == K)
        f = next(r for r in by["factored"] if r["K"] == K)
        res["speedup"][K] = {"dense_over_factored": d["cpu_seconds"] / f["cpu_seconds"],
                             "same_collaborative_set": d["excluded"] == f["excluded"],
                             "lam_L_rel_diff": abs(d["lam_L"] - f["lam_L"]) / d["lam_L"],
                             "objective_rel_diff": abs(d["objective"] - f["objective"])
                             / abs(d["objective"])}
    print("growth exponents:", res["growth_exponent"], "speed-ups:", res["speedup"])
    if not args.no_7b:
        res["module_7b"] = module_7b()
        print("7B-shaped module:", json.dumps(res["module_7b"]))
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    old.update(res)
    args.out.write_text(json.dumps(old, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
