"""Constants and the verdict, fit and plotting helpers shared by the FLUTE claim modules.

The defaults follow App. C: ``d = 10``, ``M = 15``, ``eta = 0.03``, label noise N(0, 0.3) read as a
variance. The two-sided band and all-of criteria here are the FLUTE copies of helpers other papers
also define; one cross-paper module will replace them.
"""
from __future__ import annotations

import numpy as np

from verify.stats import interval_verdict

__all__ = ["PAPER", "ETA", "NOISE", "GAP_SWEEP_ETA", "figure", "tail_rate", "band_verdict",
           "all_of", "rounds_to"]

PAPER = "flute"
ETA = 0.03                      # App. C's step size
NOISE = float(np.sqrt(0.3))     # App. C: N(0, 0.3) read as a variance
GAP_SWEEP_ETA = 0.075           # step of the gap sweeps (spectrum [4, 3, 3 - g, 1, 0.5])


def figure(nrows=1, ncols=1, **kw):
    """``(fig, ax)`` of ``nrows x ncols`` panels of 4.2 x 3.2 inches (the report code owns the backend)."""
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), **kw)


def tail_rate(err, high=1e-3, low=1e-11):
    """Per-round contraction factor fitted on the part of ``err`` inside (low, high); NaN with fewer
    than 5 points there."""
    err = np.asarray(err, dtype=float)
    idx = np.flatnonzero((err < high) & (err > low))
    if len(idx) < 5:
        return np.nan
    return float(np.exp(np.polyfit(idx, np.log(err[idx]), 1)[0]))


def band_verdict(low, high, lo, hi):
    """Two-sided criterion ``lo <= value <= hi`` on an interval ``[low, high]``: True when the interval
    lies inside the band, False when it lies entirely outside, None (inconclusive) otherwise."""
    inside = (interval_verdict(low, high, lo, side="above"), interval_verdict(low, high, hi, side="below"))
    if False in inside:
        return False
    return None if None in inside else True


def all_of(*flags):
    """All criteria: False if any is False, None if any is undecided, else True."""
    return False if False in flags else (None if None in flags else True)


def rounds_to(err, level):
    """First index with ``err <= level``; ``inf`` when never reached."""
    hit = np.flatnonzero(err <= level)
    return int(hit[0]) if len(hit) else np.inf
