"""CLAIR §8 (Table 3, Figures 2-3): federated LoRA fine-tuning of a small transformer on copying
tasks, with one contaminated client, aggregated per attention matrix (needs torch and peft). Beside
the paper's four columns, "CLAIR (automatic tuning)": the adapters package's automatic λ and
largest-gap τ (:func:`lowrank_fl.adapters.aggregate.aggregate_module`).

Every claim here reads the same runs: :func:`lowrank_fl.nn.sec8.run_replicate` for the two
regimes × replicates, under the seeds of ``clair.sec8.table3`` (the sweep cache serves them once).

The backbone (details in :mod:`verify.claims.clair._backbone_rule`): pretraining seeds 0, 1, 2, … in
this order, each trained once with checkpoints (``clair.sec8.backbone_seeds`` reports them all); a
checkpoint *copies* when its masked accuracy on its own pretraining task is at least the midpoint
between the most frequent letter's share, 25.9 %, and 100 % (63.0 %). Full scale uses Song, Xu &
Zhong's recipe (the "standard practice" S5 points to; loss on every position) and the first copying
checkpoint, on a 100-step grid from S5's 5500 steps, whose Local after LoRA (Table 3's homogeneous
design, calibration replicates with seeds of their own) reaches Table 3's 78.27 %: the backbone is
*calibrated* to the paper's Local level, not reproduced from S5's step count. This rule was changed
after a full-scale run that calibrated the bare backbone on a 500-step grid (Local 87.9 %). Quick
(our recipe, loss on the second copy) and smoke (clean copying with uniform letters, which copies
in ~200 steps) take the first copying checkpoint: they check the pipeline past the baseline check,
not the paper's numbers.

Baseline check (fixed before any CLAIR result was looked at): the chosen backbone without LoRA must
copy by the threshold above; otherwise every claim below is inconclusive with that reason (a
backbone that does not copy says nothing about CLAIR).

LoRA "scale 16" (S5) is read as PEFT's ``lora_alpha = 16`` (scaling 16/3 at r = 3;
:data:`ALPHA_READING`): under it an outside reading of S5 and Song et al.'s code found the paper's τ = 0.5 exact in 21/21
homogeneous replicates, under the other reading (scaling 16, ``lora_alpha = 48``) in 0/47 (a
quick-scale run here: 2/2 against 0/2), and ``clair.sec8.detection`` reports both (at quick scale the
other reading on one replicate, to keep the quick run short). The clients' loss positions follow the backbone's recipe.

Claims the paper states with a number are judged on its size: "holds" only when the paper's number
lies within :data:`TOLERANCE` points of ours (the 5-point band of Table 3's cells), "fails" when our
95 % interval lies entirely outside that band around the paper's number.

What the paper leaves open, and our choice (options of the experiments): the contaminated client's
task (default ``"reverse"``: second occurrence reversed; ``clair.sec8.contamination_task`` compares
``"shift"``, ``"upper"`` — the mismatch of Song et al.'s LLM experiments — and ``"clean"``), the
background tokens of fuzzy copying (drawn from the client's power law;
``clair.sec8.background_reading`` compares uniform ones on one seed), the metric's positions
(§8.2's ``M_i``; Song et al.'s code counts one position more, reported beside it for the backbones),
the homogeneous "global noisy-long" evaluation distribution (the common task t = 1.1, L = 16) and the
layer-to-client combination of the sets (each matrix uses its own Ĉ; the client-level detection
below is the majority over the eight matrices).
"""
from __future__ import annotations

import copy
import weakref

import numpy as np

from ...claim import Evidence, claim, verdict_from
from ...criteria import all_of
from ...nn_support import REQUIRES, backbone_dir, direction, mean_ci
from ._sec8_backbone import (ALPHA_READING, backbone_diagnostic, baseline_gate, chosen_backbone, load_backbone,
                                  recipe_label, settings_items, sizes)

__all__: list[str] = []

PAPER = "clair"
MAIN = "clair.sec8.table3"
REGIMES = ("homogeneous", "heterogeneous")
#: Table 3's columns, then ours: CLAIR with the adapters package's automatic λ and largest-gap τ
PAPER_METHODS = ("local", "fedavg", "oracle", "clair")
METHODS = (*PAPER_METHODS, "clair-auto")
LABELS = {"local": "Local", "fedavg": "FedAvg", "oracle": "FedAvg (Oracle)", "clair": "CLAIR",
          "clair-auto": "CLAIR (automatic tuning)"}
