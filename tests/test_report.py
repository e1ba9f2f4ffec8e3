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


def test_markdown_summary_sections_tables_and_omitted(report):
    out, results, _ = report
    md = (out / "README.md").read_text()
    # summary table: one row per claim, pipes in cells escaped
    assert "| claim | reference | verdict | evidence |" in md
    assert re.search(r"\| `fedrep\.dummy\.mean` \| Theorem 0, eq\. \(0\) \| \*\*holds\*\* \| means .* \\\| x\+0\.5 \|", md)
    assert "| `flute.dummy.raises` | Theorem 9 | **inconclusive (error)** | experiment raised ZeroDivisionError: dummy experiment divided by zero |" in md
    assert "**erratum confirmed**" in md
    # per-paper sections in paper order, with statement, measured vs predicted, figure, seeds, runtime
    assert md.index("## CLAIR") < md.index("## FedRep") < md.index("## FLUTE") < md.index("## RoLoRA")
    assert "> The mean of U(0,1) + x is x + 1/2." in md
    assert "| quantity | measured | predicted |" in md and "| ratio | 2 | 1 |" in md
    assert "![fedrep.dummy.mean](figures/fedrep.dummy.mean.png)" in md
    assert "Seeds: 6 · runtime:" in md
    # Evidence.table as a Markdown table, columns = union of the rows' keys
    assert "| method | error | time |" in md and "| ours | 0.1251 | 2 |" in md and "| paper | 0.125 |  |" in md
    # the error's traceback, and omitted claims with reasons
    assert "ZeroDivisionError: dummy experiment divided by zero" in md.split("## FLUTE")[1]
    assert "## Omitted claims" in md and "needs an oracle we do not have" in md


def test_html_is_self_contained(report):
    out, results, _ = report
    page = (out / "index.html").read_text()
    assert "http://" not in page and "https://" not in page
    assert "<link" not in page and "<script" not in page and "@import" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 1 and all(s.startswith("data:image/png;base64,") for s in sources)
    png = base64.b64decode(sources[0].split(",", 1)[1])
    assert png == (out / "figures" / "fedrep.dummy.mean.png").read_bytes()
    assert page.count('class="claim"') == 4
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
                             "requires torch": 0, "errors": 1, "claims": 4}
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
    assert (out / "figures" / "fedrep.dummy.mean.png").read_bytes() == \
        (runs / "figures" / "fedrep.dummy.mean.png").read_bytes()
    assert 'src="data:image/png;base64,' in (out / "index.html").read_text()


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
    assert fmt(np.float64(1 / 3)) == "0.3333" and fmt(1.5e-7) == "1.500e-07" and fmt(True) == "True"
    assert fmt(list(range(10)), max_items=3) == "[0, 1, 2, … (10 items)]"
    assert fmt({"a": np.array([1.0, 2.0])}) == "{a=[1, 2]}"
    assert fmt(float("nan")) == "nan"
    c = dummy_claims()[0]
    t = totals([(c, Evidence(verdict="fails", summary="x")), (c, Evidence(verdict="holds", summary="y"))])
    assert t["fails"] == 1 and t["holds"] == 1 and t["errors"] == 0 and t["claims"] == 2


def test_markdown_without_results_or_omitted():
    md = render_markdown([], scale="full")
    assert md.startswith("# lowrank_fl validation report") and "Verdicts — none." in md
    assert "Omitted" not in md
