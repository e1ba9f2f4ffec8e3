"""Automatic, scale-equivariant choice of ``λ_L, λ_S`` for program (7) on one module.

§7 uses ``λ_L = c1 K^{-1/2}``, ``λ_S = c2 K^{-3/2}`` on data of a fixed scale and does not report
``c1, c2``. Program (7) is homogeneous of degree 2 in ``(D̂, λ_L, λ_S)``: multiplying every
adapter by ``c`` multiplies the optimal ``(L̂, Ŝ)`` by ``c`` when both λ are multiplied by ``c``,
so ``P_Â``, the block norms' ordering, the largest-gap ``τ`` and the benign sets do not change.
The rule here therefore measures λ in units of the data:

* ``λ_L = c1 K^{-1/2} ŝ`` with ``ŝ = median_g ||D̂_g||_F / sqrt(2 r)`` (``r`` the target rank;
  a typical pair contrast spread over its ``2r``-dimensional support; the median over the pairs
  whose contrast is not exactly zero: two clients with the same update, or two untrained ones,
  carry no scale) and ``c1 = 1``;
* ``λ_S / λ_L`` from the rank-band rule of the Table 1 reproduction: scan ratios ``c2/(c1 K)``,
  ``c2`` on 5 log-spaced points of [1, 12] (warm-started solves at a loose tolerance), and take the
  geometric midpoint of the longest run of ratios where ``rank(L̂) = r`` (numerical rank
  relative to ``||D̂||_op``). Without such a run, ``λ_L`` is halved (up to three times, the
  signal is then below the nuclear threshold); failing that, the smallest ratio with
  ``rank(L̂) >= r`` (else the largest ratio) is used and the rule is reported as ``"fallback"``.

Everything is computed from ``D̂`` only, so the reduced and the full-dimension problems get the
same λ (block norms and singular values are invariant under the reduction).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .. import clair
from ..clair.factored import PairContrasts, solve_penalized_factored
from ..clair.pipeline import longest_run

__all__ = ["Lambdas", "auto_lambdas", "data_scale", "solve_module", "warm_start"]

# the path only decides ranks (singular values exactly zeroed by the SVT or not): 1e-3 picks the
# same λ as 1e-4 on every module checked (12 synthetic modules, K = 6..20, r = 4..16, 1-3
# contaminated) for about 20 % less tuning time; the final solve keeps the requested tol
_PATH_TOL = 1e-3


@dataclass(frozen=True)
class Lambdas:
    lam_L: float
    lam_S: float
    rule: str          # "band", "fallback", or "given"
    band: tuple | None  # (low, high) ratio band, None without one
    # the path solve nearest to the chosen ratio, as the final solve's ``init``: (L, S) for a
    # dense D̂, the FactoredResult itself for PairContrasts
    warm: object = None


def data_scale(D, q: int, rank: int) -> float:
    """``ŝ = median_g ||D̂_g||_F / sqrt(2 r)`` for a stacked (G*q, p) ``D̂`` (or
    :class:`~lowrank_fl.clair.factored.PairContrasts`), over the blocks that are not exactly zero
    (0 when all are)."""
    if isinstance(D, PairContrasts):
        sq = D.block_sq_norms
    else:
        B = D.reshape(-1, q, D.shape[1])
        sq = np.einsum("gij,gij->g", B, B)
    sq = sq[sq > 0]
    return float(np.median(np.sqrt(sq))) / np.sqrt(2.0 * rank) if sq.size else 0.0


def solve_module(D, q: int, lam_L: float, lam_S: float, *, weights, tol: float, max_iter: int,
                 init=None):
    """One solve of (7) on a module's contrasts: FISTA on the dense (G*q, p) ``D̂``, or the
    factored solver on :class:`~lowrank_fl.clair.factored.PairContrasts` (equal weights).
    ``init``: a previous solve's :attr:`Lambdas.warm`-style warm start, or None."""
    if isinstance(D, PairContrasts):
        w = None if weights is None else np.broadcast_to(np.asarray(weights, float),
                                                         (D.n_pairs,))
        if w is not None and not np.all(w == w[0]):
            raise ValueError("the factored solver needs equal pair weights; use dense contrasts")
        return solve_penalized_factored(D, lam_L, lam_S, weight=None if w is None else float(w[0]),
                                        tol=tol,
                                        max_iter=max_iter, init=init)
    return clair.solve_penalized(D, q=q, lam_L=lam_L, lam_S=lam_S, weights=weights, tol=tol,
                                 max_iter=max_iter, init=init)


def warm_start(D, sol):
    """What :func:`solve_module` takes as ``init`` from a solve ``sol`` on the same ``D``."""
    return sol if isinstance(D, PairContrasts) else (sol.L, sol.S)


def _num_rank(sol, D_op):
    return int(np.count_nonzero(sol.singular_values > 1e-6 * D_op))


def auto_lambdas(D, q: int, n_clients: int, rank: int, *, weights=None, n_ratios: int = 5,
                 max_iter: int = 2000) -> Lambdas:
    """λ for a stacked (G*q, p) ``D̂`` (or :class:`~lowrank_fl.clair.factored.PairContrasts`)
    of ``n_clients`` clients and target ``rank`` (module docstring). Deterministic; one
    warm-started path of ``n_ratios`` solves per ``λ_L`` tried."""
    K = n_clients
    s = data_scale(D, q, rank)
    if s <= 0:
        return Lambdas(lam_L=1.0, lam_S=1.0, rule="fallback", band=None)
    D_op = None
    ratios = np.geomspace(1.0, 12.0, n_ratios) / K
    lam_L = K ** -0.5 * s
    last = None
    for _ in range(4):
        ranks, prev, sols = [], None, []
        for ratio in ratios:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sol = solve_module(D, q, lam_L, ratio * lam_L, weights=weights,
                                   tol=_PATH_TOL, max_iter=max_iter, init=prev)
            prev = warm_start(D, sol)
            sols.append(prev)
            if D_op is None:        # ||D||_op, as the solver computed it (clair.fit's reference)
                D_op = getattr(sol, "data_norm", None)
                D_op = float(np.linalg.norm(D, 2)) if D_op is None else float(D_op)
            ranks.append(_num_rank(sol, D_op))
        ranks = np.array(ranks)
        band = longest_run(ratios, ranks == rank)
        if band is not None:
            ratio = float(np.sqrt(band[0] * band[1]))
            near = int(np.argmin(np.abs(np.log(ratios / ratio))))
            return Lambdas(lam_L=lam_L, lam_S=ratio * lam_L, rule="band", band=band,
                           warm=sols[near])
        last = (lam_L, ranks, sols)
        if ranks.max() > rank:      # rank already overshoots: halving λ_L would not help
            break
        lam_L /= 2
    lam_L, ranks, sols = last
    above = np.flatnonzero(ranks >= rank)
    i = int(above[0]) if above.size else len(ratios) - 1
    return Lambdas(lam_L=lam_L, lam_S=float(ratios[i]) * lam_L, rule="fallback", band=None,
                   warm=sols[i])
