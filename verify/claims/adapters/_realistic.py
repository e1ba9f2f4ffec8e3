"""Extension findings (ours): the default ``adapters aggregate --method clair`` on federations
trained the way federated LoRA is run (:mod:`lowrank_fl.nn.trained_families`: the server's common
LoRA init, few noisy examples, uneven training, ranks 4-16, rsLoRA, ``K`` up to 20, near-miss and
reversed contamination, clean federations, federations where averaging helps and where it hurts).

Two claims read the same runs, each the bar the realistic-federation issue set, written here
before any set of these seeds was built:

* ``adapters.realistic.detection`` — the default output (``adapters aggregate --method clair``'s
  defaults) leaves out no benign client in any set, leaves out at least half of the contaminated
  clients (:data:`MIN_RECALL`), and more of them than the raw-distance statistic (the median
  ``||ΔW_j - ΔW_k||_F`` per module, pooled; the issue's 30-line statistic) flags.
* ``adapters.realistic.no_harm`` — with the default output, in every set the benign clients' mean
  masked accuracy on their own task is at least their own adapters' minus :data:`SET_TOLERANCE`,
  at most :data:`MAX_LOSING` of all benign clients (pooled over the sets) lose more than
  :data:`CLIENT_TOLERANCE`, and in every set where the benign clients' FedAvg beats their own
  adapters by more than :data:`GAIN_FLOOR`, the default keeps at least :data:`MIN_GAIN_KEPT` of
  that gain.

Every constant of the rules was chosen on family seeds below 3000 (the design and report batches
of docs/adapters_evidence.md); the claims draw their sets from their own seed stream and move any seed below
:data:`FIRST_FRESH` off it, so what they report is a test. Per family rows are the
leave-one-family-out rows: no constant of the rule is fit per family. Scales: smoke — 2 tiny sets
(the pipeline runs; a base pretrained 5 steps does not copy, so inconclusive); quick — one set of
each of the eight families (:data:`FAMILIES`); full — three of each of those eight and of the two
long-trained families (30 sets). The gain criterion is the issue's "keeps at least half" applied
to every set where averaging pays: stricter than the median the README's adoption rule used.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...claim import Evidence, claim, verdict_from
from ...nn_support import REQUIRES, backbone_dir
from ._trained import baseline_failure

__all__: list[str] = []

PAPER = "adapters"
STREAM = "adapters.realistic"
#: the families judged (the long-trained ones are added at full scale)
FAMILIES = ("llama-federated", "gpt2-federated", "llama-collab", "gpt2-collab",
            "llama-personal", "gpt2-personal", "llama-uneven", "gpt2-uneven")
LONG_FAMILIES = ("llama-federated-long", "gpt2-federated-long")
#: every family seed a rule or the README's batches used is below this
FIRST_FRESH = 10_000
#: the issue's bar, fixed before these claims ran
MIN_RECALL = 0.5
SET_TOLERANCE = 0.01
CLIENT_TOLERANCE = 0.03
MAX_LOSING = 0.05
GAIN_FLOOR = 0.05
MIN_GAIN_KEPT = 0.5


def fresh_family_seed(seed: int) -> int:
    """``seed`` folded to at least :data:`FIRST_FRESH` (a set no design or report batch built)."""
    seed = int(seed) % 2**31
    return seed if seed >= FIRST_FRESH else seed + FIRST_FRESH


def _tiny(settings):
    """Smoke: 6 clients, 3 steps, a base pretrained 5 steps (it does not copy: inconclusive)."""
    return replace(settings, n_clients=6, n_contaminated=min(settings.n_contaminated, 2), steps=3,
                   pretrain_steps=5, batch_size=8, n_examples=min(settings.n_examples, 8))


def _task(*, seed, family, cache_dir, heldout, tiny=False):
    from lowrank_fl.nn.trained_eval import evaluate_set
    from lowrank_fl.nn.trained_families import family_settings
    from lowrank_fl.nn.trained_sets import trained_set

    seed = fresh_family_seed(seed)
    s = family_settings(family, seed)
    if tiny:
        s = _tiny(s)
    ts = trained_set(s, cache_dir=cache_dir)
    rec = evaluate_set(ts, cache_dir=cache_dir, with_loss=False, with_accuracy=True, n_heldout=heldout)
    rec["settings"] = {"family": family, "base": s.base, "seed": seed, "n_clients": s.n_clients,
                       "n_contaminated": s.n_contaminated}
    return rec


def runs(ctx) -> list[dict]:
    """Every set's record (:func:`lowrank_fl.nn.trained_eval.evaluate_set` with accuracies)."""
    fams = ctx.pick(smoke=("llama-federated", "gpt2-collab"), quick=FAMILIES, full=FAMILIES + LONG_FAMILIES)
    reps = ctx.pick(smoke=1, quick=1, full=3)
    main = ctx.for_claim(STREAM)
    cache = backbone_dir(ctx) + "/trained_sets"
    grid = [{"family": f, "cache_dir": cache, "heldout": ctx.pick(smoke=16, quick=256, full=256),
             "tiny": ctx.scale == "smoke"} for f in fams]
    out = main.map(_task, grid, replicates=reps)
    ctx.seeds_used.extend(main.seeds_used)
    return [r for row in out for r in row]


