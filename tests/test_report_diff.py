"""``lowrank-fl report diff A/results.json B/results.json``: verdict and number changes."""
from __future__ import annotations

import copy
import json

import pytest

from verify.cli import lowrank_fl_main
from verify.report.diff import diff_reports, format_diff, load_results


def _doc(scale="quick"):
    return {"scale": scale, "claims": [
        {"id": "fedrep.a", "verdict": "holds", "error": False,
         "measured": {"slope": -1.0, "per_seed": [1.0, 2.0], "ok": True}, "predicted": {"slope": -1.0},
         "nonfinite": {}},
        {"id": "flute.b", "verdict": "holds", "error": False, "measured": {"gap": 0.5},
         "predicted": {}, "nonfinite": {}},
        {"id": "clair.c", "verdict": "fails", "error": False, "measured": {"rate": None},
         "predicted": {}, "nonfinite": {"/measured/rate": "inf"}}]}


def _write(tmp_path, name, doc):
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(doc))
    return d


def test_identical_reports_have_no_differences():
    d = diff_reports(_doc(), _doc())
    assert d.identical and d.compared == 3 and "No differences in the 3 claims" in format_diff(d)


def test_verdict_number_and_membership_changes(tmp_path):
    a, b = _doc("quick"), _doc("full")
    b["claims"][1]["verdict"] = "fails"
    b["claims"][0]["measured"]["slope"] = -1.0 + 1e-9       # within rtol: not a change
    b["claims"][0]["measured"]["per_seed"][1] = 2.5
    b["claims"][2]["nonfinite"] = {"/measured/rate": "nan"}  # inf -> nan behind the null
    b["claims"].append({"id": "rolora.new", "verdict": "holds", "measured": {}, "predicted": {}})
    d = diff_reports(a, b)
    assert d.verdicts == [("flute.b", "holds", "fails")]
    assert d.only_b == ["rolora.new"] and d.only_a == []
    changes = {(c.claim, c.pointer): (c.old, c.new) for c in d.numbers}
    assert changes[("fedrep.a", "/measured/per_seed/1")] == (2.0, 2.5)
    assert ("fedrep.a", "/measured/slope") not in changes
    old, new = changes[("clair.c", "/measured/rate")]
    assert old == float("inf") and new != new  # nan
    text = format_diff(d, names=("quick", "full"))
    assert "quick: scale quick, 3 claims" in text and "flute.b: holds -> fails" in text
    assert "Only in full (1):\n  rolora.new" in text and "/measured/per_seed/1: 2 -> 2.5" in text
    assert diff_reports(a, b, rtol=0).numbers != d.numbers  # a zero tolerance sees the 1e-9 move


def test_command_line(tmp_path, capsys):
    a, b = _doc(), copy.deepcopy(_doc())
    b["claims"][0]["verdict"] = "inconclusive"
    da, db = _write(tmp_path, "a", a), _write(tmp_path, "b", b)
    assert lowrank_fl_main(["report", "diff", str(da / "results.json"), str(db)]) == 0
    out = capsys.readouterr().out
    assert "Verdict changes (1 of 3 claims):" in out and "fedrep.a: holds -> inconclusive" in out
    assert lowrank_fl_main(["report", "diff", str(da), str(db), "--strict"]) == 1
    assert lowrank_fl_main(["report", "diff", str(da), str(tmp_path / "missing")]) == 2
    assert "no results.json" in capsys.readouterr().err


def test_bad_input():
    with pytest.raises(ValueError, match="rtol"):
        diff_reports(_doc(), _doc(), rtol=-1)
    with pytest.raises(FileNotFoundError):
        load_results("/nonexistent/results.json")
