"""The Markdown report (``README.md``), in the order of the HTML one: counts per paper × verdict,
legends, verdicts other than "holds", the table of every claim, sections per paper, omitted claims,
provenance, references."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..claim import PAPERS, Claim, Evidence, Omitted
from ._common import (KIND_LEGEND, MISSING, anchor, verdict_legend, by_paper, is_error, kv_rows,
                      check_lines, column_legend, count_columns, non_holds, omitted_sorted, remarks_sentence,
                      stop_sentence, table_columns, totals, totals_by_paper)
from .provenance import git_text
from .references import REFERENCES, SHORT_NAMES, bibtex, citation
from .values import fmt, fmt_number, is_records

__all__ = ["render_markdown"]


def _cell(text) -> str:
    """One Markdown table cell: pipes escaped, newlines folded."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _records(rows: list) -> list[str]:
    cols = table_columns(rows)
    return _table(cols, [[fmt(r[k]) if k in r else "" for k in cols] for r in rows])


def _verdict(e: Evidence) -> str:
    return "**inconclusive (error)**" if is_error(e) else f"**{e.verdict}**"


def _reference(c: Claim) -> str:
    short = SHORT_NAMES.get(c.paper, c.paper)
    if c.paper in REFERENCES:
        return f"[{short}, {citation(c.paper)}](#ref-{c.paper}): {c.reference}"
    return f"{short}: {c.reference}"


def _value(v, extra: list, name: str, side: str) -> str:
    """Inline text; a list of records becomes a table after the quantities (``extra``)."""
    if v is MISSING:
        return ""
    if is_records(v):
        extra.append((f"{name} ({side})", v))
        return f"table below ({len(v)} rows)"
    return fmt(v)


def _claim_section(c: Claim, e: Evidence) -> list[str]:
    aid = anchor(c.id)
    out = [f'<a id="{aid}"></a>', "", f"### `{c.id}` — {_verdict(e)}", "",
           f"{_reference(c)} — kind: {c.kind}" + (" (known erratum)" if c.erratum else "")
           + f" · [↑ back to the table](#row-{aid})", "",
           f"> {c.statement}", "", f"Evidence: {e.summary}", ""]
    extra: list = []
    rows = [(f"`{k}`", _value(m, extra, k, "measured"), _value(p, extra, k, "predicted"))
            for k, m, p in kv_rows(e)]
    if rows:
        out += _table(["quantity", "measured", "predicted"], rows) + [""]
    for title, recs in extra:
        out += [f"*{title}*", ""] + _records(recs) + [""]
    if e.table:        # titled where measured tables precede it, so it does not read as theirs
        out += ([f"*{c.id} (table)*", ""] if extra else []) + _records(e.table) + [""]
    if e.figure:
        out += [f"![Figure of {c.id}]({e.figure})", ""]
    out += [f"- {line}" for line in check_lines(e)] + ([""] if check_lines(e) else [])
    if e.notes:
        if is_error(e):
            out += ["```text", e.notes, "```", ""]
        else:
            out += [f"Notes: {e.notes}", ""]
    out += [f"{len(e.seeds)} seeds · runtime {e.seconds:.2f} s", ""]
    return out


