"""Theorem 1 (and Theorem 2, Assumptions 1-3) of FedRep evaluated on an instance.

Quantities (Sec. 4, Theorem 1): ``E0 = 1 - dist^2(B^0, B*)``; ``sigma_min*``, ``sigma_max*`` the extreme
singular values of ``W*_I / sqrt(rn)`` over all client subsets ``|I| = rn`` (exact for ``r = 1``,
brute force for ``C(n, rn) <= max_subsets``, otherwise only bracketed: reported with
``holds=None``); ``kappa``; the step bound ``eta <= 1/(4 sigma_max*^2)``; the two terms of the sample
requirement ``m >= c (kappa^4 k^2 d/(E0^2 rn) + kappa^4 k^3 log(rn)/E0^2)`` (``c`` is an unspecified
absolute constant, so only the bracket is reported); the guaranteed per-round factor
``sqrt(1 - eta E0 sigma_min*^2 / 2)`` (eq. (10)).
"""
from __future__ import annotations

import itertools
import math
from typing import Mapping

import numpy as np

from lowrank_fl.algorithms.fedrep import n_participants
from lowrank_fl.exact.multitask import method_of_moments
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.multitask import multitask_linear
from lowrank_fl.validation import check_int

from . import Condition

__all__ = ["generate", "evaluate", "subset_sigmas", "guaranteed_rate"]


def subset_sigmas(W, c: int, *, max_subsets: int = 20000):
    """``(sigma_min*, sigma_max*, exact)`` of ``W_I / sqrt(c)`` over all ``|I| = c`` row subsets.

    ``exact`` is False when there are more than ``max_subsets`` subsets; then the values are those
    of the full ``W / sqrt(n)`` (a heuristic bracket: ``sigma_min* <=`` and ``sigma_max* >=`` them).
    """
    W = np.asarray(W, dtype=float)
    n = W.shape[0]
    if c == n:
        s = np.linalg.svd(W / math.sqrt(n), compute_uv=False)
        return float(s[-1]), float(s[0]), True
    if math.comb(n, c) > max_subsets:
        s = np.linalg.svd(W / math.sqrt(n), compute_uv=False)
        return float(s[-1]), float(s[0]), False
    idx = np.array(list(itertools.combinations(range(n), c)))
    s = np.linalg.svd(W[idx] / math.sqrt(c), compute_uv=False)   # batched over subsets
    return float(s[:, -1].min()), float(s[:, 0].max()), True


def guaranteed_rate(eta: float, E0: float, sigma_min: float) -> float:
    """Theorem 1's per-round factor ``sqrt(1 - eta E0 sigma_min*^2 / 2)`` (eq. (10): the rate is a square root per round)."""
    return math.sqrt(max(0.0, 1.0 - eta * E0 * sigma_min ** 2 / 2))


def generate(seed=0, *, d: int = 50, k: int = 2, n: int = 100, m: int = 10, r: float = 1.0,
             eta: float | None = None, heads="normalized") -> dict:
    """A FedRep instance: truth, MoM initialization from a batch of ``m`` samples per client.

    ``eta`` defaults to ``1/(4 sigma_max*^2)`` (full-W value). Sizes are checked under the
    theorem's names, the ones ``--param`` uses."""
    d, k, n, m = (check_int(v, name, minimum=1) for v, name in ((d, "d"), (k, "k"), (n, "n"), (m, "m")))
    p = multitask_linear(d=d, rank=k, n_clients=n, heads=heads, seed=seed)
    B0 = method_of_moments(*p.sample(m, seed=np.random.default_rng(seed).integers(2**31)), k)
    if eta is None:
        eta = 1.0 / (4 * np.linalg.norm(p.heads / math.sqrt(n), 2) ** 2)
    return {"B_star": p.B_star, "heads": p.heads, "B0": B0, "m": m, "r": r, "eta": float(eta)}


def evaluate(instance: Mapping) -> list[Condition]:
    """Assumptions 2-3 and Theorem 1's constants, step bound, sample bracket and rate."""
    B_star = np.asarray(instance["B_star"], dtype=float)
    W = np.asarray(instance["heads"], dtype=float)
    B0 = np.asarray(instance["B0"], dtype=float)
    m, r, eta = int(instance["m"]), float(instance["r"]), float(instance["eta"])
    d, k = B_star.shape
    n = W.shape[0]
    c = n_participants(r, n)
    out = []
    ortho = float(np.max(np.abs(B_star.T @ B_star - np.eye(k))))
    norms = np.linalg.norm(W, axis=1)
    out.append(Condition("Assumption 3", "B* orthonormal (max |B*^T B* - I|)", ortho, "<= 1e-10",
                         ortho <= 1e-10))
    dev = float(np.max(np.abs(norms - math.sqrt(k))))
    out.append(Condition("Assumption 3", "max | ||w_i*|| - sqrt(k) |", dev, "<= 1e-10 (relaxable to O(sqrt k))",
                         dev <= 1e-10))
    out.append(Condition("Assumption 2", "clients per round rn", c, f">= k = {k}", c >= k,
                         note="" if abs(r * n - round(r * n)) < 1e-9 else "rn is not an integer; rounded"))
    smin, smax, exact = subset_sigmas(W, c)
    note = "" if exact else "too many subsets: full-W values shown (sigma_min* <= this, sigma_max* >= this)"
    out.append(Condition("Assumption 2", "sigma_min*", smin, "> 0", (smin > 1e-12) if exact else None, note))
    out.append(Condition("Theorem 1", "sigma_max*", smax, "<= sqrt(k) under Assumption 3", None, note))
    kappa = smax / smin if smin > 0 else math.inf
    out.append(Condition("Theorem 1", "kappa", kappa, ">= 1", None, note))
    dist0 = subspace_distance(B_star, B0)
    E0 = 1.0 - dist0 ** 2
    out.append(Condition("Theorem 1", "dist(B0, B*)", dist0, "< 1", dist0 < 1))
    out.append(Condition("Theorem 1", "E0 = 1 - dist^2(B0, B*)", E0, "> 0 (bounded away from 0)", E0 > 0))
    bound = 1.0 / (4 * smax ** 2)
    out.append(Condition("Theorem 1", "step size eta", eta, f"<= 1/(4 sigma_max*^2) = {bound:.4g}",
                         (eta <= bound) if exact else None, note))
    if E0 > 0 and np.isfinite(kappa):
        t1 = kappa ** 4 * k ** 2 * d / (E0 ** 2 * c)
        t2 = kappa ** 4 * k ** 3 * math.log(max(c, 2)) / E0 ** 2
        out.append(Condition("Theorem 1", "m / (kappa^4 k^2 d/(E0^2 rn) + kappa^4 k^3 log(rn)/E0^2)",
                             m / (t1 + t2), ">= c (absolute constant, unspecified)", None,
                             f"d/(rn) term {t1:.3g}, log term {t2:.3g}"))
        rho = guaranteed_rate(eta, E0, smin)
        out.append(Condition("Theorem 1", "guaranteed per-round factor sqrt(1 - eta E0 sigma_min*^2/2)",
                             rho, "< 1", rho < 1))
    fresh = k * (d + n - k)
    out.append(Condition("identifiability", "n m / (k (d + n - k))", n * m / fresh,
                         ">= 1 (fixed-dataset regime)", n * m >= fresh))
    return out
