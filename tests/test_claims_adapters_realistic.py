"""adapters.realistic.*: the realistic-federation issue's bar as claims — criteria that can fail,
counts against hand computations, fresh seeds, and a smoke run end to end."""
import pytest

from verify.claim import REGISTRY, Context
from verify.claims.adapters import _realistic as R

IDS = ("adapters.realistic.detection", "adapters.realistic.no_harm")


def test_registered_as_torch_extension_findings():
    for cid in IDS:
        c = REGISTRY[cid]
        assert c.paper == "adapters" and "torch" in c.requires and c.kind == "comparison"
        assert c.statement.startswith("Extension finding (ours)")


def test_seeds_are_never_a_design_or_report_seed():
    assert R.fresh_family_seed(0) == R.FIRST_FRESH and R.fresh_family_seed(2999) == R.FIRST_FRESH + 2999
    assert R.fresh_family_seed(R.FIRST_FRESH) == R.FIRST_FRESH
    assert R.fresh_family_seed(2**31 + 5) == R.FIRST_FRESH + 5
    ctx = Context(scale="full").for_claim(R.STREAM)
    seeds = {R.fresh_family_seed(ctx.seed(i, j)) for i in range(10) for j in range(3)}
    assert len(seeds) == 30 and min(seeds) >= R.FIRST_FRESH


def _rec(family, seed, names, truth, flagged, raw=(), default=None):
    return {"settings": {"family": family, "seed": seed}, "names": names, "truth": list(truth),
            "flagged": {"updates": list(flagged), "pooled": [], "per-module": []},
            "default_flagged": list(flagged if default is None else default),
            "raw_scores": {n: (9.0 if n in raw else 0.0) for n in names}, "raw_threshold": 5.0}


def test_detection_counts_by_hand():
    names = [f"c{k}" for k in range(5)]
    recs = [_rec("a", 1, names, ["c3", "c4"], ["c4", "c0"], raw=["c3"]),
            _rec("b", 2, names[:4], [], [], raw=["c1"])]
    d = R.detection_counts(recs, "updates")
    assert (d["contaminated"], d["found"], d["benign"], d["benign_flagged"]) == (2, 1, 7, 1)
    assert d["recall"] == 0.5 and d["sets_with_benign_flag"] == ["a/1"]
    raw = R.detection_counts(recs, "raw")
    assert (raw["found"], raw["benign_flagged"], raw["sets_with_benign_flag"]) == (1, 1, ["b/2"])
    # "default" reads whom the default output excluded, which the verdict is on
    recs[1]["default_flagged"] = ["c2"]
    d = R.detection_counts(recs, "default")
    assert (d["found"], d["benign_flagged"], d["sets_with_benign_flag"]) == (1, 2, ["a/1", "b/2"])
    del recs[0]["default_flagged"]
    with pytest.raises(ValueError, match="no default output"):
        R.detection_counts(recs, "default")


def test_learning_clause_by_hand():
    names = ["c0", "c1", "c2"]
    rec = _rec("a", 1, names, ["c2"], ["c2"])
    rec["accuracy"] = {"c0": {"local": 0.5, "base": 0.6}, "c1": {"local": 0.7, "base": 0.6}}
    rec["contaminated_accuracy"] = {"c2": {"local": 0.9, "base": 0.6}}
    text, table = R.learning_clause([rec, _rec("b", 2, names, [], [])])     # the second: not measured
    assert table["all"]["sets"] == 1 and table["all"]["contaminated_learned"] == 1
    assert "learned their task" in text and ": 1/1, found 1 of them and 0 of the others" in text
    assert "benign clients beating the base by more than 0.02: 1/2 (by family: a 1/2)" in text
    assert R.learning_clause([_rec("b", 2, names, [], [])]) == ("", None)


def test_family_harm_by_hand():
    rows = [{"family": "a", "mean_change": -0.004, "losing": 1, "clients": 8, "gain_kept": 0.7},
            {"family": "a", "mean_change": 0.02, "losing": 0, "clients": 9, "gain_kept": 0.4},
            {"family": "b", "mean_change": -0.001, "losing": 0, "clients": 7, "gain_kept": None}]
    f = R.family_harm(rows)
    assert f["a"] == {"sets": 2, "worst_change": -0.004, "losing": 1, "clients": 17, "sets_paying": 2,
                      "least_gain_kept": 0.4}
    assert f["b"] == {"sets": 1, "worst_change": -0.001, "losing": 0, "clients": 7, "sets_paying": 0,
                      "least_gain_kept": None}


def _counts(found, bad, wrong):
    return {"contaminated": bad, "found": found, "benign_flagged": wrong,
            "recall": found / bad if bad else float("nan")}


