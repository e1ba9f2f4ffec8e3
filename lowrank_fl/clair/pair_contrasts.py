"""Program (7)'s stacked contrasts in pair-factored form, ``D_g = T_g [X_j; X_k]`` (eq. (6) order
of the pairs): products, block norms and Grams from the structure, never the (G h × p) ``D``
(:mod:`lowrank_fl.clair.factored` solves (7) on them; :func:`lowrank_fl.adapters.reduce.pair_factors`
builds them from LoRA adapters)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.linalg.blas
import scipy.sparse

from ..validation import as_float_array
from .contrasts import pairs
from .program7 import top_eigenvalue

__all__ = ["PairContrasts"]

# what PairContrasts.apply remembers (bytes)
_MEMO_BYTES = 256 * 2**20
# what PairContrasts.apply_t remembers of its pair-level products (bytes)
_MEMO_T_BYTES = 128 * 2**20


@dataclass(frozen=True, eq=False)
class PairContrasts:
    """Stacked contrasts of eq. (6) in pair-factored form: block ``g = (j, k)`` (pairs in
    eq. (6) order) is ``D_g = T_g [X_j; X_k]``.

    Attributes
    ----------
    T : ndarray, shape (G, h, 2 r)
        Per-pair left factors (``G = K(K-1)/2``).
    X : ndarray, shape (K, r, p)
        Per-client coordinates.
    """

    T: np.ndarray
    X: np.ndarray

    def __post_init__(self):
        T = as_float_array(self.T, "T", ndim=3)
        X = as_float_array(self.X, "X", ndim=3)
        K, r, _ = X.shape
        G = K * (K - 1) // 2
        if K < 2 or T.shape[0] != G or T.shape[2] != 2 * r:
            raise ValueError(f"T must have shape (K(K-1)/2, h, 2r) = ({G}, h, {2 * r}) for X of "
                             f"shape {X.shape} (K, r, p), got {T.shape}")
        object.__setattr__(self, "T", T)
        object.__setattr__(self, "X", X)

    # sizes
    @property
    def n_clients(self) -> int:
        return self.X.shape[0]

    @property
    def n_pairs(self) -> int:
        return self.T.shape[0]

    @property
    def q(self) -> int:
        """Block height ``h``."""
        return self.T.shape[1]

    @property
    def p(self) -> int:
        return self.X.shape[2]

    @property
    def shape(self) -> tuple[int, int]:
        """Shape (G h, p) of the stacked ``D``."""
        return self.n_pairs * self.q, self.p

    # cached structure
    @cached_property
    def pairs(self) -> np.ndarray:
        return pairs(self.n_clients)

    @cached_property
    def _selector(self):
        """Sparse (K, 2G) 0/1 matrix summing per-pair rows over the pairs' members: column
        ``2g`` is pair ``g``'s first member, ``2g + 1`` its second (the row order of a (G, 2, ...)
        array reshaped to (2G, ...), so a pair-level product is summed without copying halves)."""
        K, G = self.n_clients, self.n_pairs
        return scipy.sparse.csr_matrix(
            (np.ones(2 * G), (self.pairs.reshape(-1), np.arange(2 * G))), shape=(K, 2 * G))

    def _weighted_selector(self, w):
        """:attr:`_selector` with pair ``g``'s two columns weighted by ``w_g`` (a (G,) weight
        folded into the sum instead of a pass over the pair-level array)."""
        E = self._selector
        return scipy.sparse.csr_matrix((np.repeat(np.asarray(w, float), 2)[E.indices], E.indices,
                                        E.indptr), shape=E.shape)

    @cached_property
    def _TtT(self) -> np.ndarray:
        return np.matmul(self.T.transpose(0, 2, 1), self.T)             # (G, 2r, 2r)

    @cached_property
    def _Tt(self) -> np.ndarray:
        """``T_g^T`` (G, 2r, h), contiguous (a batched product with it is ~1.4x faster than
        with the transposed view)."""
        return np.ascontiguousarray(self.T.transpose(0, 2, 1))

    @cached_property
    def _gram_blocks(self):
        """``T_g^T T_g``'s blocks, contiguous: the off-diagonal (G, r, r) and the two diagonal
        ones as (2G, r r) in :attr:`_selector`'s row order."""
        r = self.X.shape[1]
        C = self._TtT
        diag = np.stack([C[:, :r, :r], C[:, r:, r:]], axis=1).reshape(2 * self.n_pairs, r * r)
        return np.ascontiguousarray(C[:, :r, r:]), diag

    @cached_property
    def client_products(self) -> np.ndarray:
        """``X X^T`` (K r, K r) of the stacked client coordinates."""
        Xs = self.X.reshape(-1, self.p)
        return Xs @ Xs.T

    @cached_property
    def _lower(self):
        """The stacked (K r, p) ``X`` in Fortran order when it is square and lower triangular
        (the reduction's CholeskyQR2 coordinates), else None: its products then take half the
        flops (BLAS ``trmm``, ~1.6x faster at K r = p = 1600)."""
        Xs = self.X.reshape(-1, self.p)
        if Xs.shape[0] != Xs.shape[1] or Xs.shape[0] < 64 or np.triu(Xs, 1).any():
            return None
        return np.asfortranarray(Xs)

    def x_product(self, W) -> np.ndarray:
        """``X W`` (K r, m) of the stacked client coordinates and a (p, m) ``W``."""
        return self._product(W, transpose=False)

    def xt_product(self, Y) -> np.ndarray:
        """``X^T Y`` (p, m) of the stacked client coordinates and a (K r, m) ``Y``."""
        return self._product(Y, transpose=True)

    def _product(self, W, transpose: bool) -> np.ndarray:
        """``X W`` or ``X^T W``: through the base's products for projected contrasts, by BLAS
        triangular products where ``X`` is lower triangular, else dense."""
        proj = self.__dict__.get("_projection")
        if proj is not None and W.shape[1]:
            base, V, F, XV = proj
            if transpose:
                return base.xt_product(W) - V @ (F[:, None] * (XV.T @ W))
            return base.x_product(W) - XV @ (F[:, None] * (V.T @ W))
        L = self._lower
        if L is None or not W.shape[1]:
            X = self.X.reshape(-1, self.p)
            return (X.T if transpose else X) @ W
        if W.shape[1] == 1:                 # trmv: 2.4x faster than gemv, trmm's 3.5x
            return scipy.linalg.blas.dtrmv(L, W[:, 0], lower=1, trans=int(transpose))[:, None]
        return scipy.linalg.blas.dtrmm(1.0, L, W, lower=1, trans_a=int(transpose))

    @cached_property
    def block_sq_norms(self) -> np.ndarray:
        """``||D_g||_F^2`` (G,), as ``tr(T_g^T T_g Z_g Z_g^T)`` with ``Z_g = [X_j; X_k]``: the
        two diagonal blocks' products plus twice the off-diagonal one's (both factors are
        symmetric), from :attr:`_gram_blocks` and the clients' (K r × K r) products."""
        K, r, p = self.X.shape
        G = self.n_pairs
        XX = self.client_products.reshape(K, r, K, r)
        ar = np.arange(K)
        off, diag = self._gram_blocks
        XXd = XX[ar, :, ar, :].reshape(K, r * r)[self.pairs.reshape(-1)]           # (2G, r r)
        d = np.einsum("gi,gi->g", diag.reshape(G, 2 * r * r), XXd.reshape(G, 2 * r * r))
        o = np.einsum("gab,gab->g", off, XX[self.pairs[:, 0], :, self.pairs[:, 1], :])
        return np.maximum(d + 2.0 * o, 0.0)

    @cached_property
    def gram(self) -> np.ndarray:
        """``D^T D`` (p, p) from the structure, read-only (kept: a cold start's first SVT and
        :attr:`op_norm` both need it)."""
        out = self.weighted_gram(np.ones(self.n_pairs))
        out.flags.writeable = False
        return out

    @cached_property
    def op_norm(self) -> float:
        """``||D||_op`` (from the structured Gram)."""
        return float(np.sqrt(top_eigenvalue(self.gram)))

    def projected(self, V, F) -> "PairContrasts":
        """The contrasts ``D N``, ``N = I - V diag(F) V^T`` for an orthonormal (p, k) ``V``: the
        clients' coordinates ``X_k N``; their products ``X N² X^T = X X^T - (X V) diag(2F - F²)
        (X V)^T`` are updated in ``O((K r)^2 k)`` rather than recomputed (``O((K r)^2 p)``), and
        their products with a (p, m) ``W`` are ``X W - (X V) diag(F) V^T W`` (``X``'s triangular
        products when it has them)."""
        V, F = np.asarray(V, float), np.asarray(F, float)
        XVs = self.x_product(V)                                         # (K r, k)
        XN = (XVs * F) @ V.T
        np.subtract(self.X.reshape(XN.shape), XN, out=XN)
        out = object.__new__(PairContrasts)         # T and X = self's checked ones, projected
        object.__setattr__(out, "T", self.T)
        object.__setattr__(out, "X", XN.reshape(self.X.shape))
        out.__dict__["client_products"] = self.client_products - (XVs * (2.0 * F - F * F)) @ XVs.T
        out.__dict__["_lower"] = None                                   # X N is full
        out.__dict__["_projection"] = (self, V, F, XVs)
        for name in ("pairs", "_selector", "_TtT", "_Tt", "_gram_blocks"):  # T and K only
            out.__dict__[name] = getattr(self, name)
        return out

    # products
    def apply(self, W) -> np.ndarray:
        """``D_g W`` for every block: (G, h, m) for a (p, m) ``W``, read-only.

        Solvers multiply by the same basis several times per iteration: the last few products
        are remembered (about 256 MB at most), keyed by ``W``'s identity, shape and two sums (a
        ``W`` changed in place is recomputed), and returned read-only (never changed under a
        later caller)."""
        W = np.asarray(W)
        key = (id(W), W.shape, float(W.sum()), float(np.vdot(W, W)))
        memo = self.__dict__.setdefault("_apply_memo", {})
        hit = memo.get(key)
        if hit is not None and hit[0] is W:
            return hit[1]
        XW = self.x_product(W).reshape(self.X.shape[:2] + (W.shape[1],))   # (K, r, m)
        j, k = self.pairs[:, 0], self.pairs[:, 1]
        r = XW.shape[1]
        Z = np.empty((self.n_pairs, 2 * r, XW.shape[2]))      # [X_j W; X_k W], no concatenation
        Z[:, :r] = XW[j]
        Z[:, r:] = XW[k]
        out = np.matmul(self.T, Z)
        out.flags.writeable = False
        while memo and sum(v[1].nbytes for v in memo.values()) + out.nbytes > _MEMO_BYTES:
            memo.pop(next(iter(memo)))
        if out.nbytes <= _MEMO_BYTES:
            memo[key] = (W, out)
        return out

    def apply_t(self, U, weights=None, remember: bool = False) -> np.ndarray:
        """``D^T diag(w) U = sum_g w_g D_g^T U_g`` (p, m) for a (G, h, m) ``U`` (``w`` (G,),
        default ones; folded into the per-client sums).

        ``remember``: keep the pair-level product ``T_g^T U_g`` of this ``U`` (the last few,
        about 128 MB at most, keyed by identity; ``U`` must not change in place): a solver's
        iterate enters the operators of two SVTs with different weights."""
        K, r, p = self.X.shape
        G, m = self.n_pairs, U.shape[2]
        memo = self.__dict__.setdefault("_apply_t_memo", {}) if remember else None
        hit = None if memo is None else memo.get(id(U))
        if hit is not None and hit[0] is U:
            Y = hit[1]
        else:
            Y = np.matmul(self._Tt, U).reshape(2 * G, r * m)            # T_g^T U_g halves
            if memo is not None and Y.nbytes <= _MEMO_T_BYTES:
                while memo and sum(v[1].nbytes for v in memo.values()) + Y.nbytes > _MEMO_T_BYTES:
                    memo.pop(next(iter(memo)))
                memo[id(U)] = (U, Y)
        E = self._selector if weights is None else self._weighted_selector(weights)
        return self.xt_product(np.asarray(E @ Y).reshape(K * r, m))

    def client_gram(self, a2) -> np.ndarray:
        """``H = sum_g a2_g E_g^T T_g^T T_g E_g`` (K r, K r), ``E_g`` selecting ``[X_j; X_k]``
        from the stacked clients: ``D^T diag(a2) D = X^T H X`` (``X`` (K r, p) stacked). Exactly
        symmetric (the (k, j) block is the transposed (j, k) block)."""
        K, r, p = self.X.shape
        a2 = np.asarray(a2, float)
        off, diag = self._gram_blocks
        j, k = self.pairs[:, 0], self.pairs[:, 1]
        H = np.empty((K, r, K, r))                 # every block is written (all pairs, diagonal)
        C = off * a2[:, None, None]
        H[j, :, k, :] = C
        H[k, :, j, :] = C.transpose(0, 2, 1)
        ar = np.arange(K)
        H[ar, :, ar, :] = np.asarray(self._weighted_selector(a2) @ diag).reshape(K, r, r)
        return H.reshape(K * r, K * r)

    def weighted_gram(self, a2) -> np.ndarray:
        """``D^T diag(a2) D = sum_g a2_g D_g^T D_g`` (p, p) for block weights ``a2`` (G,)."""
        H = self.client_gram(a2)
        L = self._lower
        if L is None:
            Xs = self.X.reshape(-1, self.p)
            out = Xs.T @ (H @ Xs)
        else:               # L^T (H L): two triangular products, half the flops
            out = scipy.linalg.blas.dtrmm(1.0, L, scipy.linalg.blas.dtrmm(1.0, L, H, side=1,
                                                                          lower=1),
                                          lower=1, trans_a=1)
        return 0.5 * (out + out.T)

    def dense(self) -> np.ndarray:
        """The stacked (G h, p) ``D`` (tests and small problems only)."""
        j, k = self.pairs[:, 0], self.pairs[:, 1]
        return np.matmul(self.T, np.concatenate([self.X[j], self.X[k]], axis=1)).reshape(
            self.shape)
