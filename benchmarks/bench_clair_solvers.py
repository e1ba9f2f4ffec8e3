"""Speed of the solvers of CLAIR's penalized program (7).

    python benchmarks/bench_clair_solvers.py [--quick] [--cap SECONDS]

Relative duality gaps are ``gap / F(0, 0)`` (``SolverResult.relative_gap``; the objective at
``L = S = 0``, so they do not depend on the data's units).

Part 1 (K = 20, q = p = 10, G = 190): time to a relative duality gap of 1e-8 for FISTA and
Algorithm 1 as printed (proximal gradient, t = 1/(2 max w)), and the exact CVXPY solves: Clarabel
and SCS with the block-Schur nuclear norm, and ``cp.normNuc`` on the tall matrix (capped: reported
as "> cap s" when it does not finish). Objectives are compared (goal: 1e-6 relative) and speed ratios
are taken against the fastest CVXPY solve (goal: FISTA >= 100x faster).

Part 2 (K = 100, q = p = 32, G = 4950, D is 158400 x 32): FISTA to a relative gap of 1e-6: time,
iterations, time per iteration against one LAPACK thin SVD of D, and peak memory (tracemalloc
peak of the solve, and the process's max RSS). Goal: under a minute and under 2 GB.

Prints a table and writes ``results/bench_clair_solvers.json`` next to this script.
"""
from __future__ import annotations

import os

# One BLAS thread per process: the matrices are thin (p <= 32), and multithreaded OpenBLAS on
# small products stalls when the cores are shared (measured 10-300x slower per call). Set before
# numpy is imported; override by exporting OPENBLAS_NUM_THREADS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json
import multiprocessing as mp
import platform
import resource
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np  # noqa: E402

from lowrank_fl.clair.contrasts import contrasts
from lowrank_fl.clair.penalized import solve_penalized
from lowrank_fl.clair.simulate import generate


