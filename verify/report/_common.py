"""Shared pieces of the report writers: grouping, totals, rows; value formatting lives in ``values``."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from ..claim import PAPERS, VERDICTS, Claim, Evidence, Omitted, jsonable
from ..convergence import STALLED_STATUSES
from ..runner import ERROR_PREFIX
from .values import columns as table_columns
from .values import fmt

__all__ = ["fmt", "count_columns", "by_paper", "totals", "totals_by_paper", "is_error", "table_columns", "kv_rows",
           "omitted_sorted", "non_holds", "remarks", "check_lines", "anchor", "svg_twin", "VERDICT_LEGEND", "KIND_LEGEND",
           "verdict_legend", "column_legend", "remarks_sentence", "stops", "stop_sentence"]


def count_columns(results: Sequence[tuple[Claim, Evidence]]) -> list[str]:
    """Columns of the counts table: ``claims``, the verdicts, ``remarks``, ``omitted``; "exceeded
    time budget" only when some claim was stopped at its budget (the usual report keeps its
    columns), ``remarks`` only when some claim is a remark."""
    shown = [v for v in VERDICTS if v != "exceeded time budget"
             or any(e.verdict == v for _, e in results)]
    return ["claims", *shown, *(["remarks"] if remarks(results) else []), "omitted"]


def is_error(evidence: Evidence) -> bool:
    """True when the runner turned an exception of the experiment into this evidence."""
    return evidence.verdict == "inconclusive" and evidence.summary.startswith(ERROR_PREFIX)


def by_paper(results: Sequence[tuple[Claim, Evidence]]) -> list[tuple[str, list[tuple[Claim, Evidence]]]]:
    """Results grouped by paper, in the order of ``PAPERS``; papers without results are dropped."""
    groups = {p: [] for p in PAPERS}
    for c, e in results:
        groups.setdefault(c.paper, []).append((c, e))
    return [(p, rows) for p, rows in groups.items() if rows]


def totals(results: Sequence[tuple[Claim, Evidence]]) -> dict:
    """Count per verdict of the claims counted as verified; ``remarks``: the claims that are not
    (kind "remark", :attr:`Claim.counted`), whatever their verdict, so that the verdicts and
    ``remarks`` add up to ``claims`` (every claim run); ``errors``: experiments that raised
    (remarks included; a counted one is also under inconclusive)."""
    out = {v: 0 for v in VERDICTS}
    for c, e in results:
        if c.counted:
            out[e.verdict] += 1
    out["remarks"] = sum(not c.counted for c, _ in results)
    out["errors"] = sum(is_error(e) for _, e in results)
    out["claims"] = len(results)
    return out


_MISSING = object()


def kv_rows(evidence: Evidence) -> list[tuple[str, object, object]]:
    """(quantity, measured, predicted) raw values; keys of both dicts, measured's order first.

    A side without the quantity holds :data:`MISSING` (rendered as an empty cell). A quantity
    that is the evidence's ``table`` itself (claims keep their rows in ``measured`` for
    ``results.json`` too) is left out when the other side is empty: the report shows that table
    right after these rows, so it would appear twice.
    """
    table = None if not evidence.table else jsonable(evidence.table)

    def is_table(value) -> bool:
        return table is not None and (value is evidence.table or jsonable(value) == table)

    keys = list(evidence.measured) + [k for k in evidence.predicted if k not in evidence.measured]
    rows = []
    for k in keys:
        m, p = evidence.measured.get(k, _MISSING), evidence.predicted.get(k, _MISSING)
        if (p is _MISSING and is_table(m)) or (m is _MISSING and is_table(p)):
            continue
        rows.append((str(k), m, p))
    return rows


MISSING = _MISSING


def totals_by_paper(results: Sequence[tuple[Claim, Evidence]], omitted: Iterable[Omitted] = ()) -> dict:
    """``{paper: {verdict: count, "errors": n, "claims": n, "omitted": n}}`` in paper order."""
    omitted = list(omitted)
    out = {}
    for paper, rows in by_paper(results):
        out[paper] = totals(rows)
    for o in omitted:
        out.setdefault(o.paper, totals([]))
    for paper in out:
        out[paper]["omitted"] = sum(o.paper == paper for o in omitted)
    order = list(PAPERS)
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def non_holds(results: Sequence[tuple[Claim, Evidence]]) -> list[tuple[Claim, Evidence]]:
    """The results whose verdict is not "holds": fails first, then inconclusive, then errata."""
    rank = {"fails": 0, "exceeded time budget": 0, "inconclusive": 1, "erratum confirmed": 2}
    picked = [(i, c, e) for i, (c, e) in enumerate(results) if e.verdict != "holds"]
    return [(c, e) for _, c, e in sorted(picked, key=lambda t: (rank.get(t[2].verdict, 3), t[0]))]


def omitted_sorted(omitted: Iterable[Omitted]) -> list[Omitted]:
    order = list(PAPERS)
    return sorted(omitted, key=lambda o: (order.index(o.paper) if o.paper in order else len(order), o.id))


#: What each verdict means (the legend of the report).
VERDICT_LEGEND = {
    "holds": "the experiment's criterion passed: the measurements agree with the claim.",
    "fails": "the criterion failed: the measurements contradict the claim as implemented here.",
    "inconclusive": "the experiment could not decide (e.g. an interval straddles the threshold); "
                    "\"inconclusive (error)\" when the experiment raised, with its traceback.",
    "erratum confirmed": "the paper's statement is wrong as printed; the experiment reproduces the "
                         "error (and checks the corrected version beside it).",
    "exceeded time budget": "the experiment was stopped at its time budget ({budget}): it does not "
                            "hold; a solver crawling to its iteration caps is the usual cause.",
    "requires torch": "not run: the claim needs optional dependencies (torch, peft) that are not "
                      "installed, so it neither holds nor fails. From a checkout of lowrank_fl, "
                      "pip install \".[peft]\" installs them; then rerun the same command.",
}

#: What each column of the counts table holds ("<verdict>" stands for every verdict column).
COLUMN_LEGEND = {
    "claims": "the claims this run checked; each is counted once, in one verdict column or under "
              "remarks, so those columns add up to it.",
    "<verdict>": "the claims counted as verified that got this verdict (see Verdicts).",
    "remarks": "claims of kind remark, whatever their verdict (shown in their section): reported, "
               "never counted as verified, so in no verdict column.",
    "omitted": "claims of the papers that the verifier leaves out, each listed with its reason at "
               "the end of the report: not among the claims checked, not in the claims column.",
}


def column_legend(results: Sequence[tuple[Claim, Evidence]]) -> dict:
    """:data:`COLUMN_LEGEND` for the columns this report shows."""
    return {k: v for k, v in COLUMN_LEGEND.items() if k != "remarks" or remarks(results)}


def remarks_sentence(results: Sequence[tuple[Claim, Evidence]]) -> str:
    """The summary's sentence on the remarks (empty without any): their ids and verdicts."""
    rows = [(c.id, e.verdict) for c, e in results if not c.counted]
    if not rows:
        return ""
    return (f" {len(rows)} remarks (kind remark: reported with their verdict, not counted as verified, "
            "so counted under remarks and in no verdict column): "
            + ", ".join(f"{cid} ({v})" for cid, v in rows) + ".")

