"""Instance builders and the verdict, fit and plotting helpers shared by the FedRep claim modules.

Every experiment uses the multi-task linear model with Assumption 3 heads (``||w_i*|| = sqrt(k)``)
and x ~ N(0, I_d). The two-sided band and all-of criteria here are the FedRep copies of helpers
other papers also define; one cross-paper module will replace them.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from verify.stats import interval_verdict

__all__ = ["PAPER", "rngs", "sigmas2", "rounds_to", "linear_phase_fit", "warm_start", "band", "all_of",
           "pyplot"]

PAPER = "fedrep"


def rngs(seed, count=2):
    """Independent generators for the instance and the run, from one task seed."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def sigmas2(W):
    """``(sigma_min^2, sigma_max^2)`` of ``W / sqrt(n)`` for heads W (n, k) (exact sigma-bar for r = 1)."""
    s = np.linalg.svd(W / math.sqrt(W.shape[0]), compute_uv=False)
    return float(s[-1] ** 2), float(s[0] ** 2)


def rounds_to(dist, eps):
    """First round with ``dist <= eps`` (``len(dist)`` = censored when never reached)."""
    hit = np.nonzero(np.asarray(dist) <= eps)[0]
    return int(hit[0]) if hit.size else len(dist)


def linear_phase_fit(dist, *, floor=1e-12, start=3):
    """Semilog fit of ``dist_t`` over ``start..T1`` (``T1`` the last round above ``floor``).

    Returns ``(rho_hat, r2, monotone_fraction, T1)``; ``rho_hat = exp(slope)``."""
    d = np.asarray(dist, dtype=float)
    ok = np.nonzero(np.isfinite(d) & (d > floor))[0]
    T1 = int(ok[-1]) if ok.size else 0
    if T1 - start < 3:
        return float("nan"), float("nan"), float("nan"), T1
    t = np.arange(start, T1 + 1)
    y = np.log(d[start:T1 + 1])
    res = stats.linregress(t, y)
    mono = float(np.mean(np.diff(np.log(d[:T1 + 1])) < 0))
    return float(np.exp(res.slope)), float(res.rvalue ** 2), mono, T1


def warm_start(B_star, E0, rng):
    """``B0 = sqrt(E0) B* + sqrt(1-E0) G_perp`` (d, k) orthonormal, with ``1 - dist^2(B0, B*) = E0``
    exactly."""
    d, k = B_star.shape
    G = rng.standard_normal((d, k))
    G -= B_star @ (B_star.T @ G)
    G = np.linalg.qr(G)[0]
    return math.sqrt(E0) * B_star + math.sqrt(1 - E0) * G


def band(fit, lo, hi):
    """Two-sided criterion ``lo <= slope <= hi`` on a fit's interval: True inside, False entirely
    outside, None (inconclusive) when the interval straddles an edge or is undefined."""
    below = interval_verdict(fit.low, fit.high, hi, side="below")
    above = interval_verdict(fit.low, fit.high, lo, side="above")
    if False in (below, above):
        return False
    return None if None in (below, above) else True


def all_of(*flags):
    """False if any flag is False, None if any is undecided, else True."""
    return False if False in flags else (None if None in flags else True)


def pyplot():
    """:mod:`matplotlib.pyplot`, imported on use (the report code chooses the backend)."""
    import matplotlib.pyplot as plt

    return plt
