"""Instances, ground-truth decompositions and small reference computations for the CLAIR claims.

Everything here follows the paper's notation (notes 003): clients are stacked on the first axis
(``W`` is (K, q, p)), pairs (j, k), j < k, are in lexicographic order (eq. (6)) and block arrays
are (G, q, p) views of the (G q, p) stacks. Nothing (G q, G q) is ever formed.

The library's CLAIR modules (``lowrank_fl.clair``) are used where they exist; the few local
routines here are the small closed forms a verifier needs to state its predictions (the §7 design,
the truth decomposition (11), Block-IC μ, window (25), the majority vote (8), refinement (9)).
"""
from __future__ import annotations

import numpy as np

from lowrank_fl.linalg import block_norms

__all__ = [
    "pairs", "contrasts", "truth_blocks", "block_mu",
    "theorem1_window", "majority_vote", "largest_gap_threshold", "refine_definition",
    "refine_closed_form", "top_r_projector", "numerical_rank",
]


# --------------------------------------------------------------------------------------------
# Pairs and contrasts (eqs. (5)-(6))
# --------------------------------------------------------------------------------------------
def pairs(K: int):
    """Index arrays ``(j, k)`` of the G = K(K-1)/2 pairs j < k in the lexicographic order of (6)."""
    return np.triu_indices(K, 1)


def contrasts(W) -> np.ndarray:
    """Stacked pairwise contrasts ``W[j] - W[k]`` for j < k, eq. (5): (K, q, p) → (G, q, p)."""
    W = np.asarray(W, dtype=float)
    j, k = pairs(W.shape[0])
    return W[j] - W[k]


# --------------------------------------------------------------------------------------------
# Truth views of a library instance
# --------------------------------------------------------------------------------------------
def truth_blocks(inst) -> dict:
    """(G, q, p) block views of a :class:`lowrank_fl.clair.simulate.ClairInstance`'s truth.

    Returns ``D``, ``D_hat``, ``L0``, ``S0``, ``E0``, ``E1`` (estimation-error contrasts), ``D0``
    (all (G,q,p)), ``I`` (G,) bool and the ints ``s``, ``G``.
    """
    G, q, p = inst.G, inst.q, inst.p
    view = lambda M: np.asarray(M).reshape(G, q, p)  # noqa: E731
    return {"D": view(inst.D), "D_hat": view(inst.D_hat), "L0": view(inst.L0),
            "S0": view(inst.S0), "E0": view(inst.E0), "E1": contrasts(inst.errors),
            "D0": view(inst.D0), "I": np.asarray(inst.I), "s": inst.s, "G": G}


# --------------------------------------------------------------------------------------------
# Theorem 1 constants
# --------------------------------------------------------------------------------------------
def block_mu(L0, r: int) -> tuple[float, np.ndarray]:
    """Block-IC constant μ of Assumption 2 for the left factor U of rank-r ``L0`` (G,q,p).

    μ = (G / r) max_g ||U^(g)||_F^2 (block leverage). Returns (μ, leverages (G,)).
    """
    G, q, p = L0.shape
    U = np.linalg.svd(L0.reshape(G * q, p), full_matrices=False)[0][:, :r]
    lev = np.einsum("gij,gij->g", U.reshape(G, q, r), U.reshape(G, q, r))
    return float(G * lev.max() / r), lev


def theorem1_window(mu, r, s, G, a=0.99, b=0.99) -> tuple[float, float, float, bool]:
    """Theorem 1: x = sqrt(μ r s / G) and window (25) for λ_S/λ_L.

    Returns ``(x, low, high, nonempty)``; the window is non-empty iff x < ab/(1+a)^2.
    """
    x = float(np.sqrt(mu * r * s / G))
    den = b - (1 + a) * x
    low = float(np.sqrt(mu * r / G) / den) if den > 0 else np.inf
    high = float(a / ((1 + a) * np.sqrt(s))) if s > 0 else np.inf
    return x, low, high, bool(x < a * b / (1 + a) ** 2 and low < high)


# --------------------------------------------------------------------------------------------
# Detection (8) and refinement (9)
# --------------------------------------------------------------------------------------------
def majority_vote(block_norm_values, K: int, tau_n: float, alpha: float) -> np.ndarray:
    """Collaborative-set estimate (8): k kept iff a fraction >= alpha of its K-1 blocks are <= tau_n.

    ``block_norm_values`` is (G,) (||Shat_{A⊥}^(g)||_F in pair order). Returns (K,) bool.
    """
    j, k = pairs(K)
    small = np.asarray(block_norm_values) <= tau_n
    votes = np.bincount(j, weights=small, minlength=K) + np.bincount(k, weights=small, minlength=K)
    return votes / (K - 1) >= alpha - 1e-12


def largest_gap_threshold(values) -> float:
    """Midpoint of the largest gap between consecutive sorted values (the §7 "largest gap" rule).

    Computed on log scale when all values are positive (block norms span orders of magnitude).
    """
    v = np.sort(np.asarray(values, dtype=float))
    t = np.log(v) if np.all(v > 0) else v
    i = int(np.argmax(np.diff(t)))
    mid = 0.5 * (t[i] + t[i + 1])
    return float(np.exp(mid)) if np.all(v > 0) else float(mid)


def refine_definition(W_hat, P, keep) -> np.ndarray:
    """Refinement (9) by its definition: mean over j in Chat of (W_hat^(j) - Lhat_A^{(j,k)}).

    ``Lhat_A^{(j,k)} = (W_hat^(j) - W_hat^(k)) P`` (antisymmetric). Returns (K,q,p); clients not in
    ``keep`` keep their local estimate (the §7 convention).
    """
    W_hat = np.asarray(W_hat, dtype=float)
    kept = W_hat[keep]
    diff = kept[:, None] - W_hat[None]                    # (|Chat|, K, q, p): W^(j) - W^(k)
    out = (kept[:, None] - diff @ P).mean(axis=0)
    return np.where(np.asarray(keep)[:, None, None], out, W_hat)


def refine_closed_form(W_hat, P, keep) -> np.ndarray:
    """Closed form (S4.3): W_hat^(k) P + mean_{j in Chat} W_hat^(j) (I - P) for k in Chat."""
    W_hat = np.asarray(W_hat, dtype=float)
    Wbar = W_hat[keep].mean(axis=0)
    out = W_hat @ P + Wbar @ (np.eye(P.shape[0]) - P)
    return np.where(np.asarray(keep)[:, None, None], out, W_hat)


def top_r_projector(L, r: int) -> np.ndarray:
    """Projector onto the top-r right singular subspace of L ((G,q,p) or (Gq,p)) → (p,p)."""
    L = np.asarray(L, dtype=float)
    Vt = np.linalg.svd(L.reshape(-1, L.shape[-1]), full_matrices=False)[2][:r]
    return Vt.T @ Vt


def numerical_rank(L, scale: float, rel: float = 1e-6) -> int:
    """Number of singular values of L above ``rel * scale`` (absolute scale, notes §7.7)."""
    L = np.asarray(L, dtype=float)
    s = np.linalg.svd(L.reshape(-1, L.shape[-1]), compute_uv=False)
    return int(np.sum(s > rel * scale))


def blocks_norm(M) -> np.ndarray:
    """Alias of :func:`lowrank_fl.linalg.block_norms` for (G,q,p) arrays."""
    return block_norms(M)
