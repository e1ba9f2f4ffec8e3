"""The comparison's figure: relative suboptimality versus time.

Suboptimality is ``(objective - lower_bound) / scale`` with ``lower_bound`` the best certified
dual value over all methods (so every curve is an upper bound on the true relative
suboptimality). Iterative methods are lines through their histories, conic solves single points.
"""
from __future__ import annotations

import numpy as np

__all__ = ["plot_comparison"]

_FLOOR = 1e-16


def plot_comparison(comparison, path=None, *, ax=None):
    """Draw ``comparison`` (a :class:`~lowrank_fl.compare.Comparison`); save to ``path`` if
    given. Returns the matplotlib ``Figure``."""
    import matplotlib

    if ax is None and path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.4, 4.2))
    lb, scale = comparison.lower_bound, comparison.scale
    markers = iter("osD^v<>p*h")
    for row in comparison.methods:
        if row.outcome != "ok" or lb is None:
            continue
        if row.history:
            t = np.asarray(row.history["seconds"])
            y = (np.asarray(row.history["objective"]) - lb) / scale
            ax.plot(t, np.maximum(y, _FLOOR), label=row.name)
        else:
            y = (row.objective - lb) / scale
            ax.plot([row.seconds], [max(y, _FLOOR)], linestyle="none",
                    marker=next(markers, "o"), markersize=8, label=row.name)
    skipped = [r.name for r in comparison.methods if r.outcome != "ok"]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("seconds")
    ax.set_ylabel("(objective - best certified lower bound) / scale")
    title = f"compare {comparison.problem}"
    if skipped:
        title += f"\nnot shown (did not finish or not run): {', '.join(skipped)}"
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
