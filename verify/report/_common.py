"""Shared pieces of the report writers: value formatting, grouping, totals, versions."""
from __future__ import annotations

import math
import platform
from typing import Any, Iterable, Mapping, Sequence

from ..claim import PAPERS, VERDICTS, Claim, Evidence, Omitted, _jsonable
from ..runner import ERROR_PREFIX

__all__ = ["fmt", "by_paper", "totals", "versions", "is_error", "table_columns", "kv_rows"]


def fmt(value: Any, *, max_items: int = 8, digits: int = 4) -> str:
    """Compact text for a measured/predicted value (floats to ``digits`` significant digits)."""
    value = _jsonable(value)
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}"
    if isinstance(value, Mapping):
        items = list(value.items())
        body = ", ".join(f"{k}={fmt(v, max_items=max_items, digits=digits)}" for k, v in items[:max_items])
        return "{" + body + (", …" if len(items) > max_items else "") + "}"
    if isinstance(value, list):
        body = ", ".join(fmt(v, max_items=max_items, digits=digits) for v in value[:max_items])
        return "[" + body + (f", … ({len(value)} items)" if len(value) > max_items else "") + "]"
    return str(value)


def is_error(evidence: Evidence) -> bool:
    """True when the runner turned an exception of the experiment into this evidence."""
    return evidence.verdict == "inconclusive" and evidence.summary.startswith(ERROR_PREFIX)


def by_paper(results: Sequence[tuple[Claim, Evidence]]) -> list[tuple[str, list[tuple[Claim, Evidence]]]]:
    """Results grouped by paper, in the order of ``PAPERS``; papers without results are dropped."""
    groups = {p: [] for p in PAPERS}
    for c, e in results:
        groups.setdefault(c.paper, []).append((c, e))
    return [(p, rows) for p, rows in groups.items() if rows]


def totals(results: Sequence[tuple[Claim, Evidence]]) -> dict:
    """Count per verdict, plus ``errors`` (experiments that raised, included in inconclusive)."""
    out = {v: 0 for v in VERDICTS}
    for _, e in results:
        out[e.verdict] += 1
    out["errors"] = sum(is_error(e) for _, e in results)
    out["claims"] = len(results)
    return out


def versions() -> dict:
    """Versions of the interpreter, the numerical stack, the toolkit, and the platform.

    Keys: python, numpy, scipy, cvxpy, clarabel, scs, joblib (those of the cache key,
    :func:`verify.sweep.dependency_versions`), lowrank_fl, platform.
    """
    import lowrank_fl

    from ..sweep import dependency_versions

    return {**dependency_versions(), "lowrank_fl": lowrank_fl.__version__, "platform": platform.platform()}


def table_columns(rows: Iterable[Mapping]) -> list[str]:
    """Union of the rows' keys, in first-seen order."""
    cols: list[str] = []
    for row in rows:
        for k in row:
            if str(k) not in cols:
                cols.append(str(k))
    return cols


def kv_rows(evidence: Evidence) -> list[tuple[str, str, str]]:
    """(quantity, measured, predicted) rows; keys of both dicts, measured's order first."""
    keys = list(evidence.measured) + [k for k in evidence.predicted if k not in evidence.measured]
    return [(str(k), fmt(evidence.measured[k]) if k in evidence.measured else "",
             fmt(evidence.predicted[k]) if k in evidence.predicted else "") for k in keys]


def omitted_sorted(omitted: Iterable[Omitted]) -> list[Omitted]:
    order = list(PAPERS)
    return sorted(omitted, key=lambda o: (order.index(o.paper) if o.paper in order else len(order), o.id))
