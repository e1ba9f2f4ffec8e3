"""Helpers shared by the FedAvg-FT claims (:mod:`verify.claims.fedavg_ft`): the two algorithms as the
claims call them, the sizes per scale, the rate fit and the curve figure."""
from __future__ import annotations

import numpy as np

from lowrank_fl.algorithms.fedavg import fedavg


P = "fedavg_ft"
ALPHA = 0.4


# ----------------------------------------------------------------------------- shared helpers
def fedavg_alg(problem, rounds, local_steps, step_size, *, clients_per_round=None, init="paper",
                seed=None):
    """The toolkit's FedAvg in the injection signature."""
    return fedavg(problem, rounds, step_size, local_steps=local_steps, clients_per_round=clients_per_round,
                  init=init, seed=seed)


def dgd_alg(problem, rounds, local_steps, step_size, *, clients_per_round=None, init="paper",
             seed=None):
    """D-GD in the injection signature (``local_steps`` is ignored: D-GD takes one)."""
    return fedavg(problem, rounds, step_size, local_steps=1, init=init, seed=seed, method="dgd")


def sizes(ctx):
    """(d, k, M) per scale: PAPER-LIN at full scale."""
    return ctx.pick(smoke=(20, 2, 10), quick=(50, 3, 20), full=(100, 5, 40))


def fit_rate(dist, lo=1e-10, hi=1e-2, min_points=5):
    """Per-round log-rate of ``dist`` on the window ``[lo, hi]``: (slope, R^2) or (nan, nan)."""
    dist = np.asarray(dist, dtype=float)
    t = np.flatnonzero((dist >= lo) & (dist <= hi) & np.isfinite(dist))
    if t.size < min_points:
        return np.nan, np.nan
    y = np.log(dist[t])
    slope, icpt = np.polyfit(t, y, 1)
    resid = y - (slope * t + icpt)
    r2 = 1 - float(resid @ resid) / max(float(np.sum((y - y.mean()) ** 2)), 1e-300)
    return float(slope), float(r2)


def curves_figure(curves, labels, *, ylabel="dist(B_t, B*)", title="", hlines=()):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for c, lab in zip(curves, labels):
        ax.semilogy(np.maximum(np.asarray(c, dtype=float), 1e-17), label=lab)
    for y, lab in hlines:
        ax.axhline(y, ls="--", color="gray", lw=0.8, label=lab)
    ax.set_xlabel("round t")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return fig