LAYERS = tuple(f"blocks.{b}.{m}_proj" for b in range(2) for m in "qkvo")
#: Table 3 of the paper (masked next-token accuracy, %, 9 benign clients x 100 replicates)
TABLE3 = {"homogeneous": {"local": 78.27, "fedavg": 62.94, "oracle": 79.17, "clair": 78.48},
          "heterogeneous": {"local": 77.77, "fedavg": 75.96, "oracle": 76.96, "clair": 77.90}}
TOLERANCE = 5.0     # points: "reproduces Table 3" = every cell within 5 points of the paper's
#: PEFT's lora_alpha at S5's rank 3 under each reading of "LoRA scale 16"
LORA_ALPHA = {"scaling": 48, "alpha": 16}
ALPHA_READINGS = tuple(LORA_ALPHA)
#: pretraining of the background-reading remark (our recipe, S5's 5500 steps at full scale)
PRETRAIN = {"smoke": {"steps": 100}, "quick": {"steps": 2500}, "full": {"steps": 5500}}


def _task(*, seed, regime, contamination, pretrain, pretrain_seed, cache_dir, n_train, n_test,
          alpha_reading=ALPHA_READING):
    """One replicate of one regime → plain lists (picklable, cacheable)."""
    from lowrank_fl.nn.clients import LoraSettings
    from lowrank_fl.nn.sec8 import run_replicate

    backbone = load_backbone(tuple(sorted(pretrain.items())), pretrain_seed, cache_dir)
    lora = LoraSettings(n_train=n_train, loss=dict(pretrain)["loss"], alpha_reading=alpha_reading)
    r = run_replicate(backbone, regime, contamination=contamination, lora=lora, n_test=n_test, seed=seed)
    return {"accuracy": {m: 100.0 * np.asarray(v) for m, v in r.accuracy.items()},
            "benign": np.asarray(r.benign), "truth": np.asarray(r.truth),
            "tasks": [(t.length, t.exponent, t.kind) for t in r.tasks], "status": list(r.clair_status),
            "block_norms": np.asarray(r.block_norms), "benign_auto": np.asarray(r.benign_auto)}


#: the runs each sweep (one verify run) has computed: {sweep: {key: (results, seeds, records)}}
_RUNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def runs(ctx, *, contamination: str = "reverse", reps: int | None = None,
         alpha_reading: str = ALPHA_READING) -> dict:
    """``{regime: [replicate result, ...]}`` under the seeds of ``clair.sec8.table3`` (default
    contamination; both α readings share them, so their replicates are paired) or of
    ``clair.sec8.table3/<contamination>``.

    The claims of this module read the same runs: computed once per sweep (one verify run; keyed
    by everything the tasks and their seeds depend on), the others reuse them with their seeds and
    solve records, also without the sweep's disk cache (``--no-cache``), as that cache would."""
    s = sizes(ctx)
    label = MAIN if contamination == "reverse" else f"{MAIN}/{contamination}"
    main = ctx.for_claim(label)
    c = chosen_backbone(ctx)
    cache_dir = backbone_dir(ctx)
    pretrain = dict(settings_items(c["settings"]))
    grid = [{"regime": reg, "contamination": contamination, "pretrain": pretrain,
             "pretrain_seed": c["seed"], "cache_dir": cache_dir, "n_train": s["n_train"],
             "n_test": s["n_test"], **({} if alpha_reading == ALPHA_READING else {"alpha_reading": alpha_reading})}
            for reg in REGIMES]
    memo = _RUNS.setdefault(ctx.sweep, {})
    key = (ctx.scale, int(ctx.base_seed), label, reps or s["reps"], repr(grid))
    if key in memo:
        results, seeds, records = memo[key]
        main.solves.extend(dict(r) for r in records)
    else:
        load_backbone(settings_items(c["settings"]), c["seed"], cache_dir)   # once, before the workers
        before = len(main.solves)
        results = dict(zip(REGIMES, main.map(_task, grid, replicates=reps or s["reps"])))
        seeds, records = list(main.seeds_used), [dict(r) for r in main.solves[before:]]
        memo[key] = (results, seeds, records)
    ctx.seeds_used.extend(seeds)
    return copy.deepcopy(results)


