"""Client-level detection, held-out loss and accuracy on PEFT-trained adapter sets
(lowrank_fl.nn.trained_sets, lowrank_fl.nn.trained_families).

Usage::

    python benchmarks/bench_trained_detection.py --seeds 0 1 --out design.json
    python benchmarks/bench_trained_detection.py --seeds 2 3 --out report.json --loss
    python benchmarks/bench_trained_detection.py --seeds 2 3 --bases sec8 --out sec8.json
    python benchmarks/bench_trained_detection.py --families llama-federated gpt2-collab --seeds 100 101 \
        --out families.json          # realistic families: detection, accuracy, harm, per family
    python benchmarks/bench_trained_detection.py --table report.json

With ``--families`` each seed draws one set per family (lowrank_fl.nn.trained_families: common LoRA
init, few noisy examples, uneven training, ranks 4-16, rsLoRA, K up to 20, near-miss and reversed
contamination, clean federations, and federations where collaboration helps) and every set
records the benign clients' accuracy of their own adapter, CLAIR's default output, (9), the
FedAvg of the benign clients, FedAvg, Krum and Multi-Krum; the tables then split by family (the
update rule's size floor and the agreement weight were designed on the llama families, seeds
below 100: report the gpt2 and sec8 families, and seeds >= 100, as held out).

Seeds 0-1 of the llama and gpt2 families designed the pooled score and its cutoff c_K
(lowrank_fl.adapters.detect); the first full report's 48 sets (the verifier's seed stream
"adapters.trained.detection", base seed 0) designed its distance-ratio floor. Other seeds report
the rule; rows "pooled-z" (the score alone, the rule before the ratio) and "pooled@3.5" compare.
Per seed and family, 4 sets: heterogeneous benign tasks with 0, 1, 2 contaminated clients and
homogeneous benign tasks with 3 (llama, gpt2: shift, clean, reverse) or 1 (sec8: reverse, as
Table 3). Per set (lowrank_fl.nn.trained_eval):
the clients each rule flags, Krum / Multi-Krum selections, the update rule re-run at each
materiality floor ρ (MIN_RATIOS: the ρ table of docs/adapters_evidence.md), timings and (--loss) the benign clients'
held-out loss of every method's adapter.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from lowrank_fl.nn.trained_eval import (LEARNED_MARGIN, MIN_RATIOS, detection_table, evaluate_set, flags_of, harm_table,
                                        learning_table, oracle_table)
from lowrank_fl.nn.trained_families import FAMILIES, family_settings
from lowrank_fl.nn.trained_sets import BASES, TrainedSetSettings, trained_set


def scenarios(seed, bases=("llama", "gpt2")):
    for base in bases:
        for bad in (0, 1, 2):
            yield TrainedSetSettings.for_base(base, n_contaminated=bad, seed=seed)
        yield TrainedSetSettings.for_base(base, n_contaminated=1 if base == "sec8" else 3, heterogeneous=False,
                                          seed=seed)


def _num(x: float) -> str:
    """A table cell: two decimals, or "–" where undefined (no flag, no contaminated client, no set)."""
    return "–" if x != x else f"{x:.2f}"


def _signed(x: float) -> str:
    """A signed table cell with three decimals, or "–" where undefined."""
    return "–" if x != x else f"{x:+.3f}"


def _ratio(found: int, of: int) -> str:
    """``found/of``, or "–" where there is nothing to find."""
    return f"{found}/{of}" if of else "–"


def table(recs) -> str:
    from lowrank_fl.adapters.detect import pooled_threshold

    for r in recs:          # records written before "names" and the cutoff c_K existed (records
        # written before the distance ratio count "pooled" as the score alone, as they were run)
        r.setdefault("names", list(r["pooled_block"]))
        if "pooled_threshold" not in r:
            cut = pooled_threshold(len(r["names"]))
            r["flagged"]["pooled"] = [n for n, v in r["pooled_block"].items() if v > cut]
    lines = ["| family | rule | precision | recall | sets exactly right | clean sets with a false flag | "
             "benign clients flagged |", "|---|---|---|---|---|---|---|"]
    groups = {"all": recs}
    for r in recs:
        groups.setdefault(r["settings"].get("family", r["settings"]["base"]), []).append(r)
    for fam, sub in groups.items():
        rules = None if fam == "all" else ("updates", "raw", "pooled", "per-module")
        for row in detection_table(sub) if rules is None else detection_table(sub, rules=rules):
            if "raw_scores" not in sub[0] and row["rule"] == "raw":
                continue
            lines.append(f"| {fam} | {row['rule']} | {_num(row['precision'])} | {_num(row['recall'])} | "
                         f"{row['exact_sets']}/{row['contaminated_sets']} | "
                         f"{row['clean_sets_false_flag']}/{row['clean_sets']} | "
                         f"{row['benign_flagged']}/{row['benign_clients']} |")
    if all("updates_by_min_ratio" in r for r in recs):
        lines += ["", "| the update rule's floor ρ | contaminated found | benign clients flagged | sets with a "
                  "benign flag |", "|---|---|---|---|"]
        for rho in MIN_RATIOS:
            rule = f"updates@{rho:g}"
            found = sum(len(set(r["truth"]) & set(flags_of(r, rule))) for r in recs)
            wrong = [len(set(flags_of(r, rule)) - set(r["truth"])) for r in recs]
            lines.append(f"| {rho:g} | {found}/{sum(len(r['truth']) for r in recs)} | {sum(wrong)} | "
                         f"{sum(w > 0 for w in wrong)} |")
    if any("accuracy" in r for r in recs):
        lines += ["", "| family | method | worst set: mean benign accuracy change vs own | benign clients "
                  "losing > 0.03 | sets where the benign FedAvg gains > 0.05 | share of that gain kept "
                  "(median, min) |", "|---|---|---|---|---|---|"]
        for fam, sub in groups.items():
            for row in harm_table(sub):
                lines.append(f"| {fam} | {row['method']} | {row['worst_set_mean_change']:+.3f} | "
                             f"{row['clients_losing']}/{row['clients']} | {row['collab_sets']} | "
                             f"{_num(row['gain_kept_median'])}, {_num(row['gain_kept_min'])} |")
    oracle = []
    if any("contaminated_accuracy" in r for r in recs):
        lines += ["", f"What the clients learned (own-task held-out accuracy of the client's adapter minus the base's; "
                  f"learned: more than {LEARNED_MARGIN}; found: left out by the default output, i.e. flagged by "
                  "the default client rule):", "",
                  "| family | benign: own − base, median | benign learned | contaminated: own − base, median | "
                  "contaminated learned | found among those that learned | found among the others |",
                  "|---|---|---|---|---|---|---|"]
        for fam, sub in groups.items():
            t = learning_table(sub)
            o = oracle_table(sub)
            if o["contaminated"]:
                oracle.append(f"| {fam} | {o['separable']}/{o['contaminated']} |")
            if t["sets"] == 0:
                continue
            others = t["contaminated"] - t["contaminated_learned"]
            lines.append(f"| {fam} | {_signed(t['benign_gain_median'])} | {t['benign_learned']}/{t['benign']} | "
                         f"{_signed(t['contaminated_gain_median'])} | "
                         f"{t['contaminated_learned']}/{t['contaminated']} | "
                         f"{_ratio(t['learned_found'], t['contaminated_learned'])} | "
                         f"{_ratio(t['not_learned_found'], others)} |")
    if oracle:
        lines += ["", "Separable by agreement even knowing who is benign (a contaminated client whose mean cosine "
                  "with the benign clients is below every benign client's; lowrank_fl.nn.trained_eval.oracle_table):",
                  "", "| family | contaminated below every benign client |", "|---|---|", *oracle]
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
    ap.add_argument("--families", nargs="+", default=None, choices=list(FAMILIES),
                    help="draw one set per family and seed (lowrank_fl.nn.trained_families) instead of "
                         "--bases' four scenarios; records accuracies")
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
        todo = ([(f, family_settings(f, seed)) for f in a.families] if a.families
                else [(s.base, s) for s in scenarios(seed, a.bases)])
        for fam, s in todo:
            t0 = time.perf_counter()
            ts = trained_set(s, cache_dir=a.cache)
            rec = {"settings": {"family": fam, "base": s.base, "seed": s.seed, "n_clients": s.n_clients,
                                "n_contaminated": s.n_contaminated, "heterogeneous": s.heterogeneous},
                   "build_s": time.perf_counter() - t0,
                   **evaluate_set(ts, cache_dir=a.cache, with_loss=a.loss, n_heldout=a.heldout,
                                  with_accuracy=a.families is not None)}
            recs.append(rec)
            print(json.dumps({k: rec[k] for k in ("settings", "truth", "flagged", "build_s")}), flush=True)
            a.out.write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
