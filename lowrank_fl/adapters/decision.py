"""The client-level decision of an aggregation, with its evidence: ``summary.json["detection"]``
and the sentence the CLI ends with.

``detection`` holds ``rule``; ``flagged`` — the clients excluded from refinement (under
``"per-module"`` the sets differ per module: the clients excluded in at least one module, each
module's own set in ``modules``); ``scores`` and ``threshold`` — the statistic the rule compares
(``"pooled"``: the modified z-scores of :mod:`.detect` against its cutoff ``c_K``, a client flagged
only where its distance ratio in ``pooled_ratios`` also reaches ``pooled_min_ratio``; ``"majority"`` / ``"any"``:
the fraction of modules whose set (8) excludes the client, flagged above 0.5 / 0;
``"per-module"``: the same fraction, no client-level threshold); ``pooled_scores``,
``pooled_threshold``, ``pooled_ratios``, ``pooled_min_ratio``, ``pooled_flagged`` (whom the pooled
rule flags, whichever rule was applied) and ``pooled_tie`` (the scores tie, so they are bounded)
(always, as evidence); ``undecided`` — the client-level set was not a strict majority, so nobody
is flagged and every client keeps its own adapter, and ``undecided_modules`` — modules whose own
set (8) was not (:mod:`.guard`);
``separated_modules`` — modules whose largest-gap split was admissible;
``modules`` — per module the clients its own (8) excludes, whether it separated, and the gap ratio
(``"inf"`` with no spread below the gap, None with no gap).
"""
from __future__ import annotations

import warnings

import numpy as np

from . import guard
from .aggregate import client_decision
from .detect import POOLED_MIN_RATIO, pooled_evidence

__all__ = ["detection_summary", "detection_sentence"]


def _min_gap_ratio() -> float:
    from ..clair.pipeline import MIN_GAP_RATIO

    return float(MIN_GAP_RATIO)


def _gap_value(g):
    """A module's gap ratio for JSON: a float, ``"inf"`` (no spread below the gap: a single pair,
    or identical ones) or None (no gap: fewer than two distinct norms)."""
    if g is None or np.isnan(g):
        return None
    return "inf" if np.isinf(g) else float(g)


def detection_summary(results, names, rule: str) -> dict:
    """``summary.json["detection"]`` of CLAIR module results (module docstring). Values are the
    exact floats the decision compared (not rounded), so the JSON agrees with ``flagged``. Warns
    where the pooled scores tie (:func:`lowrank_fl.adapters.detect.scores_tie`)."""
    K = len(names)
    flags = guard.abstain([r.benign for r in results])                  # (modules, K); undecided abstain
    excluded_frac = 1.0 - flags.mean(axis=0)
    ev = pooled_evidence(np.array([r.block_norms for r in results], float), K)
    decided = guard.guard_set(~ev.flagged) if rule == "pooled" else client_decision(results, rule)
    pooled_cutoff = ev.cutoff if K >= 3 else None
    tie = K >= 3 and ev.tie
    if tie and rule == "pooled":
        warnings.warn(f"the pooled scores of more than half of the {K} clients tie exactly (identical "
                      "adapters, or K = 3): the fallback scale bounds every score, so the pooled rule "
                      "can hardly flag anyone here; compare --client-rule per-module", RuntimeWarning,
                      stacklevel=3)
    if decided is None:                                                 # per-module
        flagged = ~flags.all(axis=0)
        scores, threshold = excluded_frac, None
    elif rule == "pooled":
        flagged, scores, threshold = ~decided, ev.scores, pooled_cutoff
    else:
        flagged, scores = ~decided, excluded_frac
        threshold = 0.5 if rule == "majority" else 0.0
    undecided = decided is not None and guard.is_undecided(decided)     # nobody flagged, all keep own
    if undecided:
        flagged = np.zeros(K, bool)
    return {
        "rule": rule,
        "flagged": [n for n, f in zip(names, flagged) if f],
        "undecided": bool(undecided),
        "undecided_modules": [r.name for r in results if guard.is_undecided(np.asarray(r.benign, bool))],
        "scores": dict(zip(names, np.asarray(scores, float).tolist())),
        "threshold": threshold,
        "pooled_scores": dict(zip(names, ev.scores.tolist())),
        "pooled_threshold": pooled_cutoff,
        "pooled_ratios": dict(zip(names, ev.ratios.tolist())),
        "pooled_min_ratio": POOLED_MIN_RATIO,
        "pooled_flagged": [n for n, f in zip(names, ev.flagged) if f],
        "pooled_tie": bool(tie),
        "separated_modules": [r.name for r in results if r.separated],
        "modules": {r.name: {"flagged": [n for n, b in zip(names, r.benign) if not b and any(r.benign)],
                             "separated": bool(r.separated),
                             "gap_ratio": _gap_value(r.gap_ratio)}
                    for r in results},
    }