def benign_mean(rep: dict, method: str) -> float:
    """Average accuracy (%) over the benign clients of one replicate (Table 3's inner average)."""
    return float(np.nanmean(rep["accuracy"][method]))


def table3_rows(results: dict) -> list[dict]:
    """Paper vs ours (mean ± SE over replicates of the benign-client average), per regime × method."""
    rows = []
    for reg in REGIMES:
        for m in METHODS:
            if m not in results[reg][0]["accuracy"]:
                continue
            mean, se, lo, hi = mean_ci([benign_mean(r, m) for r in results[reg]])
            paper = TABLE3[reg].get(m)
            rows.append({"regime": reg, "method": LABELS[m], "paper": paper, "ours": mean,
                         "se": se, "difference": None if paper is None else mean - paper})
    return rows


def table3_verdict(rows) -> bool | None:
    """Every cell within :data:`TOLERANCE` points of the paper's → True; a cell further than the
    tolerance plus two standard errors → False; otherwise (too noisy to tell) None. Rows without a
    paper number (our extra column) do not count."""
    rows = [r for r in rows if r["paper"] is not None]
    far = [abs(r["difference"]) - TOLERANCE for r in rows]
    if all(f <= 0 for f in far):
        return True
    if any(f > 2 * r["se"] for f, r in zip(far, rows)):
        return False
    return None


def paired(results: dict, regime: str, a: str, b: str) -> tuple[float, float, float, float]:
    """Mean, SE and 95% interval over replicates of ``acc(a) - acc(b)`` (benign averages, points)."""
    return mean_ci([benign_mean(r, a) - benign_mean(r, b) for r in results[regime]])