@pytest.mark.parametrize("default,raw,expected", [
    (_counts(20, 39, 0), _counts(17, 39, 2), True),
    (_counts(20, 39, 1), _counts(17, 39, 2), False),      # one benign client flagged
    (_counts(19, 39, 0), _counts(17, 39, 0), False),      # below half
    (_counts(20, 39, 0), _counts(20, 39, 0), False),      # not more than the raw statistic
    (_counts(20, 40, 0), _counts(17, 40, 0), True),       # exactly half is enough
    (_counts(0, 0, 1), _counts(0, 0, 0), False),          # a benign flag fails even without contamination
    (_counts(0, 0, 0), _counts(0, 0, 0), None)])          # nothing contaminated: cannot decide
def test_detection_criterion_can_fail(default, raw, expected):
    assert R.detection_verdict(default, raw) is expected


def _acc_rec(family, seed, own, default, fedavg):
    return {"settings": {"family": family, "seed": seed},
            "accuracy": {f"c{k}": {"local": o, "clair-default": d, "fedavg-benign": f}
                         for k, (o, d, f) in enumerate(zip(own, default, fedavg))}}


def test_harm_rows_by_hand():
    recs = [_acc_rec("p", 1, [0.6, 0.7], [0.59, 0.66], [0.5, 0.5]),     # averaging hurts
            _acc_rec("c", 2, [0.5, 0.5], [0.55, 0.57], [0.62, 0.62])]   # averaging pays 0.12
    a, b = R.harm_rows(recs)
    assert a["mean_change"] == pytest.approx(-0.025) and a["losing"] == 1 and a["gain_kept"] is None
    assert b["fedavg_gain"] == pytest.approx(0.12) and b["gain_kept"] == pytest.approx(0.06 / 0.12)
    assert b["losing"] == 0 and b["set"] == "c/2"
    assert a["base_change"] is None                        # records before "base" was measured
    for r, base in zip(recs, ([0.55, 0.55], [0.56, 0.6])):
        for v, x in zip(r["accuracy"].values(), base):
            v["base"] = x
    a, b = R.harm_rows(recs)
    assert a["base_change"] == pytest.approx(-0.1) and b["base_change"] == pytest.approx(0.08)
    # the base alone reaches 0.08 / 0.12 of the gain where averaging pays; with a second set at
    # 0.03 / 0.10 and a third at 0.12 / 0.10 the median (0.67) and the least (0.30) differ
    assert "reaches a median 0.67 of the benign FedAvg's gain (least 0.67)" in R._base_clause([b])
    more = [b, {"base_change": 0.03, "fedavg_gain": 0.10}, {"base_change": 0.12, "fedavg_gain": 0.10}]
    assert "reaches a median 0.67 of the benign FedAvg's gain (least 0.30)" in R._base_clause(more)
    assert R._base_clause([]) == ""


def _row(mean, losing=0, clients=10, kept=None):
    return {"mean_change": mean, "losing": losing, "clients": clients, "gain_kept": kept}


@pytest.mark.parametrize("rows,expected", [
    ([_row(-0.01), _row(0.1, kept=0.5)], True),                          # both at their bounds
    ([_row(-0.011), _row(0.1, kept=0.6)], False),                        # one set loses too much
    ([_row(0.0, losing=1), _row(0.1, kept=0.6)], True),                  # 1 of 20 = 5 %
    ([_row(0.0, losing=2), _row(0.1, kept=0.6)], False),                 # 2 of 20 losing
    ([_row(0.0), _row(0.1, kept=0.49)], False),                          # less than half of the gain
    ([], None), ([_row(0.0, clients=0)], None)])                         # no benign client: cannot decide
def test_no_harm_criterion_can_fail(rows, expected):
    assert R.harm_verdict(rows) is expected


def test_smoke_runs_end_to_end_and_is_inconclusive():
    """Smoke trains tiny sets on a base pretrained 5 steps: the baseline check makes both claims
    inconclusive, and the tables still add up."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    det = REGISTRY[IDS[0]].run(Context(scale="smoke"))
    assert det.verdict == "inconclusive" and det.summary.startswith("baseline check failed")
    assert det.measured["sets"] == 2 and set(det.measured["by_family"]) == {"llama-federated", "gpt2-collab"}
    total = next(r for r in det.table if r["rule"] == "default")
    assert det.table[0]["rule"] == "default" and det.table[1]["rule"] == "raw"
    per = [rows[0] for rows in det.measured["by_family"].values()]
    for key in ("contaminated", "found", "benign", "benign_flagged"):
        assert sum(r[key] for r in per) == total[key], key
    learned = det.measured["learning"]["all"]
    assert (learned["contaminated"], learned["benign"]) == (total["contaminated"], total["benign"])
    harm = REGISTRY[IDS[1]].run(Context(scale="smoke"))
    assert harm.verdict == "inconclusive" and len(harm.table) == 2
    assert sum(r["clients"] for r in harm.table) == total["benign"]
    fam = harm.measured["by_family"]
    assert set(fam) == set(det.measured["by_family"])
    assert sum(v["clients"] for v in fam.values()) == total["benign"]