def detection_counts(recs: list[dict], rule: str) -> dict:
    """Contaminated clients found and benign clients flagged by ``rule`` over ``recs``, and the
    sets with a benign flag."""
    from lowrank_fl.nn.trained_eval import flags_of

    found = wrong = bad = benign = 0
    sets_wrong = []
    for r in recs:
        flagged, truth = set(flags_of(r, rule)), set(r["truth"])
        found += len(flagged & truth)
        wrong += len(flagged - truth)
        bad += len(truth)
        benign += len(r["names"]) - len(truth)
        if flagged - truth:
            sets_wrong.append(f"{r['settings']['family']}/{r['settings']['seed']}")
    return {"rule": rule, "contaminated": bad, "found": found, "benign": benign, "benign_flagged": wrong,
            "recall": found / bad if bad else float("nan"), "sets_with_benign_flag": sets_wrong}


def detection_verdict(default: dict, raw: dict) -> bool | None:
    """Holds iff the default flags no benign client, finds at least :data:`MIN_RECALL` of the
    contaminated clients and more than the raw statistic; fails on any benign flag, else
    inconclusive without contamination."""
    if default["benign_flagged"] > 0:
        return False
    if default["contaminated"] == 0:
        return None
    return bool(default["recall"] >= MIN_RECALL and default["found"] > raw["found"])


def harm_rows(recs: list[dict], method: str = "clair-default") -> list[dict]:
    """Per set: the benign clients' mean accuracy change of ``method`` against their own adapters,
    the clients losing more than :data:`CLIENT_TOLERANCE`, the benign FedAvg's gain and the share
    of it kept (None where the gain is at most :data:`GAIN_FLOOR`)."""
    rows = []
    for r in recs:
        acc = r["accuracy"].values()
        d = np.array([v[method] - v["local"] for v in acc])
        gain = float(np.mean([v["fedavg-benign"] - v["local"] for v in acc]))
        # the base model (no adapter) against the own adapters: records before it was measured lack it
        base = float(np.mean([v["base"] - v["local"] for v in acc])) if all("base" in v for v in acc) else None
        rows.append({"set": f"{r['settings']['family']}/{r['settings']['seed']}", "family": r["settings"]["family"],
                     "mean_change": float(d.mean()), "losing": int((d < -CLIENT_TOLERANCE).sum()),
                     "clients": int(d.size), "fedavg_gain": gain, "base_change": base,
                     "gain_kept": float(d.mean() / gain) if gain > GAIN_FLOOR else None})
    return rows


