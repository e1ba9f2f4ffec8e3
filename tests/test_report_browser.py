"""The HTML report in a real headless browser (Debian's chromium; .ci/run installs it).

A copy of ``index.html`` gets a probe script (the report itself has none) that records script and
resource errors and, once the page has loaded, writes what the browser displays into the DOM:
every image's decoded size and laid-out width, and the counts table. ``chromium --dump-dom`` prints
that DOM; the test reads it back and compares it with ``results.json``.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from _dummy_tasks import dummy_claims
from verify.claim import Claim, Context, Evidence, Omitted
from verify.report.write import write_report
from verify.runner import run_claims

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]

PROBE = """<script>
window.__errors = [];
const __ce = console.error;
console.error = function (...a) { window.__errors.push('console.error: ' + a.join(' ')); __ce.apply(console, a); };
window.addEventListener('error', e => window.__errors.push(
  e.message || ('resource failed: ' + (e.target && e.target.tagName))), true);
window.addEventListener('load', () => {
  const rows = [...document.querySelectorAll('#counts tr')].map(
    tr => [...tr.children].map(td => td.textContent.trim()));
  const images = [...document.images].map(i => ({alt: i.alt, complete: i.complete,
    natural: i.naturalWidth, shown: i.getBoundingClientRect().width}));
  const pre = document.createElement('pre');
  pre.id = '__probe';
  pre.textContent = JSON.stringify({errors: window.__errors, rows: rows, images: images});
  document.body.appendChild(pre);
});
</script>"""


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium not found: .ci/run installs it (apt-get install chromium chromium-driver)")
    return exe


def _probe(html_path, tmp_path, *, probe: str = PROBE, window: str | None = None) -> tuple[dict, str]:
    page = html_path.read_text(encoding="utf-8")
    assert "<script" not in page  # the report runs nothing; the probe is added to a copy
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + probe, 1), encoding="utf-8")
    profile = tmp_path / "chromium-profile"
    size = [f"--window-size={window}"] if window else []
    run = subprocess.run([_chromium(), *CHROMIUM_FLAGS, *size, f"--user-data-dir={profile}",
                          "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=180)
    match = re.search(r'<pre id="__probe">(.*?)</pre>', run.stdout, re.S)
    assert match, f"chromium printed no probe (exit {run.returncode}): {run.stderr[-2000:]}"
    import html as _html

    return json.loads(_html.unescape(match.group(1))), run.stderr


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser-report")
    results = run_claims(dummy_claims(), Context(scale="smoke", out_dir=out))
    c = Claim(id="fedavg_ft.dummy.diverges", paper="fedavg_ft", reference="Theorem 1", kind="rate",
              statement="It converges.", experiment=lambda ctx: None)
    # a failing claim with a non-finite measurement: shown first, null in the JSON
    results.append((c, Evidence(verdict="fails", summary="diverged", measured={"rate": float("inf")},
                                figure=results[0][1].figure)))
    write_report(results, out, "smoke", [Omitted(id="flute.x", paper="flute", reference="Theorem 9",
                                                  statement="s", reason="r")], meta={"base_seed": 0})
    return out


def test_page_loads_without_errors_and_every_figure_is_displayed(report, tmp_path):
    probe, stderr = _probe(report / "index.html", tmp_path)
    assert probe["errors"] == []
    console = [line for line in stderr.splitlines() if "CONSOLE" in line]
    assert console == []
    doc = json.loads((report / "results.json").read_text())
    figures = [c["figure"] for c in doc["claims"] if c["figure"]]
    assert len(probe["images"]) == len(figures) == 2
    for img in probe["images"]:
        assert img["complete"] and img["natural"] > 100 and img["shown"] > 100, img


def test_summary_counts_match_results_json(report, tmp_path):
    probe, _ = _probe(report / "index.html", tmp_path)
    doc = json.loads((report / "results.json").read_text())
    header, *rows = probe["rows"]
    assert header == ["paper", "claims", "holds", "fails", "inconclusive", "erratum confirmed",
                      "requires torch", "omitted"]
    short = {"clair": "CLAIR", "fedrep": "FedRep", "flute": "FLUTE", "rolora": "RoLoRA",
             "fedavg_ft": "FedAvg-FT"}
    shown = {r[0]: [int(x) for x in r[1:]] for r in rows}
    for paper, t in doc["totals_by_paper"].items():
        assert shown[short[paper]] == [t[k] for k in header[1:]]
    total = doc["totals"]
    assert shown["all"] == [total[k] for k in header[1:-1]] + [len(doc["omitted"])]
    assert sum(v[0] for k, v in shown.items() if k != "all") == len(doc["claims"]) == 5


WIDTHS_PROBE = """<script>
window.addEventListener('load', () => {
  const box = id => { const t = document.getElementById(id); const d = t.closest('.scroll');
    const r = d.getBoundingClientRect();
    return {left: r.left, right: r.right, client: d.clientWidth, scroll: d.scrollWidth,
            overflow: getComputedStyle(d).overflowX, cls: d.className,
            column: d.closest('.claim').clientWidth}; };
  const pre = document.createElement('pre');
  pre.id = '__probe';
  pre.textContent = JSON.stringify({viewport: document.documentElement.clientWidth,
    page: document.documentElement.scrollWidth, wide: box('r-wide'), narrow: box('r-narrow')});
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def wide_report(tmp_path_factory):
    """A claim with a 22-column table (CLAIR's Table 1 has 21) and one with 3 columns."""
    out = tmp_path_factory.mktemp("wide-report")
    wide = [{"setting": f"(p,q) = ({k}0,{k}0)", **{f"column {j}": f"{j * 1000 + k}.123 ± 0.045"
                                                   for j in range(21)}} for k in range(1, 4)]
    claims = [(Claim(id=f"clair.dummy.{name}", paper="clair", reference="Table 1", kind="comparison",
                     statement="s", experiment=lambda ctx: None),
               Evidence(verdict="holds", summary="s", table=table))
              for name, table in (("wide", wide), ("narrow", [{"a": 1, "b": 2, "c": 3}]))]
    write_report(claims, out, "smoke", meta={"base_seed": 0})
    page = (out / "index.html").read_text(encoding="utf-8")
    # tag each evidence table so the probe finds it (the tables themselves carry no id)
    for name in ("wide", "narrow"):
        at = page.index(f'id="claim-clair-dummy-{name}"')
        at = page.index("<table", at)
        page = page[:at] + f'<table id="r-{name}"' + page[at + len("<table"):]
    (out / "index.html").write_text(page, encoding="utf-8")
    return out


@pytest.mark.parametrize("window", ["1280,900", "2560,900"])
def test_a_wide_table_is_never_cut_off(wide_report, tmp_path, window):
    """A wide table may use the window's width beyond the text column and scrolls beyond that:
    every column is visible or reachable by scrolling, and the page itself never overflows."""
    probe, _ = _probe(wide_report / "index.html", tmp_path, probe=WIDTHS_PROBE, window=window)
    wide, narrow = probe["wide"], probe["narrow"]
    assert probe["page"] <= probe["viewport"]                      # no page-wide overflow
    assert wide["cls"] == "scroll wide" and wide["overflow"] == "auto"
    assert 0 <= wide["left"] and wide["right"] <= probe["viewport"]
    assert wide["client"] > wide["column"]                         # wider than the text column
    if window.startswith("1280"):
        assert wide["scroll"] > wide["client"]                     # the rest is a scroll away
    else:
        assert wide["scroll"] == wide["client"]                    # all columns shown at once
    assert narrow["cls"] == "scroll" and narrow["client"] <= narrow["column"]