def _vs(value: float, ref: float) -> str:
    """``value`` with enough decimals that it reads on the same side of ``ref`` as it is."""
    for d in range(2, 17):
        text = f"{value:.{d}f}"
        if (float(text) < ref) == (value < ref) and (float(text) > ref) == (value > ref):
            return text
    return repr(value)


def _pooled_clause(det: dict) -> str:
    """What the pooled rule says, whichever rule was applied."""
    cut, rho = det["pooled_threshold"], det["pooled_min_ratio"]
    if cut is None:
        return "no pooled score with fewer than 3 clients"
    name, top = max(det["pooled_scores"].items(), key=lambda kv: kv[1])
    text = f"largest pooled score {_vs(top, cut)} ({name}) against the cutoff {cut:.2f}"
    would = det["pooled_flagged"]
    if det["rule"] != "pooled" and would:
        return text + f"; the pooled rule would flag {', '.join(would)}"
    if top > cut and name not in would:   # above the cutoff, kept: the ratio says why
        text += (f", its distance ratio {_vs(det['pooled_ratios'][name], rho)} below the {rho:g} a "
                 "pooled flag needs")
    if det["pooled_tie"]:
        text += "; the pooled scores of most clients tie, which bounds every score"
    return text


def detection_sentence(det: dict) -> str:
    """One sentence: which clients were flagged and on what evidence, or that none was."""
    need = _min_gap_ratio()
    n_sep = len(det["separated_modules"])
    pooled = _pooled_clause(det)
    note = ""
    if det.get("undecided") or det.get("undecided_modules"):
        where = ("every module" if det.get("undecided") else
                 f"{len(det['undecided_modules'])} module(s) ({', '.join(det['undecided_modules'][:3])}"
                 f"{', ...' if len(det['undecided_modules']) > 3 else ''})")
        note = (f"; the evidence cannot decide in {where}: a set there would not be a strict majority "
                "(lowrank_fl.adapters.guard)")
        pooled += note
    if not det["flagged"]:
        if n_sep:
            why = (f"{n_sep} module(s) separated, their own sets (8) excluding "
                   + ", ".join(sorted({n for m in det["separated_modules"] for n in det["modules"][m]["flagged"]}))
                   + f" there, but the {det['rule']} rule flags nobody")
            return f"no contaminated client detected ({why}; {pooled})."
        gaps = [(float(v["gap_ratio"]), m) for m, v in det["modules"].items() if v["gap_ratio"] is not None]
        best = max(gaps) if gaps else None
        if best is None:
            margin = "no module had two distinct block norms"
        elif best[0] >= need:   # a gap wide enough, but too few pairs below it for a majority set (8)
            margin = (f"largest gap ratio {best[0]:.2f} in {best[1]}, above the {need:g} needed but with "
                      "fewer pairs below the gap than a majority set (8) has")
        else:
            margin = f"largest gap ratio {best[0]:.2f} of the {need:g} needed, in {best[1]}"
        return f"no contaminated client detected (no module separated; {margin}; {pooled})."
    rule = det["rule"]
    if rule == "pooled":
        ev = ", ".join(f"{n} {_vs(det['scores'][n], det['threshold'])}" for n in det["flagged"])
        rat = ", ".join(_vs(det["pooled_ratios"][n], det["pooled_min_ratio"]) for n in det["flagged"])
        return (f"flagged {', '.join(det['flagged'])} by the pooled rule over all modules (pooled "
                f"score {ev} > {det['threshold']:.2f}, distance ratio {rat} >= "
                f"{det['pooled_min_ratio']:g}; {n_sep} module(s) separated on their own{note}).")
    # "<client> is outside ...", not "excluded by <client>": the sets (8) exclude the client
    ev = "; ".join(f"{n} is outside the set (8) in {det['scores'][n]:.0%} of the modules"
                   for n in det["flagged"])
    what = {"per-module": "each in the modules whose set (8) excludes it",
            "majority": "in every module (excluded by a majority of modules' sets (8))",
            "any": "in every module (excluded by at least one module's set (8))"}[rule]
    return (f"flagged {', '.join(det['flagged'])} {what}: {ev} ({n_sep} module(s) separated; "
            f"{pooled}).")