def harm_verdict(rows: list[dict]) -> bool | None:
    """Holds iff every set's mean change is at least ``-SET_TOLERANCE``, at most
    :data:`MAX_LOSING` of all benign clients lose more than :data:`CLIENT_TOLERANCE`, and every set
    where averaging pays keeps at least :data:`MIN_GAIN_KEPT` of the gain; inconclusive without a
    benign client."""
    losing = sum(r["losing"] for r in rows)
    clients = sum(r["clients"] for r in rows)
    if clients == 0:
        return None
    return bool(all(r["mean_change"] >= -SET_TOLERANCE for r in rows) and losing <= MAX_LOSING * clients
                and all(r["gain_kept"] is None or r["gain_kept"] >= MIN_GAIN_KEPT for r in rows))


def _base_clause(kept: list[dict]) -> str:
    """Where averaging pays: how much of the benign FedAvg's gain the base model alone reaches
    (context, not a criterion: a gain the base reaches is fine-tuning's cost undone)."""
    shares = [r["base_change"] / r["fedavg_gain"] for r in kept if r.get("base_change") is not None]
    if not shares:
        return ""
    return (f"; in those sets the base model alone (no adapter) reaches a median {np.median(shares):.2f} of the "
            f"benign FedAvg's gain (least {min(shares):.2f})")


def family_harm(rows: list[dict]) -> dict:
    """Per family, from :func:`harm_rows`: its sets, the worst set's mean change, the benign clients
    losing more than :data:`CLIENT_TOLERANCE`, the sets where averaging pays and the least share
    of the gain kept there (None where it pays nowhere)."""
    out = {}
    for f in sorted({r["family"] for r in rows}):
        sub = [r for r in rows if r["family"] == f]
        kept = [r["gain_kept"] for r in sub if r["gain_kept"] is not None]
        out[f] = {"sets": len(sub), "worst_change": min(r["mean_change"] for r in sub),
                  "losing": sum(r["losing"] for r in sub), "clients": sum(r["clients"] for r in sub),
                  "sets_paying": len(kept), "least_gain_kept": min(kept) if kept else None}
    return out


def learning_clause(recs: list[dict]) -> tuple[str, dict | None]:
    """What the clients learned (:func:`lowrank_fl.nn.trained_eval.learning_table`, per family):
    a clause for the summary and the table (``None`` for records without the measurement). Not
    a criterion: it says which contaminated clients had learned their task at all."""
    from lowrank_fl.nn.trained_eval import LEARNED_MARGIN, learning_table

    recs = [r for r in recs if "contaminated_accuracy" in r]
    if not recs:
        return "", None
    t = learning_table(recs)
    fam = _by_family(recs, learning_table)
    return (f"; contaminated clients whose adapter learned their task (own-task accuracy above the base's by "
            f"more than {LEARNED_MARGIN}): {t['contaminated_learned']}/{t['contaminated']}, found "
            f"{t['learned_found']} of them and {t['not_learned_found']} of the others; benign clients beating "
            f"the base by more than {LEARNED_MARGIN}: {t['benign_learned']}/{t['benign']} (by family: "
            + ", ".join(f"{f} {v['benign_learned']}/{v['benign']}" for f, v in fam.items()) + ")",
            {"all": t, "by_family": fam})


def _by_family(recs, fn):
    fams = sorted({r["settings"]["family"] for r in recs})
    return {f: fn([r for r in recs if r["settings"]["family"] == f]) for f in fams}


@claim("adapters.realistic.detection", paper=PAPER,
       reference="extension of (8) (lowrank_fl.adapters.detect_updates); the realistic-federation issue's bar",
       statement="Extension finding (ours): on federations trained the way federated LoRA is run, the default "
                 "client rule flags no benign client, finds at least half of the contaminated clients, and "
                 "more of them than the raw-distance statistic.",
       kind="comparison", requires=REQUIRES)
