"""Program (7) itself: objective, dual, duality gap, KKT residuals, input checks, the result.

Program (7) (§3.1), for a stacked contrast ``D`` of shape (G*q, p) and pair weights ``w`` (G,)::

    min_{L,S}  1/2 sum_g w_g ||P_g(D - L - S)||_F^2 + lam_L ||L||_* + lam_S sum_g ||S^(g)||_F

Dual (Fenchel duality with ``P_w`` block-diagonal; the norms' duals are ``||.||_op`` and
``max_g ||.^(g)||_F``, §1.1 and S1.1)::

    max_Q  <Q, D> - 1/2 sum_g ||Q^(g)||_F^2 / w_g   s.t.  ||Q||_op <= lam_L,  max_g ||Q^(g)||_F <= lam_S

At an optimum ``Q* = P_w R*`` with ``R* = D - L* - S*``. From any ``(L, S)`` the point
``c P_w R`` with the best feasible scale ``c`` is dual feasible, so ``primal - dual`` certifies
``(L, S)`` whichever solver produced it (:func:`duality_gap`, :func:`certify`).

Every solver of (7) (:mod:`~lowrank_fl.clair.penalized`: Algorithm 1 and FISTA;
:mod:`~lowrank_fl.clair.programs`: CVXPY) imports this module; it imports no solver.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.linalg

from ..validation import as_float_array, check_int, check_positive
from ..linalg import block_norms
from ..results import SolverResult
from .contrasts import as_blocks, check_block_rows, check_weights

__all__ = [
    "PenalizedResult",
    "LowRankMixin",
    "Certified",
    "check_problem",
    "check_same_shape",
    "penalized_objective",
    "zero_objective",
    "block_sq_norms",
    "frobenius_inner",
    "op_norm",
    "singular_parts",
    "dual_from_residual",
    "dual_scale_from_residual",
    "dual_scale_from_summaries",
    "top_eigenvalue",
    "DualPoint",
    "dual_point",
    "dual_value",
    "duality_gap",
    "certify",
    "kkt_residuals",
    "rescale_result",
]


class DualPoint(NamedTuple):
    """A dual-feasible point of (7) and the dual objective there."""

    Q: np.ndarray
    value: float


class Certified(NamedTuple):
    """Program (7) evaluated at a primal point (see :func:`certify`)."""

    objective: float
    Q: np.ndarray
    dual: float
    gap: float
    relative_gap: float
    scale: float


class LowRankMixin:
    """``rank`` / ``projector`` for results holding ``singular_values`` (p,) and ``Vt`` (p, p)
    of their low-rank component ``L`` (and, optionally, ``data_norm``: ``||D||_op``)."""

    def rank(self, rtol: float = 1e-6, scale: float | None = None) -> int:
        """Numerical rank of ``L``: singular values above ``rtol * scale``.

        ``scale`` defaults to the stored ``data_norm`` (``||D||_op`` of the program's data: a
        threshold relative to ``sigma_1(L)`` alone reports noise as full rank when ``L ~ 0``),
        or to ``sigma_1(L)`` when the result has none. No floor at 1: the rank must not depend
        on the units of the data.
        """
        rtol = check_positive(rtol, "rtol")
        s = self.singular_values
        if scale is None:
            scale = getattr(self, "data_norm", None)
        if scale is None:
            scale = float(s[0]) if s.size else 0.0
        scale = check_positive(scale, "scale", strict=False)
        return int(np.count_nonzero(s > rtol * scale))

    def projector(self, rank: int) -> np.ndarray:
        """``P_Â``: projector (p, p) onto the top-``rank`` right singular subspace of ``L``."""
        rank = check_int(rank, "rank", minimum=1, maximum=self.Vt.shape[0])
        V = self.Vt[:rank].T
        return V @ V.T


@dataclass(frozen=True, kw_only=True)
class PenalizedResult(LowRankMixin, SolverResult):
    """Solution of program (7).

    Attributes
    ----------
    L, S : ndarray, shape (G*q, p)
        Low-rank and block-sparse components.
    Q : ndarray, shape (G*q, p)
        The dual-feasible point used for :attr:`gap` (``c P_w (D - L - S)``).
    dual : float
        Dual objective at ``Q`` (so ``gap = objective - dual``).
    singular_values : ndarray, shape (p,)
        Singular values of ``L`` in decreasing order.
    Vt : ndarray, shape (p, p)
        Right singular vectors of ``L`` as rows, matching ``singular_values``.
    q : int
        Block height.
    lam_L, lam_S : float
    weights : ndarray, shape (G,)
    diverged_at : int or None
        Iteration at which a non-finite value appeared (status ``"diverged"``).
    data_norm : float or None
        ``||D||_op``, the default reference of :meth:`rank`.

    ``gap_scale`` (see :class:`~lowrank_fl.results.SolverResult`) is the objective at
    ``(L, S) = (0, 0)``, ``F(0, 0) = 1/2 sum_g w_g ||D_g||_F^2``: (7) is homogeneous of degree 2
    in ``(D, lam_L, lam_S)``, so ``relative_gap = gap / F(0, 0)`` does not depend on the data's
    units (``F* <= F(0, 0)``, so it is also a conservative relative accuracy).
    """

    L: np.ndarray
    S: np.ndarray
    Q: np.ndarray
    dual: float
    singular_values: np.ndarray
    Vt: np.ndarray
    q: int
    lam_L: float
    lam_S: float
    weights: np.ndarray
    diverged_at: int | None = None
    data_norm: float | None = None


# --------------------------------------------------------------------------------------------
# validation


def check_problem(D, q, lam_L, lam_S, weights):
    """Validate the data of (7): returns ``(D, q, G, lam_L, lam_S, w)`` with ``D`` float (G*q, p)
    and ``w`` the (G,) weights (``None`` → ``1/K``). Raises ``ValueError``/``TypeError`` naming the
    argument."""
    D = as_float_array(D, "D", ndim=2)
    q = _check_q(q, D)
    G = D.shape[0] // q
    lam_L = check_positive(lam_L, "lam_L")
    lam_S = check_positive(lam_S, "lam_S")
    if weights is None and not _is_pair_count(G):
        # D's rows split into G blocks of q rows; a G that counts no pairs of clients points at q
        raise ValueError(f"D has {D.shape[0]} rows, so q={q} gives G={G} blocks, which is K(K-1)/2 for no "
                         "number of clients K: check q (the rows of one block, the output dimension), or "
                         "pass explicit weights of shape (G,) for blocks that are not all pairs")
    w = check_weights(weights, G)
    return D, q, G, lam_L, lam_S, w


def _is_pair_count(G: int) -> bool:
    K = int(round((1 + (1 + 8 * G) ** 0.5) / 2))
    return K * (K - 1) // 2 == G


def _check_q(q, D):
    return check_block_rows(D, q, "D")[0]


def check_same_shape(X, name, D):
    """``X`` as a float array of ``D``'s shape (``ValueError`` naming ``name`` otherwise)."""
    return as_float_array(X, name, shape=D.shape)


