"""The self-contained HTML report (``index.html``): inline CSS, figures as data URIs (SVG, else PNG).

Nothing is fetched from outside and nothing runs: no external stylesheets, scripts, fonts or
images. Order: counts per paper × verdict, the legends, the claims whose verdict is not "holds"
(with evidence and figure), the table of every claim, one section per paper, omitted claims,
provenance, references. Every table row links to its claim's section and every section back.
"""
from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Mapping, Sequence

from ..claim import PAPERS, Claim, Evidence, Omitted
from ._common import (KIND_LEGEND, MISSING, anchor, verdict_legend, by_paper, is_error, kv_rows,
                      check_lines, column_legend, count_columns, non_holds, omitted_sorted, remarks_sentence,
                      stop_sentence, svg_twin, table_columns, totals, totals_by_paper)
from .provenance import git_text
from .references import REFERENCES, SHORT_NAMES, bibtex, citation
from .values import fmt_number, html_value

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1150px;margin:2em auto;
     padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
nav a{margin-right:.9em}
.scroll{overflow-x:auto;max-width:100%;margin:.6em 0;scrollbar-color:#999 #eee;
 background:linear-gradient(to right,#fff 30%,#fff0) left/2em 100% no-repeat local,
  linear-gradient(to left,#fff 30%,#fff0) right/2em 100% no-repeat local,
  radial-gradient(farthest-side at 0 50%,#0003,#0000) left/.8em 100% no-repeat scroll,
  radial-gradient(farthest-side at 100% 50%,#0003,#0000) right/.8em 100% no-repeat scroll;
 background-color:#fff}
.scroll::-webkit-scrollbar{height:10px} .scroll::-webkit-scrollbar-thumb{background:#999;border-radius:5px}
.scroll::-webkit-scrollbar-track{background:#eee}
.scroll.wide{width:max-content;min-width:100%;max-width:calc(100vw - 3em);position:relative;left:50%;
 transform:translateX(-50%)}
@media print{.scroll{overflow:visible;background:none} .scroll.wide{width:auto;left:0;transform:none}}
table{border-collapse:collapse;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3} code{font-size:.95em}
table.inner{font-size:.95em;margin:0} table.inner th,table.inner td{border-color:#e3e3e3;padding:.1em .4em}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.v{font-weight:bold;padding:.1em .45em;border-radius:.3em;white-space:nowrap}
.holds{background:#d8f0d8;color:#175217} .fails{background:#f6d5d5;color:#7a1212}
.inconclusive{background:#eee;color:#444} .requires{background:#dde6f5;color:#1d3a6b} .erratum{background:#fbe8c8;color:#6b4300}
.budget{background:#f3d0e8;color:#6b1250}
.error{background:#f6d5d5;color:#7a1212;border:1px dashed #7a1212}
.claim{border:1px solid #ddd;border-radius:.4em;padding:.4em 1em;margin:1em 0}
.claim h3 a.back{font-size:.75em;font-weight:normal;margin-left:.6em}
blockquote{margin:.4em 0;padding-left:.8em;border-left:3px solid #ccc;color:#444}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
figure{margin:.8em 0} figure img{max-width:100%;min-width:min(100%,640px);height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.85em}
details .all{max-width:60em;word-break:break-word}
dl.legend dt{font-weight:bold;margin-top:.3em} dl.legend dd{margin-left:1.5em}
.meta{color:#555;font-size:.9em} .stub{color:#555}
"""


def _badge(e: Evidence) -> str:
    if is_error(e):
        return '<span class="v error">inconclusive (error)</span>'
    cls = {"erratum confirmed": "erratum", "requires torch": "requires",
           "exceeded time budget": "budget"}.get(e.verdict, e.verdict)
    return f'<span class="v {cls}">{escape(e.verdict)}</span>'


#: Tables with more columns than this may use the window's width beyond the text column.
WIDE_COLUMNS = 8


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, raw: bool = False,
           row_ids: Sequence[str] | None = None, cls: str = "") -> str:
    """An HTML table in a horizontally scrolling box; cells escaped unless ``raw`` (already HTML).

    The box shows a shadow at an edge where columns are hidden and keeps its scroll bar visible
    (overlay scroll bars hide it: a wide table then looked cut off at the right edge). A table
    of more than :data:`WIDE_COLUMNS` columns (``wide``) may widen its box, centred, up to the
    window's width, and scrolls beyond that.
    """
    cell = (lambda x: str(x)) if raw else (lambda x: escape(str(x)))
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    thead = f"<thead><tr>{head}</tr></thead>" if any(header) else ""
    body = []
    for k, row in enumerate(rows):
        rid = f' id="{row_ids[k]}"' if row_ids else ""
        body.append(f"<tr{rid}>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>")
    klass = f' class="{cls}"' if cls else ""
    box = "scroll wide" if len(header) > WIDE_COLUMNS else "scroll"
    return (f'<div class="{box}"><table{klass}>{thead}'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _figure(path: str, root: Path | None, claim: Claim) -> str:
    """The figure as a data URI: the SVG beside the PNG when there is one (vector), else the PNG."""
    png = None if root is None else Path(root) / path
    if png is None or not png.is_file():
        return f'<p class="meta">figure {escape(path)} not found</p>'
    svg = svg_twin(png)
    if svg.is_file():
        src = "data:image/svg+xml;base64," + base64.b64encode(svg.read_bytes()).decode("ascii")
    else:
        src = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
    alt = f"Figure of {claim.id}: {claim.statement}"
    return (f'<figure><img alt="{escape(alt)}" src="{src}">'
            f'<figcaption>Figure of <code>{escape(claim.id)}</code> · PNG: '
            f'<code>{escape(path)}</code></figcaption></figure>')


def _reference(c: Claim) -> str:
    short = SHORT_NAMES.get(c.paper, c.paper)
    link = (f'<a href="#ref-{escape(c.paper)}">{escape(short)}, {escape(citation(c.paper))}</a>'
            if c.paper in REFERENCES else escape(short))
    return f"{link}: {escape(c.reference)}"


def _claim(c: Claim, e: Evidence, figure_root: Path | None) -> str:
    aid = anchor(c.id)
    parts = [f'<div class="claim" id="{aid}">',
             f'<h3><code>{escape(c.id)}</code> {_badge(e)}'
             f'<a class="back" href="#row-{aid}">↑ back to the table</a></h3>',
             f'<p class="meta">{_reference(c)} — kind: {escape(c.kind)}'
             + (" (known erratum)" if c.erratum else "") + "</p>",
             f"<blockquote>{escape(c.statement)}</blockquote>",
             f"<p><b>Evidence.</b> {escape(e.summary)}</p>"]
    rows = kv_rows(e)
    if rows:
        parts.append(_table(["quantity", "measured", "predicted"], [
            [f"<code>{escape(k)}</code>", "" if m is MISSING else html_value(m),
             "" if p is MISSING else html_value(p)] for k, m, p in rows], raw=True))
    if e.table:
        cols = table_columns(e.table)
        parts.append(_table(cols, [[html_value(r[k]) if k in r else "" for k in cols] for r in e.table],
                            raw=True))
    if e.figure:
        parts.append(_figure(e.figure, figure_root, c))
    if check_lines(e):
        parts.append("<ul>" + "".join(f"<li>{escape(x)}</li>" for x in check_lines(e)) + "</ul>")
    if e.notes:
        parts.append(f"<pre>{escape(e.notes)}</pre>" if is_error(e)
                     else f"<p><b>Notes.</b> {escape(e.notes)}</p>")
    parts.append(f'<p class="meta">{len(e.seeds)} seeds · runtime {e.seconds:.2f} s</p></div>')
    return "\n".join(parts)


def _counts(results, omitted) -> str:
    per = totals_by_paper(results, omitted)
    cols = count_columns(results)
    rows = []
    for paper, t in per.items():
        name = escape(SHORT_NAMES.get(paper, paper))
        rows.append([f'<a href="#paper-{escape(paper)}">{name}</a>', *[str(t.get(k, 0)) for k in cols]])
    all_t = {**totals(results), "omitted": len(list(omitted))}
    rows.append(["<b>all</b>", *[f"<b>{all_t[k]}</b>" for k in cols]])
    return _table(["paper", *cols], rows, raw=True)


def _legend(items: Mapping[str, str], badges: bool) -> str:
    out = ['<dl class="legend">']
    for k, text in items.items():
        cls = {"erratum confirmed": "erratum", "exceeded time budget": "budget",
               "requires torch": "requires"}.get(k, k)
        label = (f'<span class="v {cls}">{escape(k)}</span>'
                 if badges else f"<code>{escape(k)}</code>")
        out.append(f"<dt>{label}</dt><dd>{escape(text)}</dd>")
    return "".join(out) + "</dl>"


def _provenance(results, scale: str, meta: Mapping) -> str:
    prov = meta.get("provenance") or {}
    git = prov.get("git") or {}
    commit_text = git_text(git)
    machine = prov.get("machine") or {}
    rows = [["lowrank_fl", prov.get("lowrank_fl", meta.get("versions", {}).get("lowrank_fl", "?"))],
            ["git commit", commit_text],
            ["command", f"<code>{escape(str(prov.get('command', '?')))}</code>"],
            ["scale", scale], ["base seed", meta.get("base_seed", "?")],
            ["backend", meta.get("backend", "?")],
            ["created", prov.get("created", meta.get("created", "?"))]]
    if "total_seconds" in meta:
        rows.append(["total runtime", f"{meta['total_seconds']:.1f} s"])
    if meta.get("tasks"):
        rows.append(["tasks", html_value(meta["tasks"])])
    if machine:
        rows.append(["machine", html_value(machine)])
    deps = prov.get("dependencies") or meta.get("versions") or {}
    if deps:
        rows.append(["dependencies", escape(", ".join(f"{k} {v}" for k, v in deps.items()))])
    safe = [[escape(str(k)), v if k in ("command", "tasks", "machine", "dependencies") else escape(str(v))]
            for k, v in rows]
    out = [_table(["", ""], safe, raw=True),
           "<p>Seeds: every task's seed is <code>SeedSequence(base_seed, spawn_key=(crc32(claim id), "
           "[map call,] grid point, replicate))</code>, so every backend gives the same numbers; the "
           "full list of each claim's seeds is in <code>results.json</code>.</p>",
           "<details><summary>Runtime and seeds per claim</summary>",
           _table(["claim", "runtime (s)", "seeds", "first seeds"], [
               [f'<a href="#{anchor(c.id)}"><code>{escape(c.id)}</code></a>',
                f"{e.seconds:.2f}", str(len(e.seeds)),
                escape(", ".join(str(s) for s in e.seeds[:3]) + (", …" if len(e.seeds) > 3 else ""))]
               for c, e in results], raw=True),
           "</details>"]
    return "\n".join(out)


def _references() -> str:
    out = []
    for paper in REFERENCES:
        out.append(f'<div id="ref-{paper}"><p><b>[{escape(SHORT_NAMES[paper])}]</b> '
                   f"{escape(PAPERS.get(paper, paper))}</p><pre>{escape(bibtex(paper))}</pre></div>")
    return "\n".join(out)


def render_html(results: Sequence[tuple[Claim, Evidence]], *, scale: str,
                omitted: Sequence[Omitted] = (), meta: Mapping | None = None,
                figure_root=None) -> str:
    """HTML text of the report.

    Parameters
    ----------
    results : sequence of (Claim, Evidence)
    scale : str
    omitted : sequence of Omitted
    meta : mapping, optional
        ``provenance`` (from :func:`verify.report.provenance.collect`), ``base_seed``, ``backend``,
        ``total_seconds``, ``tasks``, ``versions``, ``created``.
    figure_root : path, optional
        Directory the evidence's figure paths are relative to; figures are embedded from there.
    """
    meta = dict(meta or {})
    results = list(results)
    root = None if figure_root is None else Path(figure_root)
    omitted = omitted_sorted(omitted)
    t = totals(results)
    prov = meta.get("provenance") or {}
    head = [f"scale <b>{escape(scale)}</b>", f"{t['claims']} claims"]
    if "base_seed" in meta:
        head.append(f"base seed {escape(str(meta['base_seed']))}")
    if "total_seconds" in meta:
        head.append(f"{meta['total_seconds']:.1f} s")
    created = prov.get("created", meta.get("created"))
    if created:
        head.append(escape(str(created)))
    commit = (prov.get("git") or {}).get("commit")
    if commit:
        head.append(f"commit <code>{escape(commit[:10])}</code>"
                    + (" (dirty)" if (prov.get("git") or {}).get("dirty") else ""))
    attention = non_holds(results)
    nav = ['<a href="#summary">Summary</a>']
    if attention:
        nav.append('<a href="#attention">Verdicts other than holds</a>')
    nav += ['<a href="#all-claims">All claims</a>']
    nav += [f'<a href="#paper-{p}">{escape(SHORT_NAMES.get(p, p))}</a>' for p, _ in by_paper(results)]
    if omitted:
        nav.append('<a href="#omitted">Omitted</a>')
    nav += ['<a href="#provenance">Provenance</a>', '<a href="#references">References</a>']
    body = ["<h1>lowrank_fl validation report</h1>", f'<p class="meta">{" · ".join(head)}</p>',
            f"<nav>{''.join(nav)}</nav>",
            '<h2 id="summary">Summary</h2>',
            f"<p>Verdicts of {t['claims']} claims at scale <b>{escape(scale)}</b> "
            "(smoke: seconds, quick: minutes, full: the published report); verdicts can differ "
            "between scales." + escape(remarks_sentence(results)) + "</p>",
            f'<div id="counts">{_counts(results, omitted)}</div>',
            *([f'<p id="stops">{escape(stop_sentence(results))}</p>'] if stop_sentence(results) else []),
            "<h3>Columns</h3>", _legend(column_legend(results), False),
            "<h3>Verdicts</h3>", _legend(verdict_legend(results), True),
            "<h3>Kinds of claim</h3>", _legend(KIND_LEGEND, False)]
    if attention:
        body.append('<h2 id="attention">Verdicts other than holds</h2>')
        body += [_claim(c, e, root) for c, e in attention]
    body.append('<h2 id="all-claims">All claims</h2>')
    body.append(_table(["claim", "paper: reference", "kind", "verdict", "evidence", "runtime (s)"], [
        [f'<a href="#{anchor(c.id)}"><code>{escape(c.id)}</code></a>', _reference(c),
         escape(c.kind), _badge(e), escape(e.summary), fmt_number(round(e.seconds, 2))]
        for c, e in results], raw=True, row_ids=[f"row-{anchor(c.id)}" for c, _ in results],
        cls="summary"))
    shown = {c.id for c, _ in attention}
    for paper, rows in by_paper(results):
        body.append(f'<h2 id="paper-{escape(paper)}">{escape(PAPERS.get(paper, paper))}</h2>')
        for c, e in rows:
            if c.id in shown:
                body.append(f'<p class="stub"><code>{escape(c.id)}</code> {_badge(e)} — shown above in '
                            f'<a href="#{anchor(c.id)}">verdicts other than holds</a>.</p>')
            else:
                body.append(_claim(c, e, root))
    if omitted:
        body.append('<h2 id="omitted">Omitted claims</h2>')
        body.append(_table(["claim", "reference", "statement", "reason"],
                           [[o.id, f"{SHORT_NAMES.get(o.paper, o.paper)}: {o.reference}", o.statement,
                             o.reason] for o in omitted]))
    body.append('<h2 id="provenance">Provenance</h2>')
    body.append(_provenance(results, scale, meta))
    body.append('<h2 id="references">References</h2>')
    body.append(_references())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>lowrank_fl validation report ({escape(scale)})</title><style>{_CSS}</style>"
            "</head><body>\n" + "\n".join(body) + "\n</body></html>\n")
