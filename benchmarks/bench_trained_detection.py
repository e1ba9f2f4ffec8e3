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


def _flags_of(rec, rule):
    """Flagged clients of ``rule`` in a record; the pooled rule recomputed with today's cutoff
    from the stored scores (and with Iglewicz & Hoaglin's 3.5 for comparison)."""
    from lowrank_fl.adapters.detect import pooled_threshold

    if rule.startswith("pooled"):
        sc = rec["pooled_block"]
        cut = 3.5 if rule == "pooled@3.5" else pooled_threshold(len(sc))
        return [n for n, v in sc.items() if v > cut]
    if rule in ("krum", "multikrum"):            # not selected = flagged
        return [n for n in rec["pooled_block"] if n not in rec["selected"][rule]]
    return rec["flagged"][rule]


def table(recs):
    """Markdown: per rule, detection precision / recall over the sets with contamination
    (client-level, pooled over sets), sets with a false flag among those without, benign
    clients flagged."""
    rules = ("per-module", "majority", "any", "pooled", "pooled@3.5", "krum", "multikrum")
    lines = ["| rule | precision | recall | sets fully right | clean sets with a false flag | benign clients flagged |",
             "|---|---|---|---|---|---|"]
    for rule in rules:
        tp = fp = fn = exact = clean_ff = n_clean = n_dirty = benign_ff = n_benign = 0
        for r in recs:
            truth, got = set(r["truth"]), set(_flags_of(r, rule))
            tp += len(truth & got)
            fp += len(got - truth)
            fn += len(truth - got)
            benign_ff += len(got - truth)
            n_benign += len(r["pooled_block"]) - len(truth)
            if truth:
                n_dirty += 1
                exact += got == truth
            else:
                n_clean += 1
                clean_ff += bool(got)
        prec = f"{tp / (tp + fp):.2f}" if tp + fp else "–"
        lines.append(f"| {rule} | {prec} | {tp / max(tp + fn, 1):.2f} | {exact}/{n_dirty} | "
                     f"{clean_ff}/{n_clean} | {benign_ff}/{n_benign} |")
    if all("heldout_loss" in r for r in recs):
        methods = list(next(iter(recs[0]["heldout_loss"].values())))
        lines += ["", "| method | mean benign held-out loss | sets better than fedavg | sets better than local |",
                  "|---|---|---|---|"]
        per = {m: [np.mean([v[m] for v in r["heldout_loss"].values()]) for r in recs] for m in methods}
        for m in methods:
            lines.append(f"| {m} | {np.mean(per[m]):.4f} | "
                         f"{sum(a < b for a, b in zip(per[m], per['fedavg']))}/{len(recs)} | "
                         f"{sum(a < b for a, b in zip(per[m], per['local']))}/{len(recs)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", type=Path, default=None, help="print the table of a results file")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("LOWRANK_FL_CACHE", ".cache")))
    ap.add_argument("--loss", action="store_true")
    a = ap.parse_args()
    if a.table is not None:
        print(table(json.loads(a.table.read_text())))
        return
    recs = []
    for seed in a.seeds:
        for s in scenarios(seed):
            rec = one(s, a.cache, a.loss)
            recs.append(rec)
            print(json.dumps({k: rec[k] for k in ("settings", "truth", "flagged", "build_s")}), flush=True)
            a.out.write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
