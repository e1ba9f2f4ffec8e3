"""``lowrank-fl report diff A/results.json B/results.json``: verdict and number changes."""
from __future__ import annotations

import copy
import json
from pathlib import Path

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
    assert "missing does not exist; expected a results.json" in capsys.readouterr().err


def test_bad_input():
    with pytest.raises(ValueError, match="rtol"):
        diff_reports(_doc(), _doc(), rtol=-1)
    with pytest.raises(FileNotFoundError):
        load_results("/nonexistent/results.json")


NOT_REPORTS = {  # file content -> what the one error line must say
    "[]": "the top level is an array, not an object with a 'claims' list",
    "{}": "it has no 'claims' list (keys: none)",
    '{"scale": "quick"}': "it has no 'claims' list (keys: 'scale')",
    '{"claims": 3}': "'claims' is a number, not a list of claims",
    '{"claims": [1]}': "claims[0] is a number, not an object with 'id' and 'verdict'",
    '{"claims": [{}]}': "claims[0] has no 'id'",
    '{"claims": [{"id": "a", "verdict": 1}]}': "claims[0].verdict is a number, not a string",
    '{"claims": [{"id": "a", "verdict": "holds", "measured": [1]}]}':
        "claims[0] (a).measured is an array, not an object",
    "not json": "not JSON (Expecting value at line 1 column 1)",
    '{"claims": [': "not JSON (Expecting value at line 1 column 13)",
}


@pytest.mark.parametrize("content", list(NOT_REPORTS), ids=range(len(NOT_REPORTS)))
def test_a_file_that_is_not_a_report_is_one_clear_line(tmp_path, capsys, content):
    good = _write(tmp_path, "good", _doc())
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for args in ([str(good), str(bad)], [str(bad), str(good)]):
        assert lowrank_fl_main(["report", "diff", *args]) == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert captured.out == "" and len(err) == 1, err
        assert err[0] == (f"lowrank-fl: error: {bad} is not a report: {NOT_REPORTS[content]}; "
                          "expected a results.json written by `lowrank-fl verify` (or its report "
                          "directory)")
    with pytest.raises(ValueError, match="is not a report"):
        load_results(bad)


def test_missing_binary_and_directory_inputs(tmp_path, capsys):
    good = _write(tmp_path, "good", _doc())
    binary = tmp_path / "r.json"
    binary.write_bytes(bytes(range(128, 256)))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {tmp_path / "nope.json": f"{tmp_path / 'nope.json'} does not exist",
             binary: f"{binary} is not a report: not UTF-8 text (a binary file?)",
             empty: f"the directory {empty} has no results.json"}
    for path, said in cases.items():
        assert lowrank_fl_main(["report", "diff", str(good), str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"lowrank-fl: error: {said}; expected"), err
    # the module's own entry point says the same
    from verify.report.diff import main
    assert main([str(good), str(tmp_path / "nope.json")]) == 2
    assert "nope.json does not exist" in capsys.readouterr().err


def test_a_report_without_provenance_or_odd_provenance_still_diffs(tmp_path):
    a = _doc()
    a["provenance"] = ["not", "an", "object"]
    b = _doc()
    b["provenance"] = {"git": {"commit": "f" * 40, "dirty": True}}
    text = format_diff(diff_reports(load_results(_write(tmp_path, "a", a)),
                                    load_results(_write(tmp_path, "b", b))))
    assert "A: scale quick, 3 claims\n" in text and f"B: scale quick, 3 claims, commit {'f' * 10} (dirty)" in text


def test_the_check_agrees_with_the_published_schema():
    """Every JSON refused above is refused by results.schema.json too, and the committed report
    passes both (the check is the subset of the schema that the diff reads)."""
    import jsonschema

    from verify.report.diff import report_problem
    from verify.report.results_json import load_schema

    validator = jsonschema.Draft202012Validator(load_schema())
    for content in NOT_REPORTS:
        try:
            doc = json.loads(content)
        except json.JSONDecodeError:
            continue
        assert report_problem(doc) is not None and not validator.is_valid(doc), content
    real = json.loads((Path(__file__).resolve().parents[1] / "reports" / "full" / "results.json")
                      .read_text())
    assert report_problem(real) is None and validator.is_valid(real)


def test_max_values_is_checked_and_the_header_says_the_seed(tmp_path, capsys):
    from verify.report.diff import format_diff

    a = {"scale": "smoke", "base_seed": 0, "claims": {}}
    b = {"scale": "smoke", "base_seed": 1, "claims": {}}
    d = diff_reports(a, b)
    text = format_diff(d, names=("r1", "r2"))
    assert text.startswith("r1: scale smoke, base seed 0, 0 claims\nr2: scale smoke, base seed 1, 0 claims\n")
    assert "No differences in the 0 claims compared." in text
    with pytest.raises(ValueError, match="max_numbers must be an integer >= 0"):
        format_diff(d, max_numbers=-1)
    with pytest.raises(SystemExit) as exc:
        lowrank_fl_main(["report", "diff", str(tmp_path), str(tmp_path), "--max-values", "-1"])
    assert exc.value.code == 2 and "--max-values: expected an integer >= 0, got '-1'" in capsys.readouterr().err
