"""The client-level decision of an aggregation, with its evidence: ``summary.json["detection"]``
and the sentence the CLI ends with.

``detection`` holds ``rule``; ``flagged`` — the clients excluded from refinement (under
``"per-module"`` the sets differ per module: the clients excluded in at least one module, each
module's own set in ``modules``); ``scores`` and ``threshold`` — the statistic the rule compares
(``"pooled"``: the modified z-scores of :mod:`.detect` against its cutoff ``c_K``, a client flagged
only where its distance ratio in ``pooled_ratios`` also reaches ``pooled_min_ratio``; ``"majority"`` / ``"any"``:
the fraction of modules whose set (8) excludes the client, flagged above 0.5 / 0;
``"per-module"``: the same fraction, no client-level threshold); ``pooled_scores``,
``pooled_threshold``, ``pooled_ratios`` and ``pooled_min_ratio`` (always, as evidence);
``separated_modules`` — modules whose largest-gap split was admissible;
``modules`` — per module the clients its own (8) excludes, whether it separated, and the gap ratio.
"""
from __future__ import annotations

import numpy as np

from .aggregate import client_decision
from .detect import POOLED_MIN_RATIO, pooled_ratios, pooled_scores, pooled_threshold

__all__ = ["detection_summary", "detection_sentence"]


def _min_gap_ratio() -> float:
    from ..clair.pipeline import MIN_GAP_RATIO

    return float(MIN_GAP_RATIO)


def detection_summary(results, names, rule: str) -> dict:
    """``summary.json["detection"]`` of CLAIR module results (module docstring)."""
    K = len(names)
    flags = np.array([r.benign for r in results], bool)                 # (modules, K) per-module
    excluded_frac = 1.0 - flags.mean(axis=0)
    norms = np.array([r.block_norms for r in results], float)
    pooled, _ = pooled_scores(norms, K)
    ratios = pooled_ratios(norms, K)
    decided = client_decision(results, rule)
    pooled_cutoff = pooled_threshold(K) if K >= 3 else None
    if decided is None:                                                 # per-module
        flagged = ~flags.all(axis=0)
        scores, threshold = excluded_frac, None
    elif rule == "pooled":
        flagged, scores, threshold = ~decided, pooled, pooled_cutoff
    else:
        flagged, scores = ~decided, excluded_frac
        threshold = 0.5 if rule == "majority" else 0.0
    return {
        "rule": rule,
        "flagged": [n for n, f in zip(names, flagged) if f],
        "scores": dict(zip(names, np.round(scores, 6).tolist())),
        "threshold": threshold,
        "pooled_scores": dict(zip(names, np.round(pooled, 6).tolist())),
        "pooled_threshold": pooled_cutoff,
        "pooled_ratios": dict(zip(names, np.round(ratios, 6).tolist())),
        "pooled_min_ratio": POOLED_MIN_RATIO,
        "separated_modules": [r.name for r in results if r.separated],
        "modules": {r.name: {"flagged": [n for n, b in zip(names, r.benign) if not b],
                             "separated": bool(r.separated),
                             "gap_ratio": None if r.gap_ratio is None or not np.isfinite(r.gap_ratio)
                             else float(r.gap_ratio)}
                    for r in results},
    }


def detection_sentence(det: dict) -> str:
    """One sentence: which clients were flagged and on what evidence, or that none was."""
    need = _min_gap_ratio()
    ratios = [(v["gap_ratio"], m) for m, v in det["modules"].items() if v["gap_ratio"] is not None]
    best = max(ratios) if ratios else None
    if best is None:
        margin = "no module had two distinct block norms"
    elif best[0] >= need:   # a gap wide enough, but too few pairs below it for a majority set (8)
        margin = (f"largest gap ratio {best[0]:.2f} in {best[1]}, above the {need:g} needed but with "
                  "fewer pairs below the gap than a majority set (8) has")
    else:
        margin = f"largest gap ratio {best[0]:.2f} of the {need:g} needed, in {best[1]}"
    top = max(det["pooled_scores"].items(), key=lambda kv: kv[1])
    cut, rho = det["pooled_threshold"], det["pooled_min_ratio"]
    pooled = (f"largest pooled score {top[1]:.2f} ({top[0]}) against the cutoff {cut:.2f}"
              if cut is not None else "no pooled score with fewer than 3 clients")
    if cut is not None and top[1] > cut:   # above the cutoff: the ratio decides
        ratio = det["pooled_ratios"][top[0]]
        pooled += (f", its distance ratio {ratio:.2f} below the {rho:g} a pooled flag needs" if ratio < rho
                   else f", distance ratio {ratio:.2f}: the pooled rule would flag it")
    n_sep = len(det["separated_modules"])
    if not det["flagged"]:
        why = "no module separated" if n_sep == 0 else f"{n_sep} module(s) separated"
        return f"no contaminated client detected ({why}; {margin}; {pooled})."
    rule = det["rule"]
    if rule == "pooled":
        ev = ", ".join(f"{n} {det['scores'][n]:.2f}" for n in det["flagged"])
        rat = ", ".join(f"{det['pooled_ratios'][n]:.2f}" for n in det["flagged"])
        return (f"flagged {', '.join(det['flagged'])} by the pooled rule over all modules (pooled "
                f"score {ev} > {det['threshold']:.2f}, distance ratio {rat} >= "
                f"{det['pooled_min_ratio']:g}; {n_sep} module(s) separated on their own).")
    # "<client> is outside ...", not "excluded by <client>": the sets (8) exclude the client
    ev = "; ".join(f"{n} is outside the set (8) in {det['scores'][n]:.0%} of the modules"
                   for n in det["flagged"])
    what = {"per-module": "each in the modules whose set (8) excludes it",
            "majority": "in every module (excluded by a majority of modules' sets (8))",
            "any": "in every module (excluded by at least one module's set (8))"}[rule]
    return (f"flagged {', '.join(det['flagged'])} {what}: {ev} ({n_sep} module(s) separated; "
            f"{pooled}).")
