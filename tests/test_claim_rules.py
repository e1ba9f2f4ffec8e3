"""The framework rules of the Claim machinery (issue 9 §1): solve records, baseline checks,
remarks, relaxed criteria."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from lowrank_fl.results import SolverResult
from verify.claim import (KINDS, SOLVES_KEY, Claim, Context, Evidence, enforce_rules, solve_record,
                          summarize_solves, verdict_from)
from verify.criteria import baseline_check, relaxation


def _result(status="optimal", gap=1e-9, objective=1.0):
    return SolverResult(objective=objective, gap=gap, iterations=3, status=status, solver="test")


def test_solve_record_checks_status_and_gap():
    assert solve_record(_result(), tol=1e-6)["ok"]
    assert not solve_record(_result(gap=1e-3), tol=1e-6)["ok"]          # gap above its tolerance
    assert not solve_record(_result(status="max_iter"), tol=1e-6)["ok"]
    assert not solve_record(_result(status="optimal_inaccurate"))["ok"]
    assert not solve_record(_result(gap=float("nan")), tol=1e-6)["ok"]
    assert not solve_record(_result(gap=-1e-3), tol=1e-6)["ok"]          # weak duality violated
    assert solve_record(_result(gap=-1e-12), tol=1e-6)["ok"]             # rounding
    rec = solve_record(SimpleNamespace(status="diverged"), what="run")      # a Trace has no gap
    assert rec == {"what": "run", "status": "diverged", "relative_gap": None, "tol": None, "ok": False}
    assert solve_record(SimpleNamespace(status="completed"))["ok"]
    json.dumps(solve_record(_result(), tol=1e-6))


def _task_with_solves(seed, *, status):
    return {"value": seed % 7, SOLVES_KEY: [solve_record(_result(status=status), tol=1e-6, what="toy")]}


def _claim_body(ctx, *, status="optimal", verdict="holds"):
    out = ctx.map(_task_with_solves, [{"status": status}], replicates=3)[0]
    assert all(SOLVES_KEY not in o and "value" in o for o in out)      # records removed
    ctx.record_solve(_result(), tol=1e-6, what="body solve")
    return Evidence(verdict=verdict, summary="toy")


_TOY = Claim(id="rolora.toy.rules", paper="rolora", reference="-", statement="-", kind="identity",
             experiment=_claim_body)


def test_claim_run_collects_records_and_keeps_holds_when_converged():
    ev = _TOY.run(Context())
    assert ev.verdict == "holds"
    assert ev.solves["count"] == 4 and ev.solves["not_converged"] == 0
    assert ev.to_dict()["solves"]["by_status"] == {"optimal": 4}


@pytest.mark.parametrize("verdict", ["holds", "erratum confirmed"])
def test_non_converged_solve_withholds_a_positive_verdict(verdict):
    ev = _TOY.run(Context(), status="max_iter", verdict=verdict)
    assert ev.verdict == "inconclusive"
    assert "3 of 4 solves not converged" in ev.summary and "max_iter" in ev.summary
    assert ev.solves["failures"][0]["what"] == "toy"


def test_non_converged_solve_leaves_fails():
    assert _TOY.run(Context(), status="max_iter", verdict="fails").verdict == "fails"


def test_failed_baseline_makes_comparison_inconclusive():
    good = baseline_check("FedRep vs AltMin", 1.0 + 1e-9, 1.0, rtol=1e-6)
    bad = baseline_check("FedRep vs AltMin", 1.2, 1.0, rtol=1e-6)
    assert good["ok"] and not bad["ok"]
    for verdict in ("holds", "fails"):
        ev = enforce_rules(Evidence(verdict=verdict, summary="x", baselines=[good, bad]))
        assert ev.verdict == "inconclusive" and "baseline FedRep vs AltMin" in ev.summary
    assert enforce_rules(Evidence(verdict="holds", summary="x", baselines=[good])).verdict == "holds"


def test_remark_kind_is_not_counted():
    assert "remark" in KINDS
    remark = Claim(id="clair.toy.def", paper="clair", reference="-", statement="-", kind="remark",
                   experiment=lambda ctx: Evidence(verdict=verdict_from(True), summary="ok"))
    assert not remark.counted and _TOY.counted


def test_relaxation_reported_with_both_outcomes():
    r = relaxation("every seed rate <= 0.9", False, relaxed="median rate <= 0.9", relaxed_outcome=True,
                   reason="one seed of twenty starts in a saddle region (derived in the notes)")
    ev = Evidence(verdict="holds", summary="x", relaxations=[r])
    d = ev.to_dict()
    assert d["relaxations"][0]["original_outcome"] == "fails"
    assert d["relaxations"][0]["relaxed_outcome"] == "passes"
    assert "relaxations" not in Evidence(verdict="holds", summary="x").to_dict()   # old JSON unchanged


def test_summarize_solves_empty_and_listing_cap():
    assert summarize_solves([]) == {}
    recs = [solve_record(_result(status="max_iter")) for _ in range(30)]
    s = summarize_solves(recs)
    assert s["not_converged"] == 30 and len(s["failures"]) == 10


def test_nested_context_reports_to_the_claim():
    def body(ctx):
        sub = ctx.for_claim("rolora.other")
        sub.record_solve(_result(status="max_iter"))
        return Evidence(verdict="holds", summary="x")

    c = Claim(id="rolora.toy.nested", paper="rolora", reference="-", statement="-", kind="identity",
              experiment=body)
    assert c.run(Context()).verdict == "inconclusive"
    outer = Context()
    outer.for_claim("rolora.a").record_solve(_result(status="max_iter"))
    assert outer.solves == []          # the run's shared context collects nothing
