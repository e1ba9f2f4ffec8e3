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
is flagged and every client keeps its own adapter (so too where ``untrained``, the clients whose update
is zero everywhere, are most), and ``undecided_modules`` — modules whose own set (8) was not (:mod:`.guard`);
``separated_modules`` — modules whose largest-gap split was admissible;
``modules`` — per module the clients its own (8) excludes, whether it separated, and the gap ratio
(``"inf"`` with no spread below the gap, None with no gap);
``raw_scores``, ``raw_threshold`` (``c_K``), ``raw_flagged``, ``raw_tie`` — the raw-distance statistic
(:func:`lowrank_fl.adapters.detect.raw_evidence`), whichever rule was applied (None without the
updates' Grams or below 3 clients; ``raw_tie``: most scores tie, and the statistic flags nobody); under
``"raw"`` it is ``scores`` and ``threshold`` too (a None per client and None below 3 clients);
``updates`` — the update rule's evidence (:mod:`.detect_updates`), always: per client the
direction score and agreement ratio, the lower confidence bound of its agreement, the size score
and norm ratio, the cutoffs (single and joint), both floors, whom it flags and on which evidence
(``by_direction``, where the federation shares a direction at ``shared_direction_p`` below
``shared_alpha``; ``by_outside``, ``by_size``, ``by_joint``: direction and size together at an agreement
of at most ``joint_agreement``, with ``joint_evidence`` where it holds at 1/ρ and ``joint_flag``,
``by_opposed``: significantly pointing away from a material shared direction, with
``shortfall_bounds`` and ``shared_floor``; ``by_profile``: its update spread over the modules
unlike the others', with ``profile_scores``, ``profile_ratios`` and ``profile_cutoff``;
``by_farther``: at least ``farther_ratio`` times the typical size and agreeing at most ``farther_agreement``
as much (1/``farther_ratio`` and 1/ρ), where the
``typical_agreement`` reaches ``shared_floor``; ``by_reversed_init``: its ``A`` is the common LoRA
initialization reversed, with ``init_cosines``, ``init_modules`` (modules tested), ``init_reversed_modules``
and ``reversed_cosine``, :mod:`.init_reversal`; the block is :func:`.updates_summary.updates_block`'s).
"""
from __future__ import annotations

import warnings

import numpy as np

from . import guard
from .aggregate import client_decision
from .detect import POOLED_MIN_RATIO, pooled_evidence, raw_evidence
from .detect_updates import FARTHER_RATIO, update_evidence
from .feature_profile import results_features
from .init_reversal import reversed_init_flags
from .refinement_sentence import refinement_sentence    # its home before: re-exported
from .updates import untrained_clients
from .updates_summary import names_where, updates_block

__all__ = ["detection_summary", "detection_sentence", "raw_comparison", "refinement_sentence"]


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
    grams = [getattr(r, "gram", None) for r in results]
    grams = None if any(g is None for g in grams) else np.array(grams, float)    # (modules, K, K), built once
    uv = None if grams is None else update_evidence(
        grams, np.array([r.outside for r in results], float), features=results_features(results))
    if rule in ("updates", "raw") and uv is None:
        raise ValueError(f"client_rule {rule!r} needs every module's Gram of the updates (CLAIR results "
                         "of aggregate_module)")
    raw = None if uv is None or K < 3 else raw_evidence(grams)
    cosines = [getattr(r, "init_cosines", None) for r in results]          # duck-typed results may lack it
    reversed_ = reversed_init_flags(cosines, K)                         # the update rule's, beside uv's
    untrained = None if grams is None else names_where(names, untrained_clients(grams))
    decided = (guard.guard_set(~ev.flagged) if rule == "pooled" else
               guard.guard_set(~(uv.flagged | reversed_)) if rule == "updates" else
               guard.guard_set(~raw.flagged) if rule == "raw" and raw is not None else
               np.ones(K, bool) if rule == "raw" else client_decision(results, rule))
    if rule == "updates" and 2 * len(untrained) > K:   # most sent nothing: it abstains, as client_decision
        decided = np.zeros(K, bool)
    pooled_cutoff = ev.cutoff if K >= 3 else None
    tie = K >= 3 and ev.tie
    if tie and rule == "pooled":
        warnings.warn(f"the pooled scores of more than half of the {K} clients tie exactly (identical "
                      "adapters, or K = 3): the fallback scale bounds every score, so the pooled rule "
                      "can hardly flag anyone here; compare --client-rule per-module", RuntimeWarning,
                      stacklevel=3)
    if rule == "raw" and raw is not None and raw.tie:
        warnings.warn(f"the raw-distance scores of more than half of the {K} clients tie exactly (identical "
                      "adapters, or K = 3-4): the fallback scale gives every client that differs the same score "
                      "however little it differs, so the raw rule flags nobody here; compare --client-rule "
                      "updates", RuntimeWarning, stacklevel=3)
    if decided is None:                                                 # per-module
        flagged = ~flags.all(axis=0)
        scores, threshold = excluded_frac, None
    elif rule == "pooled":
        flagged, scores, threshold = ~decided, ev.scores, pooled_cutoff
    elif rule == "updates":
        flagged = ~decided
        scores = np.maximum(np.maximum(uv.direction_scores, uv.size_scores), uv.outside_scores)
        threshold = uv.cutoff if np.isfinite(uv.cutoff) else None
    elif rule == "raw":                                                 # no score below 3 clients
        flagged = ~decided
        scores = np.full(K, np.nan) if raw is None else raw.scores
        threshold = None if raw is None else raw.cutoff
    else:
        flagged, scores = ~decided, excluded_frac
        threshold = 0.5 if rule == "majority" else 0.0
    undecided = decided is not None and guard.is_undecided(decided)     # nobody flagged, all keep own
    if undecided:
        flagged = np.zeros(K, bool)
    return {
        "rule": rule,
        "flagged": names_where(names, flagged),
        "undecided": bool(undecided),
        "undecided_modules": [r.name for r in results if guard.is_undecided(np.asarray(r.benign, bool))],
        "scores": {n: (None if np.isnan(v) else v) for n, v in zip(names, np.asarray(scores, float).tolist())},
        "threshold": threshold,
        "pooled_scores": dict(zip(names, ev.scores.tolist())),
        "pooled_threshold": pooled_cutoff,
        "pooled_ratios": dict(zip(names, ev.ratios.tolist())),
        "pooled_min_ratio": POOLED_MIN_RATIO,
        "pooled_flagged": names_where(names, ev.flagged),
        "pooled_tie": bool(tie),
        # the raw-distance statistic, whichever rule was applied (None without Grams or below 3 clients)
        "raw_scores": None if raw is None else dict(zip(names, raw.scores.tolist())),
        "raw_threshold": None if raw is None else raw.cutoff,
        "raw_flagged": None if raw is None else names_where(names, raw.flagged),
        "raw_tie": None if raw is None else bool(raw.tie),
        "updates": None if uv is None else updates_block(uv, grams, names, results, cosines),
        # clients whose update is zero in every module (PEFT's initial state); None without the Grams
        "untrained": untrained,
        "separated_modules": [r.name for r in results if r.separated],
        "modules": {r.name: {"flagged": [n for n, b in zip(names, r.benign) if not b and any(r.benign)],
                             "separated": bool(r.separated),
                             "gap_ratio": _gap_value(r.gap_ratio)}
                    for r in results},
    }


def _largest(values: dict) -> tuple:
    """``(name, value)`` of the largest of ``{client: value}`` (the first such client on a tie)."""
    return max(values.items(), key=lambda kv: kv[1])


def _vs(value: float, ref: float) -> str:
    """``value`` with enough decimals that it reads on the same side of ``ref`` as it is (in
    scientific notation from 1e6 on: a poisoned update's scores run to 1e40)."""
    for d in range(2, 17):
        text = f"{value:.{d}f}" if abs(value) < 1e6 else f"{value:.{d + 1}e}"
        if (float(text) < ref) == (value < ref) and (float(text) > ref) == (value > ref):
            return text
    return repr(value)


def _pooled_clause(det: dict) -> str:
    """What the pooled rule says, whichever rule was applied."""
    cut, rho = det["pooled_threshold"], det["pooled_min_ratio"]
    if cut is None:
        return "no pooled score with fewer than 3 clients"
    name, top = _largest(det["pooled_scores"])
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


def _updates_sentence(det: dict, refine: str | None = None) -> str:
    """The update rule's sentence: whom it flagged and why, or what "nothing detected" means."""
    u = det["updates"]
    cut = u["cutoff"]
    if cut is None:
        return "no contaminated client can be detected with fewer than 3 clients (update rule)."
    idle, K = det.get("untrained") or [], len(u["size_ratios"])
    if det.get("undecided") and 2 * len(idle) > K:         # most clients untrained: the rule abstained
        return (f"no client flagged: {len(idle)} of the {K} clients sent no update (untrained: {_some(idle)}), "
                "so the typical update is zero and every client that trained stands out against it, whatever "
                "it learned: the update rule cannot decide, and every client keeps its own adapter; aggregate "
                "the clients that trained without the others.")
    if det.get("undecided") and u.get("flagged"):         # the guard refused the set: say whom it pointed at
        parts = [f"{n} (" + "; ".join(_update_reasons(u, n)) + ")" for n in u["flagged"]]
        return (f"no client flagged: the update rule's evidence points at {', '.join(parts)}, but the clients "
                "left would not be a strict majority, so the evidence cannot decide (lowrank_fl.adapters.guard).")
    if det["flagged"]:
        parts = [f"{n} (" + "; ".join(_update_reasons(u, n)) + ")" for n in det["flagged"]]
        return (f"flagged {', '.join(det['flagged'])} by the update rule over all modules: "
                + ", ".join(parts) + f"; {_left_out(refine)}{_grouped(u)}{_joint_only(u)}.")
    return _updates_limit(u)


def _left_out(refine: str | None) -> str:
    """What the flagged clients' updates do (the sentences of the update and raw rules)."""
    return ("every client keeps its own adapter (--refine own), so nobody receives them" if refine == "own"
            else "their updates are left out of what the others receive")


def _updates_limit(u: dict) -> str:
    """What "nothing detected" means under the update rule: per test, the largest value now (and whose)
    and what a flag needs (the detection limit)."""
    cut, rho, rho_s = u["cutoff"], u["min_ratio"], u["size_ratio"]
    dn, dv = _largest(u["direction_scores"])
    on, ov = _largest(u["outside_scores"])
    sn, sv = _largest(u["size_ratios"])
    jn, jv = _largest({n: min(v, u["size_scores"][n]) for n, v in u["direction_scores"].items()})
    # the last test's values: the least agreement, and the largest size among those agreeing that little
    ratios = {n: r for n, r in u["agreement_ratios"].items() if r is not None}
    less = {n: u["size_ratios"][n] for n, r in ratios.items() if r <= _farther_bound(u)}
    if ratios:
        an = min(ratios, key=ratios.get)
        least = (f"{ratios[an]:.3g}x the typical" if _material(u) else f"{ratios[an] * u['typical_agreement']:.3g}")
        away = f"least agreement {least} ({an})"
        if less:
            fn = max(less, key=less.get)
            away += f", largest update agreeing that little {_times(less[fn])} ({fn})"
    else:
        away = "no shared direction to agree with"
    shared = u["shared_direction_p"] < u["shared_alpha"]
    direction = (f"direction {_vs(dv, cut)} ({dn}, {_agreement(u, dn)}) / "
                 + (f"above {cut:.2f} with an agreement at most 0 (the federation significantly shares a direction, "
                    f"p = {u['shared_direction_p']:.3g} < {u['shared_alpha']:g})" if shared else
                    f"off here: no significantly shared direction (p = {u['shared_direction_p']:.3g} >= "
                    f"{u['shared_alpha']:g}); when on, above {cut:.2f} with an agreement at most 0"))
    tests = [
        direction,
        f"share outside the shared row space {_vs(ov, cut)} ({on}, {u['outside_ratios'][on]:.2f}x the "
        f"typical{_rms(u, on)}) / above {cut:.2f} and {rho:g}x, with a root-mean-square share above "
        f"{np.sqrt(0.5):.2f}",
        f"size {_times(sv)} the typical ({sn}) / {rho_s:g}x",
        f"module profile {_profile(u)}",
        _joint_limit(u, jn, jv, rho),
        f"away from the shared direction, or {u['farther_ratio']:g}x as far while agreeing at most "
        f"{_farther_bound(u):.3g} as much: {away} / a "
        f"material shared direction ({_shared(u)})",
        _reversed_limit(u),
    ]
    head = "no client flagged" if _joint_unflagged(u) else "no client stands out"
    return (f"{head} under the updates rule. Each test, its largest value now / what a flag needs: "
            + "; ".join(t for t in tests if t)
            + ". A contaminated client below all of these limits goes unflagged.")


def _rho_bound(u: dict) -> float:
    """1/ρ: the agreement bound of the joint evidence, and of the flags in summaries written before
    they had their own."""
    rho = u["min_ratio"]
    return 1.0 / rho if rho > 0 else np.inf


def _farther_bound(u: dict) -> float:
    """The farther flag's agreement bound (``farther_agreement``: at most 1/2 and 1/ρ of the typical);
    1/ρ in a summary written before it had its own."""
    return u.get("farther_agreement", _rho_bound(u))


def _reversed_limit(u: dict) -> str:
    """The A-reversal test's clause: the lowest typical row cosine with the common initialization, or why
    no module was tested ("" in summaries written before it)."""
    if "reversed_cosine" not in u:
        return ""
    cos = {n: v for n, v in (u.get("init_cosines") or {}).items() if v is not None}
    if not cos:
        return ("A reversed against the common init: not tested (no 3 clients of one rank >= 2, SVD factors, "
                "or no shared init)")
    n = min(cos, key=cos.get)
    return (f"A reversed against the common init: lowest mean row cosine {cos[n]:.2f} ({n}) / every row below "
            f"{u['reversed_cosine']:g} and -A among the others' A")


def _pooled_hint(det: dict) -> str:
    """Whom the pooled rule (8) would flag where the update rule flagged nobody: a lead, with its cost."""
    would = det.get("pooled_flagged") or []
    if det["flagged"] or not would or 2 * len(det.get("untrained") or []) > len(det["pooled_scores"]):
        return ""                      # (most clients untrained: it would point at the trained ones)
    return (f" The pooled rule on (8)'s block norms would flag {', '.join(would)} (--client-rule pooled; it also "
            "flags benign clients that trained harder).")


def _joint_bound(u: dict) -> float:
    """The agreement bound of a joint flag (``joint_agreement``: 1/4, or 1/ρ with ``joint_flag``); 1/ρ in
    a summary written before it had its own."""
    return u.get("joint_agreement", _rho_bound(u))


def _joint_limit(u: dict, jn: str, jv: float, rho: float) -> str:
    """The joint test's clause of the limit: its largest value now and what a flag needs; "off here"
    where the federation shares no material direction (the test reads "agrees less" only against one)."""
    need = (f"both above {_joint(u)}, the size {rho:g}x the typical and the agreement at most "
            f"{_joint_bound(u):.3g} of the typical")
    now = f"{_vs(jv, u['joint_cutoff'] or np.inf)} ({jn}, the smaller of its two scores)"
    if _material(u):
        return f"direction and size together {now} / {need}{_joint_only(u)}"
    # the next clause states the typical agreement and the floor: not repeated here (the sentence's length)
    return (f"direction and size together {now} / off here, as the next test: no material shared direction; "
            f"when on, {need}")


def _agreement(u: dict, n: str) -> str:
    """Client ``n``'s agreement: as a ratio of the typical client's where the typical one is material
    (a ratio of a near-zero typical agreement reads as strong opposition when it is not)."""
    t, ratio = u["typical_agreement"], u["agreement_ratios"][n]
    if ratio is None:
        return "no shared direction in the federation"
    if _material(u):
        return f"agreement {ratio:.3g}x the typical client's"
    return f"agreement {ratio * t:.3g}, the typical {t:.3f}"


def _update_reasons(u: dict, n: str) -> list:
    """Why the update rule flagged client ``n``: one clause per piece of evidence it met."""
    cut, rho, rho_s = u["cutoff"], u["min_ratio"], u["size_ratio"]
    if u.get("zero_modules", {}).get(n, 0) == u.get("live_modules", -1) > 0:   # zero everywhere: not "opposed"
        return ["its update is zero in every module (an untrained adapter, PEFT's initial state): the evidence "
                "reads that absence (none of the shared direction, no size), not a task of its own"]
    why = []
    if n in u["by_direction"]:
        why.append(f"direction score {_vs(u['direction_scores'][n], cut)} > {cut:.2f}, agreement "
                   f"{_vs(u['agreement_ratios'][n], 0.0)} of the typical client's <= 0: none of the shared "
                   f"direction ({_shared_p(u)})")
    if n in u["by_joint"]:
        cj = u["joint_cutoff"]
        why.append(f"direction and size together: direction score {_vs(u['direction_scores'][n], cj)} and size "
                   f"score {_vs(u['size_scores'][n], cj)} both > {cj:.2f}, agreement "
                   f"{_vs(u['agreement_ratios'][n], _joint_bound(u))} of the typical <= {_joint_bound(u):.3g}, update "
                   f"{_vs(u['size_ratios'][n], rho)}x the typical size >= {rho:g}x, the typical agreement "
                   f"{u['typical_agreement']:.3f} >= {u['shared_floor']:g}")
    if n in u["by_opposed"]:
        why.append(f"opposed to the shared direction: agreement {u['agreement_ratios'][n]:.2f} of the "
                   f"typical client's <= 0, its shortfall significant (upper bound "
                   f"{u['shortfall_bounds'][n]:.3g} < 0 at 5 % over the clients, the typical agreement "
                   f"{u['typical_agreement']:.3f} >= {u['shared_floor']:g})")
    if n in u.get("by_farther", ()):
        why.append("farther, not along the shared direction: update "
                   f"{_vs(u['size_ratios'][n], u['farther_ratio'])}x "
                   f"the typical size >= {u['farther_ratio']:g}x, agreement "
                   f"{_vs(u['agreement_ratios'][n], _farther_bound(u))} of the typical client's <= "
                   f"{_farther_bound(u):.3g}, "
                   f"the typical agreement {u['typical_agreement']:.3f} >= {u['shared_floor']:g}")
    if n in u.get("by_profile", ()):
        cp = u["profile_cutoff"]
        zeros = u.get("zero_modules", {}).get(n, 0)
        off = (f"its update all zeros in {zeros} module(s) (untrained there?)" if zeros else
               f"module norms off the typical profile by a factor "
               f"{np.exp(u['profile_distances'][n]):.2f} >= {rho:g}")
        near, g = u.get("profile_second_nearest", {}).get(n), u.get("profile_group_ratio")
        alone = "" if near is None or g is None else (
            f", no two others spread alike (second-nearest profile {near:.3f} >= "
            f"{u['profile_distances'][n] / g:.3f}, its distance / {g:g})")
        why.append(f"spread over the modules unlike the others: profile score "
                   f"{_vs(u['profile_scores'][n], cp)} > {cp:.2f}, "
                   f"{_distance_ratio(u['profile_ratios'][n], rho)}, {off}{alone}")
    if n in u["by_outside"]:
        why.append(f"share outside the shared row space: score {_vs(u['outside_scores'][n], cut)} > "
                   f"{cut:.2f}, ratio {_vs(u['outside_ratios'][n], rho)} >= {rho:g}{_rms(u, n, '>')}")
    if n in u.get("by_reversed_init", ()):
        why.append(f"its A factor is the common LoRA initialization reversed: every row below a cosine of "
                   f"{u['reversed_cosine']:g} with its typical row and -A among the others' A, in "
                   f"{u['init_reversed_modules'][n]} of the {u['init_modules'][n]} module(s) tested (mean row "
                   f"cosine {u['init_cosines'][n]:.2f}): not trained from it; a flipped A sends -ΔW, flipping B "
                   "too leaves ΔW unchanged")
    if n in u["by_size"]:
        v = u["size_ratios"][n]
        size = _times(v) if abs(v) >= 1e4 else f"{_vs(v, rho_s)}x"       # far above rho_s: any rounding reads so
        why.append(f"update {size} the typical size (>= {rho_s:g}x: more than honest "
                   f"uneven training moves; size score {u['size_scores'][n]:.2f})")
    # an honest client whose training diverged (too large a learning rate) is far out in size, profile
    # and direction alike (trained families: 3x-learning-rate clients at 2.4-3.5x and 9-11x the
    # typical size, own-task accuracy far below the base's): the server cannot tell it apart, so say so
    # (the size, joint and farther reasons state the size ratio already: the note does not repeat it)
    big = u["size_ratios"][n] >= u.get("farther_ratio", FARTHER_RATIO)
    if big and any(n in u.get(k, ()) for k in ("by_joint", "by_profile", "by_farther", "by_size")):
        stated = any(n in u.get(k, ()) for k in ("by_joint", "by_farther", "by_size"))
        at = "at that size" if stated else f"its update is {u['size_ratios'][n]:.3g}x the typical size"
        why.append(f"{at}: an honest client whose training diverged looks alike (check its own accuracy)")
    return why


def _some(names: list, most: int = 4) -> str:
    """``c0, c1, c2, c3 and 2 more``."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _material(u) -> bool:
    """Whether the federation shares a material direction (the joint, opposed and farther flags' gate)."""
    return u["typical_agreement"] >= u["shared_floor"]


def _rms(u: dict, n: str, rel: str = "") -> str:
    """``, root-mean-square share 0.68`` (``> 0.71`` with ``rel``); "" in summaries written before it."""
    v = (u.get("outside_rms_shares") or {}).get(n)
    if v is None:
        return ""
    return f", root-mean-square share {_vs(v, np.sqrt(0.5))}" + (f" {rel} {np.sqrt(0.5):.2f}" if rel else "")


def _times(v: float) -> str:
    """A size ratio: ``2.31x``, or ``8.6e+08x`` from 1e4 on."""
    return f"{v:.2f}x" if abs(v) < 1e4 else f"{v:.3g}x"


def _shared(u) -> str:
    t, floor = u["typical_agreement"], u["shared_floor"]
    # "significant" (the direction flag's gate) and "material" (these flags') are two bars: say which
    p = u["shared_direction_p"]
    weak = (f"significant, p = {p:.3g}, but below the floor" if p < u["shared_alpha"] else
            f"none significant, p = {p:.3g}")
    state = "on" if _material(u) else f"off: no material shared direction ({weak})"
    return f"typical agreement {t:.3f} against the floor {floor:g}, {state}"


def _shared_p(u) -> str:
    p, a = u["shared_direction_p"], u["shared_alpha"]
    state = "shared" if p < a else "none significantly shared: the direction flag is off"
    return f"the federation's direction {state}, p = {p:.3g} against {a:g}"


def _distance_ratio(v, rho: float) -> str:
    """A profile distance as a ratio of the typical client's; where the typical distance is 0 (most
    clients' profiles identical) the ratio is infinite (None in the summary, inf in the evidence)."""
    if v is None or not np.isfinite(v):
        return "distance above 0 where the typical client's is 0 (most profiles identical)"
    return f"distance {v:.2f}x the typical client's >= {rho:g}x"


def _profile(u) -> str:
    cp = u.get("profile_cutoff")
    if cp is None:
        return "not measurable with one module"
    pn, pv = _largest(u["profile_scores"])
    floor = max(u["min_ratio"], 1.0)
    g = u.get("profile_group_ratio")
    alike = "" if g is None else f", alone (second-nearest profile >= distance / {g:g})"
    return (f"{_vs(pv, cp)} ({pn}) / above {cp:.2f}, {u['min_ratio']:g}x the typical distance, module "
            f"norms off the typical profile by a factor {floor:g}{alike}{_grouped(u)}")


def _grouped(u) -> str:
    """The clients far out by their module profile but spared as one of three or more spread alike."""
    grouped = u.get("profile_grouped") or []
    if not grouped:
        return ""
    return (f"; spread far from the typical profile but alike, as a group (not flagged by the profile: a "
            f"group that trained harder looks so): {', '.join(grouped)}")


def _joint_unflagged(u) -> list:
    """The clients the joint evidence holds for (agreement at most 1/ρ) that nothing flagged."""
    return [n for n in u.get("joint_evidence") or [] if n not in u["flagged"]]


def _joint_only(u) -> str:
    """The clause naming :func:`_joint_unflagged`'s clients, with their agreement and size."""
    held = _joint_unflagged(u)
    if not held:
        return ""
    each = ", ".join(f"{n} (agreement {u['agreement_ratios'][n]:.2f}x, size {u['size_ratios'][n]:.2f}x)"
                     for n in held)
    return (f"; direction and size together hold (both scores above {_joint(u)}, agreement at most "
            f"{_rho_bound(u):.3g}) for {each}: not flagged, a flag needs the agreement at most "
            f"{_joint_bound(u):.3g} of the typical (a benign client that trained with a larger learning rate "
            "can have both)")


def _joint(u) -> str:
    cj = u.get("joint_cutoff")
    return "the joint cutoff" if cj is None else f"{cj:.2f}"


def detection_sentence(det: dict, *, refine: str | None = None) -> str:
    """One sentence: which clients were flagged and on what evidence, or that none was (under
    ``refine="own"`` nobody receives anything, and the sentence does not say otherwise)."""
    if det["rule"] == "updates":
        return _updates_sentence(det, refine) + _pooled_hint(det)
    if det["rule"] == "raw":
        return _raw_sentence(det, refine)
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
            why = (f"{n_sep} module(s) separated, their own collaborative sets of CLAIR's (8) excluding "
                   + ", ".join(sorted({n for m in det["separated_modules"] for n in det["modules"][m]["flagged"]}))
                   + f" there, but the {det['rule']} rule flags nobody")
            return f"no client flagged ({why}; {pooled}); a contaminated client below these limits goes unflagged."
        gaps = [(float(v["gap_ratio"]), m) for m, v in det["modules"].items() if v["gap_ratio"] is not None]
        best = max(gaps) if gaps else None
        if best is None:
            margin = "no module had two distinct block norms"
        elif np.isinf(best[0]):   # the pairs below the gap coincide (one pair, or identical ones)
            margin = (f"in {best[1]} the pairs below the widest gap have identical block norms (an "
                      "unbounded gap ratio), but fewer pairs lie below it than a majority set (8) has")
        elif best[0] >= need:   # a gap wide enough, but too few pairs below it for a majority set (8)
            margin = (f"largest gap ratio {best[0]:.2f} in {best[1]}, above the {need:g} needed but with "
                      "fewer pairs below the gap than a majority set (8) has")
        else:
            margin = f"largest gap ratio {best[0]:.2f} of the {need:g} needed, in {best[1]}"
        return (f"no client flagged (no module separated; {margin}; {pooled}); a contaminated client below these "
                "limits goes unflagged.")
    rule = det["rule"]
    if rule == "pooled":
        ev = ", ".join(f"{n} {_vs(det['scores'][n], det['threshold'])}" for n in det["flagged"])
        rat = ", ".join(_vs(det["pooled_ratios"][n], det["pooled_min_ratio"]) for n in det["flagged"])
        return (f"flagged {', '.join(det['flagged'])} by the pooled rule over all modules (pooled "
                f"score {ev} > {det['threshold']:.2f}, distance ratio {rat} >= "
                f"{det['pooled_min_ratio']:g}; {n_sep} module(s) separated on their own{note}).")
    # "<client> is outside ...", not "excluded by <client>": the sets (8) exclude the client
    ev = "; ".join(f"{n} is outside the collaborative set of CLAIR's (8) in {det['scores'][n]:.0%} of the modules"
                   for n in det["flagged"])
    what = {"per-module": "each in the modules whose collaborative set of CLAIR's (8) excludes it",
            "majority": "in every module (excluded by a majority of the modules' collaborative sets of CLAIR's (8))",
            "any": "in every module (excluded by at least one module's collaborative set of CLAIR's (8))"}[rule]
    return (f"flagged {', '.join(det['flagged'])} {what}: {ev} ({n_sep} module(s) separated; "
            f"{pooled}).")


def _raw_sentence(det: dict, refine: str | None) -> str:
    """The sentence of ``client_rule="raw"``: whom the raw-distance statistic flagged, or its largest score."""
    if det["raw_scores"] is None:
        return "no contaminated client can be detected with fewer than 3 clients (raw-distance statistic)."
    cut = det["raw_threshold"]
    if not det["flagged"]:
        name, top = _largest(det["raw_scores"])
        return (f"no client stands out under the raw-distance statistic: largest score {_vs(top, cut)} ({name}) "
                f"against the cutoff {cut:.2f}{_RAW_TIE if det.get('raw_tie') else ''}.")
    return (f"flagged {', '.join(det['flagged'])} by the raw-distance statistic over all modules "
            f"({_raw_scores(det, det['flagged'])}); {_RAW_CAVEAT}; {_left_out(refine)}.")


#: why a tie flags nobody (:func:`lowrank_fl.adapters.detect.raw_evidence`)
_RAW_TIE = ("; the scores of most clients tie, so every client that differs gets the same score however "
            "little it differs, and nobody is flagged")
#: what the raw-distance statistic cannot tell (module docstring of :mod:`.detect`, ``raw_evidence``)
_RAW_CAVEAT = ("it counts size as much as direction, so a benign client that trained harder or less (a larger or "
               "smaller update) stands out too")


def _raw_scores(det: dict, names) -> str:
    cut = det["raw_threshold"]
    word = "score" if len(names) == 1 else "scores"
    return f"{word} " + ", ".join(f"{n} {_vs(det['raw_scores'][n], cut)}" for n in names) + f", each > {cut:.2f}"


def raw_comparison(det: dict) -> str:
    """The raw-distance statistic beside the applied rule (README, "The raw-distance statistic"): whom it
    would flag, and where it and the rule differ; "" where the rule applied is that statistic or it has no
    score (fewer than 3 clients)."""
    if det.get("raw_scores") is None or det["rule"] == "raw":
        return ""
    cut, would, rule = det["raw_threshold"], det["raw_flagged"], det["rule"]
    tie = _RAW_TIE if det.get("raw_tie") else ""
    only_rule = [n for n in det["flagged"] if n not in would]
    spared = f"; it would not flag {', '.join(only_rule)}, whom the {rule} rule flagged" if only_rule else ""
    if not would:
        name, top = _largest(det["raw_scores"])
        either = "" if det["flagged"] else " either"
        return (f"beside it, the raw-distance statistic flags nobody{either} (largest score {_vs(top, cut)}, "
                f"{name}, against {cut:.2f}{tie}){spared}.")
    only_raw = [n for n in would if n not in det["flagged"]]
    differ = (f"; the {rule} rule flagged them too" if not only_raw else
              f"; the {rule} rule flagged none of them" if len(only_raw) == len(would) else
              f"; of these the {rule} rule did not flag {', '.join(only_raw)}")
    return (f"beside it, the raw-distance statistic would flag {', '.join(would)} ({_raw_scores(det, would)})"
            f"{differ}{spared}; {_RAW_CAVEAT}.")
