"""Reports: README.md, self-contained index.html, figures/*.png and results.json from Evidence."""
from __future__ import annotations

import base64
import json
import re
from importlib import metadata

import joblib
import numpy as np
import pytest

from _dummy_tasks import dummy_claims
from verify.claim import Claim, Context, Evidence, Omitted
from verify.report._common import fmt, totals
from verify.report.html import render_html
from verify.report.markdown import render_markdown
from verify.report.values import html_value
from verify.report.write import write_report
from verify.runner import run_claims

OMITTED = [Omitted(id="flute.thm9.lower", paper="flute", reference="Theorem 9",
                   statement="A lower bound.", reason="needs an oracle we do not have")]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    results = run_claims(dummy_claims(), Context(scale="smoke", out_dir=out))
    paths = write_report(results, out, "smoke", OMITTED, meta={"base_seed": 0})
    return out, results, paths


def test_writes_the_four_artifacts(report):
    out, results, paths = report
    assert paths["markdown"] == out / "README.md" and paths["markdown"].is_file()
    assert (out / "index.html").is_file() and (out / "results.json").is_file()
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert pngs == ["fedrep.dummy.mean.png"]
    assert (out / "figures" / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / "figures" / "fedrep.dummy.mean.svg").read_text()  # the vector twin
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg


def test_markdown_summary_sections_tables_and_omitted(report):
    out, results, _ = report
    md = (out / "README.md").read_text()
    # counts per paper x verdict first, then the legends
    assert "| paper | claims | holds | fails | inconclusive | erratum confirmed | requires torch | omitted |" in md
    assert "| FLUTE | 1 | 0 | 0 | 1 | 0 | 0 | 1 |" in md and "| **all** | **4** | **2** | **0** | **1** | **1** | **0** | **1** |" in md
    assert md.index("| paper | claims |") < md.index("Verdicts:") < md.index("Kinds of claim:")
    # the non-holds verdicts come before the table of all claims, each with its section
    attention = md.index("## Verdicts other than holds")
    assert attention < md.index("### `flute.dummy.raises`") < md.index("## All claims")
    assert attention < md.index("### `rolora.dummy.erratum`") < md.index("## All claims")
    # the table: one row per claim, linked to its section, the section linked back
    assert "| claim | paper: reference | kind | verdict | evidence | runtime (s) |" in md
    assert re.search(r'\| <a id="row-claim-fedrep-dummy-mean"></a>\[`fedrep\.dummy\.mean`\]\(#claim-fedrep-dummy-mean\) '
                     r'\| \[FedRep, Collins et al\. \(2021\)\]\(#ref-fedrep\): Theorem 0, eq\. \(0\) \| identity '
                     r'\| \*\*holds\*\* \| means .* \\\| x\+0\.5 \|', md)
    assert "[↑ back to the table](#row-claim-fedrep-dummy-mean)" in md
    assert "| **inconclusive (error)** | experiment raised ZeroDivisionError: dummy experiment divided by zero |" in md
    assert "**erratum confirmed**" in md
    # per-paper sections in paper order, with statement, measured vs predicted, figure, seeds, runtime
    assert md.index("## CLAIR") < md.index("## FedRep") < md.index("## FLUTE") < md.index("## RoLoRA")
    assert "> The mean of U(0,1) + x is x + 1/2." in md
    assert "| quantity | measured | predicted |" in md and "| `ratio` | 2 | 1 |" in md
    assert re.search(r"\| `means` \| \[0\.\d+, 1\.\d+, 2\.\d+\] \| \[0\.5, 1\.5, 2\.5\] \|", md)
    assert "![Figure of fedrep.dummy.mean](figures/fedrep.dummy.mean.png)" in md
    assert "6 seeds · runtime" in md
    # a claim shown among the non-holds is a one-line pointer in its paper's section
    assert "`flute.dummy.raises` — **inconclusive (error)**: shown above" in md.split("## FLUTE")[1]
    # Evidence.table as a Markdown table, columns = union of the rows' keys
    assert "| method | error | time |" in md and "| ours | 0.1251 | 2 |" in md and "| paper | 0.125 |  |" in md
    # the error's traceback, omitted claims with reasons, provenance, references
    assert "ZeroDivisionError: dummy experiment divided by zero" in md.split("## Verdicts other than holds")[1]
    assert "## Omitted claims" in md and "needs an oracle we do not have" in md
    prov = md.split("## Provenance")[1]
    for label in ("| lowrank_fl |", "| git commit |", "| command |", "| scale | smoke |", "| base seed | 0 |",
                  "| machine |", "| dependencies |", "cpu_count:"):
        assert label in prov, label
    refs = md.split("## References")[1]
    assert refs.count("```bibtex") == 5 and "Exploiting Shared Representations for Personalized" in refs
    assert not re.search("notes? \u00a7", md)          # no citation of the reading notes


