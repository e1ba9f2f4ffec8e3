"""Every aggregator of :mod:`lowrank_fl.adapters` on one trained adapter set
(:mod:`lowrank_fl.nn.trained_sets`): the clients each client-level rule flags, the robust
methods' selections, timings, and the benign clients' held-out loss of every method's adapter.

Plain dicts and lists (picklable, cacheable by the verifier's sweep).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ..adapters import ModuleOptions, aggregate_factors, guard
from ..adapters.decision import detection_summary
from ..adapters.detect import pooled_evidence, pooled_scores, pooled_threshold, raw_evidence
from ..adapters.detect_updates import update_flags
from ..adapters.init_reversal import reversed_init_flags
from ..adapters.updates import unit_gram
from .trained_families import benign_fedavg
from .trained_sets import TrainedSet, base_accuracy, copying_threshold, heldout_accuracy, heldout_loss

__all__ = ["RULES", "ROBUST", "LOSS_METHODS", "ACCURACY_METHODS", "MIN_RATIOS", "LEARNED_MARGIN", "evaluate_set",
           "flags_of", "detection_table", "harm_table", "learning_table", "oracle_agreement", "oracle_table"]

RULES = ("per-module", "majority", "any", "pooled", "updates")
ROBUST = ("krum", "multikrum", "median", "trimmed-mean", "geomed")
LOSS_METHODS = ("local", "clair-per-module", "clair-pooled", "fedavg", "flexlora") + ROBUST
#: the accuracy comparison: the client's own adapter, CLAIR's default output (update rule,
#: exchangeable refinement), the same with ``refine="agreement"`` and ``refine="shrink"``, (9) as the
#: paper writes it (``refine="paper"``), the FedAvg of the truly benign clients (the reference
#: "collaboration helps" is measured against), FedAvg, Krum, Multi-Krum, and the base model (a zero
#: update: what the client had before it trained)
ACCURACY_METHODS = ("local", "clair-default", "clair-agreement", "clair-shrink", "clair-paper", "fedavg-benign",
                    "fedavg", "krum", "multikrum", "base")
#: a client *learned* its task when its own adapter's held-out accuracy on it beats the base's by
#: more than this (:func:`learning_table`)
LEARNED_MARGIN = 0.02
#: the update rule re-run with only its materiality floor ρ changed (rules ``"updates@ρ"``;
#: the default is :data:`lowrank_fl.adapters.detect.POOLED_MIN_RATIO`)
MIN_RATIOS = (1.0, 1.1, 1.2, 1.3, 1.5, 2.0)


def evaluate_set(ts: TrainedSet, *, cache_dir=None, with_loss: bool = True, n_heldout: int = 256,
                 with_accuracy: bool = False) -> dict:
    """One set's record: ``truth``, ``flagged`` per rule, ``pooled_block`` / ``pooled_contrast``
    (pooled scores from the block norms of (8) / the raw contrast norms), ``pooled_ratio``
    (distance ratios from the block norms), ``updates_by_min_ratio`` (the update rule's flags at
    each floor ρ of :data:`MIN_RATIOS`, keyed ``f"{ρ:g}"``), ``selected`` (Krum,
    Multi-Krum), ``seconds`` per method, ``base_accuracy`` (%) of the base against its
    ``copying_threshold``, and with ``with_loss`` ``heldout_loss`` per benign client
    and method (:data:`LOSS_METHODS`; ``local`` = the client's own adapter; every method's model
    also carries the client's ``ts.local`` modules, :func:`heldout_loss`)."""
    names = ts.names
    K = len(names)
    t0 = time.perf_counter()
    res = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"), client_rule="per-module",
                          refine="paper")
    seconds = {"clair": time.perf_counter() - t0}
    results = res.aggregation.results
    with warnings.catch_warnings():                             # a pooled tie is recorded, not warned
        warnings.simplefilter("ignore", RuntimeWarning)
        # whom the CLI would flag (undecided modules and sets flag nobody)
        flags = {rule: detection_summary(results, names, rule)["flagged"] for rule in RULES}
    grams = np.array([r.gram for r in results], float)
    outside = np.array([r.outside for r in results], float)
    by_ratio = {}
    reversed_ = reversed_init_flags([r.init_cosines for r in results], K)      # the update rule's, as the CLI's
    for rho in MIN_RATIOS:
        d = guard.guard_set(~(update_flags(grams, outside, min_ratio=rho) | reversed_))
        by_ratio[f"{rho:g}"] = [] if guard.is_undecided(d) else [n for n, b in zip(names, d) if not b]
    ev = pooled_evidence(np.array([r.block_norms for r in results]), K)
    Mc, _ = pooled_scores(np.array([r.contrast_norms for r in results]), K)
    # the raw-distance statistic (client_rule="raw"): median ||ΔW_j - ΔW_k||_F per module, pooled
    Mr = raw_evidence(np.array([r.gram for r in results])).scores
    benign = np.array([n not in ts.contaminated for n in names])
    rec = {"truth": list(ts.contaminated), "names": names, "flagged": flags,
           "oracle_agreement": {n: None if np.isnan(v) else float(v)            # strict JSON
                                for n, v in zip(names, oracle_agreement(grams, benign))},
           "pooled_block": dict(zip(names, ev.scores.tolist())),
           "pooled_contrast": dict(zip(names, Mc.tolist())),
           "raw_scores": dict(zip(names, Mr.tolist())),
           "raw_threshold": pooled_threshold(K) if K >= 3 else None,
           "updates_by_min_ratio": by_ratio,
           "pooled_ratio": dict(zip(names, ev.ratios.tolist())),
           "pooled_threshold": ev.cutoff if K >= 3 else None,
           "separated_modules": sum(bool(r.separated) for r in results), "n_modules": len(results),
           "lam_rules": [r.lam_rule for r in results], "selected": {}, "build_seconds": ts.seconds,
           "base_accuracy": base_accuracy(ts.settings, cache_dir=cache_dir),
           "copying_threshold": copying_threshold(ts.settings.exponent)}
    outs = {}
    for m in ROBUST + ("fedavg", "flexlora"):
        t0 = time.perf_counter()
        r = aggregate_factors(ts.factors, ModuleOptions(method=m, output_dtype="float64"))
        seconds[m] = time.perf_counter() - t0
        if "robust" in r.summary and r.summary["robust"]["selected"] is not None:
            rec["selected"][m] = r.summary["robust"]["selected"]
        outs[m] = r.outputs["aggregated"]
    rec["seconds"] = seconds
    if with_accuracy:
        rec.update(_accuracy(ts, outs, cache_dir, n_heldout))
    if with_loss:
        pooled = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"), client_rule="pooled",
                                   refine="paper")
        loss = {}
        for n in ts.benign:
            own = {"local": ts.factors[n], "clair-per-module": res.outputs[n],
                   "clair-pooled": pooled.outputs[n], **outs}
            loss[n] = {m: heldout_loss(ts, n, own[m], n=n_heldout, cache_dir=cache_dir)
                       for m in LOSS_METHODS}
        rec["heldout_loss"] = loss
    return rec