_TABLE = "its budget in verify/budgets.json, 10 times its measured runtime with a floor"
_UNMEASURED = "the default budget of a claim not yet measured"


def _budget_source(source: str, limit) -> str:
    """Words for one ``budget.source`` (:func:`verify.budgets.budget_for`)."""
    if source == "--time-budget":
        return f"{fmt(limit)} s for every claim, given with --time-budget"
    if " x " in source:
        factor, base = source.split(" x ", 1)
        return (f"{factor} times " + (_TABLE if base == "budgets.json" else _UNMEASURED)
                + f", scaled with --time-budget {factor}x")
    return {"budgets.json": _TABLE, "unmeasured default": _UNMEASURED}.get(source, source)


def verdict_legend(results: Iterable[tuple[Claim, Evidence]]) -> dict:
    """:data:`VERDICT_LEGEND` with the budget's origin as this run set it (the table's, scaled by
    ``--time-budget Nx``, or the seconds given with ``--time-budget N``)."""
    kinds = list(dict.fromkeys(_budget_source(e.budget["source"], e.budget.get("limit_s"))
                               for _, e in results if e.budget and "source" in e.budget))
    words = "; ".join(kinds) if kinds else _TABLE + ", unless --time-budget set it"
    return {k: v.format(budget=words) if k == "exceeded time budget" else v
            for k, v in VERDICT_LEGEND.items()}

