"""Write a report directory: ``README.md``, ``index.html``, ``figures/*.png`` (+ ``.svg``), ``results.json``."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from ..claim import Claim, Evidence, Omitted
from ._common import svg_twin
from .provenance import collect as _provenance
from .provenance import versions as _versions
from .html import render_html
from .markdown import render_markdown
from .results_json import build_results

__all__ = ["write_report"]


def _inside(path: Path, root: Path) -> Path | None:
    """``path`` relative to ``root`` when it lies inside it, else None."""
    try:
        return path.resolve().relative_to(root.resolve())
    except ValueError:
        return None


def _collect_figures(results, out_dir: Path, figure_root: Path) -> list[tuple[Claim, Evidence]]:
    """Copy figures living elsewhere into ``out_dir/figures`` and point the evidence at them.

    Figures already inside ``out_dir`` stay where they are. A copied figure keeps its file name
    unless that name is taken (by a figure in place or by another copied figure with the same
    name from a different directory); it then gets a ``-2``, ``-3``, ... suffix, so no figure
    overwrites another. A missing figure is left as is (the HTML says it is not found).
    """
    sources = []
    for _, e in results:
        src = None
        if e.figure:
            src = Path(e.figure) if Path(e.figure).is_absolute() else figure_root / e.figure
            src = src.resolve() if src.is_file() else None
        sources.append(src)
    # every file that stays in place reserves its name first
    taken = {rel.as_posix(): src for src in sources if src is not None
             for rel in [_inside(src, out_dir)] if rel is not None}
    fixed = []
    for (c, e), src in zip(results, sources):
        if src is not None:
            rel = _inside(src, out_dir)
            if rel is None:
                rel, n = Path("figures") / src.name, 1
                while taken.get(rel.as_posix(), src) != src:
                    n += 1
                    rel = Path("figures") / f"{src.stem}-{n}{src.suffix}"
                if rel.as_posix() not in taken:
                    taken[rel.as_posix()] = src
                    (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, out_dir / rel)
                    twin = svg_twin(src)
                    if twin.is_file():  # the vector version saved beside the PNG
                        shutil.copyfile(twin, svg_twin(out_dir / rel))
            e = replace(e, figure=rel.as_posix())
        fixed.append((c, e))
    return fixed


def write_report(results: Sequence[tuple[Claim, Evidence]], out_dir, scale: str,
                 omitted: Sequence[Omitted] | Mapping = (), *, figure_root=None,
                 meta: Mapping | None = None) -> dict:
    """Render the report of ``results`` into ``out_dir``.

    Parameters
    ----------
    results : sequence of (Claim, Evidence)
        As returned by :func:`verify.runner.run_claims`.
    out_dir : path
        Report directory (created).
    scale : str
        Scale the claims ran at.
    omitted : sequence of Omitted, or a mapping id -> Omitted (e.g. ``verify.claim.OMITTED``)
    figure_root : path, optional
        Directory the evidence's figure paths are relative to (default ``out_dir``, which is where
        ``Context(out_dir=...)`` saves them); figures elsewhere are copied into ``out_dir/figures``.
    meta : mapping, optional
        Extra top-level entries (``base_seed``, ``backend``, ``total_seconds``, ...). ``versions``,
        ``provenance`` (:func:`verify.report.provenance.collect`: git commit, command line,
        dependencies, machine) and ``created`` are filled in when absent.

    Returns
    -------
    dict
        Paths written: ``markdown``, ``html``, ``json``, ``figures`` (list).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figure_root = out_dir if figure_root is None else Path(figure_root)
    if isinstance(omitted, Mapping):
        omitted = list(omitted.values())
    meta = dict(meta or {})
    meta.setdefault("versions", _versions())
    meta.setdefault("provenance", _provenance(out_dir))
    meta.setdefault("created", meta["provenance"].get("created"))
    results = _collect_figures(list(results), out_dir, figure_root)
    md = out_dir / "README.md"
    md.write_text(render_markdown(results, scale=scale, omitted=omitted, meta=meta), encoding="utf-8")
    page = out_dir / "index.html"
    page.write_text(render_html(results, scale=scale, omitted=omitted, meta=meta, figure_root=out_dir),
                    encoding="utf-8")
    js = out_dir / "results.json"
    doc = build_results(results, scale=scale, omitted=omitted, meta=meta)
    js.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    figures = sorted(str(out_dir / e.figure) for _, e in results if e.figure)
    return {"markdown": md, "html": page, "json": js, "figures": figures}
