"""Client-level detection and held-out loss on PEFT-trained adapter sets (lowrank_fl.nn.trained_sets).

Usage::

    python benchmarks/bench_trained_detection.py --seeds 0 1 --out design.json [--loss]
    python benchmarks/bench_trained_detection.py --seeds 2 3 4 --out report.json --loss

Seeds 0-1 designed the pooled rule (lowrank_fl.adapters.detect); seeds >= 2 report it. Per set:
the clients each rule flags (CLAIR per-module / majority / any / pooled), the pooled scores from
the block norms of (8) and from the raw contrast norms, Krum / Multi-Krum selections, timings and
(--loss) the benign clients' held-out loss of every method's adapter.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.aggregate import client_decision
from lowrank_fl.adapters.detect import pooled_scores
from lowrank_fl.nn.trained_sets import TrainedSetSettings, heldout_loss, trained_set

RULES = ("per-module", "majority", "any", "pooled")
ROBUST = ("krum", "multikrum", "median", "trimmed-mean", "geomed")


def scenarios(seed):
    for base in ("llama", "gpt2"):
        for bad in (0, 1, 2):
            yield TrainedSetSettings(base=base, n_contaminated=bad, seed=seed)
        yield TrainedSetSettings(base=base, n_contaminated=3, heterogeneous=False, seed=seed)


def one(s, cache, with_loss):
    t0 = time.perf_counter()
    ts = trained_set(s, cache_dir=cache)
    t_build = time.perf_counter() - t0
    names = ts.names
    t0 = time.perf_counter()
    res = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"))
    t_clair = time.perf_counter() - t0
    results = res.aggregation.results
    rec = {"settings": {"base": s.base, "seed": s.seed, "n_contaminated": s.n_contaminated,
                        "heterogeneous": s.heterogeneous},
           "truth": ts.contaminated, "build_s": t_build, "clair_s": t_clair,
           "separated_modules": sum(bool(r.separated) for r in results),
           "n_modules": len(results), "lam_rules": [r.lam_rule for r in results]}
    K = len(names)
    flags = {}
    for rule in RULES:
        d = client_decision(results, rule)
        bad = ~np.array([r.benign for r in results]).all(axis=0) if d is None else ~d
        flags[rule] = [n for n, b in zip(names, bad) if b]
    rec["flagged"] = flags
    Mb, _ = pooled_scores(np.array([r.block_norms for r in results]), K)
    Mc, _ = pooled_scores(np.array([r.contrast_norms for r in results]), K)
    rec["pooled_block"] = dict(zip(names, Mb.round(3).tolist()))
    rec["pooled_contrast"] = dict(zip(names, Mc.round(3).tolist()))
    outs = {}
    for m in ROBUST + ("fedavg", "flexlora"):
        t0 = time.perf_counter()
        r = aggregate_factors(ts.factors, ModuleOptions(method=m, output_dtype="float64"))
        rec[f"{m}_s"] = time.perf_counter() - t0
        if "robust" in r.summary and r.summary["robust"]["selected"] is not None:
            rec.setdefault("selected", {})[m] = r.summary["robust"]["selected"]
        outs[m] = r.outputs["aggregated"]
    if with_loss:
        pooled = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"), client_rule="pooled")
        loss = {}
        for n in ts.benign:
            row = {"local": heldout_loss(ts, n, ts.factors[n], cache_dir=cache),
                   "clair-per-module": heldout_loss(ts, n, res.outputs[n], cache_dir=cache),
                   "clair-pooled": heldout_loss(ts, n, pooled.outputs[n], cache_dir=cache)}
            for m, o in outs.items():
                row[m] = heldout_loss(ts, n, o, cache_dir=cache)
            loss[n] = row
        rec["heldout_loss"] = loss
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("LOWRANK_FL_CACHE", ".cache")))
    ap.add_argument("--loss", action="store_true")
    a = ap.parse_args()
    recs = []
    for seed in a.seeds:
        for s in scenarios(seed):
            rec = one(s, a.cache, a.loss)
            recs.append(rec)
            print(json.dumps({k: rec[k] for k in ("settings", "truth", "flagged", "build_s")}), flush=True)
            a.out.write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
