"""Shared verdict helpers of the claim modules (one copy; issue 9 §1).

Every criterion returns ``True`` (passes), ``False`` (fails) or ``None`` (undecided →
"inconclusive"), and is decided on an interval over seeds, never on a bare mean:

* :func:`all_of` — all criteria (False beats None beats True); :func:`all_judged` ignores undecided
  entries.
* :func:`band` / :func:`fit_band` — a two-sided ``lo <= value <= hi`` on an interval.
* :func:`reaches` — a level the mean over seeds must reach (Student-t interval);
  :func:`reaches_proportion` — the same for a success fraction (Clopper-Pearson interval).
* :func:`trend` — a monotone trend that must *also* reach a level: a slope whose interval has the
  right sign and a last point whose interval reaches the level the theorem's regime predicts.
* :func:`rounds_to` — first round at which a curve reaches a level (``inf`` when never: censored).
* :func:`baseline_check` / :func:`gated` — a comparison first checks that its baseline reaches its
  own reference; the checks go in ``Evidence.baselines`` and :meth:`verify.claim.Claim.run` makes
  the verdict inconclusive when one failed.
* :func:`relaxation` — a criterion changed after a run is reported with the original and both
  outcomes (``Evidence.relaxations``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy import stats

from .stats import SlopeFit, fit_loglog_slope, fit_semilog_slope, interval_verdict, mean_ci

__all__ = ["all_of", "all_judged", "band", "fit_band", "reaches", "reaches_proportion",
           "proportion_interval", "trend", "rounds_to", "baseline_check", "gated", "relaxation"]

def all_of(*flags) -> bool | None:
    """All criteria: False if any is False, else None if any is undecided, else True.

    Accepts flags as arguments or one iterable (``all_of(a, b)`` or ``all_of([a, b])``).
    """
    if len(flags) == 1 and not isinstance(flags[0], (bool, np.bool_)) and flags[0] is not None:
        flags = tuple(flags[0])
    flags = [None if f is None else bool(f) for f in flags]
    return False if False in flags else (None if None in flags else True)


def all_judged(flags) -> bool | None:
    """True/False over the judged flags (None entries are not judged); None if none was judged."""
    judged = [bool(f) for f in flags if f is not None]
    return all(judged) if judged else None


def band(low: float, high: float, lo: float, hi: float) -> bool | None:
    """Two-sided ``lo <= value <= hi`` on an interval ``[low, high]`` of the value: True when the
    interval lies inside the band, False when it lies entirely outside one edge, None when it
    straddles an edge or is undefined (NaN bound)."""
    return all_of(interval_verdict(low, high, lo, side="above"),
                  interval_verdict(low, high, hi, side="below"))


def fit_band(fit, lo: float, hi: float) -> bool | None:
    """:func:`band` on a :class:`verify.stats.SlopeFit`'s interval."""
    return band(fit.low, fit.high, lo, hi)


def reaches(samples, threshold: float, *, side: str = "above", level: float = 0.95) -> bool | None:
    """Does the mean over seeds reach ``threshold``? Decided on its Student-t interval
    (:func:`verify.stats.interval_verdict`): ``side="above"`` for "mean >= threshold"."""
    mean, half = mean_ci(np.asarray(samples, dtype=float).ravel(), level=level)
    return interval_verdict(float(mean - half), float(mean + half), threshold, side=side)