def _per_client_figure(results):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    for col, reg in enumerate(REGIMES):
        clients = np.flatnonzero(results[reg][0]["truth"])
        methods = [m for m in METHODS if m in results[reg][0]["accuracy"]]
        acc = {m: np.full(len(results[reg][0]["truth"]), np.nan) for m in methods}
        for m in methods:
            acc[m][clients] = np.mean([r["accuracy"][m][clients] for r in results[reg]], axis=0)
        w = 0.8 / len(methods)
        for i, m in enumerate(methods):
            off = (i - (len(methods) - 1) / 2) * w
            axes[0, col].bar(clients + off, acc[m][clients], w, label=LABELS[m])
            if m != "local":
                rel = 100 * (acc[m][clients] - acc["local"][clients]) / acc["local"][clients]
                axes[1, col].bar(clients + off, rel, w, label=LABELS[m])
        axes[0, col].set_title(f"{reg} (evaluated on {'the common task' if reg == 'homogeneous' else 'own task'})")
        axes[0, col].set_ylabel("masked accuracy (%)")
        axes[1, col].set_ylabel("relative change vs Local (%)")
        axes[1, col].axhline(0, color="k", lw=0.6)
        axes[1, col].set_xlabel("benign client")
        axes[1, col].set_xticks(clients)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Per-client masked next-token accuracy ({len(results[REGIMES[0]])} replicates; paper's Figs. 2-3)")
    fig.tight_layout()
    return fig


@claim(MAIN, paper=PAPER, reference="§8.3, Table 3, Figures 2-3, S5",
       statement="Average masked next-token accuracy of benign clients (Local, FedAvg, FedAvg (Oracle), "
                 "CLAIR) is 78.27/62.94/79.17/78.48% homogeneous and 77.77/75.96/76.96/77.90% heterogeneous.",
       kind="comparison", requires=REQUIRES)
def _table3(ctx, *, contamination: str = "reverse") -> Evidence:
    results = runs(ctx, contamination=contamination)
    rows = table3_rows(results)
    ok = table3_verdict(rows)
    n = len(results[REGIMES[0]])
    diag = backbone_diagnostic(ctx)
    return baseline_gate(ctx, Evidence(
        verdict=verdict_from(ok),
        summary="; ".join(f"{reg}: " + ", ".join(f"{r['method']} {r['ours']:.1f}±{r['se']:.1f} (paper {r['paper'] or '-'})"
                                                 for r in rows if r["regime"] == reg) for reg in REGIMES),
        measured={"rows": rows, "replicates": n},
        predicted={"paper": TABLE3, "tolerance_points": TOLERANCE},
        table=rows, figure=ctx.save_figure(_per_client_figure(results), name=f"{MAIN}.per_client"),
        notes=f"Standard errors over {n} replicates (the paper reports none, over 100). Contaminated client's "
              f"task: {contamination!r} (unspecified by the paper). Backbone: {recipe_label(ctx)}; LoRA scale "
              f"read as {ALPHA_READING!r}. 'Holds' = every cell within {TOLERANCE:g} points of the paper's. "
              f"Backbone without LoRA: masked accuracy {diag['masked_accuracy']:.1f}% on the common task "
              f"({diag['masked_accuracy_song_metric']:.1f}% by Song et al.'s metric), next-token loss "
              f"{diag['next_token_loss']:.3f} vs the unigram entropy {diag['unigram_entropy']:.3f}."))


# ------------------------------------------------------------------------------------------ detection
def detection_counts(results: dict) -> dict:
    """Per regime: ``excluded[layer, client]`` = replicates in which CLAIR left the client out of
    Ĉ on that matrix; ``layer_exact`` = (layer, replicate) pairs with Ĉ equal to the truth;
    ``client_exact`` = replicates where the majority-over-matrices set equals the truth."""
    out = {}
    for reg in REGIMES:
        reps = results[reg]
        benign = np.stack([r["benign"] for r in reps])            # (R, 8, K)
        truth = reps[0]["truth"]
        client_level = benign.mean(axis=1) > 0.5                  # (R, K)
        K = truth.size
        j, k = np.triu_indices(K, 1)
        contaminated_pair = ~(truth[j] & truth[k])
        norms = np.stack([r["block_norms"] for r in reps]) if "block_norms" in reps[0] else None
        sep = ({} if norms is None else {
            "median_norm_benign_pairs": float(np.median(norms[..., ~contaminated_pair])),
            "median_norm_contaminated_pairs": float(np.median(norms[..., contaminated_pair])),
            # per (replicate, matrix): do all contaminated pairs exceed every benign pair?
            "separable": int((norms[..., contaminated_pair].min(-1) > norms[..., ~contaminated_pair].max(-1)).sum()),
            **largest_gap_taus(norms)})
        auto = {}
        if reps[0].get("benign_auto") is not None and np.ndim(reps[0]["benign_auto"]) == 2:
            ba = np.stack([r["benign_auto"] for r in reps])
            auto = {"auto_layer_exact": int((ba == truth).all(axis=2).sum()),
                    "auto_client_exact": int(((ba.mean(axis=1) > 0.5) == truth).all(axis=1).sum())}
        out[reg] = {**sep, **auto, "excluded": (~benign).sum(axis=0), "replicates": len(reps), "truth": truth,
                    "layer_exact": int((benign == truth).all(axis=2).sum()),
                    "layer_total": int(benign.shape[0] * benign.shape[1]),
                    "client_exact": int((client_level == truth).all(axis=1).sum())}
    return out


def largest_gap_taus(norms) -> dict:
    """The plain largest-gap τ (midpoint of the largest gap between sorted block norms,
    :func:`lowrank_fl.clair.largest_gap_threshold`) of every (replicate, matrix): its median and
    quartiles, to set beside the paper's τ. ``norms``: (R, 8, G)."""
    from lowrank_fl.clair import largest_gap_threshold

    taus = np.array([largest_gap_threshold(n) for n in np.asarray(norms).reshape(-1, np.shape(norms)[-1])])
    q1, med, q3 = np.percentile(taus, [25, 50, 75])
    return {"largest_gap_tau_median": float(med), "largest_gap_tau_quartiles": [float(q1), float(q3)]}


def detection_verdict(counts: dict) -> bool:
    """The paper's statement: exact client-level identification in both regimes in every replicate,
    and layerwise exact on all eight matrices in the homogeneous regime."""
    h = counts["homogeneous"]
    return (h["layer_exact"] == h["layer_total"]
            and all(c["client_exact"] == c["replicates"] for c in counts.values()))


def _heatmap(counts):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12.5, 3.8), gridspec_kw={"wspace": 0.5})
    for ax, reg in zip(axes, REGIMES):
        c = counts[reg]
        frac = c["excluded"] / c["replicates"]
        im = ax.imshow(frac, vmin=0, vmax=1, cmap="magma_r", aspect="auto")
        ax.set_yticks(range(len(LAYERS)), LAYERS, fontsize=7)
        K = frac.shape[1]
        ax.set_xticks(range(K), [f"{k}{'*' if not c['truth'][k] else ''}" for k in range(K)])
        ax.set_xlabel("client (* = contaminated)")
        ax.set_title(f"{reg}: fraction excluded from Ĉ")
    fig.colorbar(im, ax=axes, shrink=0.8)
    return fig


