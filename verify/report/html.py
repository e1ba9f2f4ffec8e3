"""The self-contained HTML report (``index.html``): inline CSS, figures as base64 data URIs.

Nothing is fetched from outside: no external stylesheets, scripts, fonts or images.
"""
from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Mapping, Sequence

from ..claim import PAPERS, Claim, Evidence, Omitted
from ._common import by_paper, fmt, is_error, kv_rows, omitted_sorted, table_columns, totals

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;
     padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3} code{font-size:.95em}
.v{font-weight:bold;padding:.1em .45em;border-radius:.3em;white-space:nowrap}
.holds{background:#d8f0d8;color:#175217} .fails{background:#f6d5d5;color:#7a1212}
.inconclusive{background:#eee;color:#444} .requires{background:#dde6f5;color:#1d3a6b} .erratum{background:#fbe8c8;color:#6b4300}
.error{background:#f6d5d5;color:#7a1212;border:1px dashed #7a1212}
.claim{border:1px solid #ddd;border-radius:.4em;padding:.4em 1em;margin:1em 0}
blockquote{margin:.4em 0;padding-left:.8em;border-left:3px solid #ccc;color:#444}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
img{max-width:100%;height:auto} .meta{color:#555;font-size:.9em}
"""


def _badge(e: Evidence) -> str:
    if is_error(e):
        return '<span class="v error">inconclusive (error)</span>'
    cls = {"erratum confirmed": "erratum", "requires torch": "requires"}.get(e.verdict, e.verdict)
    return f'<span class="v {cls}">{escape(e.verdict)}</span>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, raw: bool = False) -> str:
    """An HTML table; cells are escaped unless ``raw`` (already HTML)."""
    cell = (lambda x: str(x)) if raw else (lambda x: escape(str(x)))
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _anchor(claim_id: str) -> str:
    return "claim-" + "".join(ch if ch.isalnum() else "-" for ch in claim_id)


def _figure(path: str, root: Path | None, alt: str) -> str:
    file = None if root is None else Path(root) / path
    if file is None or not file.is_file():
        return f'<p class="meta">figure {escape(path)} not found</p>'
    data = base64.b64encode(file.read_bytes()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def _claim(c: Claim, e: Evidence, figure_root: Path | None) -> str:
    parts = [f'<div class="claim" id="{_anchor(c.id)}">',
             f"<h3><code>{escape(c.id)}</code> {_badge(e)}</h3>",
             f'<p class="meta">{escape(c.reference)} — {escape(c.kind)}'
             + (" (known erratum)" if c.erratum else "") + "</p>",
             f"<blockquote>{escape(c.statement)}</blockquote>",
             f"<p>{escape(e.summary)}</p>"]
    rows = kv_rows(e)
    if rows:
        parts.append(_table(["quantity", "measured", "predicted"], rows))
    if e.table:
        cols = table_columns(e.table)
        parts.append(_table(cols, [[fmt(r[k]) if k in r else "" for k in cols] for r in e.table]))
    if e.figure:
        parts.append(_figure(e.figure, figure_root, c.id))
    if e.notes:
        parts.append(f"<pre>{escape(e.notes)}</pre>" if is_error(e)
                     else f"<p><b>Notes.</b> {escape(e.notes)}</p>")
    parts.append(f'<p class="meta">Seeds: {len(e.seeds)} · runtime: {e.seconds:.2f} s</p></div>')
    return "\n".join(parts)


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
        As for :func:`verify.report.markdown.render_markdown`.
    figure_root : path, optional
        Directory the evidence's figure paths are relative to; figures are embedded from there.
    """
    meta = dict(meta or {})
    root = None if figure_root is None else Path(figure_root)
    t = totals(results)
    head = [f"scale <b>{escape(scale)}</b>", f"{t['claims']} claims"]
    if "base_seed" in meta:
        head.append(f"base seed {escape(str(meta['base_seed']))}")
    if "total_seconds" in meta:
        head.append(f"{meta['total_seconds']:.1f} s")
    if "created" in meta:
        head.append(escape(str(meta["created"])))
    counts = ", ".join(f"{escape(k)}: {v}" for k, v in t.items() if k != "claims" and v)
    body = ["<h1>lowrank_fl validation report</h1>", f'<p class="meta">{" · ".join(head)}</p>',
            f"<p>Verdicts — {counts or 'none'}.</p>"]
    if meta.get("versions"):
        body.append('<p class="meta">Versions: ' + escape(", ".join(
            f"{k} {v}" for k, v in meta["versions"].items())) + "</p>")
    body.append("<h2>Summary</h2>")
    body.append(_table(["claim", "reference", "verdict", "evidence"], [
        [f'<a href="#{_anchor(c.id)}"><code>{escape(c.id)}</code></a>', escape(c.reference),
         _badge(e), escape(e.summary)] for c, e in results], raw=True))
    for paper, rows in by_paper(results):
        body.append(f"<h2>{escape(PAPERS.get(paper, paper))}</h2>")
        body += [_claim(c, e, root) for c, e in rows]
    omitted = omitted_sorted(omitted)
    if omitted:
        body.append("<h2>Omitted claims</h2>")
        body.append(_table(["claim", "reference", "statement", "reason"],
                           [[o.id, o.reference, o.statement, o.reason] for o in omitted]))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>lowrank_fl validation report ({escape(scale)})</title><style>{_CSS}</style>"
            "</head><body>\n" + "\n".join(body) + "\n</body></html>\n")