def _provenance(results, scale: str, meta: Mapping) -> list[str]:
    prov = meta.get("provenance") or {}
    git = prov.get("git") or {}
    commit = git.get("commit")
    commit_text = git_text(git)
    if commit:
        commit_text = commit_text.replace(commit, f"`{commit}`", 1)
    rows = [["lowrank_fl", prov.get("lowrank_fl", meta.get("versions", {}).get("lowrank_fl", "?"))],
            ["git commit", commit_text], ["command", f"`{prov.get('command', '?')}`"],
            ["scale", scale], ["base seed", meta.get("base_seed", "?")],
            ["backend", meta.get("backend", "?")], ["created", prov.get("created", meta.get("created", "?"))]]
    if "total_seconds" in meta:
        rows.append(["total runtime", f"{meta['total_seconds']:.1f} s"])
    if meta.get("tasks"):
        rows.append(["tasks", fmt(meta["tasks"])])
    if prov.get("machine"):
        rows.append(["machine", fmt(prov["machine"])])
    deps = prov.get("dependencies") or meta.get("versions") or {}
    if deps:
        rows.append(["dependencies", ", ".join(f"{k} {v}" for k, v in deps.items())])
    out = _table(["item", "value"], rows) + [
        "", "Seeds: every task's seed is `SeedSequence(base_seed, spawn_key=(crc32(claim id), "
        "[map call,] grid point, replicate))`, so every backend gives the same numbers; each "
        "claim's seeds are listed in `results.json`.", "",
        "<details><summary>Runtime and seeds per claim</summary>", ""]
    out += _table(["claim", "runtime (s)", "seeds"],
                  [[f"[`{c.id}`](#{anchor(c.id)})", f"{e.seconds:.2f}", len(e.seeds)] for c, e in results])
    return out + ["", "</details>", ""]


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
        As for :func:`verify.report.html.render_html`.
    """
    meta = dict(meta or {})
    results = list(results)
    omitted = omitted_sorted(omitted)
    t = totals(results)
    prov = meta.get("provenance") or {}
    lines = ["# lowrank_fl validation report", ""]
    head = [f"Scale **{scale}**", f"{t['claims']} claims"]
    if "base_seed" in meta:
        head.append(f"base seed {meta['base_seed']}")
    if "total_seconds" in meta:
        head.append(f"{meta['total_seconds']:.1f} s")
    created = prov.get("created", meta.get("created"))
    if created:
        head.append(str(created))
    commit = (prov.get("git") or {}).get("commit")
    if commit:
        head.append(f"commit `{commit[:10]}`" + (" (dirty)" if prov["git"].get("dirty") else ""))
    lines += [" · ".join(head), "", "## Summary", "",
              f"Verdicts of {t['claims']} claims at scale **{scale}** (smoke: seconds, quick: minutes, "
              "full: the published report); verdicts can differ between scales."
              + remarks_sentence(results), ""]
    cols = count_columns(results)
    per = totals_by_paper(results, omitted)
    rows = [[SHORT_NAMES.get(p, p), *[c.get(k, 0) for k in cols]] for p, c in per.items()]
    all_t = {**t, "omitted": len(omitted)}
    rows.append(["**all**", *[f"**{all_t[k]}**" for k in cols]])
    lines += _table(["paper", *cols], rows) + [""]
    cut = stop_sentence(results)
    if cut:
        lines += [cut, ""]
    lines += ["Columns:", ""] + [f"- *{k}*: {v}" for k, v in column_legend(results).items()] + [""]
    lines += ["Verdicts:", ""] + [f"- **{k}**: {v}" for k, v in verdict_legend(results).items()] + [""]
    lines += ["Kinds of claim:", ""] + [f"- *{k}*: {v}" for k, v in KIND_LEGEND.items()] + [""]
    attention = non_holds(results)
    if attention:
        lines += ["## Verdicts other than holds", ""]
        for c, e in attention:
            lines += _claim_section(c, e)
    lines += ["## All claims", ""]
    lines += _table(["claim", "paper: reference", "kind", "verdict", "evidence", "runtime (s)"], [
        [f'<a id="row-{anchor(c.id)}"></a>[`{c.id}`](#{anchor(c.id)})', _reference(c), c.kind,
         _verdict(e), e.summary, fmt_number(round(e.seconds, 2))] for c, e in results]) + [""]
    shown = {c.id for c, _ in attention}
    for paper, prows in by_paper(results):
        lines += [f"## {PAPERS.get(paper, paper)}", ""]
        for c, e in prows:
            if c.id in shown:
                lines += [f"`{c.id}` — {_verdict(e)}: shown above in "
                          f"[verdicts other than holds](#{anchor(c.id)}).", ""]
            else:
                lines += _claim_section(c, e)
    if omitted:
        lines += ["## Omitted claims", ""]
        lines += _table(["claim", "reference", "statement", "reason"],
                        [[f"`{o.id}`", f"{SHORT_NAMES.get(o.paper, o.paper)}: {o.reference}", o.statement,
                          o.reason] for o in omitted]) + [""]
    lines += ["## Provenance", ""] + _provenance(results, scale, meta)
    lines += ["## References", ""]
    for paper in REFERENCES:
        lines += [f'<a id="ref-{paper}"></a>**[{SHORT_NAMES[paper]}]** {PAPERS.get(paper, paper)}', "",
                  "```bibtex", bibtex(paper), "```", ""]
    return "\n".join(lines).rstrip() + "\n"
