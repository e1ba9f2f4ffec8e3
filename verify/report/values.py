"""Values as a reader would write them: numbers with sensible digits, intervals, summarized lists.

:func:`fmt` gives one line of text (Markdown cells, the console); :func:`html_value` gives HTML in
which a dict is a small two-column table, a list of records a table, and a long list a one-line
summary that opens to every value.

* floats: 4 significant digits between 1e-3 and 1e5 (``0.3333``, ``12.32``), otherwise scientific
  with 3 (``2.2e-16``, ``1.5e6``); ``∞``, ``−∞``, ``NaN`` for non-finite values;
* bools ``yes`` / ``no``; ``None`` ``—``;
* a pair of numbers ``[lo, hi]`` (intervals are stored as pairs); a dict with ``ci_low`` /
  ``ci_high`` as ``centre [lo, hi] (95%, n seeds)``;
* a numeric list of up to :data:`SHORT` values in full, a longer one as
  ``first, second, …, last (n values; min a, max b)``; a list of bools as ``k of n true``;
* a dict of scalars ``a: 1 · b: 2``; nested containers summarized by size.
"""
from __future__ import annotations

import math
from html import escape
from numbers import Integral, Real
from typing import Any, Mapping

import numpy as np

__all__ = ["fmt", "fmt_number", "html_value", "interval", "is_records", "plain", "columns"]

SHORT = 6


def plain(value: Any) -> Any:
    """numpy scalars/arrays to Python objects (non-finite floats kept, unlike JSON)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _is_number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def fmt_number(v, *, digits: int = 4) -> str:
    """A number with ``digits`` significant digits, scientific outside [1e-3, 1e5)."""
    if not _is_number(v):
        return _scalar(v)
    if isinstance(v, Integral):
        return str(int(v))
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e5:
        return np.format_float_positional(v, precision=digits, unique=False, fractional=False,
                                          trim="-")
    mantissa, exp = f"{v:.{max(digits - 2, 0)}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exp)}"


def is_records(value) -> bool:
    """A non-empty list of dicts (rendered as a table)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _scalar(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if _is_number(v):
        return fmt_number(v)
    return str(v)


def _list_summary(values: list) -> str:
    n = len(values)
    if all(isinstance(v, bool) for v in values):
        k = sum(values)
        return f"all {n} true" if k == n else ("all {n} false".format(n=n) if k == 0 else f"{k} of {n} true")
    if all(_is_number(v) for v in values):
        finite = [float(v) for v in values if math.isfinite(float(v))]
        head = ", ".join(fmt_number(v) for v in values[:2])
        body = f"{head}, …, {fmt_number(values[-1])} ({n} values"
        if finite:
            body += f"; min {fmt_number(min(finite))}, max {fmt_number(max(finite))}"
        if len(finite) < n:
            body += f"; {n - len(finite)} non-finite"
        return body + ")"
    if all(isinstance(v, list) for v in values):
        sizes = {len(v) for v in values}
        inner = f"{sizes.pop()}" if len(sizes) == 1 else "ragged"
        flat = [x for v in values for x in v if _is_number(x) and math.isfinite(float(x))]
        rng = f"; min {fmt_number(min(flat))}, max {fmt_number(max(flat))}" if flat else ""
        return f"{n} × {inner} values{rng}"
    shown = ", ".join(fmt(v) for v in values[:3])
    return f"{shown}, … ({n} entries)"


_CENTRES = ("slope", "mean", "estimate", "value", "median")


def interval(value: Mapping) -> str | None:
    """``0.04 [-0.06, 0.14] (95%, 3 seeds)`` for a dict holding ``ci_low`` and ``ci_high`` (and a
    centre such as ``slope`` or ``mean``), as :mod:`verify.stats` writes them; else ``None``."""
    if not isinstance(value, Mapping) or "ci_low" not in value or "ci_high" not in value:
        return None
    centre = next((k for k in _CENTRES if k in value), None)
    text = (f"{fmt_number(value[centre])} " if centre else "") + \
        f"[{fmt_number(value['ci_low'])}, {fmt_number(value['ci_high'])}]"
    extra = []
    if "level" in value and _is_number(value["level"]):
        extra.append(f"{100 * float(value['level']):g}%")
    if "n_seeds" in value:
        extra.append(f"{value['n_seeds']} seeds")
    rest = [k for k in value if k not in ("ci_low", "ci_high", "level", "n_seeds", centre)]
    extra += [f"{k}: {fmt(value[k])}" for k in rest]
    return text + (f" ({', '.join(extra)})" if extra else "")


def fmt(value: Any) -> str:
    """One line of text for ``value`` (see the module docstring)."""
    value = plain(value)
    if interval(value) is not None:
        return interval(value)
    if isinstance(value, Mapping):
        if not value:
            return "—"
        if all(not isinstance(v, (Mapping, list)) for v in value.values()) and len(value) <= 2 * SHORT:
            return " · ".join(f"{k}: {_scalar(v)}" for k, v in value.items())
        return " · ".join(f"{k}: {fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        if not value:
            return "[]"
        if is_records(value):
            return f"table of {len(value)} rows"
        if len(value) <= SHORT and all(not isinstance(v, (Mapping, list)) for v in value):
            return "[" + ", ".join(_scalar(v) for v in value) + "]"
        if len(value) <= 3 and all(isinstance(v, list) and len(v) <= SHORT for v in value):
            return "[" + ", ".join(fmt(v) for v in value) + "]"
        return _list_summary(value)
    return _scalar(value)


# ----------------------------------------------------------------------------- HTML
def _html_table(header, rows, cls="inner") -> str:
    """A table; no header row when every header is empty (a key/value table)."""
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    thead = f"<thead><tr>{head}</tr></thead>" if any(str(h) for h in header) else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}">{thead}<tbody>{body}</tbody></table>'


def columns(rows) -> list[str]:
    """Union of the records' keys, in first-seen order."""
    cols: list[str] = []
    for row in rows:
        for k in row:
            if str(k) not in cols:
                cols.append(str(k))
    return cols


def html_value(value: Any, *, depth: int = 0) -> str:
    """HTML for ``value``: dicts and records as small tables, long lists folded."""
    value = plain(value)
    if interval(value) is not None:
        return escape(interval(value))
    if depth < 2 and isinstance(value, Mapping) and value:
        return _html_table(["", ""], [[f"<b>{escape(str(k))}</b>", html_value(v, depth=depth + 1)]
                                      for k, v in value.items()])
    if depth < 2 and is_records(value):
        cols = columns(value)
        return _html_table(cols, [[html_value(r[c], depth=depth + 1) if c in r else "" for c in cols]
                                  for r in value])
    text = escape(fmt(value))
    if isinstance(value, list) and (len(value) > SHORT or any(isinstance(v, (list, Mapping)) for v in value)):
        full = escape(", ".join(fmt(v) for v in value))
        return f"<details><summary>{text}</summary><div class=\"all\">{full}</div></details>"
    return text