def oracle_agreement(grams, benign) -> np.ndarray:
    """(K,) each client's mean cosine with the *truly* benign clients other than itself, averaged
    over modules, from the update Grams (modules, K, K): what an agreement statistic would see if it
    knew the benign set (:func:`oracle_table`). NaN with fewer than two benign clients."""
    C = unit_gram(grams)
    b = np.asarray(benign, bool)
    if b.sum() < 2:
        return np.full(b.size, np.nan)
    diag = np.einsum("mkk->mk", C)
    total = C[:, :, b].sum(axis=-1) - np.where(b, diag, 0.0)        # leave the client itself out
    return (total / (b.sum() - b)).mean(axis=0)


def oracle_table(recs) -> dict:
    """Over records with :func:`oracle_agreement`: the contaminated clients, and those whose
    agreement with the benign clients is below every benign client's of their set (separable by
    agreement even knowing who is benign: a ceiling for any agreement statistic at no benign flag)."""
    bad = below = 0
    for r in recs:
        a = r.get("oracle_agreement")
        if a is None or not r["truth"]:
            continue
        benign = [a[n] for n in r["names"] if n not in r["truth"]]
        if len(benign) < 2:
            continue
        floor = min(benign)
        bad += len(r["truth"])
        below += sum(a[n] < floor for n in r["truth"])
    return {"contaminated": bad, "separable": below}


