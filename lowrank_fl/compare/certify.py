"""The library's certificate of each compared program, the same formula for every method.

Each class turns a method's returned point into ``objective``, ``dual`` (a certified lower bound
on the optimum), ``gap = objective - dual`` and ``relative_gap = gap / scale``, whatever the
method claimed; and gives the top-``r`` projector of the point's low-rank part and (CLAIR
programs) the collaborative set (8) it implies.

* (7): :func:`lowrank_fl.clair.penalized_objective` and :func:`lowrank_fl.clair.duality_gap` at
  ``(L, S)``; ``scale = F(0, 0) = 1/2 sum_g w_g ||D_g||_F^2`` (the ``gap_scale`` of
  :class:`~lowrank_fl.clair.PenalizedResult`).
* nuclear-norm least squares: :func:`~lowrank_fl.exact.nuclear.nuclear_objective` and
  :func:`~lowrank_fl.exact.nuclear.nuclear_duality_gap` at ``Theta``; ``scale = P(0)``.
* (24): the primal point is made exactly feasible by ``S = D0 - L`` and the returned dual ``Q``
  by the largest ``c <= 1`` with ``||cQ||_op <= lam_L`` and ``max_g ||cQ_g||_F <= lam_S``;
  ``dual = max(0, c <Q, D0>)``; ``scale = min(lam_L ||D0||_*, lam_S sum_g ||D0_g||_F)``, the
  better of the two trivial feasible points ``(D0, 0)`` and ``(0, D0)``.

A zero scale means the instance is trivial (all contrasts zero, or ``y = 0``): the optimum is the
zero point with objective 0 and ``gap / scale`` is undefined. The certifiers refuse such data
with a ``ValueError`` (:func:`check_scale`) instead of dividing by zero or silently switching
to an absolute gap.
"""
from __future__ import annotations

import numpy as np

from ..clair import (as_blocks, collaborative_set, duality_gap, largest_gap_threshold,
                     penalized_objective)
from ..exact.nuclear import nuclear_duality_gap, nuclear_objective
from ..linalg import block_norms, nuclear_norm, spectral_norm, thin_svd

__all__ = ["ClairCertifier", "NuclearCertifier", "NoiselessCertifier", "top_projector",
           "numerical_rank", "check_scale"]


def check_scale(scale: float, data: str, why: str, optimum: str) -> float:
    """``scale`` when it is > 0; else ``ValueError`` saying the instance is trivial.

    ``data``: the argument ("W_hat"); ``why``: what makes it trivial; ``optimum``: the solution
    and objective the program then has (all shown in the message).
    """
    scale = float(scale)
    if scale > 0:
        return scale
    raise ValueError(f"{data}: {why}, so {optimum} and the relative duality gap (gap / scale) "
                     f"has scale {scale:g}: there is nothing to compare")


def top_projector(M, rank: int) -> np.ndarray:
    """Projector (p, p) onto the top-``rank`` right singular subspace of ``M`` (m, p)."""
    _, _, Vt = thin_svd(M)
    V = Vt[:rank].T
    return V @ V.T


def numerical_rank(M, reference: float, rtol: float = 1e-6) -> int:
    """Singular values of ``M`` above ``rtol * reference`` (``reference``: the data's norm)."""
    s = np.linalg.svd(np.asarray(M, dtype=float), compute_uv=False)
    return int(np.count_nonzero(s > rtol * reference))


def _trivial_contrasts(D, K) -> str:
    if not np.any(D):
        return (f"all K = {K} clients' matrices are equal (every contrast W_j - W_k is 0, e.g. "
                "an all-zero input)")
    return "the contrasts are so small that their squared norms underflow to 0"


