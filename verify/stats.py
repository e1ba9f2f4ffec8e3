"""Statistics for verdicts: fitted log-log slopes with intervals over seeds, Monte Carlo bands.

Rates and exponents are fitted, never eyeballed: :func:`fit_loglog_slope` fits one slope per seed
and reports the mean with a Student-t interval across seeds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["SlopeFit", "fit_loglog_slope", "fit_semilog_slope", "mean_ci", "within_mc_error",
           "interval_verdict"]


@dataclass(frozen=True)
class SlopeFit:
    """Slope estimate: ``slope`` (mean over seeds), ``low``/``high`` (confidence interval),
    ``per_seed`` slopes, and ``level``."""

    slope: float
    low: float
    high: float
    per_seed: np.ndarray
    level: float

    def as_dict(self) -> dict:
        return {"slope": self.slope, "ci_low": self.low, "ci_high": self.high, "level": self.level,
                "n_seeds": int(len(self.per_seed))}

    def __str__(self) -> str:
        return f"{self.slope:.3g} [{self.low:.3g}, {self.high:.3g}]"


def _slopes(x, Y):
    x = np.asarray(x, dtype=float)
    Y = np.asarray(Y, dtype=float)
    if Y.ndim == 1:
        Y = Y[:, None]
    if Y.shape[0] != x.shape[0]:
        raise ValueError(f"Y must have one row per x value, got {Y.shape} for {x.shape[0]} x values")
    xc = x - x.mean()
    return (xc @ (Y - Y.mean(axis=0))) / (xc @ xc)


def _fit(slopes, level):
    slopes = np.asarray(slopes, dtype=float)
    m = float(np.mean(slopes))
    if len(slopes) < 2:
        return SlopeFit(m, np.nan, np.nan, slopes, level)
    half = stats.t.ppf(0.5 + level / 2, len(slopes) - 1) * np.std(slopes, ddof=1) / np.sqrt(len(slopes))
    return SlopeFit(m, m - half, m + half, slopes, level)


def fit_loglog_slope(x, Y, *, level: float = 0.95) -> SlopeFit:
    """Slope of ``log Y`` against ``log x``, one fit per seed (column of ``Y``, shape (len(x), seeds))."""
    Y = np.asarray(Y, dtype=float)
    if np.any(Y <= 0) or np.any(np.asarray(x) <= 0):
        raise ValueError("fit_loglog_slope needs positive x and Y")
    return _fit(_slopes(np.log(x), np.log(Y)), level)


def fit_semilog_slope(t, Y, *, level: float = 0.95) -> SlopeFit:
    """Slope of ``log Y`` against ``t`` (a linear-convergence rate is ``exp(slope)``)."""
    Y = np.asarray(Y, dtype=float)
    if np.any(Y <= 0):
        raise ValueError("fit_semilog_slope needs positive Y")
    return _fit(_slopes(t, np.log(Y)), level)


def mean_ci(samples, *, level: float = 0.95, axis: int = -1):
    """Mean and half-width of the Student-t confidence interval along ``axis``."""
    samples = np.asarray(samples, dtype=float)
    n = samples.shape[axis]
    mean = samples.mean(axis=axis)
    if n < 2:
        return mean, np.full_like(mean, np.nan)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * samples.std(axis=axis, ddof=1) / np.sqrt(n)
    return mean, half


def within_mc_error(samples, predicted: float, *, n_se: float = 3.0) -> tuple[bool, float, float]:
    """Is the sample mean within ``n_se`` Monte Carlo standard errors of ``predicted``?

    Returns (passed, mean, standard error).
    """
    samples = np.asarray(samples, dtype=float).ravel()
    mean = float(samples.mean())
    se = float(samples.std(ddof=1) / np.sqrt(len(samples)))
    return abs(mean - predicted) <= n_se * se, mean, se


def interval_verdict(low: float, high: float, threshold: float, *, side: str = "below") -> bool | None:
    """Decide a one-sided criterion on an interval estimate (e.g. a fitted slope's CI).

    ``side="below"``: the claim is "value <= threshold"; it passes (True) when the whole interval
    lies at or below the threshold, fails (False) when the whole interval lies above it, and is
    undecided (None → "inconclusive") when the interval straddles it. ``side="above"`` mirrors this
    for "value >= threshold". A NaN bound (e.g. a single seed) is undecided.
    """
    if side not in ("below", "above"):
        raise ValueError(f"side must be 'below' or 'above', got {side!r}")
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    if side == "below":
        return True if high <= threshold else (False if low > threshold else None)
    return True if low >= threshold else (False if high < threshold else None)