def _detection(ctx) -> Evidence:
    recs = runs(ctx)
    failed = baseline_failure(recs)
    rules = ("default", "raw", "updates", "pooled", "per-module")
    rows = [detection_counts(recs, r) for r in rules]
    d, raw = rows[0], rows[1]
    ok = None if failed else detection_verdict(d, raw)
    fam = _by_family(recs, lambda sub: [detection_counts(sub, r) for r in rules[:2]])
    learn = learning_clause(recs)
    return Evidence(
        verdict=verdict_from(ok),
        summary=(f"{failed}default: {d['found']}/{d['contaminated']} contaminated found (recall "
                 f"{d['recall']:.2f}, at least {MIN_RECALL} asked), {d['benign_flagged']}/{d['benign']} benign "
                 f"flagged; raw statistic: {raw['found']} found, {raw['benign_flagged']} benign flagged; by family "
                 "(default found/contaminated, benign flagged): "
                 + ", ".join(f"{f} {v[0]['found']}/{v[0]['contaminated']}, {v[0]['benign_flagged']}"
                             for f, v in fam.items()) + learn[0]),
        measured={"rows": rows, "by_family": fam, "sets": len(recs), "learning": learn[1]},
        predicted={"benign_flagged": 0, "recall": f">= {MIN_RECALL}", "found": "> raw statistic's"},
        table=[{k: v for k, v in r.items() if k != "sets_with_benign_flag"} for r in rows],
        notes="'default' is whom the default output (the one no_harm measures) excluded, 'updates' the "
              "default client rule's flags in the same record; 'raw' the issue's statistic (median "
              "||ΔW_j - ΔW_k||_F per module, robustly standardised, averaged, against c_K); 'pooled' the "
              "rule before. Per family rows are leave-one-family-out: no constant is fit per family. The "
              "families and their seeds are lowrank_fl.nn.trained_families; seeds from this claim's stream, "
              f"at least {FIRST_FRESH} (every design and report batch used seeds below 3000).")


@claim("adapters.realistic.no_harm", paper=PAPER,
       reference="extension of (9) (lowrank_fl.adapters.noharm, exchangeable); the realistic-federation issue's bar",
       statement="Extension finding (ours): on federations trained the way federated LoRA is run, the default "
                 "output leaves no set's benign clients worse off than their own adapters (mean at least own - "
                 "0.01, at most 5 % losing more than 0.03) and keeps at least half of the benign FedAvg's gain "
                 "wherever that gain exceeds 0.05.",
       kind="comparison", requires=REQUIRES)
def _no_harm(ctx) -> Evidence:
    recs = runs(ctx)
    failed = baseline_failure(recs)
    rows = harm_rows(recs)
    ok = None if failed else harm_verdict(rows)
    paper = harm_rows(recs, "clair-paper")
    fams = family_harm(rows)
    worst = min(rows, key=lambda r: r["mean_change"])
    kept = [r for r in rows if r["gain_kept"] is not None]
    least = min(kept, key=lambda r: r["gain_kept"]) if kept else None
    losing = sum(r["losing"] for r in rows)
    clients = sum(r["clients"] for r in rows)
    return Evidence(
        verdict=verdict_from(ok),
        summary=(f"{failed}default: worst set {worst['mean_change']:+.3f} ({worst['set']}), {losing}/{clients} "
                 f"benign clients lose > {CLIENT_TOLERANCE}; averaging pays in {len(kept)} set(s)"
                 + (f", least share of its gain kept {least['gain_kept']:.2f} ({least['set']}; at least "
                    f"{MIN_GAIN_KEPT} asked)" if least else "")
                 + _base_clause(kept)
                 + f"; (9): worst set {min(r['mean_change'] for r in paper):+.3f}, "
                 f"{sum(r['losing'] for r in paper)}/{clients} losing; by family (worst set, least gain kept): "
                 + ", ".join(f"{f} {v['worst_change']:+.3f}/"
                             + ("-" if v["least_gain_kept"] is None else f"{v['least_gain_kept']:.2f}")
                             for f, v in fams.items())),
        measured={"sets": rows, "paper": paper, "by_family": fams},
        predicted={"worst set": f">= -{SET_TOLERANCE}", "losing": f"<= {MAX_LOSING:.0%}",
                   "gain kept": f">= {MIN_GAIN_KEPT} where the benign FedAvg gains > {GAIN_FLOOR}"},
        table=rows,
        notes="Masked accuracy of each benign client on its own task (held-out sequences), the default output "
              "(updates rule, exchangeable refinement) against the client's own adapter; 'fedavg_gain' is "
              "the benign clients' FedAvg against their own adapters; (9) is --refine paper.")