# --------------------------------------------------------------------------------------------
# objective, dual, gap, KKT (public: certify any (L, S))


def frobenius_inner(A, B) -> float:
    """``<A, B> = tr(A^T B)`` for two arrays of one shape (no checks: hot path)."""
    # einsum's own loop, not BLAS ddot: multithreaded BLAS on tiny reductions stalls badly on a
    # loaded machine (measured 18 ms vs 0.07 ms for 6960 x 16)
    return float(np.einsum("ij,ij->", A, B))


def block_sq_norms(X, q):
    """Squared Frobenius norms ``||X^(g)||_F^2`` (G,) of the row blocks of a (G*q, p) array."""
    B = X.reshape(-1, q, X.shape[1])
    return np.einsum("gij,gij->g", B, B)


def zero_objective(D, q, w) -> float:
    """``F(0, 0) = 1/2 sum_g w_g ||D_g||_F^2``, the scale of (7) (1 for ``D = 0``, where every
    gap is 0 anyway)."""
    f0 = 0.5 * float(w @ block_sq_norms(D, q))
    return f0 if f0 > 0 else 1.0


def penalized_objective(D, q, L, S, lam_L, lam_S, weights=None) -> float:
    """Objective of program (7) at ``(L, S)``.

    Parameters
    ----------
    D, L, S : array_like, shape (G*q, p)
    q : int
    lam_L, lam_S : float, > 0
    weights : None or array_like, shape (G,)
        ``None`` means ``w_g = 1/K``.
    """
    D, q, G, lam_L, lam_S, w = check_problem(D, q, lam_L, lam_S, weights)
    L = check_same_shape(L, "L", D)
    S = check_same_shape(S, "S", D)
    R = D - L - S
    nuc = float(np.linalg.svd(L, compute_uv=False).sum())
    blk = float(np.sqrt(block_sq_norms(S, q)).sum())
    return 0.5 * float(w @ block_sq_norms(R, q)) + lam_L * nuc + lam_S * blk


