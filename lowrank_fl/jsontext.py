"""Strict JSON for the files the library writes (``summary.json``, result files): a non-finite number
is written as the JSON every parser reads, never as Python's ``NaN`` / ``Infinity`` tokens, which
RFC 8259 does not allow and strict parsers (``jq``, JavaScript's ``JSON.parse``) refuse.

Convention (the one ``summary.json["detection"]["modules"][m]["gap_ratio"]`` has always used):
NaN ("undefined": too few values) is ``null``; ``+inf`` / ``-inf`` are the strings ``"inf"`` /
``"-inf"``.
"""
from __future__ import annotations

import json
import math

import numpy as np

__all__ = ["finite_json", "strict_dumps"]


def finite_json(value):
    """``value`` with every float NaN replaced by None and every ±inf by ``"inf"`` / ``"-inf"``,
    recursively through dicts, lists, tuples and numpy arrays / scalars (arrays become lists)."""
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return finite_json(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def strict_dumps(value, **kwargs) -> str:
    """``json.dumps`` of :func:`finite_json` ``(value)`` with ``allow_nan=False`` (so anything
    non-finite left over raises instead of writing invalid JSON)."""
    return json.dumps(finite_json(value), allow_nan=False, **kwargs)