def _instance(K, p, q, r, seed=0):
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=max(1, K // 10), noise=0.3 / np.sqrt(K), seed=seed)
    return contrasts(inst.W_hat)


def _lams(K):
    return 1.0 / np.sqrt(K), 3.0 / K ** 1.5          # §7 scalings, (c1, c2) = (1, 3)


def _cvx_worker(conn, D, q, lam_L, lam_S, solver, nuclear):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # an uncertified answer is reported in the table
            res = solve_penalized(D, q, lam_L, lam_S, method="cvxpy", solver=solver,
                                  nuclear=nuclear)
        conn.send({"objective": res.objective, "gap": res.gap, "status": res.status,
                   "relative_gap": res.relative_gap, "iterations": res.iterations,
                   "solve_seconds": res.seconds})
    except Exception as exc:  # report, never hide
        conn.send({"error": repr(exc)})
    conn.close()


def _run_capped(cap, *args):
    """Run one CVXPY solve in a child process, killed after ``cap`` seconds."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_cvx_worker, args=(child, *args))
    t0 = time.perf_counter()
    proc.start()
    child.close()                      # so a crashed child shows up as EOF, not as a timeout
    out = None
    if parent.poll(cap):
        try:
            out = parent.recv()
        except EOFError:               # the solver process died (e.g. a failed huge allocation)
            out = {"error": "solver process crashed"}
    wall = time.perf_counter() - t0
    if out is None:
        proc.kill()
    proc.join()
    if out is None:
        return {"seconds": None, "capped": cap}
    if "error" in out and proc.exitcode:
        out["error"] += f" (exit code {proc.exitcode})"
    out["seconds"] = wall
    return out


def part1(K, p, q, cap):
    D = _instance(K, p, q, 2)
    lam_L, lam_S = _lams(K)
    rows = {}
    for method in ("fista", "proxgrad"):
        solve_penalized(D, q, lam_L, lam_S, method=method, max_iter=3, tol=None)  # warm-up
        t0 = time.perf_counter()
        res = solve_penalized(D, q, lam_L, lam_S, method=method, tol=1e-8, max_iter=100000)
        rows[method] = {"seconds": time.perf_counter() - t0, "objective": res.objective,
                        "gap": res.gap, "relative_gap": res.relative_gap,
                        "iterations": res.iterations, "status": res.status}
    for name, solver, nuclear in (("cvxpy:CLARABEL", "CLARABEL", "schur"),
                                  ("cvxpy:SCS", "SCS", "schur"),
                                  ("cvxpy:CLARABEL:normNuc", "CLARABEL", "normNuc")):
        rows[name] = _run_capped(cap, D, q, lam_L, lam_S, solver, nuclear)
    ref = rows["fista"]["objective"]
    for row in rows.values():
        if row.get("objective") is not None:
            row["objective_rel_diff_vs_fista"] = abs(row["objective"] - ref) / abs(ref)
    cvx_times = [r["seconds"] for k, r in rows.items() if k.startswith("cvxpy")
                 and r.get("seconds") is not None and "error" not in r]
    fastest = min(cvx_times) if cvx_times else None
    for row in rows.values():
        if fastest and row.get("seconds") and "error" not in row:
            row["speedup_vs_fastest_cvxpy"] = fastest / row["seconds"]
    return {"K": K, "p": p, "q": q, "G": K * (K - 1) // 2, "rows": rows}


def part2(K, p, q, tol):
    D = _instance(K, p, q, 2)
    lam_L, lam_S = _lams(K)
    svd_seconds = np.inf
    for _ in range(3):                                 # best of 3 (shared machine)
        t0 = time.perf_counter()
        np.linalg.svd(D, full_matrices=False)
        svd_seconds = min(svd_seconds, time.perf_counter() - t0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = solve_penalized(D, q, lam_L, lam_S, method="fista", tol=tol, max_iter=5000)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    per_iter = seconds / max(res.iterations, 1)
    return {"K": K, "p": p, "q": q, "G": K * (K - 1) // 2, "rows_D": D.shape[0],
            "D_megabytes": D.nbytes / 2 ** 20, "tol": tol, "seconds": seconds,
            "iterations": res.iterations, "status": res.status,
            "relative_gap": res.relative_gap, "seconds_per_iteration": per_iter,
            "thin_svd_seconds": svd_seconds, "iteration_over_svd": per_iter / svd_seconds,
            "rank_L": res.rank(1e-6, float(np.linalg.norm(D, 2))),
            "tracemalloc_peak_megabytes": peak / 2 ** 20,
            "max_rss_megabytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _fmt(x, unit=""):
    return "-" if x is None else f"{x:.3g}{unit}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    ap.add_argument("--cap", type=float, default=None, help="time cap per CVXPY solve (s)")
    args = ap.parse_args(argv)
    if args.quick:
        p1 = part1(8, 6, 6, args.cap or 20.0)
        p2 = part2(30, 16, 16, 1e-6)
    else:
        p1 = part1(20, 10, 10, args.cap or 300.0)
        p2 = part2(100, 32, 32, 1e-6)
    print(f"Part 1: K={p1['K']}, p=q={p1['p']}, G={p1['G']} (relative gap target 1e-8)")
    print(f"{'method':26s} {'time':>10s} {'iters':>7s} {'rel.gap':>9s} {'obj diff':>9s} "
          f"{'speedup':>9s}  status")
    for name, r in p1["rows"].items():
        t = f"> {r['capped']:.0f} s" if r.get("capped") else _fmt(r.get("seconds"), " s")
        if "error" in r:
            t = "crashed" if "crashed" in r["error"] else "error"
        print(f"{name:26s} {t:>10s} {str(r.get('iterations', '-')):>7s} "
              f"{_fmt(r.get('relative_gap')):>9s} {_fmt(r.get('objective_rel_diff_vs_fista')):>9s} "
              f"{_fmt(r.get('speedup_vs_fastest_cvxpy'), 'x'):>9s}  {r.get('status', '-')}")
    print(f"\nPart 2: K={p2['K']}, p=q={p2['p']}, G={p2['G']}, D {p2['rows_D']} x {p2['p']} "
          f"({p2['D_megabytes']:.0f} MB), FISTA to relative gap {p2['tol']:g}")
    for key in ("seconds", "iterations", "status", "relative_gap", "seconds_per_iteration",
                "thin_svd_seconds", "iteration_over_svd", "rank_L",
                "tracemalloc_peak_megabytes", "max_rss_megabytes"):
        v = p2[key]
        print(f"  {key:28s} {v if isinstance(v, (str, int)) else f'{v:.4g}'}")
    out = {"quick": args.quick, "machine": platform.platform(), "numpy": np.__version__,
           "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
           "part1": p1, "part2": p2}
    path = Path(__file__).parent / "results" / "bench_clair_solvers.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=float))
    print(f"\nwrote {path.name}")


if __name__ == "__main__":
    main()