def op_norm(X) -> float:
    """``||X||_op`` of a tall (m, p) array through its p x p Gram (no checks)."""
    # sqrt of the top eigenvalue of the p x p Gram: relative accuracy ~eps, enough for scaling
    C = X.T @ X
    return float(np.sqrt(max(np.linalg.eigvalsh(C)[-1], 0.0)))


def dual_scale_from_residual(D, q, R, w, lam_L, lam_S, *, sq_norms=None):
    """Scale ``c`` and dual value of the best feasible rescaling ``c P_w R`` of a residual
    ``R = D - L - S`` (G*q, p), without forming ``P_w R`` (no input checks: ``w`` (G,) already
    validated). ``sq_norms``: the block norms ``||R^(g)||_F^2`` (G,) when already known.

    Returns ``(c, value)``. Only block norms, ``<P_w R, D>`` and the p x p Gram of ``P_w R``
    are needed (no (G*q, p) temporary: a fresh one page-faults and costs several passes)."""
    if sq_norms is None:
        sq_norms = block_sq_norms(R, q)
    qn2 = w * w * sq_norms                              # ||(P_w R)^(g)||_F^2
    Rb = R.reshape(-1, q, R.shape[1])
    lin = float(w @ np.einsum("gij,gij->g", Rb, D.reshape(Rb.shape)))   # <P_w R, D>
    # Gram of P_w R = sum_g w_g^2 R_g^T R_g: one product for equal weights (§7's 1/K), else over
    # chunks of blocks (small temporaries)
    p = R.shape[1]
    if np.all(w == w[0]):
        C = R.T @ R
        C *= w[0] * w[0]
    else:
        step = max(1, 4096 // q)
        C = np.zeros((p, p))
        for a in range(0, Rb.shape[0], step):
            X = Rb[a:a + step].reshape(-1, p)
            C += (X * np.repeat(w[a:a + step] ** 2, q)[:, None]).T @ X
    return dual_scale_from_summaries(qn2, lin, top_eigenvalue(C), w, lam_L, lam_S)


def top_eigenvalue(C) -> float:
    """Largest eigenvalue of a symmetric PSD (p, p) ``C`` (LAPACK ``syevr``, clipped at 0)."""
    p = C.shape[0]
    try:
        top = scipy.linalg.eigh(C, eigvals_only=True, subset_by_index=(p - 1, p - 1),
                                driver="evr", check_finite=False)
    except np.linalg.LinAlgError:
        # syevr (MRRR) reports an "Internal Error" on some tightly clustered spectra; the
        # divide-and-conquer solver of every eigenvalue does not fail there
        top = np.linalg.eigvalsh(C)
    return max(float(top[-1]), 0.0)


def dual_scale_from_summaries(qn2, lin, gram_top, w, lam_L, lam_S):
    """Scale ``c`` and dual value of ``c P_w R`` from the residual's summaries: ``qn2`` (G,)
    the block norms ``||(P_w R)^(g)||_F^2``, ``lin = <P_w R, D>`` and ``gram_top`` the largest
    eigenvalue of the Gram ``(P_w R)^T (P_w R)`` (so ``||P_w R||_op = sqrt(gram_top)``).

    Every certificate of (7) ends here, whether the residual is a dense array
    (:func:`dual_scale_from_residual`) or kept in factored form
    (:mod:`~lowrank_fl.clair.factored`). Returns ``(c, value)``."""
    opn = float(np.sqrt(max(float(gram_top), 0.0)))
    c_max = 1.0 / max(opn / lam_L, float(np.sqrt(np.max(qn2))) / lam_S, np.finfo(float).tiny)
    quad = float(qn2 @ (1.0 / w))
    # dual(cQ) = c lin - c^2 quad / 2 is concave in c: maximise over [0, c_max]. c = min(1, c_max)
    # is the plain rescaling; the optimal c is never worse and costs nothing.
    c = min(max(lin / quad, 0.0), c_max) if quad > 0 else 0.0
    return c, c * lin - 0.5 * c * c * quad


def dual_from_residual(D, q, R, w, lam_L, lam_S):
    """Best feasible rescaling ``c P_w R`` of a residual ``R = D - L - S`` (G*q, p) and its
    dual value, as a :class:`DualPoint` (no input checks: ``w`` (G,) already validated)."""
    c, value = dual_scale_from_residual(D, q, R, w, lam_L, lam_S)
    Q = R * np.repeat(w, q)[:, None]
    Q *= c
    return DualPoint(Q, value)


def dual_value(D, q, Q, lam_L, lam_S, weights=None, *, rtol: float = 1e-6) -> float:
    """Dual objective of (7), ``<Q, D> - 1/2 sum_g ||Q^(g)||_F^2 / w_g``, at a feasible ``Q``.

    Parameters
    ----------
    D, Q : array_like, shape (G*q, p)
    rtol : float
        Feasibility slack: ``||Q||_op <= lam_L (1 + rtol)`` and
        ``max_g ||Q^(g)||_F <= lam_S (1 + rtol)`` are required (solver duals are feasible only to
        solver accuracy).

    Raises
    ------
    ValueError
        If ``Q`` violates a dual constraint by more than ``rtol``.
    """
    D, q, G, lam_L, lam_S, w = check_problem(D, q, lam_L, lam_S, weights)
    Q = check_same_shape(Q, "Q", D)
    rtol = check_positive(rtol, "rtol", strict=False)
    qn2 = block_sq_norms(Q, q)
    opn = op_norm(Q)
    if opn > lam_L * (1 + rtol):
        raise ValueError(f"Q is not dual feasible: ||Q||_op = {opn:.6g} > lam_L = {lam_L:.6g}")
    bmax = float(np.sqrt(qn2.max()))
    if bmax > lam_S * (1 + rtol):
        raise ValueError(
            f"Q is not dual feasible: max_g ||Q_g||_F = {bmax:.6g} > lam_S = {lam_S:.6g}")
    return frobenius_inner(Q, D) - 0.5 * float(qn2 @ (1.0 / w))


def dual_point(D, q, L, S, lam_L, lam_S, weights=None):
    """Dual-feasible ``Q`` (G*q, p) built from ``(L, S)`` and its dual value.

    ``Q = c P_w (D - L - S)`` with the scale ``c`` that maximises the dual subject to
    ``||Q||_op <= lam_L`` and ``max_g ||Q^(g)||_F <= lam_S``.

    Returns
    -------
    DualPoint
        ``(Q, value)``: ``Q`` (G*q, p) and the dual objective at it.
    """
    D, q, G, lam_L, lam_S, w = check_problem(D, q, lam_L, lam_S, weights)
    L = check_same_shape(L, "L", D)
    S = check_same_shape(S, "S", D)
    return dual_from_residual(D, q, D - L - S, w, lam_L, lam_S)


def duality_gap(D, q, L, S, lam_L, lam_S, weights=None) -> float:
    """Duality gap of (7) at ``(L, S)``: primal objective minus the dual value of
    :func:`dual_point`. Non-negative; zero exactly at an optimum. Shapes as in
    :func:`penalized_objective`."""
    primal = penalized_objective(D, q, L, S, lam_L, lam_S, weights)
    _, dual = dual_point(D, q, L, S, lam_L, lam_S, weights)
    return primal - dual


def kkt_residuals(D, q, L, S, lam_L, lam_S, weights=None, *, rank_tol: float = 1e-6) -> dict:
    """Residuals of the optimality conditions of (7) at ``(L, S)``.

    With ``Z = P_w (D - L - S)`` optimality means ``Z ∈ lam_L ∂||L||_*`` and
    ``Z ∈ lam_S ∂||S||_{blk,1}`` (the subdifferentials of S1.1 with supp(S) in place of I).
    For ``L = U diag(s) V^T`` the first is ``U^T Z V = lam_L I``, ``P_U Z P_V⊥ = 0``,
    ``P_U⊥ Z P_V = 0`` and ``||P_U⊥ Z P_V⊥||_op <= lam_L``.

    Parameters
    ----------
    D, L, S : array_like, shape (G*q, p)
    q : int
    lam_L, lam_S : float, > 0
    weights : None or array_like, shape (G,)
    rank_tol : float, > 0
        Singular values of ``L`` above ``rank_tol * ||D||_op`` span its range; blocks of ``S``
        above ``rank_tol * max_g ||D_g||_F`` form its support (both scale with the data).

    Returns
    -------
    dict of float
        ``"nuclear_aligned"``: ``||U^T Z V - lam_L I||_F / lam_L``;
        ``"nuclear_cross"``: ``max(||U^T Z P_V⊥||_F, ||P_U⊥ Z V||_F) / lam_L``;
        ``"nuclear_op"``: ``max(0, ||P_U⊥ Z P_V⊥||_op / lam_L - 1)``;
        ``"block_aligned"``: ``max_{g in supp} ||Z_g - lam_S S_g/||S_g|| ||_F / lam_S``;
        ``"block_bound"``: ``max(0, max_{g not in supp} ||Z_g||_F / lam_S - 1)``.
    """
    D, q, G, lam_L, lam_S, w = check_problem(D, q, lam_L, lam_S, weights)
    L = check_same_shape(L, "L", D)
    S = check_same_shape(S, "S", D)
    rank_tol = check_positive(rank_tol, "rank_tol")
    Z = (D - L - S) * np.repeat(w, q)[:, None]
    U, s, Vt = np.linalg.svd(L, full_matrices=False)
    k = int(np.count_nonzero(s > rank_tol * op_norm(D)))
    U, V = U[:, :k], Vt[:k].T
    UtZ = U.T @ Z                                       # (k, p)
    ZV = Z @ V                                          # (Gq, k)
    aligned = UtZ @ V - lam_L * np.eye(k)
    cross_row = UtZ - (UtZ @ V) @ V.T                   # U^T Z P_V⊥
    cross_col = ZV - U @ (U.T @ ZV)                     # P_U⊥ Z V
    Zperp = Z - U @ UtZ
    Zperp = Zperp - (Zperp @ V) @ V.T
    nuc_al = float(np.linalg.norm(aligned)) / lam_L if k else 0.0
    nuc_cross = max(float(np.linalg.norm(cross_row)), float(np.linalg.norm(cross_col))) / lam_L \
        if k else 0.0
    nuc_op = max(0.0, op_norm(Zperp) / lam_L - 1.0)
    Sb = as_blocks(S, q)
    Zb = as_blocks(Z, q)
    sn = block_norms(Sb)
    supp = sn > rank_tol * float(block_norms(as_blocks(D, q)).max())
    if np.any(supp):
        blk_al = float(block_norms(Zb[supp] - lam_S * Sb[supp] / sn[supp, None, None]).max()) \
            / lam_S
    else:
        blk_al = 0.0
    zn = block_norms(Zb)
    blk_b = max(0.0, float(zn[~supp].max()) / lam_S - 1.0) if np.any(~supp) else 0.0
    return {"nuclear_aligned": nuc_al, "nuclear_cross": nuc_cross, "nuclear_op": nuc_op,
            "block_aligned": blk_al, "block_bound": blk_b}


def singular_parts(L):
    """Singular values (p,) and a full (p, p) right basis (rows) of a tall (m, p) ``L``.

    Thin SVD only (the full left factor would be m x m); when ``m < p`` the values are padded
    with zeros and the basis completed by an orthonormal basis of the null space.
    """
    L = as_float_array(L, "L", ndim=2)
    _, s, Vt = np.linalg.svd(L, full_matrices=False)
    p = Vt.shape[1]
    if Vt.shape[0] < p:
        Vt = np.vstack([Vt, scipy.linalg.null_space(Vt).T])
        s = np.concatenate([s, np.zeros(p - s.size)])
    return s, Vt


def certify(D, q, L, S, lam_L, lam_S, w, singular_values=None) -> Certified:
    """Objective, dual point and relative duality gap of (7) at ``(L, S)``: the library's own
    certificate, applied to every solver's answer (iterative or CVXPY).

    Parameters
    ----------
    D, L, S : ndarray, shape (G*q, p)
        Already validated (see :func:`check_problem`).
    q : int
    lam_L, lam_S : float
    w : ndarray, shape (G,)
    singular_values : ndarray, optional
        Singular values of ``L`` when already known (saves one SVD).

    Returns
    -------
    Certified
        ``relative_gap = gap / F(0, 0)`` with ``F(0, 0) = 1/2 sum_g w_g ||D_g||_F^2``
        (:func:`zero_objective`): (7) is homogeneous of degree 2 in ``(D, lam_L, lam_S)``, so the
        ratio does not depend on the data's units.
    """
    if singular_values is None:
        singular_values = np.linalg.svd(L, compute_uv=False)
    R = D - L - S
    objective = 0.5 * float(w @ block_sq_norms(R, q)) + lam_L * float(np.sum(singular_values)) \
        + lam_S * float(np.sqrt(block_sq_norms(S, q)).sum())
    Q, dual = dual_from_residual(D, q, R, w, lam_L, lam_S)
    scale = zero_objective(D, q, w)
    gap = objective - dual
    return Certified(objective=float(objective), Q=Q, dual=float(dual), gap=float(gap),
                     relative_gap=float(gap / scale), scale=float(scale))


def rescale_result(result: PenalizedResult, c: float) -> PenalizedResult:
    """A solution of (7) computed on ``(D / c, lam_L / c, lam_S / c)`` expressed for
    ``(D, lam_L, lam_S)``: (7) is homogeneous, so ``L``, ``S``, ``Q``, the singular values and the
    penalties scale by ``c``, the objective, dual value, gap and ``gap_scale`` by ``c^2``
    (``relative_gap`` and ``Vt`` are unchanged). ``c = 1`` returns ``result`` itself."""
    c = float(c)
    if c == 1.0:
        return result
    c2 = c * c
    hist = {k: (np.asarray(v) * c2 if k in ("objective", "gap") else v)
            for k, v in result.history.items()}
    return dataclasses.replace(
        result, L=result.L * c, S=result.S * c, Q=result.Q * c, dual=result.dual * c2,
        singular_values=result.singular_values * c, lam_L=result.lam_L * c,
        lam_S=result.lam_S * c, objective=result.objective * c2, gap=result.gap * c2,
        gap_scale=None if result.gap_scale is None else result.gap_scale * c2,
        data_norm=None if result.data_norm is None else result.data_norm * c, history=hist)