@claim("clair.sec8.detection", paper=PAPER, reference="§8.3 (first paragraph)",
       statement="CLAIR identifies the contaminated client exactly in both regimes; layerwise recovery is "
                 "exact for all eight attention matrices in the homogeneous regime.",
       kind="comparison", requires=REQUIRES)
def _detection(ctx, *, contamination: str = "reverse") -> Evidence:
    from lowrank_fl.nn.sec8 import PAPER_TUNING

    readings = (ALPHA_READING, *(r for r in ALPHA_READINGS if r != ALPHA_READING))
    # the other reading is reported, not judged: one replicate at quick scale (paired with the first)
    other_reps = ctx.pick(smoke=None, quick=1, full=None)
    by_reading = {r: detection_counts(runs(ctx, contamination=contamination, alpha_reading=r,
                                           reps=None if r == ALPHA_READING else other_reps))
                  for r in readings}
    counts = by_reading[ALPHA_READING]
    ok = detection_verdict(counts)
    table = []
    for reg in REGIMES:
        c = counts[reg]
        for li, layer in enumerate(LAYERS):
            table.append({"regime": reg, "matrix": layer,
                          **{f"client {k}{'*' if not c['truth'][k] else ''}": int(c["excluded"][li, k])
                             for k in range(c["excluded"].shape[1])}})
    readings_rows = [{"LoRA scale reading": f"{r} (lora_alpha = {LORA_ALPHA[r]})", "regime": reg,
                      "paper's tau": PAPER_TUNING[reg][2],
                      "client-level exact": f"{c['client_exact']}/{c['replicates']}",
                      "layerwise exact": f"{c['layer_exact']}/{c['layer_total']}",
                      "separable by some tau": f"{c.get('separable', '?')}/{c['layer_total']}",
                      "largest-gap tau (median)": c.get("largest_gap_tau_median"),
                      "benign-pair norm (median)": c.get("median_norm_benign_pairs")}
                     for r, cs in by_reading.items() for reg, c in cs.items()]
    return baseline_gate(ctx, Evidence(
        verdict=verdict_from(ok),
        summary="; ".join(f"{reg}: layerwise exact {c['layer_exact']}/{c['layer_total']}, client-level exact "
                          f"{c['client_exact']}/{c['replicates']}, separable by some tau "
                          f"{c.get('separable', '?')}/{c['layer_total']}, largest-gap tau "
                          f"{c.get('largest_gap_tau_median', float('nan')):.3g} (paper {PAPER_TUNING[reg][2]:g})"
                          for reg, c in counts.items())
                + "; client-level exact by reading: " + ", ".join(
                    f"{r}: " + "/".join(f"{c['client_exact']}/{c['replicates']}" for c in cs.values())
                    for r, cs in by_reading.items()),
        measured={"readings": {r: {reg: {k: v for k, v in c.items() if k != "excluded"} | {"excluded": c["excluded"]}
                                       for reg, c in cs.items()} for r, cs in by_reading.items()},
                  "default_reading": ALPHA_READING, "excluded_per_matrix": table},
        predicted={"layer_exact_homogeneous": "all", "client_exact": "all"},
        table=readings_rows, figure=ctx.save_figure(_heatmap(counts)),
        notes=f"Verdict under the default LoRA-scale reading {ALPHA_READING!r} (lora_alpha = 16, scaling 16/r); the "
              "other reading ('scaling': lora_alpha = 16 r) on the same seeds is listed beside it. The figure (and "
              "measured.excluded_per_matrix): replicates in which each client was excluded on each matrix "
              "(* = contaminated). "
              "Client-level set = clients kept on a majority of the eight matrices (the paper does not "
              "say how it combines them). 'separable' counts the (replicate, matrix) pairs where every pair "
              "involving the contaminated client has a larger block norm than every benign pair, i.e. where "
              "some threshold tau would detect exactly; the largest-gap tau (median over (replicate, matrix)) "
              "and the benign-pair medians put the paper's tau (0.5 / 0.01) in scale."))


