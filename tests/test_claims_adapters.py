"""The extension findings on trained adapters (verify/claims/adapters/): registry, criteria that
can fail, and a smoke run end to end."""
import numpy as np
import pytest

from verify.claim import PAPERS, REGISTRY, VERDICTS, Context
from verify.claims.adapters import _trained as AD

IDS = ("adapters.trained.detection", "adapters.trained.heldout_loss")
POISON = "adapters.poisoned.scaled_or_flipped"


def test_registry():
    assert "adapters" in PAPERS
    assert {k for k in REGISTRY if k.startswith("adapters.")} == set(IDS) | {POISON} | {
        "adapters.realistic.detection", "adapters.realistic.no_harm"}
    assert REGISTRY[POISON].requires == () or "torch" not in REGISTRY[POISON].requires
    assert all(REGISTRY[c].paper == "adapters" and "torch" in REGISTRY[c].requires for c in IDS)
    assert all("Extension finding (ours)" in REGISTRY[c].statement for c in IDS)


def test_claims_draw_no_design_set():
    """The distance ratio was designed on the first full report's sets (stream MAIN, base seed 0;
    3012181476 and 10881800 are two of the seeds its results.json lists) and the score on
    generator seeds 0-1: the claims' stream draws none of them, and a design seed is moved off."""
    ds = AD.design_seeds()
    assert {0, 1, 3012181476, 10881800} <= ds and len(ds) == 2 + 12 * 4
    ctx = Context(scale="full").for_claim(AD.STREAM)
    fresh = {ctx.seed(i, j) for i in range(12) for j in range(4)}
    assert len(fresh) == 48 and not fresh & ds
    assert AD.fresh_seed(0) == 2 and AD.fresh_seed(1) == 3 and AD.fresh_seed(5) == 5
    assert AD.fresh_seed(3012181476) == 3012181478


def _row(rule, precision, recall, clean_ff, clean=4, dirty=12):
    return {"rule": rule, "precision": precision, "recall": recall, "clean_sets_false_flag": clean_ff,
            "clean_sets": clean, "contaminated_sets": dirty}


@pytest.mark.parametrize("judged,expected", [
    (_row("updates", 0.95, 0.5, 0), True),
    (_row("updates", 0.90, 0.38, 1), False),      # one false flag
    (_row("updates", 0.80, 0.5, 0), False),       # precision below 0.9
    (_row("updates", 1.0, 0.08, 0), False),       # no better than per-module
    (_row("updates", float("nan"), 0.0, 0), False),
    (_row("updates", 1.0, 0.5, 0, clean=0), None)])
def test_detection_criterion_can_fail(judged, expected):
    assert AD.detection_verdict([judged, _row("per-module", 1.0, 0.08, 0)]) is expected


def test_poisoning_criterion_can_fail():
    """The verdict of adapters.poisoned.*: a missed attacker, a flagged benign client or a benign
    output moved more than +0.05 beyond the clean run each make it fail."""
    from verify.claims.adapters import _poisoned as P

    moves = {f"c{k}": 0.1 for k in range(10)}
    good = {"flagged": ["c0", "c9"], "moves": moves, "reversed": []}
    from lowrank_fl.adapters import DEFAULT_REFINE

    assert P.REFINES == (DEFAULT_REFINE, "paper")            # the library's default refinement and (9)
    rows = {"none": {r: {"flagged": ["c9"], "moves": moves, "reversed": []} for r in P.REFINES},
            **{a: {r: dict(good) for r in P.REFINES} for a in P.ATTACKS}}
    rows["flipA"] = {r: {**good, "reversed": ["c0"]} for r in P.REFINES}
    assert P._verdict(rows) is True
    bad = {k: {r: dict(v2) for r, v2 in v.items()} for k, v in rows.items()}
    bad["flipA"]["paper"]["reversed"] = []                  # flagged, but not seen as a reversed factor
    assert P._verdict(bad) is False
    bad = {k: {r: dict(v2) for r, v2 in v.items()} for k, v in rows.items()}
    bad["x1e3"]["exchangeable"]["reversed"] = ["c0"]         # a scaled A is not a reversed one
    assert P._verdict(bad) is False
    bad = {k: {r: dict(v2) for r, v2 in v.items()} for k, v in rows.items()}
    bad["x1e6"]["paper"] = {"flagged": ["c9"], "moves": moves, "reversed": []}
    assert P._verdict(bad) is False
    bad = {k: {r: dict(v2) for r, v2 in v.items()} for k, v in rows.items()}
    bad["flip"]["exchangeable"] = {"flagged": ["c0", "c3", "c9"], "moves": moves, "reversed": []}
    assert P._verdict(bad) is False
    bad = {k: {r: dict(v2) for r, v2 in v.items()} for k, v in rows.items()}
    bad["x10"]["exchangeable"] = {"flagged": ["c0", "c9"], "moves": {**moves, "c4": 0.16}, "reversed": []}
    assert P._verdict(bad) is False