def test_html_is_self_contained(report):
    out, results, _ = report
    page = (out / "index.html").read_text()
    assert "http://" not in page and "https://" not in page
    assert "<link" not in page and "<script" not in page and "@import" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 1 and all(s.startswith("data:image/svg+xml;base64,") for s in sources)
    svg = base64.b64decode(sources[0].split(",", 1)[1])
    assert svg == (out / "figures" / "fedrep.dummy.mean.svg").read_bytes()
    assert page.count('class="claim"') == 4
    # every row of the table links to its section, every section back to its row
    for c, _ in results:
        aid = "claim-" + c.id.replace(".", "-")
        assert f'<tr id="row-{aid}">' in page and f'href="#{aid}"' in page
        assert f'id="{aid}"' in page and f'href="#row-{aid}"' in page
    # wide tables scroll instead of overflowing
    assert ".scroll{overflow-x:auto" in page and page.count('<div class="scroll">') >= 5
    assert "a dummy claim with a | pipe" in page
    assert "<style>" in page and "needs an oracle we do not have" in page


def test_html_escapes_text():
    c = Claim(id="clair.x", paper="clair", reference="Thm <1>", statement="a < b & c", kind="bound",
              experiment=lambda ctx: None)
    page = render_html([(c, Evidence(verdict="fails", summary="<script>x</script>"))], scale="quick")
    assert "<script>" not in page and "&lt;script&gt;" in page and "a &lt; b &amp; c" in page


def test_results_json_fields(report):
    out, results, _ = report
    doc = json.loads((out / "results.json").read_text())
    assert doc["scale"] == "smoke" and doc["base_seed"] == 0
    assert set(doc["versions"]) >= {"python", "numpy", "scipy", "cvxpy", "clarabel", "scs", "joblib",
                                    "lowrank_fl", "platform"}
    assert doc["versions"]["numpy"] == np.__version__
    assert doc["versions"]["scs"] == metadata.version("scs")
    assert doc["versions"]["clarabel"] == metadata.version("clarabel")
    assert doc["versions"]["joblib"] == joblib.__version__
    assert doc["totals"] == {"holds": 2, "fails": 0, "inconclusive": 1, "erratum confirmed": 1,
                             "requires torch": 0, "exceeded time budget": 0, "remarks": 0, "errors": 1,
                             "claims": 4}
    required = {"id", "paper", "reference", "kind", "verdict", "measured", "predicted", "seeds",
                "seconds", "statement", "summary", "notes", "figure", "table"}
    assert [c["id"] for c in doc["claims"]] == [c.id for c, _ in results]
    for entry, (c, e) in zip(doc["claims"], results):
        assert required <= set(entry)
        assert entry["verdict"] == e.verdict and entry["seeds"] == e.seeds
    mean = doc["claims"][0]
    assert mean["figure"] == "figures/fedrep.dummy.mean.png" and len(mean["seeds"]) == 6
    assert mean["predicted"] == {"means": [0.5, 1.5, 2.5]}
    raised = next(c for c in doc["claims"] if c["id"] == "flute.dummy.raises")
    assert raised["error"] is True and "ZeroDivisionError" in raised["measured"]["error"]
    assert doc["omitted"] == [{"id": "flute.thm9.lower", "paper": "flute", "reference": "Theorem 9",
                               "statement": "A lower bound.", "reason": "needs an oracle we do not have"}]