# ------------------------------------------------------------------------------------------ orderings
def size_verdict(mean: float, low: float, high: float, paper: float, band: float = TOLERANCE) -> bool | None:
    """Judge a number the paper states on its size: True when the paper's number lies within
    ``band`` points of our mean; False when our whole interval ``[low, high]`` lies more than
    ``band`` points away from it; None (too noisy to tell) otherwise."""
    if abs(mean - paper) <= band:
        return True
    if low > paper + band or high < paper - band:
        return False
    return None


def _ordering(ctx, regime, pairs, statement, contamination, *, judge: str = "sign"):
    """Paired differences ``a - b``: ``judge="sign"`` asks for > 0 (interval above 0),
    ``judge="size"`` compares them with Table 3's differences by :func:`size_verdict`."""
    results = runs(ctx, contamination=contamination)
    rows, outcomes = [], []
    for a, b in pairs:
        mean, se, lo, hi = paired(results, regime, a, b)
        d = direction(lo, hi)
        paper = TABLE3[regime][a] - TABLE3[regime][b]
        outcomes.append(d if judge == "sign" else size_verdict(mean, lo, hi, paper))
        rows.append({"regime": regime, "difference": f"{LABELS[a]} - {LABELS[b]}", "mean": mean, "se": se,
                     "ci_low": lo, "ci_high": hi, "paper": paper,
                     "sign": {True: "> 0", False: "< 0", None: "within noise"}[d],
                     **({"paper within band": abs(mean - paper) <= TOLERANCE} if judge == "size" else {})})
    rule = ("'within noise' (interval containing 0) gives inconclusive" if judge == "sign" else
            f"holds when each of the paper's differences lies within {TOLERANCE:g} points of ours, fails when "
            f"an interval lies entirely more than {TOLERANCE:g} points from the paper's number, otherwise "
            "inconclusive; the sign is listed, not judged")
    return baseline_gate(ctx, Evidence(verdict=verdict_from(all_of(outcomes)),
                    summary=", ".join(f"{r['difference']} = {r['mean']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"
                                      f" (paper {r['paper']:+.2f})" for r in rows),
                    measured={"rows": rows},
                    predicted=({"all differences": "> 0"} if judge == "sign" else
                               {"differences": {r["difference"]: r["paper"] for r in rows}, "band_points": TOLERANCE}),
                    table=rows,
                    notes=f"{statement} Paired differences of benign-client averages over "
                          f"{len(results[regime])} replicates, 95% t intervals; {rule}."))


@claim("clair.sec8.oracle_best_homogeneous", paper=PAPER, reference="§8.3, Table 3 (homogeneous row)",
       statement="In the homogeneous regime oracle FedAvg has the highest accuracy (above Local, FedAvg and CLAIR).",
       kind="comparison", requires=REQUIRES)
def _oracle_best(ctx, *, contamination: str = "reverse") -> Evidence:
    return _ordering(ctx, "homogeneous", [("oracle", "local"), ("oracle", "fedavg"), ("oracle", "clair")],
                     "Oracle FedAvg minus each other method.", contamination)


@claim("clair.sec8.clair_best_heterogeneous", paper=PAPER, reference="§8.3, Table 3 (heterogeneous row)",
       statement="In the heterogeneous regime CLAIR attains the highest average own-client accuracy: "
                 "CLAIR - Local = 0.13, CLAIR - FedAvg = 1.94, CLAIR - FedAvg (Oracle) = 0.94 points (Table 3).",
       kind="comparison", requires=REQUIRES)
def _clair_best(ctx, *, contamination: str = "reverse") -> Evidence:
    return _ordering(ctx, "heterogeneous", [("clair", "local"), ("clair", "fedavg"), ("clair", "oracle")],
                     "CLAIR minus each other method, judged on size (Table 3's margins are 0.13-1.94 points).",
                     contamination, judge="size")


@claim("clair.sec8.fedavg_negative_transfer", paper=PAPER, reference="§8.3, Table 3",
       statement="FedAvg over all clients suffers negative transfer: Local - FedAvg = 15.33 points homogeneous "
                 "(78.27 - 62.94) and 1.81 heterogeneous (77.77 - 75.96).",
       kind="comparison", requires=REQUIRES)
