"""``lowrank-fl adapters inspect|aggregate``: CLAIR and baselines on PEFT LoRA adapter directories.

::

    lowrank-fl adapters inspect DIR [DIR ...] [--summary OUT/summary.json] [--figure FILE.png]
    lowrank-fl adapters aggregate DIR [DIR ...] --method clair --out OUT [--rank-out R] [--rank R]
        [--lam-L X --lam-S Y] [--client-rule per-module|majority|any|pooled] [--energy E]
        [--byzantine F] (--method krum|multikrum|median|trimmed-mean|geomed: robust baselines)
        [--dtype float32|float16] [--jobs N] [--scheduler ADDR] [--overwrite]

Bad input (missing files, non-LoRA adapters, mismatched modules or shapes, non-finite or
truncated weights, fewer than 2 clients, a non-empty OUT without --overwrite, an unknown method)
prints one line naming the file or module and exits with status 2; nothing is written.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .aggregate import CLIENT_RULES, METHODS, ModuleOptions
from .io import load_adapters
from .reduce import reduce_module

__all__ = ["add_parser", "run_inspect", "run_aggregate"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``adapters`` (``inspect``, ``aggregate``) to an argparse sub-parser set."""
    top = subparsers.add_parser("adapters", help="CLAIR and baselines on PEFT LoRA adapters")
    sub = top.add_subparsers(dest="adapters_command", required=True)

    ins = sub.add_parser("inspect", help="shapes, ranks, norms, joint-subspace dimensions")
    ins.add_argument("dirs", nargs="+", type=Path, help="client adapter directories")
    ins.add_argument("--summary", type=Path, default=None,
                     help="an aggregate's summary.json: also draw the detection heatmap")
    ins.add_argument("--figure", type=Path, default=None,
                     help="where to save the clients x modules heatmap (needs --summary)")
    ins.set_defaults(handler=run_inspect)

    agg = sub.add_parser("aggregate", help="aggregate client adapters into PEFT adapters")
    agg.add_argument("dirs", nargs="+", type=Path, help="client adapter directories (K >= 2)")
    agg.add_argument("--method", default="clair",
                     help=f"aggregator: {', '.join(METHODS)} (default clair)")
    agg.add_argument("--out", type=Path, required=True, help="output directory")
    agg.add_argument("--rank-out", dest="rank_out", type=int, default=None,
                     help="truncate every output adapter to this rank by SVD (error reported)")
    agg.add_argument("--rank", type=int, default=None,
                     help="rank of P_A (CLAIR) / of FlexLoRA's SVD; default the LoRA rank")
    agg.add_argument("--lam-L", dest="lam_L", type=float, default=None,
                     help="nuclear penalty of (7) (with --lam-S; default automatic per module)")
    agg.add_argument("--lam-S", dest="lam_S", type=float, default=None,
                     help="block penalty of (7) (with --lam-L)")
    agg.add_argument("--alpha", type=float, default=0.5, help="majority fraction of (8)")
    agg.add_argument("--client-rule", dest="client_rule", default="per-module",
                     choices=CLIENT_RULES, help="how per-module benign sets decide refinement")
    agg.add_argument("--byzantine", type=int, default=None,
                     help="f, the Byzantine clients krum/multikrum/trimmed-mean tolerate "
                          "(default floor((K-3)/2))")
    agg.add_argument("--energy", type=float, default=None,
                     help="truncated reduction keeping this energy fraction (default exact)")
    agg.add_argument("--tol", type=float, default=1e-6,
                     help="relative duality-gap tolerance of (7) (default 1e-6)")
    agg.add_argument("--dtype", default="float32", choices=("float32", "float16"),
                     help="storage dtype of the output tensors")
    agg.add_argument("--jobs", type=int, default=1, help="joblib processes over modules")
    agg.add_argument("--scheduler", default=None, help="dask scheduler address (tcp://...)")
    agg.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    agg.add_argument("--quiet", action="store_true", help="no progress bar")
    agg.set_defaults(handler=run_aggregate)
    return top


