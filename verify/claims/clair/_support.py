"""Instances, ground-truth decompositions and small reference computations for the CLAIR claims.

Everything here follows the paper's notation: clients are stacked on the first axis
(``W`` is (K, q, p)), pairs (j, k), j < k, are in lexicographic order (eq. (6)) and block arrays
are (G, q, p) views of the (G q, p) stacks. Nothing (G q, G q) is ever formed.

The library's CLAIR modules (``lowrank_fl.clair``) do the work; the few local routines here are
independent restatements the claims compare the library with: contrasts of arbitrary stacked
arrays, (G, q, p) views of the truth (11), the vote (8) for any alpha (Remark 3's range reaches
below the library's alpha >= 1/2) and the refinement (9) written as a mean of corrected estimates.
"""
from __future__ import annotations

import numpy as np

__all__ = ["pairs", "contrasts", "truth_blocks", "majority_vote", "refine_definition", "t3"]


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
# Detection (8) and refinement (9)
# --------------------------------------------------------------------------------------------
def majority_vote(block_norm_values, K: int, tau_n: float, alpha: float) -> np.ndarray:
    """Collaborative-set estimate (8): k kept iff a fraction >= alpha of its K-1 blocks are <= tau_n.

    ``block_norm_values`` is (G,) (||Shat_{A⊥}^(g)||_F in pair order). Returns (K,) bool.
    """
    j, k = pairs(K)
    small = np.asarray(block_norm_values) <= tau_n
    votes = np.bincount(j, weights=small, minlength=K) + np.bincount(k, weights=small, minlength=K)
    return votes / (K - 1) >= alpha


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


def t3(n: int) -> float:
    """Student-t multiplier with the two-sided level of 3 standard errors (99.73%) for n replicates."""
    from scipy import stats

    return float(stats.t.isf(stats.norm.sf(3.0), max(n - 1, 1)))
