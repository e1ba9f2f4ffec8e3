r"""Program (7)'s iterates in block-affine form, ``a_g D_g + U_g V^T`` on pair-factored contrasts
(:class:`~lowrank_fl.clair.pair_contrasts.PairContrasts`): the algebra
:mod:`lowrank_fl.clair.factored` runs FISTA with, never forming a (G h × p) array.

Every FISTA iterate of (7) is ``S_g = f_g (D_g - L_g)`` with a low-rank ``L = U V^T``, so all
objects are ``diag(a) D + U V^T`` (``a`` (G,), ``U`` (G, h, m), ``V`` (p, m)). Their block norms,
inner products, products with a (p, m) basis and Grams come from the structure; the pair-level
factors ``U`` (G h m numbers, 20 MB at K = 100, m = 16) are the memory traffic, so a combination
(FISTA's extrapolated point) keeps its factors as parts and each iterate's products are
remembered or carried instead of recomputed.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .pair_contrasts import PairContrasts

__all__ = ["AffineBlocks", "zero_blocks", "combine", "left_parts", "width", "left_factor", "times",
           "left_gram", "apply_blocks", "sq_norms", "residual_sq_norms", "cross_terms", "inner",
           "gram", "dense"]


class AffineBlocks(NamedTuple):
    """``diag(a) D + U V^T`` blockwise: ``a_g D_g + U_g V^T``; a (G,), U (G, h, m), V (p, m).
    ``parts``: the bases whose concatenation is ``V`` (a combination's), so that ``D V`` is
    assembled from products :meth:`PairContrasts.apply` remembers; ``uparts``: likewise
    ``(c_i, U_i)`` with ``U = [c_1 U_1, c_2 U_2, ...]`` (``D^T diag(w) U`` from the
    ``T_g^T U_i`` that :meth:`PairContrasts.apply_t` remembers); a combination leaves ``U``
    None (never written out: :func:`left_factor` when a fallback needs it). ``UtU``: ``U^T U``
    (m × m) when known."""

    a: np.ndarray
    U: np.ndarray | None
    V: np.ndarray
    parts: tuple | None = None
    uparts: tuple | None = None
    UtU: np.ndarray | None = None


def zero_blocks(D: PairContrasts) -> AffineBlocks:
    """The zero iterate (no low-rank term)."""
    return AffineBlocks(np.zeros(D.n_pairs), np.zeros((D.n_pairs, D.q, 0)), np.zeros((D.p, 0)))


def combine(c1, X: AffineBlocks, c2, Y: AffineBlocks, YtX=None) -> AffineBlocks:
    """``c1 X + c2 Y``, its left factor kept as parts (no (G, h, m) array written); ``YtX``:
    ``Y.U^T X.U`` when known (then ``U^T U`` is assembled from the parts' Grams)."""
    UtU = None
    if YtX is not None and X.UtU is not None and Y.UtU is not None:
        UtU = np.block([[c1 * c1 * X.UtU, c1 * c2 * YtX.T], [c1 * c2 * YtX, c2 * c2 * Y.UtU]])
    return AffineBlocks(c1 * X.a + c2 * Y.a, None, np.concatenate([X.V, Y.V], axis=1),
                        _parts(X) + _parts(Y), tuple((c1 * c, u) for c, u in left_parts(X))
                        + tuple((c2 * c, u) for c, u in left_parts(Y)), UtU)


def left_parts(X: AffineBlocks) -> tuple:
    """``((c_i, U_i), ...)`` with ``U = [c_1 U_1, ...]`` (one part when ``U`` is written out)."""
    return X.uparts if X.uparts is not None else ((1.0, X.U),)


def width(X: AffineBlocks) -> int:
    """Columns of ``X``'s low-rank term."""
    return X.U.shape[2] if X.U is not None else sum(u.shape[2] for _, u in X.uparts)


def left_factor(X: AffineBlocks) -> np.ndarray:
    """``X``'s (G, h, m) left factor (written out from the parts of a combination)."""
    if X.U is not None:
        return X.U
    return np.concatenate([c * u for c, u in X.uparts], axis=2)


def left_gram(X: AffineBlocks) -> np.ndarray:
    """``U^T U`` (m × m): carried, or from the written-out factor."""
    if X.UtU is not None:
        return X.UtU
    U = left_factor(X)
    Uf = U.reshape(U.shape[0] * U.shape[1], U.shape[2])
    return Uf.T @ Uf


def times(U, M) -> np.ndarray:
    """``U_g M`` (G, h, n) for a (G, h, m) ``U`` and an (m, n) ``M``: one GEMM on the stacked
    blocks (numpy's broadcast matmul loops over the pairs: 2x slower at K = 100)."""
    G, h, m = U.shape
    return (np.ascontiguousarray(U).reshape(G * h, m) @ M).reshape(G, h, M.shape[1])


def _parts(X: AffineBlocks) -> tuple:
    return X.parts if X.parts is not None else (X.V,)


def _DV(D, X: AffineBlocks) -> np.ndarray:
    """``D_g V`` (G, h, m) for ``X``'s ``V``, part by part."""
    parts = [D.apply(P) for P in _parts(X) if P.shape[1]]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=2) if parts else \
        np.zeros((D.n_pairs, D.q, 0))


def apply_blocks(D, X: AffineBlocks, W, scale=None) -> np.ndarray:
    """``X_g W diag(scale)`` (G, h, m) for a (p, m) ``W`` (a combination part by part; the
    column scale folded into the small factors, no extra pass)."""
    sc = np.ones(W.shape[1]) if scale is None else np.asarray(scale, float)
    out = D.apply(W) * (X.a[:, None, None] * sc)
    if X.U is None:
        VtW, i = (X.V.T @ W) * sc, 0
        for c, u in X.uparts:
            if u.shape[2]:
                out += times(u, c * VtW[i:i + u.shape[2]])
            i += u.shape[2]
    elif X.U.shape[2]:
        out += times(X.U, (X.V.T @ W) * sc)
    return out


def sq_norms(D, X: AffineBlocks) -> np.ndarray:
    """``||X_g||_F^2`` (G,), clipped at 0 (the expansion cancels when a block nearly vanishes:
    absolute error ~eps ||D_g||^2)."""
    out = X.a * X.a * D.block_sq_norms
    if X.U.shape[2]:
        out = out + 2.0 * X.a * np.einsum("ghm,ghm->g", _DV(D, X), X.U)
        VtV = X.V.T @ X.V
        UV = X.U if np.allclose(VtV, np.eye(VtV.shape[0]), rtol=0, atol=1e-13) \
            else times(X.U, VtV)                                      # orthonormal V: U_g
        out = out + np.einsum("ghm,ghm->g", UV, X.U)
    return np.maximum(out, 0.0)


def residual_sq_norms(D, UL, V):
    """``||D_g - UL_g V^T||_F^2`` (G,), clipped at 0, and ``<D_g V, UL_g>`` (G,) (what the
    restart test needs of the BST step ``-f UL``)."""
    e = np.einsum("ghk,ghk->g", D.apply(V), UL) if UL.shape[2] else np.zeros(D.n_pairs)
    out = D.block_sq_norms - 2.0 * e
    if UL.shape[2]:
        VtV = V.T @ V
        UV = UL if np.allclose(VtV, np.eye(VtV.shape[0]), rtol=0, atol=1e-13) \
            else times(UL, VtV)                                       # orthonormal V: UL_g
        out = out + np.einsum("ghk,ghk->g", UV, UL)
    return np.maximum(out, 0.0), e


def cross_terms(D, X: AffineBlocks) -> np.ndarray:
    """``<U_g, D_g V>`` (G,): what :func:`inner` needs of ``X``'s pair-level factor."""
    return np.einsum("ghm,ghm->g", _DV(D, X), X.U)


def inner(D, X: AffineBlocks, Y: AffineBlocks, qX=None, qY=None, UU=None) -> float:
    """``<X, Y>`` (Frobenius, all blocks); ``qX``, ``qY``: their :func:`cross_terms` when known
    (each FISTA iterate enters three inner products), ``UU``: ``X.U^T Y.U`` when known."""
    out = float(X.a * Y.a @ D.block_sq_norms)
    if Y.U.shape[2]:
        out += float(X.a @ (cross_terms(D, Y) if qY is None else qY))
    if X.U.shape[2]:
        out += float(Y.a @ (cross_terms(D, X) if qX is None else qX))
        if Y.U.shape[2]:       # sum_g <X_U_g X_V^T, Y_U_g Y_V^T> as one product of the stacks
            if UU is None:
                UU = X.U.reshape(-1, X.U.shape[2]).T @ Y.U.reshape(-1, Y.U.shape[2])
            out += float(np.sum(UU * (X.V.T @ Y.V)))
    return out


def gram(D, X: AffineBlocks) -> np.ndarray:
    """``X^T X`` (p, p) from the structure (``D``'s own Gram, shared with
    :attr:`PairContrasts.op_norm`, when ``X = D``: a cold start's first SVT)."""
    m = width(X)
    if not m and np.all(X.a == 1.0):
        return D.gram.copy()
    C = D.weighted_gram(X.a * X.a)
    if m:
        cross = D.apply_t(left_factor(X), X.a) @ X.V.T
        C += cross + cross.T + X.V @ left_gram(X) @ X.V.T
    return C


def dense(D, X: AffineBlocks) -> np.ndarray:
    out = D.dense().reshape(D.n_pairs, D.q, D.p) * X.a[:, None, None]
    if width(X):
        out += np.matmul(left_factor(X), X.V.T)
    return out.reshape(D.shape)
