"""Client-level detection and held-out loss on PEFT-trained adapter sets (lowrank_fl.nn.trained_sets).

Usage::

    python benchmarks/bench_trained_detection.py --seeds 0 1 --out design.json
    python benchmarks/bench_trained_detection.py --seeds 2 3 --out report.json --loss
    python benchmarks/bench_trained_detection.py --seeds 2 3 --bases sec8 --out sec8.json
    python benchmarks/bench_trained_detection.py --table report.json

Seeds 0-1 of the llama and gpt2 families designed the pooled score and its cutoff c_K
(lowrank_fl.adapters.detect); the first full report's 48 sets (the verifier's seed stream
"adapters.trained.detection", base seed 0) designed its distance-ratio floor. Other seeds report
the rule; rows "pooled-z" (the score alone, the rule before the ratio) and "pooled@3.5" compare.
Per seed and family, 4 sets: heterogeneous benign tasks with 0, 1, 2 contaminated clients and
homogeneous benign tasks with 3 (llama, gpt2: shift, clean, reverse) or 1 (sec8: reverse, as
Table 3). Per set (lowrank_fl.nn.trained_eval):
the clients each rule flags, Krum / Multi-Krum selections, timings and (--loss) the benign
clients' held-out loss of every method's adapter.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from lowrank_fl.nn.trained_eval import detection_table, evaluate_set
from lowrank_fl.nn.trained_sets import BASES, TrainedSetSettings, trained_set


def scenarios(seed, bases=("llama", "gpt2")):
    for base in bases:
        for bad in (0, 1, 2):
            yield TrainedSetSettings.for_base(base, n_contaminated=bad, seed=seed)
        yield TrainedSetSettings.for_base(base, n_contaminated=1 if base == "sec8" else 3, heterogeneous=False,
                                          seed=seed)


def table(recs) -> str:
    from lowrank_fl.adapters.detect import pooled_threshold

    for r in recs:          # records written before "names" and the cutoff c_K existed (records
        # written before the distance ratio count "pooled" as the score alone, as they were run)
        r.setdefault("names", list(r["pooled_block"]))
        if "pooled_threshold" not in r:
            cut = pooled_threshold(len(r["names"]))
            r["flagged"]["pooled"] = [n for n, v in r["pooled_block"].items() if v > cut]
    lines = ["| rule | precision | recall | sets exactly right | clean sets with a false flag | benign clients flagged |",
             "|---|---|---|---|---|---|"]
    for row in detection_table(recs):
        lines.append(f"| {row['rule']} | {row['precision']:.2f} | {row['recall']:.2f} | "
                     f"{row['exact_sets']}/{row['contaminated_sets']} | "
                     f"{row['clean_sets_false_flag']}/{row['clean_sets']} | "
                     f"{row['benign_flagged']}/{row['benign_clients']} |")
    if all("heldout_loss" in r for r in recs):
        methods = list(next(iter(recs[0]["heldout_loss"].values())))
        from scipy.stats import t as student

        lines += ["", "| method | mean benign held-out loss | sets better than FedAvg | sets better than Local "
                  "| method − CLAIR pooled, mean [95 % t interval over sets] |", "|---|---|---|---|---|"]
        per = {m: np.array([np.mean([v[m] for v in r["heldout_loss"].values()]) for r in recs]) for m in methods}
        n = len(recs)
        for m in methods:
            d = per[m] - per["clair-pooled"]
            h = float(student.ppf(0.975, n - 1)) * d.std(ddof=1) / np.sqrt(n) if n > 1 else float("inf")
            lines.append(f"| {m} | {per[m].mean():.4f} | {int((per[m] < per['fedavg']).sum())}/{n} | "
                         f"{int((per[m] < per['local']).sum())}/{n} | "
                         f"{d.mean():+.4f} [{d.mean() - h:+.4f}, {d.mean() + h:+.4f}] |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, default=None, help="print the tables of a results file and stop")
    ap.add_argument("--seeds", type=int, nargs="+", help="generator seeds of the sets (0-1: the design seeds)")
    ap.add_argument("--out", type=Path, help="results file (JSON, rewritten after every set)")
    ap.add_argument("--cache", type=Path, help="cache of bases and sets (default $LOWRANK_FL_CACHE/"
                    "trained_sets, else the system temporary directory)",
                    default=Path(os.environ.get("LOWRANK_FL_CACHE", tempfile.gettempdir())) / "trained_sets")
    ap.add_argument("--bases", nargs="+", default=["llama", "gpt2"], choices=list(BASES),
                    help="families of sets (default: the two the rule was designed on)")
    ap.add_argument("--loss", action="store_true", help="also the benign clients' held-out loss per method")
    ap.add_argument("--heldout", type=int, default=256, help="held-out sequences per benign client")
    a = ap.parse_args()
    if a.table is not None:
        try:
            print(table(json.loads(a.table.read_text())))
        except (OSError, ValueError) as exc:
            ap.error(f"--table: cannot read {a.table}: {exc}")
        return
    if not a.seeds or a.out is None:
        ap.error("--seeds and --out are required (or --table FILE)")
    recs = []
    for seed in a.seeds:
        for s in scenarios(seed, a.bases):
            t0 = time.perf_counter()
            ts = trained_set(s, cache_dir=a.cache)
            rec = {"settings": {"base": s.base, "seed": s.seed, "n_contaminated": s.n_contaminated,
                                "heterogeneous": s.heterogeneous}, "build_s": time.perf_counter() - t0,
                   **evaluate_set(ts, cache_dir=a.cache, with_loss=a.loss, n_heldout=a.heldout)}
            recs.append(rec)
            print(json.dumps({k: rec[k] for k in ("settings", "truth", "flagged", "build_s")}), flush=True)
            a.out.write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
