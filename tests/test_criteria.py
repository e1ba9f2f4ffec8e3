"""The shared verdict helpers (verify/criteria.py)."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from verify.criteria import (all_judged, all_of, band, baseline_check, fit_band, gated, proportion_interval,
                             reaches, reaches_proportion, rounds_to, trend)
from verify.stats import SlopeFit


def test_all_of_orders_false_none_true():
    assert all_of(True, True) is True
    assert all_of(True, None) is None
    assert all_of(None, False) is False
    assert all_of([True, np.bool_(True)]) is True
    assert all_of() is True
    assert all_judged([None, True]) is True and all_judged([None, False]) is False
    assert all_judged([None]) is None


def test_band_on_intervals():
    assert band(1.0, 2.0, 0.5, 2.5) is True
    assert band(3.0, 4.0, 0.5, 2.5) is False
    assert band(2.0, 3.0, 0.5, 2.5) is None
    assert band(float("nan"), 1.0, 0.0, 2.0) is None
    assert fit_band(SlopeFit(-1.0, -1.1, -0.9, np.zeros(3), 0.95), -1.2, -0.8) is True


def test_rounds_to_is_censored_explicitly():
    assert rounds_to([1.0, 0.1, 0.01], 0.1) == 1
    assert rounds_to([1.0, 0.5], 0.1) == float("inf")
    assert rounds_to([1.0, 0.5], 0.1, censored=2) == 2


def test_reaches_decides_on_the_interval_not_the_mean():
    assert reaches([0.95, 0.96, 0.97, 0.96], 0.9) is True
    assert reaches([0.2, 0.4, 0.3, 0.25], 0.9) is False
    assert reaches([0.85, 0.97], 0.9) is None          # mean 0.91 but the interval straddles 0.9
    assert reaches([0.91], 0.9) is None                # one seed: no interval


def test_proportions():
    low, high = proportion_interval(20, 20)
    assert high == 1.0 and 0.8 < low < 0.9
    assert reaches_proportion(20, 20, 0.8) is True
    assert reaches_proportion(2, 20, 0.8) is False
    assert reaches_proportion(9, 10, 0.8) is None


def test_trend_must_also_reach_the_level():
    x = np.array([1.0, 2.0, 4.0])
    rising_low = np.array([[0.1, 0.12, 0.11], [0.2, 0.21, 0.22], [0.4, 0.41, 0.42]])   # the audit's case
    ok, d = trend(x, rising_low, direction="increasing", reach=0.9)
    assert ok is False and d["slope_ok"] is True and d["reach_ok"] is False
    rising_high = np.array([[0.3, 0.31, 0.32], [0.6, 0.62, 0.61], [0.97, 0.98, 0.99]])
    assert trend(x, rising_high, direction="increasing", reach=0.9)[0] is True
    falling = 1 / rising_high
    assert trend(x, falling, direction="decreasing", reach=1.2, scale="linear")[0] is True
    with pytest.raises(ValueError, match="direction"):
        trend(x, rising_high, direction="up", reach=0.9)


def test_baseline_gate():
    ok = baseline_check("b", 1.0, 1.0, rtol=0.0)
    bad = baseline_check("b", float("nan"), 1.0, rtol=1.0)
    assert ok["ok"] and not bad["ok"]
    assert gated(True, [ok]) is True and gated(True, [ok, bad]) is None


def test_claim_modules_define_no_private_copy_of_the_shared_helpers():
    """One implementation: no claim module defines its own band/all-of/rounds-to helper."""
    shared = {"_band", "_band_verdict", "_all", "_combine", "_all_of", "_rounds_to", "_all_or_none",
              "band", "band_verdict", "fit_band", "all_of", "all_judged", "rounds_to", "combine"}
    root = Path(__file__).resolve().parent.parent / "verify" / "claims"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in shared:
                found.append(f"{path.name}:{node.name}")
    assert found == [], found