def test_figures_saved_elsewhere_are_copied(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "report"
    results = run_claims(dummy_claims()[:1], Context(out_dir=runs))
    write_report(results, out, "smoke", {}, figure_root=runs, meta={"versions": {"python": "x"}})
    for suffix in (".png", ".svg"):
        assert (out / "figures" / f"fedrep.dummy.mean{suffix}").read_bytes() == \
            (runs / "figures" / f"fedrep.dummy.mean{suffix}").read_bytes()
    assert 'src="data:image/svg+xml;base64,' in (out / "index.html").read_text()


def _png(path, value):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, value])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path.read_bytes()


def test_figures_with_the_same_name_do_not_overwrite_each_other(tmp_path):
    """Two external figures named plot.png (and one already in the report) keep distinct files."""
    out = tmp_path / "report"
    a = _png(tmp_path / "a" / "plot.png", 1.0)
    b = _png(tmp_path / "b" / "plot.png", 2.0)
    inside = _png(out / "figures" / "plot.png", 3.0)
    assert len({a, b, inside}) == 3
    c = dummy_claims()[1]
    results = [(c, Evidence(verdict="holds", summary="a", figure=str(tmp_path / "a" / "plot.png"))),
               (c, Evidence(verdict="holds", summary="b", figure=str(tmp_path / "b" / "plot.png"))),
               (c, Evidence(verdict="holds", summary="in", figure="figures/plot.png")),
               (c, Evidence(verdict="holds", summary="a again", figure=str(tmp_path / "a" / "plot.png")))]
    paths = write_report(results, out, "smoke", meta={"versions": {}})
    doc = json.loads((out / "results.json").read_text())
    names = [entry["figure"] for entry in doc["claims"]]
    assert names[2] == "figures/plot.png" and names[0] == names[3]  # in place; same source, one copy
    assert len(set(names)) == 3 and all(n.startswith("figures/plot") for n in names)
    assert [(out / n).read_bytes() for n in names] == [a, b, inside, a]
    assert len(paths["figures"]) == 4 and len(list((out / "figures").glob("*.png"))) == 3
    page = (out / "index.html").read_text()
    embedded = [base64.b64decode(x) for x in re.findall(r'src="data:image/png;base64,([^"]*)"', page)]
    assert embedded == [a, b, inside, a]


def test_missing_figure_is_reported_not_fatal(tmp_path):
    c = dummy_claims()[1]
    e = Evidence(verdict="holds", summary="s", figure="figures/gone.png")
    write_report([(c, e)], tmp_path, "quick", meta={"versions": {}})
    assert "figure figures/gone.png not found" in (tmp_path / "index.html").read_text()


