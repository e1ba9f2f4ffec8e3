"""Constants and the verdict, fit and plotting helpers shared by the FLUTE claim modules.

The defaults follow App. C: ``d = 10``, ``M = 15``, ``eta = 0.03``, label noise N(0, 0.3) read as a
variance. The verdict helpers (band, all-of, rounds-to) are :mod:`verify.criteria`'s, re-exported.
"""
from __future__ import annotations

import numpy as np

from verify.criteria import all_of, rounds_to
from verify.criteria import band as band_verdict

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
