"""Helpers shared by the RoLoRA claims (:mod:`verify.claims.rolora`): figures, solve records of
runs, geometric slopes."""
from __future__ import annotations

import numpy as np

from verify.claim import solve_record
from verify.stats import fit_semilog_slope

PAPER = "rolora"


def new_figure(nrows=1, ncols=1, **kw):
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), **kw)


def solve_records(**traces) -> list[dict]:
    """Solve records (status checked by the framework) of the runs a task's result rests on."""
    return [solve_record(tr, what=name) for name, tr in traces.items()]


def geometric_slopes(deltas, floor=1e-12):
    """Per-seed semilog slope of delta_t over the part above ``floor`` (>= 3 points)."""
    slopes = []
    for row in deltas:
        row = np.asarray(row)
        keep = np.flatnonzero(row > floor)
        keep = keep[: max(3, len(keep))] if len(keep) >= 3 else np.arange(min(3, len(row)))
        slopes.append(fit_semilog_slope(keep.astype(float), np.maximum(row[keep], 1e-300)[:, None]).slope)
    return np.asarray(slopes)