def _zero_update(factors: dict) -> dict:
    """A client's factors with every update zero: the base model (its ``ts.local`` modules kept)."""
    return {m: (np.zeros_like(A), np.zeros_like(B), s) for m, (A, B, s) in factors.items()}


def _accuracy(ts: TrainedSet, outs: dict, cache_dir, n: int) -> dict:
    """Benign clients' masked accuracy on their own task (:data:`ACCURACY_METHODS`), each
    default output's relative change from the client's own adapter and its weight, and the
    contaminated clients' accuracy on their own (contaminated) task with their adapter and with
    the base (``contaminated_accuracy``: did they learn it?)."""
    default = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"))
    paper = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"), refine="paper")
    shrink = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"), refine="shrink")
    agree = aggregate_factors(ts.factors, ModuleOptions(output_dtype="float64"), refine="agreement")
    ref = benign_fedavg(ts.factors, ts.benign)
    acc = {}
    for c in ts.benign:
        own = {"local": ts.factors[c], "clair-default": default.outputs[c], "clair-shrink": shrink.outputs[c],
               "clair-agreement": agree.outputs[c],
               "clair-paper": paper.outputs[c],
               "fedavg-benign": ref, "fedavg": outs["fedavg"], "krum": outs["krum"],
               "multikrum": outs["multikrum"], "base": _zero_update(ts.factors[c])}
        acc[c] = {m: heldout_accuracy(ts, c, own[m], n=n, cache_dir=cache_dir) for m in ACCURACY_METHODS}
    bad = {c: {"local": heldout_accuracy(ts, c, ts.factors[c], n=n, cache_dir=cache_dir),
               "base": heldout_accuracy(ts, c, _zero_update(ts.factors[c]), n=n, cache_dir=cache_dir)}
           for c in ts.contaminated}
    return {"accuracy": acc, "contaminated_accuracy": bad, "refinement": default.summary["refinement"]["clients"],
            "exchangeability": default.summary["refinement"]["exchangeability"],
            "default_flagged": default.summary["detection"]["flagged"]}


def harm_table(recs, tolerance: float = 0.03) -> list[dict]:
    """Per accuracy method over records with accuracies: the worst set's mean benign change
    against the clients' own adapters, the share of benign clients losing more than
    ``tolerance``, and, over the sets where the benign FedAvg beats the own adapters by more
    than 0.05, the share of that gain kept (median over those sets). A method some record lacks
    (records written before it was measured, such as ``"base"``) has no row."""
    recs = [r for r in recs if "accuracy" in r]
    rows = []
    for m in ACCURACY_METHODS:
        if not all(m in v for r in recs for v in r["accuracy"].values()):
            continue                              # records written before the method was measured
        worst, losers, n, kept = np.inf, 0, 0, []
        for r in recs:
            d = np.array([v[m] - v["local"] for v in r["accuracy"].values()])
            worst = min(worst, float(d.mean()))
            losers += int((d < -tolerance).sum())
            n += d.size
            gain = np.mean([v["fedavg-benign"] - v["local"] for v in r["accuracy"].values()])
            if gain > 0.05:
                kept.append(float(d.mean() / gain))
        rows.append({"method": m, "worst_set_mean_change": worst, "clients_losing": losers, "clients": n,
                     "collab_sets": len(kept), "gain_kept_median": float(np.median(kept)) if kept else float("nan"),
                     "gain_kept_min": float(min(kept)) if kept else float("nan")})
    return rows


