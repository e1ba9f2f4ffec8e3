"""The Markdown report (``README.md``): summary table, one section per paper, omitted claims."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..claim import PAPERS, Claim, Evidence, Omitted
from ._common import by_paper, fmt, is_error, kv_rows, omitted_sorted, table_columns, totals

__all__ = ["render_markdown"]


def _cell(text) -> str:
    """One Markdown table cell: pipes escaped, newlines folded."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _verdict(e: Evidence) -> str:
    return "**inconclusive (error)**" if is_error(e) else f"**{e.verdict}**"


def _claim_section(c: Claim, e: Evidence) -> list[str]:
    out = [f"### `{c.id}`", "", f"*{c.reference}* — {c.kind}" + (" (known erratum)" if c.erratum else ""),
           "", f"> {c.statement}", "", f"Verdict: {_verdict(e)} — {e.summary}", ""]
    rows = kv_rows(e)
    if rows:
        out += _table(["quantity", "measured", "predicted"], rows) + [""]
    if e.table:
        cols = table_columns(e.table)
        out += _table(cols, [[fmt(r[k]) if k in r else "" for k in cols] for r in e.table]) + [""]
    if e.figure:
        out += [f"![{c.id}]({e.figure})", ""]
    if e.notes:
        if is_error(e):
            out += ["```text", e.notes, "```", ""]
        else:
            out += [f"Notes: {e.notes}", ""]
    out += [f"Seeds: {len(e.seeds)} · runtime: {e.seconds:.2f} s", ""]
    return out


def render_markdown(results: Sequence[tuple[Claim, Evidence]], *, scale: str,
                    omitted: Sequence[Omitted] = (), meta: Mapping | None = None) -> str:
    """Markdown text of the report.

    Parameters
    ----------
    results : sequence of (Claim, Evidence)
    scale : str
        Scale the claims ran at.
    omitted : sequence of Omitted
        Claims left out, listed with their reasons.
    meta : mapping, optional
        ``versions`` (dict), ``base_seed``, ``total_seconds``, ``created`` shown in the header.
    """
    meta = dict(meta or {})
    t = totals(results)
    lines = ["# lowrank_fl validation report", ""]
    head = [f"Scale **{scale}**", f"{t['claims']} claims"]
    if "base_seed" in meta:
        head.append(f"base seed {meta['base_seed']}")
    if "total_seconds" in meta:
        head.append(f"{meta['total_seconds']:.1f} s")
    if "created" in meta:
        head.append(str(meta["created"]))
    lines += [" · ".join(head), ""]
    counts = ", ".join(f"{k}: {v}" for k, v in t.items() if k != "claims" and v)
    lines += [f"Verdicts — {counts or 'none'}.", ""]
    if meta.get("versions"):
        lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    lines += ["## Summary", ""]
    lines += _table(["claim", "reference", "verdict", "evidence"],
                    [[f"`{c.id}`", c.reference, _verdict(e), e.summary] for c, e in results]) + [""]
    for paper, rows in by_paper(results):
        lines += [f"## {PAPERS.get(paper, paper)}", ""]
        for c, e in rows:
            lines += _claim_section(c, e)
    omitted = omitted_sorted(omitted)
    if omitted:
        lines += ["## Omitted claims", ""]
        lines += _table(["claim", "reference", "statement", "reason"],
                        [[f"`{o.id}`", o.reference, o.statement, o.reason] for o in omitted]) + [""]
    return "\n".join(lines).rstrip() + "\n"