def test_fmt_and_totals():
    assert fmt(np.float64(1 / 3)) == "0.3333" and fmt(1.5e-7) == "1.5e-7" and fmt(True) == "yes"
    assert fmt(12.3456) == "12.35" and fmt(2.2e-16) == "2.2e-16" and fmt(1.5e6) == "1.5e6" and fmt(0.0) == "0"
    assert fmt(float("inf")) == "∞" and fmt(-np.inf) == "−∞" and fmt(float("nan")) == "NaN" and fmt(None) == "—"
    assert fmt([0.49, 0.79]) == "[0.49, 0.79]"                      # an interval
    assert fmt(list(range(10))) == "0, 1, …, 9 (10 values; min 0, max 9)"  # a long list, summarized
    assert fmt([True] * 9 + [False]) == "9 of 10 true"
    assert fmt({"a": np.array([1.0, 2.0])}) == "a: [1, 2]"
    assert fmt({"a": 1, "b": False}) == "a: 1 · b: no"
    assert fmt({"slope": -0.489, "ci_low": -0.5, "ci_high": -0.478, "level": 0.95, "n_seeds": 20}) == \
        "-0.489 [-0.5, -0.478] (95%, 20 seeds)"
    assert fmt([{"k": 2}, {"k": 4}]) == "table of 2 rows"
    assert "items)" not in fmt(list(range(100))) and "{" not in fmt({"x": {"y": 1}})
    c = dummy_claims()[0]
    t = totals([(c, Evidence(verdict="fails", summary="x")), (c, Evidence(verdict="holds", summary="y"))])
    assert t["fails"] == 1 and t["holds"] == 1 and t["errors"] == 0 and t["claims"] == 2
    # a remark is counted apart, whatever its verdict: the verdicts and remarks add up to the claims
    from dataclasses import replace
    r = replace(c, kind="remark")
    t = totals([(r, Evidence(verdict="holds", summary="x")), (r, Evidence(verdict="fails", summary="y")),
                (c, Evidence(verdict="holds", summary="z"))])
    assert t["holds"] == 1 and t["fails"] == 0 and t["remarks"] == 2 and t["claims"] == 3


def test_html_values_are_small_tables_not_reprs():
    assert html_value({"a": 1.0, "b": [1, 2]}).startswith('<table class="inner">')
    records = html_value([{"k": 2, "err": 0.5}, {"k": 4, "err": float("inf")}])
    assert "<th>k</th><th>err</th>" in records and "<td>∞</td>" in records
    folded = html_value(list(np.linspace(0, 1, 20)))
    assert folded.startswith("<details><summary>0, 0.05263, …, 1 (20 values; min 0, max 1)</summary>")
    assert "{'" not in records and "'}" not in folded


def test_markdown_without_results_or_omitted():
    md = render_markdown([], scale="full")
    assert md.startswith("# lowrank_fl validation report") and "| **all** | **0** |" in md
    assert "Omitted" not in md and "## Verdicts other than holds" not in md


def test_checks_and_remarks_are_shown():
    from verify.claim import Claim, Evidence
    from verify.criteria import baseline_check, relaxation
    from verify.report._common import check_lines, remarks

    ev = Evidence(verdict="inconclusive", summary="s",
                  solves={"count": 3, "not_converged": 1, "by_status": {"optimal": 2, "max_iter": 1},
                          "max_relative_gap": 0.02, "failures": []},
                  baselines=[baseline_check("FedRep vs AltMin", 1.5, 1.0, rtol=1e-3)],
                  relaxations=[relaxation("mean <= 1.01", True, relaxed="interval < 0.01",
                                          relaxed_outcome=False, reason="seeds.")])
    lines = check_lines(ev)
    assert lines[0].startswith("Solves: 3 recorded (optimal 2, max_iter 1); 1 not converged; "
                               "largest relative duality gap 0.02")
    assert "NOT reached" in lines[1] and "FedRep vs AltMin" in lines[1]
    assert "original: mean <= 1.01 (passes); relaxed: interval < 0.01 (fails); why: seeds." in lines[2]
    assert check_lines(Evidence(verdict="holds", summary="s")) == []
    mk = lambda i, kind: Claim(id=f"clair.{i}", paper="clair", reference="r", statement="s",
                               kind=kind, experiment=None)
    assert remarks([(mk("a", "remark"), ev), (mk("b", "bound"), ev)]) == ["clair.a"]


# ----------------------------------------------------------------------------- each table once
def _committed_claim(cid):
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "reports" / "full" / "results.json")
                     .read_text())
    d = next(c for c in doc["claims"] if c["id"] == cid)
    c = Claim(id=d["id"], paper=d["paper"], reference=d["reference"], kind=d["kind"],
              statement=d["statement"], experiment=lambda ctx: None)
    return c, Evidence(verdict=d["verdict"], summary=d["summary"], measured=d["measured"],
                       predicted=d["predicted"], table=d["table"])