def flags_of(rec: dict, rule: str) -> list:
    """Clients ``rule`` flags in a record: a client-level rule, ``"pooled-z"`` (the pooled score
    against ``c_K`` alone, without the distance ratio: the first pooled rule), ``"pooled@3.5"``
    (that score against Iglewicz & Hoaglin's per-observation cutoff), or ``"krum"`` /
    ``"multikrum"`` (the clients not selected), ``"updates@ρ"`` (the update rule with its floor ρ
    at one of :data:`MIN_RATIOS`), or ``"default"`` (the flags of the default output the record's
    accuracies were measured on); the comparisons are for the benchmark."""
    if rule == "pooled-z":
        cut = rec["pooled_threshold"]            # None: fewer than 3 clients, no pooled score
        return [] if cut is None else [n for n, v in rec["pooled_block"].items() if v > cut]
    if rule == "pooled@3.5":
        return [n for n, v in rec["pooled_block"].items() if v > 3.5]
    if rule == "raw":
        cut = rec["raw_threshold"]
        return [] if cut is None else [n for n, v in rec["raw_scores"].items() if v > cut]
    if rule == "default":                        # what the command's default output applied
        if "default_flagged" not in rec:
            raise ValueError("rule 'default': the record has no default output (evaluate it with_accuracy)")
        return list(rec["default_flagged"])
    if rule in ("krum", "multikrum"):
        return [n for n in rec["names"] if n not in rec["selected"][rule]]
    if rule.startswith("updates@"):
        by = rec["updates_by_min_ratio"]
        rho = rule[len("updates@"):]
        if rho not in by:
            raise ValueError(f"rule {rule!r}: the record has the update rule at the floors {list(by)} only")
        return list(by[rho])
    return list(rec["flagged"][rule])


def detection_table(recs, rules=RULES + ("raw", "pooled-z", "pooled@3.5", "krum", "multikrum")) -> list[dict]:
    """Per rule over records: client-level precision / recall (pooled over sets), sets with the
    exact contaminated set among those with contamination, sets with a false flag among those
    without, benign clients flagged."""
    rows = []
    for rule in rules:
        tp = fp = fn = exact = clean_ff = n_clean = n_dirty = n_benign = 0
        for r in recs:
            truth, got = set(r["truth"]), set(flags_of(r, rule))
            tp += len(truth & got)
            fp += len(got - truth)
            fn += len(truth - got)
            n_benign += len(r["names"]) - len(truth)
            if truth:
                n_dirty += 1
                exact += got == truth
            else:
                n_clean += 1
                clean_ff += bool(got)
        rows.append({"rule": rule, "precision": tp / (tp + fp) if tp + fp else float("nan"),
                     "recall": tp / (tp + fn) if tp + fn else float("nan"),
                     "exact_sets": exact, "contaminated_sets": n_dirty,
                     "clean_sets_false_flag": clean_ff, "clean_sets": n_clean,
                     "benign_flagged": fp, "benign_clients": n_benign})
    return rows


def learning_table(recs, rule: str = "default", margin: float = LEARNED_MARGIN) -> dict:
    """What the clients learned, over records with accuracies: the benign clients' own-task gain
    of their adapter over the base (median, and how many beat it by more than ``margin``), the
    contaminated clients' gain on their own task, and how many of those that learned it
    (gain > ``margin``) and that did not ``rule`` flags (:func:`flags_of`)."""
    recs = [r for r in recs if "contaminated_accuracy" in r]
    gb = [v["local"] - v["base"] for r in recs for v in r["accuracy"].values()]
    gc, found = [], []
    for r in recs:
        flagged = set(flags_of(r, rule))
        for c, v in r["contaminated_accuracy"].items():
            gc.append(v["local"] - v["base"])
            found.append(c in flagged)
    gb, gc, found = np.array(gb, float), np.array(gc, float), np.array(found, bool)
    learned = gc > margin
    return {"sets": len(recs), "benign": int(gb.size),
            "benign_gain_median": float(np.median(gb)) if gb.size else float("nan"),
            "benign_learned": int((gb > margin).sum()),
            "contaminated": int(gc.size),
            "contaminated_gain_median": float(np.median(gc)) if gc.size else float("nan"),
            "contaminated_learned": int(learned.sum()), "learned_found": int((found & learned).sum()),
            "not_learned_found": int((found & ~learned).sum()), "rule": rule, "margin": margin}
