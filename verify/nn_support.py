"""Shared helpers of the torch-only claims (CLAIR §8, RoLoRA §5.2): paired differences with
intervals over replicates, and where the backbone cache lives. Nothing here imports torch."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["mean_ci", "direction", "backbone_dir", "REQUIRES"]

REQUIRES = ("torch", "peft")


def mean_ci(x, level: float = 0.95) -> tuple[float, float, float, float]:
    """``(mean, standard error, low, high)`` of ``x`` over replicates (Student t interval; with one
    replicate the interval is infinite)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    n = x.size
    if n == 0:
        return float("nan"), float("nan"), float("-inf"), float("inf")
    m = float(x.mean())
    if n < 2:
        return m, float("inf"), float("-inf"), float("inf")
    se = float(x.std(ddof=1) / np.sqrt(n))
    from scipy.stats import t as student

    h = float(student.ppf(0.5 + level / 2, n - 1)) * se
    return m, se, m - h, m + h


def direction(low: float, high: float, margin: float = 0.0) -> bool | None:
    """``True`` if the interval ``[low, high]`` lies above ``margin``, ``False`` if it lies below,
    ``None`` (within noise) if it contains ``margin``."""
    if low > margin:
        return True
    if high < margin:
        return False
    return None


def backbone_dir(ctx) -> str:
    """Directory of the cached pretrained backbones: ``<sweep cache>/backbones`` when the sweep
    caches, else ``$LOWRANK_FL_CACHE/backbones`` or the system temporary directory (the file
    names are keyed by the pretraining settings, so sharing is safe)."""
    cache = getattr(ctx.sweep, "cache_dir", None)
    if cache is not None:
        return str(Path(cache) / "backbones")
    if os.environ.get("LOWRANK_FL_CACHE"):
        return str(Path(os.environ["LOWRANK_FL_CACHE"]) / "backbones")
    return str(Path(tempfile.gettempdir()) / "lowrank_fl_backbones")