def _negative_transfer(ctx, *, contamination: str = "reverse") -> Evidence:
    results = runs(ctx, contamination=contamination)
    rows, outcomes = [], []
    for reg in REGIMES:
        mean, se, lo, hi = paired(results, reg, "local", "fedavg")
        paper = TABLE3[reg]["local"] - TABLE3[reg]["fedavg"]
        outcomes.append(size_verdict(mean, lo, hi, paper))
        rows.append({"regime": reg, "Local - FedAvg": mean, "se": se, "ci_low": lo, "ci_high": hi, "paper": paper,
                     "paper within band": abs(mean - paper) <= TOLERANCE,
                     "sign": {True: "> 0", False: "< 0", None: "within noise"}[direction(lo, hi)]})
    return baseline_gate(ctx, Evidence(verdict=verdict_from(all_of(outcomes)),
                    summary=", ".join(f"{r['regime']}: Local - FedAvg = {r['Local - FedAvg']:+.2f} "
                                      f"[{r['ci_low']:+.2f}, {r['ci_high']:+.2f}] (paper {r['paper']:+.2f}, "
                                      f"band ±{TOLERANCE:g})" for r in rows),
                    measured={"rows": rows},
                    predicted={"Local - FedAvg": {r["regime"]: r["paper"] for r in rows}, "band_points": TOLERANCE},
                    table=rows,
                    notes=f"Judged on size: holds when the paper's drop lies within {TOLERANCE:g} points of ours in "
                          f"both regimes, fails when an interval lies entirely more than {TOLERANCE:g} points from "
                          "it, otherwise inconclusive. A drop of the right sign but a fraction of the paper's size "
                          "does not reproduce the paper's negative transfer."))


# ------------------------------------------------------------------------------------------ contamination
@claim("clair.sec8.contamination_task", paper=PAPER, reference="§8.2 (the contaminated client's task), S5",
       statement="The §8 conclusions (exact detection; CLAIR at least as good as Local) do not depend on which "
                 "mismatched copying task the contaminated client learns (the paper does not say which).",
       kind="comparison", requires=REQUIRES)
def _contamination(ctx, *, kinds=None) -> Evidence:
    kinds = kinds or ctx.pick(smoke=("reverse", "upper"), quick=("reverse", "upper"),
                              full=("reverse", "shift", "upper", "clean"))
    reps = ctx.pick(smoke=1, quick=1, full=6)
    rows, outcomes = [], []
    for kind in kinds:
        res = runs(ctx, contamination=kind, reps=None if kind == "reverse" else reps)
        counts = detection_counts(res)
        for reg in REGIMES:
            mean, se, lo, hi = paired(res, reg, "clair", "local")
            fa = paired(res, reg, "local", "fedavg")
            c = counts[reg]
            exact = c["client_exact"] == c["replicates"]
            outcomes.append(bool(exact and hi >= 0))      # hi >= 0: CLAIR not significantly below Local
            rows.append({"contamination": kind, "regime": reg, "replicates": c["replicates"],
                         "client-level exact": f"{c['client_exact']}/{c['replicates']}",
                         "layerwise exact": f"{c['layer_exact']}/{c['layer_total']}",
                         "CLAIR - Local": mean, "ci_low": lo, "ci_high": hi, "Local - FedAvg": fa[0]})
    ok = all(outcomes)
    return baseline_gate(ctx, Evidence(verdict=verdict_from(ok),
                    summary="; ".join(f"{r['contamination']}/{r['regime'][:3]}: detect {r['client-level exact']}, "
                                      f"CLAIR-Local {r['CLAIR - Local']:+.2f}" for r in rows),
                    measured={"rows": rows}, predicted={"detection": "exact", "CLAIR - Local": ">= 0 (not below)"},
                    table=rows,
                    notes="Tasks (lowrank_fl.nn.copying.CONTAMINATIONS): 'reverse' (second occurrence reversed), "
                          "'shift' (shifted by one letter), 'upper' (in upper case: the mismatch of Song et al.'s LLM "
                          "experiments), 'clean' (clean instead of fuzzy copying). 'reverse' (default) reuses the "
                          "main runs; the others have their own seeds and fewer replicates. Holds when detection is exact and CLAIR is not significantly below Local "
                          "for every task."))



# ------------------------------------------------------------------------------------------ background reading
def _background_task(*, seed, background, pretrain, pretrain_seed, cache_dir, n):
    """Pretrain (or load) the backbone of one background reading and score it: masked accuracy (%)
    of each of ``n`` common-task sequences (t = 1.1, L = 16) of that reading."""
    from lowrank_fl.nn import copying
    from lowrank_fl.nn.clients import predict

    pre = {**pretrain, "background": background} if background != "power-law" else dict(pretrain)
    model = load_backbone(tuple(sorted(pre.items())), pretrain_seed, cache_dir)
    batch = copying.sample(n, length=16, exponent=1.1, background=background, seed=seed)
    M = copying.mask(batch)
    hits = (predict(model, batch) == batch.tokens) & M
    return 100.0 * hits.sum(axis=1) / M.sum(axis=1)


