"""CLAIR on LoRA adapters at LLM scale (issue 8 §4).

    python benchmarks/bench_adapters.py [--quick] [--part 1 2 3 4 5 6] [--jobs 2] [--workdir DIR]

Part 1 — the whole CLI on a 7B-shaped synthetic set: 10 clients × 32 layers × {q,k,v,o}_proj,
4096 × 4096, r = 16, fp16 on disk, one contaminated client (written by
:func:`lowrank_fl.adapters.synthetic.write_synthetic_adapters`, real PEFT directories).
``lowrank-fl adapters aggregate --method clair --jobs N`` runs as a child process; wall time,
the CPU seconds of the process tree (user + system, sampled every 50 ms: on a shared machine
``cpu / 2`` is the wall time two idle cores would take) and the peak of the summed RSS are
reported, with the detection result. Goal: < 60 s and < 4 GB on 2 cores.

Part 2 — exactness at size: one 1024 × 1024 module, K = 10: the reduced pipeline
(:func:`lowrank_fl.adapters.aggregate_module`) against :func:`lowrank_fl.clair.fit` on the full
(K, 1024, 1024) updates with the same λ; same objective / projector / benign set / refined ΔW,
and the speed ratio (goal >= 100x).

Part 3 — K = 50, r = 8 (Σ r_k = 400) on one 4096 × 4096 module: time and memory of one module,
split into reading, reduction, λ tuning and the final solve.

Part 4 — K = 100 clients, two 2048 × 2048 modules (``q_proj``, ``v_proj`` of one layer), r = 16,
10 contaminated, the CLI's defaults (split outputs): wall, CPU, peak RSS, output size over input
size, the clients flagged. Goal (issue 30): < 60 s on 2 cores, at most 3x the inputs.

Part 5 — the 7B-shaped federation of 100 clients (128 modules of 4096², r = 16, 10 contaminated),
the CLI's defaults. Goal: under 20 minutes and 4 GB on 2 cores. ``--workdir`` keeps the
generated inputs (3.4 GB of fp16) between runs.

Part 6 — part 1's set through ``--scheduler`` on a local dask cluster of 1, 2 and 4 single-thread
workers (``dask scheduler`` and ``dask worker`` started by the script).

Parts 1 and 4-6 run the CLI with its defaults (outputs in the inputs' dtype, fp16). Writes
``results/bench_adapters.json`` next to this script.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _tree_sample(proc, cpu: dict) -> int:
    """Summed RSS of the process tree; records each process's CPU seconds in ``cpu``."""
    import psutil

    try:
        p = psutil.Process(proc.pid)
        procs = [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
            t = q.cpu_times()
            cpu[q.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _synthetic(workdir: Path, K: int, layers: int, shape, contaminated: int, modules=None) -> tuple:
    """``write_synthetic_adapters`` into ``workdir`` (kept between runs); (data dir, seconds).
    The set is written through :class:`lowrank_fl.outdir.OutputDir` (staged, marked): an existing
    directory of that name is reused or replaced only when this script wrote it, never a user's."""
    from lowrank_fl.adapters.synthetic import LLAMA_ATTENTION, write_synthetic_adapters
    from lowrank_fl.outdir import OutputDir, is_output_dir

    modules = LLAMA_ATTENTION if modules is None else modules
    data = workdir / f"adapters_K{K}_L{layers}_{len(modules)}x{shape[0]}"
    t0 = time.perf_counter()
    if not (is_output_dir(data) and (data / f"client_{K - 1:02d}" / "adapter_config.json").exists()):
        with OutputDir(data, command="bench_adapters synthetic set", overwrite=True,
                       option="--workdir") as o:
            write_synthetic_adapters(o.dir, n_clients=K, n_layers=layers, modules=modules, shape=shape,
                                     rank=16, contaminated=contaminated, dtype="float16", seed=0)
            o.commit()
    return data, time.perf_counter() - t0


def part1(workdir: Path, quick: bool, jobs: int, extra=(), K: int = 10, layers=None,
          shape=(4096, 4096), contaminated: int = 1, modules=None, scheduler=None) -> dict:
    """The CLI on a synthetic set (default: part 1's 7B-shaped K = 10; parts 4-6 reuse it)."""
    from lowrank_fl.outdir import is_output_dir

    layers = (4 if quick else 32) if layers is None else layers
    data, gen = _synthetic(workdir, K, layers, shape, contaminated, modules)
    out = workdir / "out"
    dirs = sorted(str(p) for p in data.iterdir() if p.is_dir())
    # --overwrite: the CLI replaces "out" only when it wrote it (its marker), never a user's folder
    cmd = [sys.executable, "-m", "lowrank_fl.cli", "adapters", "aggregate", *dirs, "--method",
           "clair", "--out", str(out), "--overwrite", "--quiet", *extra]
    cmd += ["--jobs", str(jobs)] if scheduler is None else ["--scheduler", scheduler]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak, cpu = 0, {}
    while proc.poll() is None:
        peak = max(peak, _tree_sample(proc, cpu))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"CLI failed ({proc.returncode}): {stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    mods = summary["modules"]
    flagged = {c: summary["client_benign"]["n_modules"] - n
               for c, n in summary["client_benign"]["modules_benign"].items()}
    out_bytes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    res = {"modules": len(mods), "clients": len(summary["clients"]), "jobs": jobs,
           "generate_seconds": gen, "cli_seconds": wall, "solve_seconds": summary["seconds"],
           "cpu_seconds_tree": sum(cpu.values()),
           "cpu_seconds_main": cpu.get(proc.pid, 0.0),
           "cpu_seconds_workers": sum(v for k, v in cpu.items() if k != proc.pid),
           # what two idle cores would take: the workers' share split over the jobs, plus the
           # main process (loading, collecting, writing), which runs mostly alone
           "idle_estimate_seconds": cpu.get(proc.pid, 0.0)
           + sum(v for k, v in cpu.items() if k != proc.pid) / jobs,
           "load_avg_after": os.getloadavg(), "peak_rss_gb": peak / 2**30, "flagged_modules_per_client": flagged,
           "max_relative_gap": max(m["relative_gap"] for m in mods.values()),
           "statuses": sorted({m["status"] for m in mods.values()}),
           "lam_rules": sorted({m["lam_rule"] for m in mods.values()}),
           "reduced_dims": sorted({tuple(m["reduced_dims"]) for m in mods.values()}),
           "output_gb": out_bytes / 2**30, "stdout": [line.replace(str(out), "OUT") for line in stdout.strip().splitlines()[:3]],
           "input_gb": sum(f.stat().st_size for f in data.rglob("*") if f.is_file()) / 2**30,
           "flagged_clients": sorted(c for c, n in flagged.items() if n)}
    res["output_over_input"] = res["output_gb"] / res["input_gb"]
    if is_output_dir(out):                         # what the CLI wrote (its marker), nothing else
        shutil.rmtree(out)
    return res


def part4(workdir: Path, quick: bool, jobs: int) -> dict:
    """K = 100 clients, two 2048 × 2048 modules, r = 16, 10 contaminated, the CLI's defaults
    (issue 30's check: < 60 s on 2 cores, outputs at most 3x the inputs, exactly the 10 flagged)."""
    K = 20 if quick else 100
    return part1(workdir, quick, jobs, K=K, layers=1, shape=(2048, 2048), contaminated=K // 10,
                 modules=("q_proj", "v_proj"))


def part5(workdir: Path, quick: bool, jobs: int) -> dict:
    """The 7B-shaped federation of 100 clients: 128 modules of 4096², r = 16, 10 contaminated,
    the CLI's defaults (goal: under 20 minutes and 4 GB on 2 cores)."""
    K = 20 if quick else 100
    return part1(workdir, quick, jobs, K=K, layers=2 if quick else 32, contaminated=K // 10)


def part6(workdir: Path, quick: bool, jobs: int) -> dict:
    """Part 1's set across a local dask cluster (``dask scheduler`` + ``dask worker`` processes,
    one thread each) of 1, 2 and 4 workers: the CLI's ``--scheduler``."""
    out = {}
    for n in (1, 2, 4):
        port = 8800 + n
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
        sched = subprocess.Popen(dask + ["--host", "127.0.0.1", "--port", str(port),
                                         "--dashboard-address", ":0"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wk = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                               f"tcp://127.0.0.1:{port}", "--nworkers", str(n), "--nthreads", "1",
                               "--host", "127.0.0.1", "--no-dashboard", "--memory-limit", "0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(8)
            out[n] = part1(workdir, quick, jobs, scheduler=f"tcp://127.0.0.1:{port}")
            print(f"dask workers {n}: {out[n]['cli_seconds']:.1f} s", flush=True)
        finally:
            for proc in (wk, sched):
                proc.terminate()
                proc.wait(timeout=60)
    return out


def part2(quick: bool) -> dict:
    from lowrank_fl import clair
    from lowrank_fl.adapters import ModuleOptions, aggregate_module
    from lowrank_fl.adapters.io import ModuleFactors
    from lowrank_fl.adapters.reduce import reduce_module

    n = 256 if quick else 1024
    K, r = 10, 16
    rng = np.random.default_rng(1)
    A0 = np.linalg.qr(rng.standard_normal((n, r)))[0].T
    A = [A0 + 0.05 * rng.standard_normal((r, n)) / np.sqrt(n) for _ in range(K - 1)]
    A.append(np.linalg.qr(rng.standard_normal((n, r)))[0].T)
    B = [0.02 * rng.standard_normal((n, r)) for _ in range(K)]
    f = ModuleFactors(name="m", A=A, B=B, scaling=np.full(K, 2.0))
    opts = ModuleOptions(method="clair", output_dtype="float64", tol=1e-10)
    t0 = time.perf_counter()
    auto = aggregate_module(f, opts)                     # automatic λ (timed separately)
    t_auto = time.perf_counter() - t0
    opts = ModuleOptions(method="clair", lam_L=auto.lam_L, lam_S=auto.lam_S,
                         output_dtype="float64", tol=1e-10)
    t0 = time.perf_counter()
    red = aggregate_module(f, opts)
    t_red = time.perf_counter() - t0
    W = np.stack([f.delta(k) for k in range(K)])
    t0 = time.perf_counter()
    full = clair.fit(W, rank=red.rank, lam_L=red.lam_L, lam_S=red.lam_S, tol=1e-10,
                     refinement="closed-form")
    t_full = time.perf_counter() - t0
    rm = reduce_module(f)
    Z = red.state["Z"]
    P = rm.V @ Z @ Z.T @ rm.V.T
    errs = []
    for k in range(K):
        Bk, Ak, _ = red.outputs(k)
        errs.append(np.linalg.norm(Bk @ Ak - full.refined[k]) / np.linalg.norm(full.refined[k]))
    return {"n": n, "K": K, "rank": r, "reduced_seconds": t_red, "full_seconds": t_full,
            "speed_ratio": t_full / t_red, "auto_lambda_seconds": t_auto,
            "objective_rel_diff": abs(red.state["objective"] - full.solution.objective)
            / full.solution.objective,
            "projector_diff": float(np.abs(P - full.projector).max()),
            "same_benign": bool(np.array_equal(red.benign, full.benign)),
            "refined_rel_err_max": float(max(errs)), "iterations": [red.iterations,
                                                                  full.solution.iterations]}


def part3(quick: bool) -> dict:
    from lowrank_fl.adapters import ModuleOptions, aggregate_module
    from lowrank_fl.adapters.io import ModuleFactors
    from lowrank_fl.adapters.reduce import pair_blocks, reduce_module
    from lowrank_fl.adapters.tuning import auto_lambdas

    n = 1024 if quick else 4096
    K, r = 50, 8
    rng = np.random.default_rng(2)
    A0 = np.linalg.qr(rng.standard_normal((n, r)))[0].T
    A = [A0 + 0.05 * rng.standard_normal((r, n)) / np.sqrt(n) for _ in range(K - 2)]
    A += [np.linalg.qr(rng.standard_normal((n, r)))[0].T for _ in range(2)]
    B = [0.02 * rng.standard_normal((n, r)) for _ in range(K)]
    f = ModuleFactors(name="m", A=A, B=B, scaling=np.full(K, 2.0))
    tracemalloc.start()
    t0 = time.perf_counter()
    red = reduce_module(f)
    t_red = time.perf_counter() - t0
    D, h = pair_blocks(red)
    t_pair = time.perf_counter() - t0 - t_red
    t1 = time.perf_counter()
    lam = auto_lambdas(D, h, K, r, weights=np.full(D.shape[0] // h, 1.0 / K))
    t_tune = time.perf_counter() - t1
    t1 = time.perf_counter()
    res = aggregate_module(f, ModuleOptions(lam_L=lam.lam_L, lam_S=lam.lam_S))
    t_total_given = time.perf_counter() - t1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"n": n, "K": K, "rank": r, "reduced_dims": list(red.dims), "pair_height": h,
            "D_shape": list(D.shape), "reduce_seconds": t_red, "pair_blocks_seconds": t_pair,
            "tuning_seconds": t_tune, "module_seconds_given_lambda": t_total_given,
            "iterations": res.iterations, "lam_rule": lam.rule,
            "flagged": [i for i, b in enumerate(res.benign) if not b],
            "tracemalloc_peak_gb": peak / 2**30}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_adapters_"))
    workdir.mkdir(parents=True, exist_ok=True)
    res = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "load_avg": os.getloadavg()}, "quick": args.quick}
    sys.path.insert(0, str(ROOT))
    if 1 in args.part:
        res["cli_7b"] = part1(workdir, args.quick, args.jobs)
        print("part 1:", json.dumps(res["cli_7b"], indent=1))
    if 2 in args.part:
        res["exact_1024"] = part2(args.quick)
        print("part 2:", json.dumps(res["exact_1024"], indent=1))
    if 3 in args.part:
        res["k50_r8"] = part3(args.quick)
        print("part 3:", json.dumps(res["k50_r8"], indent=1))
    for part, key, fn in ((4, "cli_k100_2048", part4), (5, "cli_7b_k100", part5), (6, "dask_workers", part6)):
        if part in args.part:
            res[key] = fn(workdir, args.quick, args.jobs)
            print(f"part {part}:", json.dumps(res[key], indent=1, default=str), flush=True)
    res["max_rss_gb_this_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if not args.quick:
        path = Path(__file__).parent / "results" / "bench_adapters.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        old.update(res)
        path.write_text(json.dumps(old, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