def run_aggregate(args) -> int:
    from .run import aggregate_to_dir, check_out_dir

    if args.method not in METHODS:
        raise ValueError(f"--method must be one of {', '.join(METHODS)}, got {args.method!r}")
    if args.energy is not None and not 0 < args.energy <= 1:
        raise ValueError(f"--energy must be in (0, 1], got {args.energy}")
    check_out_dir(args.out, args.overwrite)
    options = ModuleOptions(method=args.method, rank=args.rank, lam_L=args.lam_L,
                            lam_S=args.lam_S, alpha=args.alpha, energy=args.energy,
                            rank_out=args.rank_out, tol=args.tol,
                            byzantine=getattr(args, "byzantine", None))
    adapters = load_adapters(args.dirs)
    agg, summary = aggregate_to_dir(adapters, options, args.out, client_rule=args.client_rule,
                                    dtype=args.dtype, overwrite=args.overwrite, jobs=args.jobs,
                                    scheduler=args.scheduler, progress=not args.quiet)
    mods = summary["modules"]
    print(f"{args.method}: {len(mods)} modules, {len(adapters.clients)} clients, "
          f"{agg.seconds:.1f} s; wrote {', '.join(summary['outputs'])} and summary.json to "
          f"{args.out}")
    if args.method == "clair":
        cb = summary["client_benign"]
        for name in adapters.names:
            print(f"  {name}: benign in {cb['modules_benign'][name]}/{cb['n_modules']} modules "
                  f"(majority: {cb['majority'][name]}, any: {cb['any'][name]})")
        bad = [m for m, s in mods.items() if s["status"] not in ("optimal", "completed")]
        if bad:
            print(f"  warning: {len(bad)} module(s) stopped before the tolerance: {bad[:3]}",
                  file=sys.stderr)
        low = [m for m, s in mods.items() if s["numerical_rank"] < s["rank"]]
        if low:
            print(f"  warning: {len(low)} module(s) have rank(L_hat) below --rank (their P_A is "
                  f"partly arbitrary; see numerical_rank in summary.json): {low[:3]}",
                  file=sys.stderr)
    if args.rank_out is not None:
        worst = max(e for d in summary["rank_out_relative_error"].values() for e in d.values())
        print(f"  --rank-out {args.rank_out}: largest relative Frobenius error {worst:.3e}")
    if "robust" in summary:
        rb = summary["robust"]
        sel = "" if rb["selected"] is None else f"; selected {', '.join(rb['selected'])}"
        print(f"{args.method} (f = {rb['f']}, {rb['coordinates']} coordinates){sel}.")
    if "detection" in summary:
        from .decision import detection_sentence

        print(detection_sentence(summary["detection"]))
    return 0


def run_inspect(args) -> int:
    adapters = load_adapters(args.dirs)
    K = adapters.n_clients
    print(f"{K} clients: {', '.join(adapters.names)}; {len(adapters.modules)} modules")
    print(f"{'module':60s} {'out x in':>12s} {'ranks':>14s} {'q′ x p′':>9s} "
          f"{'||ΔW_k||_F min..max':>22s}")
    for m in adapters.modules:
        f = adapters.factors(m)
        red = reduce_module(f)
        norms = np.sqrt(np.einsum("kij,kij->k", red.M, red.M))
        ranks = sorted(set(f.ranks))
        print(f"{m[-60:]:60s} {f.shape[0]:>5d} x {f.shape[1]:<5d} "
              f"{','.join(map(str, ranks)):>14s} {red.dims[0]:>4d}x{red.dims[1]:<4d} "
              f"{norms.min():>10.4g}..{norms.max():<10.4g}")
    if args.summary is not None:
        summary = json.loads(Path(args.summary).read_text())
        mods = [m for m in adapters.modules if m in summary.get("modules", {})]
        flags = np.array([[not b for b in summary["modules"][m]["benign"]] for m in mods])
        print("flagged (contaminated) per client:",
              dict(zip(summary["clients"], flags.sum(axis=0).tolist())))
        if args.figure is not None:
            _heatmap(flags, summary["clients"], mods, args.figure)
            print(f"heatmap: {args.figure}")
    elif args.figure is not None:
        raise ValueError("--figure needs --summary (an aggregate's summary.json)")
    return 0


def _heatmap(flags, clients, modules, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.08 * len(modules) + 2), 0.35 * len(clients) + 1.5))
    ax.imshow(flags.T, aspect="auto", cmap="Reds", vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(clients)), clients)
    ax.set_xlabel(f"module (0..{len(modules) - 1})")
    ax.set_title("CLAIR detection (8): red = excluded from the collaborative set")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