def test_a_claims_table_appears_once():
    """fedrep.thm1.sample_complexity keeps its rows in ``measured`` and in ``table``: the report
    showed the table twice (once as a nested table in the quantity rows)."""
    c, e = _committed_claim("fedrep.thm1.sample_complexity")
    assert e.measured["rows"] == e.table                     # the duplication is in the data
    page = render_html([(c, e)], scale="full")
    assert page.count("<th>m_star_80pct</th>") == 1
    assert "<code>affine_fit</code>" in page and "<code>rows</code>" not in page
    md = render_markdown([(c, e)], scale="full")
    assert md.count("| n | d_over_n | m_star_80pct | m_star_per_seed |") == 1
    assert "| `affine_fit` |" in md and "| `rows` |" not in md


def test_a_quantity_equal_to_the_table_is_kept_when_the_other_side_has_a_value():
    rows = [{"k": 1, "err": np.float64(0.5)}, {"k": 2, "err": np.float64(0.25)}]
    c = Claim(id="flute.dummy.t", paper="flute", reference="r", kind="bound", statement="s",
              experiment=lambda ctx: None)
    e = Evidence(verdict="holds", summary="s", table=[{"k": 1, "err": 0.5}, {"k": 2, "err": 0.25}],
                 measured={"rows": rows, "other": [{"k": 1, "err": 0.5}], "x": 1.0},
                 predicted={"rows": [{"k": 1, "err": 0.5}, {"k": 2, "err": 0.3}], "x": 1.0})
    page = render_html([(c, e)], scale="smoke")
    assert "<code>rows</code>" in page and "<code>other</code>" in page
    e2 = Evidence(verdict="holds", summary="s", table=e.table, measured={"rows": rows, "x": 1.0})
    page = render_html([(c, e2)], scale="smoke")
    assert "<code>rows</code>" not in page and page.count("<th>err</th>") == 1


def test_the_claims_table_is_titled_after_measured_tables_in_markdown():
    """A measured list of records is a titled table after the quantities; the claim's own table
    that follows gets a title too, else it reads as more of the measured one."""
    c = Claim(id="flute.dummy.t", paper="flute", reference="r", kind="bound", statement="s",
              experiment=lambda ctx: None)
    table = [{"k": 1, "err": 0.5}, {"k": 2, "err": 0.25}]
    e = Evidence(verdict="holds", summary="s", table=table, measured={"paper": [{"k": 1, "err": 0.9}], "x": 1.0})
    md = render_markdown([(c, e)], scale="smoke")
    i, j = md.index("*paper (measured)*"), md.index("*flute.dummy.t (table)*")
    assert i < j < md.index("| 2 | 0.25 |")
    alone = render_markdown([(c, Evidence(verdict="holds", summary="s", table=table, measured={"x": 1.0}))],
                            scale="smoke")
    assert "(table)*" not in alone and "| 2 | 0.25 |" in alone


def test_wide_tables_sit_in_a_box_that_may_use_the_window_and_scrolls():
    from verify.report.html import WIDE_COLUMNS

    c, e = _committed_claim("clair.sec7.table1")
    assert len(e.table[0]) == 21 > WIDE_COLUMNS
    page = render_html([(c, e)], scale="full")
    section = page[page.index('id="claim-clair-sec7-table1"'):]
    assert section.count('<div class="scroll wide"><table><thead><tr><th>(p,q)</th>') == 1
    assert '<div class="scroll"><table><thead><tr><th>quantity</th>' in section    # 3 columns
    css = page[page.index("<style>"):page.index("</style>")]
    assert ".scroll{overflow-x:auto" in css and ".scroll.wide{width:max-content" in css
    assert "max-width:calc(100vw - 3em)" in css