def test_poisoning_claim_holds_at_smoke_scale():
    ev = REGISTRY[POISON].run(Context(scale="smoke"))
    assert ev.verdict == "holds", ev.summary
    # every solve of (7) the evidence rests on reached its tolerance, the refits included
    assert ev.solves["count"] >= 6 * 2 * 4 and ev.solves["not_converged"] == 0


def test_baseline_check_names_the_base_that_does_not_copy():
    rec = lambda base, acc: {"settings": {"base": base}, "base_accuracy": acc,  # noqa: E731
                             "copying_threshold": 50.96}
    assert AD.baseline_failure([rec("llama", 86.0), rec("gpt2", 51.0)]) == ""
    msg = AD.baseline_failure([rec("llama", 86.0), rec("gpt2", 27.3), rec("gpt2", 27.3)])
    assert msg.startswith("baseline check failed") and "gpt2: 27.3% < 51.0%" in msg and "llama" not in msg


def test_smoke_bases_do_not_copy_so_the_claims_are_inconclusive():
    """Smoke pretrains 5 steps: the base cannot copy and the baseline check must say so."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    ev = REGISTRY[IDS[0]].run(Context(scale="smoke"))
    assert ev.verdict == "inconclusive" and ev.summary.startswith("baseline check failed")


def test_loss_rows_paired_differences_by_hand():
    recs = [{"heldout_loss": {"a": {"clair-pooled": 1.0, "fedavg": 1.5, "local": 1.1},
                              "b": {"clair-pooled": 2.0, "fedavg": 2.5, "local": 2.3}}},
            {"heldout_loss": {"a": {"clair-pooled": 1.0, "fedavg": 1.2, "local": 0.9}}}]
    rows = {r["method"]: r for r in AD.loss_rows(recs)}
    # per set means: pooled (1.5, 1.0), fedavg (2.0, 1.2), local (1.7, 0.9)
    assert rows["fedavg"]["loss"] == pytest.approx(1.6)
    assert rows["fedavg"]["minus_clair-pooled"] == pytest.approx((0.5 + 0.2) / 2)
    assert rows["fedavg"]["se"] == pytest.approx(np.std([0.5, 0.2], ddof=1) / np.sqrt(2))
    assert rows["local"]["minus_clair-pooled"] == pytest.approx((0.2 - 0.1) / 2)
    assert rows["clair-pooled"]["minus_clair-pooled"] == 0.0


def test_smoke_runs_end_to_end():
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    for cid in IDS:
        ev = REGISTRY[cid].run(Context(scale="smoke"))
        assert ev.verdict in VERDICTS, ev.summary
        assert ev.table and ev.measured["sets"] == 3                 # one tiny set per family
    det = REGISTRY[IDS[0]].run(Context(scale="smoke"))
    assert set(det.measured["by_base"]) == {"llama", "gpt2", "sec8"}
    # the per-family rows add up to the pooled row
    pooled = next(r for r in det.table if r["rule"] == "pooled")
    per = [next(r for r in rows if r["rule"] == "pooled") for rows in det.measured["by_base"].values()]
    for key in ("contaminated_sets", "clean_sets", "exact_sets", "benign_clients", "benign_flagged"):
        assert sum(r[key] for r in per) == pooled[key], key
    rules = {r["rule"] for r in det.table}
    assert {"per-module", "majority", "any", "pooled", "krum", "multikrum"} <= rules