class _Blocks:
    """Shared by the CLAIR programs: top-r projector of ``L`` and the collaborative set (8)."""

    low_rank_key = "L"

    def __init__(self, D, q, K, tau, alpha):
        self.D, self.q, self.K, self.tau, self.alpha = D, q, K, tau, alpha
        self.reference = spectral_norm(D)

    def collaborative(self, P):
        """Collaborative set (8) from ``||(D P_⊥)_g||_F`` with the comparison's τ rule:
        ``benign`` (K,) bool and the ``tau`` used."""
        norms = block_norms(as_blocks(self.D - self.D @ P, self.q))
        if isinstance(self.tau, str):
            tau = largest_gap_threshold(norms, log=(self.tau == "largest-log-gap"))
        else:
            tau = float(self.tau)
        benign, _ = collaborative_set(norms, self.K, tau, self.alpha)
        return benign, tau


class ClairCertifier(_Blocks):
    """Program (7) on ``D`` (G*q, p) with pair weights ``w`` (G,) (None: 1/K)."""

    def __init__(self, D, q, K, lam_L, lam_S, weights, *, tau="largest-gap", alpha=0.5):
        super().__init__(D, q, K, tau, alpha)
        self.lam_L, self.lam_S, self.weights = lam_L, lam_S, weights
        Z = np.zeros_like(D)
        self.scale = check_scale(penalized_objective(D, q, Z, Z, lam_L, lam_S, weights), "W_hat",
                                 _trivial_contrasts(D, K), "program (7) is solved by L = S = 0 "
                                 "with objective F(0, 0) = 0")

    def certify(self, point: dict) -> dict:
        args = (self.D, self.q, point["L"], point["S"], self.lam_L, self.lam_S, self.weights)
        obj = penalized_objective(*args)
        gap = duality_gap(*args)
        return {"objective": obj, "dual": obj - gap, "gap": gap, "relative_gap": gap / self.scale}


class NoiselessCertifier(_Blocks):
    """Program (24) on ``D0`` (G*q, p)."""

    def __init__(self, D, q, K, lam_L, lam_S, *, tau="largest-gap", alpha=0.5):
        super().__init__(D, q, K, tau, alpha)
        self.lam_L, self.lam_S = lam_L, lam_S
        self.scale = check_scale(min(lam_L * nuclear_norm(D),
                                     lam_S * float(block_norms(as_blocks(D, q)).sum())), "W",
                                 _trivial_contrasts(D, K), "program (24) is solved by L = S = 0 "
                                 "with objective 0")

    def certify(self, point: dict) -> dict:
        L = point["L"]
        S = self.D - L                                   # exactly feasible: L + S = D0
        obj = self.lam_L * nuclear_norm(L) + self.lam_S * float(
            block_norms(as_blocks(S, self.q)).sum())
        Q = point["Q"]
        bound = max(spectral_norm(Q) / self.lam_L,
                    float(block_norms(as_blocks(Q, self.q)).max()) / self.lam_S, 1.0)
        dual = max(0.0, float(np.vdot(Q, self.D)) / bound)
        return {"objective": obj, "dual": dual, "gap": obj - dual,
                "relative_gap": (obj - dual) / self.scale}


class NuclearCertifier:
    """Nuclear-norm multi-task least squares on ``X`` (n, m, d), ``y`` (n, m)."""

    low_rank_key = "Theta"

    def __init__(self, X, y, mu):
        self.X, self.y, self.mu = X, y, mu
        self.scale = check_scale(
            nuclear_objective(np.zeros((X.shape[0], X.shape[2])), X, y, mu), "y",
            "every response is 0" if not np.any(y) else "sum of y^2 underflows to 0",
            "Theta = 0 is optimal with objective P(0) = 0")
        self.reference = max(spectral_norm(np.einsum("nmd,nm->nd", X, y) / X.shape[1]),
                             np.finfo(float).tiny)

    def certify(self, point: dict) -> dict:
        T = point["Theta"]
        obj = nuclear_objective(T, self.X, self.y, self.mu)
        gap = nuclear_duality_gap(T, self.X, self.y, self.mu)
        return {"objective": obj, "dual": obj - gap, "gap": gap, "relative_gap": gap / self.scale}

    def collaborative(self, P):
        return None, None