#: pretraining steps of the background comparison per scale (full: the main runs' backbone, cached;
#: quick: fewer steps than the main runs so that both pretrainings fit the quick budget, in parallel)
BACKGROUND_STEPS = {"smoke": 100, "quick": 1000, "full": PRETRAIN["full"]["steps"]}


@claim("clair.sec8.background_reading", paper=PAPER, reference="§8.1, S5 (fuzzy copying: \"random tokens\")",
       statement="S5's fuzzy copying fills the non-copy positions with \"random tokens\" without saying from which "
                 "distribution. On one pretraining seed the reading can change what the S5 backbone learns: pretrained "
                 "by the same recipe and seed, with the background drawn from the segment's power law (our default) or uniform over the 52 "
                 "letters, the backbones' masked accuracy on the common task (t = 1.1, L = 16, each reading's own "
                 "sequences) differs by more than Table 3's 5-point tolerance.",
       kind="remark", requires=REQUIRES)
def _background_reading(ctx) -> Evidence:
    from lowrank_fl.nn import copying

    steps = ctx.pick(**BACKGROUND_STEPS)
    sub = ctx.for_claim("clair.sec8.background_reading")
    grid = [{"background": bg, "pretrain": {**PRETRAIN["full"], "steps": steps},
             "pretrain_seed": ctx.for_claim(MAIN).seed(99, 0), "cache_dir": backbone_dir(ctx),
             "n": ctx.pick(smoke=50, quick=500, full=1000)} for bg in copying.BACKGROUNDS]
    out = sub.map(_background_task, grid, replicates=1)
    ctx.seeds_used.extend(sub.seeds_used)
    acc = {bg: np.asarray(row[0]) for bg, row in zip(copying.BACKGROUNDS, out)}
    rows = []
    for bg in copying.BACKGROUNDS:
        m, se, lo, hi = mean_ci(acc[bg])
        rows.append({"background": bg, "masked accuracy (%)": m, "se": se, "ci_low": lo, "ci_high": hi,
                     "Table 3 Local (homogeneous, after LoRA)": TABLE3["homogeneous"]["local"]})
    n = acc["uniform"].size
    d = acc["uniform"].mean() - acc["power-law"].mean()
    se_d = float(np.hypot(*(a.std(ddof=1) / np.sqrt(a.size) for a in acc.values())))
    lo, hi = d - 1.96 * se_d, d + 1.96 * se_d
    # holds: the interval lies beyond ±TOLERANCE; fails: inside it; inconclusive: it straddles a bound
    ok = True if (lo > TOLERANCE or hi < -TOLERANCE) else (False if -TOLERANCE <= lo and hi <= TOLERANCE else None)
    return baseline_gate(ctx, Evidence(
        verdict=verdict_from(ok),
        summary=", ".join(f"{r['background']} background: {r['masked accuracy (%)']:.1f}% "
                          f"[{r['ci_low']:.1f}, {r['ci_high']:.1f}]" for r in rows)
                + f"; uniform - power-law = {d:+.1f} [{lo:+.1f}, {hi:+.1f}] points (vs {TOLERANCE:g}); "
                  f"Table 3's Local: {TABLE3['homogeneous']['local']}",
        measured={"rows": rows, "difference": d, "interval": [lo, hi]},
        predicted={"|difference|": f"> {TOLERANCE:g} points"}, table=rows,
        notes=f"{steps} pretraining steps per reading (S5: 5500), the main runs' pretraining seed, one seed per "
              "reading; "
              f"intervals over {n} test sequences each (not over pretraining seeds). The main §8 runs use the "
              "power-law reading. A remark, not a test of the paper. The seed confounds it: in an outside reading of S5 "
              "and Song et al.'s code, 2 of 9 power-law seeds stay on a plateau near 60% on the common task (the committed full "
              "report's power-law backbone: 59.8%) while 7 of 9 reach 97-98%, as uniform backgrounds do; "
              "clair.sec8.backbone_seeds shows the spread over seeds."))