#: What each claim kind checks.
KIND_LEGEND = {
    "identity": "an equality (algebra, closed form) checked to numerical precision on random instances.",
    "bound": "an inequality checked on instances, with the ratio to the bound reported.",
    "rate": "a convergence rate: the per-round contraction of an error, fitted over seeds.",
    "scaling": "how a quantity scales with a parameter: a fitted log-log slope with its interval.",
    "comparison": "one method against another, or the paper's table/figure against our numbers.",
    "phase transition": "where success turns into failure as a parameter moves.",
    "erratum": "a statement the paper gets wrong; the verdict says whether the error is reproduced.",
    "remark": "checks only a definition, a scope remark or the verifier's own code: reported with its "
              "verdict but not counted as verified (the counts put it under remarks, not its verdict).",
}


def check_lines(evidence: Evidence) -> list[str]:
    """Sentences on what the verdict rests on: the solves' certificates, the baseline checks and
    any criterion relaxed after a run (both criteria and outcomes). Empty when none were recorded."""
    out = []
    sv = evidence.solves
    if sv:
        statuses = ", ".join(f"{k} {v}" for k, v in sv.get("by_status", {}).items())
        gap = sv.get("max_relative_gap")
        out.append(f"Solves: {sv['count']} recorded ({statuses}); {sv['not_converged']} not converged"
                   + ("" if gap is None or gap != gap else f"; largest relative duality gap {fmt(gap)}")
                   + ".")
    for b in evidence.baselines:
        out.append(f"Baseline check — {b['what']}: {fmt(b['value'])} vs its reference "
                   f"{fmt(b['reference'])} (tolerance {fmt(b['atol'])} + {fmt(b['rtol'])}·|ref|): "
                   + ("reached" if b["ok"] else "NOT reached, so the comparison is undecided") + ".")
    if evidence.budget.get("exceeded"):
        b = evidence.budget
        out.append(f"Time budget: {fmt(b['limit_s'])} s ({b['source']}); the experiment was stopped "
                   f"after {evidence.seconds:.1f} s, with its workers.")
    for r in evidence.relaxations:
        out.append(f"Criterion changed after a run — original: {r['original']} ({r['original_outcome']}); "
                   f"relaxed: {r['relaxed']} ({r['relaxed_outcome']}); why: {r['reason'].rstrip('.')}.")
    return out


def stops(results: Iterable[tuple[Claim, Evidence]]) -> dict:
    """How claims were cut short: ``{"stalled": ids, "time_budget": ids}``. ``stalled``: claims
    with a solve that the solver's stall rule stopped (``lowrank_fl.stall``: its certificate
    stopped improving far above its tolerance; status "stalled" or a captured StalledWarning);
    ``time_budget``: claims stopped at their time budget (:mod:`verify.budgets`, the backstop)."""
    stalled, budget = [], []
    for c, e in results:
        by_status = (e.solves or {}).get("by_status", {})
        if any(by_status.get(s, 0) for s in STALLED_STATUSES):
            stalled.append(c.id)
        if e.budget.get("exceeded"):
            budget.append(c.id)
    return {"stalled": stalled, "time_budget": budget}


def stop_sentence(results: Iterable[tuple[Claim, Evidence]]) -> str:
    """One sentence naming the claims stopped on a stalled solve and at a time budget ("" when
    none was)."""
    st = stops(results)
    parts = []
    if st["stalled"]:
        parts.append(f"{len(st['stalled'])} on a stalled solve (the solver's certificate stopped "
                     "improving far above its tolerance, lowrank_fl.stall; a holds resting on one "
                     "becomes inconclusive): " + ", ".join(st["stalled"]))
    if st["time_budget"]:
        parts.append(f"{len(st['time_budget'])} at their time budget: "
                     + ", ".join(st["time_budget"]))
    return ("Claims cut short: " + "; ".join(parts) + ".") if parts else ""


def remarks(results: Sequence[tuple[Claim, Evidence]]) -> list[str]:
    """Ids of the claims whose kind is reported but not counted as verified (``Claim.counted``)."""
    return [c.id for c, _ in results if not c.counted]


def anchor(claim_id: str) -> str:
    """HTML id of a claim's section (the summary row is ``"row-" + anchor(...)``)."""
    return "claim-" + "".join(ch if ch.isalnum() else "-" for ch in claim_id)


def svg_twin(png) -> "Path":
    """The SVG saved beside a figure's PNG (``figures/x.y.png`` -> ``figures/x.y.svg``)."""
    from pathlib import Path

    png = Path(png)
    return png.with_name(png.stem + ".svg") if png.suffix == ".png" else png.with_name(png.name + ".svg")