def proportion_interval(successes: int, n: int, *, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a success fraction ``successes / n``."""
    if n <= 0:
        return float("nan"), float("nan")
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def reaches_proportion(successes: int, n: int, threshold: float, *, side: str = "above",
                       level: float = 0.95) -> bool | None:
    """Does the success probability reach ``threshold``? Decided on its Clopper-Pearson interval."""
    low, high = proportion_interval(successes, n, level=level)
    return interval_verdict(low, high, threshold, side=side)


def trend(x, Y, *, direction: str, reach: float, scale: str = "loglog",
          level: float = 0.95) -> tuple[bool | None, dict]:
    """A monotone trend that must also reach a level.

    Parameters
    ----------
    x : (P,) array
        The swept variable.
    Y : (P, S) array
        One column per seed.
    direction : "increasing" or "decreasing"
    reach : float
        The level the last point must reach (>= for increasing, <= for decreasing), e.g. the
        theorem's regime: detection must reach 0.9, not merely not decrease.
    scale : "loglog", "semilog" or "linear"
        How the slope is fitted (per seed, Student-t interval over seeds).

    Returns
    -------
    (outcome, details)
        ``all_of(slope sign on its interval, last point reaches on its interval)`` and a JSON-able
        dict with the fit and the last point's mean and interval.
    """
    if direction not in ("increasing", "decreasing"):
        raise ValueError(f"direction must be 'increasing' or 'decreasing', got {direction!r}")
    x = np.asarray(x, dtype=float)
    Y = np.asarray(Y, dtype=float)
    if Y.ndim != 2 or Y.shape[0] != x.shape[0]:
        raise ValueError(f"Y must have shape (len(x), seeds), got {Y.shape} for {x.shape[0]} x values")
    if scale == "loglog":
        fit = fit_loglog_slope(x, Y, level=level)
    elif scale == "semilog":
        fit = fit_semilog_slope(x, Y, level=level)
    elif scale == "linear":                          # per-seed least-squares slope, t interval
        slopes = np.polyfit(x, Y, 1)[0]
        m, half = mean_ci(slopes, level=level)
        fit = SlopeFit(float(m), float(m - half), float(m + half), slopes, level)
    else:
        raise ValueError(f"scale must be 'loglog', 'semilog' or 'linear', got {scale!r}")
    side = "above" if direction == "increasing" else "below"
    slope_ok = interval_verdict(fit.low, fit.high, 0.0, side=side)
    last_ok = reaches(Y[-1], reach, side=side, level=level)
    mean, half = mean_ci(Y[-1], level=level)
    details = {"slope": fit.as_dict(), "last_mean": float(mean), "last_ci": [float(mean - half), float(mean + half)],
               "reach": float(reach), "direction": direction, "slope_ok": slope_ok, "reach_ok": last_ok}
    return all_of(slope_ok, last_ok), details


def rounds_to(values, level: float, *, censored: float = float("inf")) -> float:
    """First index ``t`` with ``values[t] <= level``; ``censored`` (default ``inf``) when never.

    Pass ``censored=len(values)`` where a finite stand-in is wanted (e.g. a fit over runs), and say
    so: a censored count is a lower bound, not a measurement.
    """
    hit = np.flatnonzero(np.asarray(values, dtype=float) <= level)
    return int(hit[0]) if hit.size else censored


def baseline_check(what: str, value: float, reference: float, *, rtol: float, atol: float = 0.0) -> dict:
    """Did a baseline reach its own reference (ERM, AltMin, population optimum, stationary point)?

    ``ok`` when ``|value - reference| <= atol + rtol |reference|``. The dict goes in
    ``Evidence.baselines``; :meth:`verify.claim.Claim.run` makes the verdict inconclusive when a
    check failed, so a comparison never rests on a broken baseline.
    """
    value, reference = float(value), float(reference)
    err = abs(value - reference)
    ok = bool(np.isfinite(err) and err <= atol + rtol * abs(reference))
    return {"what": what, "value": value, "reference": reference, "rtol": float(rtol), "atol": float(atol),
            "error": err, "ok": ok}


def gated(passed: bool | None, checks: Sequence[dict]) -> bool | None:
    """``passed`` when every baseline check is ok, else None (undecided)."""
    return passed if all(c["ok"] for c in checks) else None


def relaxation(original: str, original_outcome: bool | None, *, relaxed: str,
               relaxed_outcome: bool | None, reason: str) -> dict:
    """Record of a criterion changed after a run: both criteria, both outcomes, and why.

    The verdict must follow the relaxed outcome only when ``reason`` is a derivation, not the data;
    the report shows both (``Evidence.relaxations``).
    """
    def word(o: Any) -> str:
        return "undecided" if o is None else ("passes" if o else "fails")

    return {"original": original, "original_outcome": word(original_outcome), "relaxed": relaxed,
            "relaxed_outcome": word(relaxed_outcome), "reason": reason}
