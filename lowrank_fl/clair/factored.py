r"""Program (7) on pair-factored contrasts ``D_g = T_g [X_j; X_k]`` with equal pair weights.

On LoRA adapters the pair-reduced contrasts (:func:`lowrank_fl.adapters.reduce.pair_factors`)
are a small per-pair factor ``T_g`` (h × 2r) times the two clients' coordinates ``X_j, X_k``
(r × p each): the data is ``K r p + G h 2r`` numbers while the stacked ``D`` has ``G h p``
entries (``G = K(K-1)/2``, ``p = K r``: ``K^3 r^2``). This solver never forms ``D`` nor any
(G h × p) iterate.

**Algorithm.** With equal weights ``w`` the L-part of (7) has a closed form given ``S``:
``min_L 1/2 w ||D - S - L||_F^2 + lam_L ||L||_*`` is attained at ``L = SVT(D - S; τ)``,
``τ = lam_L / w``, with value ``w env_τ(D - S)`` (the Moreau envelope of the nuclear norm). So
(7) is ``min_S F(S) = w env_τ(D - S) + lam_S sum_g ||S_g||_F``, whose smooth part has the
gradient ``-w (B - SVT(B; τ))``, ``B = D - S``, ``w``-Lipschitz. FISTA on ``S`` with step
``1/w`` (O'Donoghue–Candès gradient restart) has the prox step
``S⁺ = BST(y + B_y - SVT(B_y); θ) = BST(D - L_y; θ)``, ``θ = lam_S / w``,
``L_y = SVT(D - y; τ)``. Every iterate is therefore ``S_g = f_g (D_g - L_g)`` with a low-rank
``L = U V^T``: all objects are *affine* ``diag(a) D + U V^T`` (``a`` (G,), ``U`` (G, h, m),
``V`` (p, m)), stored in ``O(G h m + p m)`` (:mod:`~lowrank_fl.clair.affine_blocks`; the
extrapolated point keeps its factors as parts). A warm start at the same ``τ`` (the λ path and
its final solve share ``λ_L``) takes its first ``L_y`` from the init's certified ``L``.

**SVT** (``svt=``). Only the singular values of ``B = diag(a) D + U V^T`` above ``τ`` are
needed (the solution's rank is ~r). ``"full"``: the Gram route of
:mod:`~lowrank_fl.clair.penalized` (eigenpairs of ``B^T B`` above ``τ^2``, LAPACK ``syevr``)
with the p × p Gram assembled from the structure, ``D^T diag(a^2) D = X^T H X``, ``H``
(K r × K r) summed from the pairs' ``T_g^T T_g``: ``O(G r^3 + (K r)^2 p)`` flops instead of
``O(G h p^2)``. ``"partial"``: Lanczos (ARPACK) on the operator ``x -> B^T B x`` applied
through ``X``, ``H`` and the low-rank terms (``O((K r)^2)`` per product, no p × p Gram and no
p³ eigensolver), asking for a few more pairs than the last rank and doubling until one falls
below ``τ^2``; it declines (Gram route) when more than ``p/4`` would be needed (``τ`` below
many singular values). ``"block"`` (what ``"auto"`` takes from ``p >= 384``): subspace iteration
on the same operator warm-started from the previous iteration's vectors
(:mod:`~lowrank_fl.clair.subspace`), falling back to Lanczos (K = 100, r = 16, 4096²: 1.6x
faster per module, the same iterates to the certificate's digits); a cold start's ``SVT(D; τ)``
(many values above ``τ``) takes the Gram route, whose eigenproblem also gives ``||D||_op``.
Either route is trusted when ``τ > 1e-6 σ_1``; below, that step forms ``B`` and uses LAPACK.
An inexact SVT inside the loop cannot make the answer wrong: the certificate decides.

**Certificate.** At ``S`` (every ``check_every`` iterations and at the end) ``L = B W``,
``W = V diag(1 - τ/s) V^T`` from the SVT of ``B = D - S``, its nuclear norm exact from the
k × k Gram of ``B V``, and ``R = D - L - S`` (factored); the dual point ``c P_w R`` and
its value come from program (7)'s own
:func:`~lowrank_fl.clair.program7.dual_scale_from_summaries`, fed with ``R``'s block norms,
``<P_w R, D>`` and the top eigenvalue of ``R``'s structured Gram: the numbers
:func:`~lowrank_fl.clair.program7.certify` computes on the dense arrays (the tests compare
them). The reported gap certifies the returned ``(L, S)``.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from ..results import ConvergenceWarning, SolverResult
from ..stall import INACCURATE, StallRule, check_stall_window
from ..validation import check_choice, check_gap_tolerance, check_int, check_positive
from .program7 import LowRankMixin, dual_scale_from_summaries, top_eigenvalue
from .pair_contrasts import PairContrasts
from . import affine_blocks as blocks
from .subspace import eigenpairs_above, lanczos_above, start_vector, top_eigenvalue_bound

__all__ = ["PairContrasts", "FactoredResult", "solve_penalized_factored", "SVT_MODES"]

SVT_MODES = ("auto", "full", "partial", "block")
# from this p on, Lanczos on the structured operator beats the p x p Gram route (measured)
_PARTIAL_AUTO_P = 384

# the Gram route resolves singular values above ~sqrt(eps) sigma_1; keep a 100x margin
_GRAM_SAFE_RATIO = 1e-6
# the block SVT's residual tolerance inside the loop (the certificate's SVT keeps 1e-12): an
# inexact step only perturbs the iterate, the certificate decides
_LOOP_RTOL = 1e-9
# a failed block SVT that saw more values above τ goes to the Gram route, not Lanczos (which
# asks for a few pairs and doubles: K = 100, r = 16, 84 values: 1.3 s vs 0.6 s)
_LANCZOS_MAX_ABOVE = 32
# below this p a full eigendecomposition is as cheap as the value-range one
_PARTIAL_MIN_P = 48


def _svt(D, B: blocks.AffineBlocks, tau):
    """Exact ``SVT(B; τ) = U_L V^T``: returns ``U_L`` (G, h, k), ``V`` (p, k) orthonormal and the
    new singular values ``s - τ`` (k,) (only ``s > τ``); None on overflow."""
    is_D = not blocks.width(B) and np.all(B.a == 1.0)
    C = blocks.gram(D, B)
    if not np.all(np.isfinite(C)):
        return None
    p = C.shape[0]
    if p >= _PARTIAL_MIN_P:
        ev, V = scipy.linalg.eigh(C, subset_by_value=(tau * tau, np.inf), driver="evr",
                                  check_finite=False)
        ev, V = ev[::-1], V[:, ::-1]
        top = float(ev[0]) if ev.size else top_eigenvalue(C)
        if is_D:                    # the same eigenproblem as op_norm's: one tridiagonalization
            D.__dict__.setdefault("op_norm", float(np.sqrt(max(top, 0.0))))
    else:
        ev, V = np.linalg.eigh(C)
        ev, V = ev[::-1], V[:, ::-1]
        top = float(ev[0])
        keep = ev > tau * tau
        ev, V = ev[keep], V[:, keep]
    if tau <= _GRAM_SAFE_RATIO * np.sqrt(max(top, 0.0)):
        # the Gram cannot resolve values this far below sigma_1: LAPACK on the formed B
        Uf, s, Vt = np.linalg.svd(blocks.dense(D, B), full_matrices=False)
        k = int(np.count_nonzero(s > tau))
        snew = s[:k] - tau
        return (Uf[:, :k] * snew).reshape(D.n_pairs, D.q, k), Vt[:k].T, snew
    s = np.sqrt(np.maximum(ev, 0.0))
    snew = s - tau
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(s > 0, snew / s, 0.0)
    return blocks.apply_blocks(D, B, V, f), V, snew


def _operator_pieces(D, B: blocks.AffineBlocks):
    """``(H, P, U^T U)`` of :func:`_gram_operator`: ``H`` = :meth:`PairContrasts.client_gram`
    (K r × K r), ``P = D^T diag(a) U`` (p × m), ``U^T U`` (m × m; ``P``, ``U^T U`` None when
    ``m = 0``)."""
    H = D.client_gram(B.a * B.a)
    if not blocks.width(B):
        return H, None, None
    if B.uparts is None:
        P = D.apply_t(B.U, B.a)
    else:               # the iterates' pair-level products, remembered across the two SVTs
        P = np.concatenate([c * D.apply_t(u, B.a, remember=True) for c, u in B.uparts
                            if u.shape[2]], axis=1)
    return H, P, blocks.left_gram(B)


def _gram_operator(D, B: blocks.AffineBlocks, pieces=None):
    """``x -> B^T B x`` (p, m) as ``X^T (H (X x)) + P V^T x + V P^T x + V (U^T U) V^T x``
    with the :func:`_operator_pieces` (given, or formed once): each product is a few dense BLAS
    calls of ``O((K r)^2 + K r p)``, never the p × p Gram."""
    p = D.p
    H, P, UtU = _operator_pieces(D, B) if pieces is None else pieces
    m = blocks.width(B)

    def mm(x):
        x = x.reshape(p, -1)
        out = D.xt_product(H @ D.x_product(x))
        if m:
            Vx = B.V.T @ x
            out += P @ Vx + B.V @ (P.T @ x + UtU @ Vx)
        return out

    return scipy.sparse.linalg.LinearOperator((p, p), matvec=mm, matmat=mm, dtype=float)


def _svt_partial(D, B: blocks.AffineBlocks, tau, k_hint, v0, pieces=None):
    """``SVT(B; τ)`` from the eigenpairs of ``B^T B`` above ``τ^2`` found by Lanczos on the
    structured operator (:func:`lowrank_fl.clair.subspace.lanczos_above`): ``O(G h r + K r p)``
    per product instead of the ``O((K r)^2 p + p^3)`` Gram route; None (use the Gram route)
    when the threshold lies below more than ``p / 4`` values or ARPACK fails."""
    found = lanczos_above(_gram_operator(D, B, pieces), D.p, tau * tau, k_hint, v0)
    return None if found is None else _svt_parts(D, B, tau, *found)


def _svt_parts(D, B, tau, ev, V):
    """``(U_L, V, s - τ)`` of ``SVT(B; τ)`` from the eigenpairs of ``B^T B`` above ``τ^2``; None
    below the Gram route's resolution (``τ <= 1e-6 σ_1``)."""
    s = np.sqrt(ev)
    if s.size and tau <= _GRAM_SAFE_RATIO * s[0]:
        return None
    return blocks.apply_blocks(D, B, V, (s - tau) / s), V, s - tau


@dataclass(frozen=True, kw_only=True)
class FactoredResult(LowRankMixin, SolverResult):
    """Solution of program (7) in factored form (:func:`solve_penalized_factored`).

    Attributes
    ----------
    L_left : ndarray, shape (G, h, k)
        ``L = L_left V^T`` blockwise with ``V = Vt[:k].T`` (``k`` kept singular values).
    S_scale : ndarray, shape (G,)
    S_left : ndarray, shape (G, h, m)
    S_right : ndarray, shape (p, m)
        ``S_g = S_scale_g D_g + S_left_g S_right^T``.
    dual : float
        Dual objective at ``c P_w R`` (``gap = objective - dual``).
    dual_scale : float
        ``c``.
    singular_values : ndarray, shape (p,)
        Singular values of ``L`` (decreasing, zero-padded).
    Vt : ndarray, shape (p, p)
        Right singular vectors of ``L`` as rows (completed to a basis).
    q : int
    lam_L, lam_S : float
    weights : ndarray, shape (G,)
    data_norm : float
        ``||D||_op``.
    """

    L_left: np.ndarray
    S_scale: np.ndarray
    S_left: np.ndarray
    S_right: np.ndarray
    dual: float
    dual_scale: float
    singular_values: np.ndarray
    Vt: np.ndarray
    q: int
    lam_L: float
    lam_S: float
    weights: np.ndarray
    data_norm: float | None = None

    @property
    def _S(self) -> blocks.AffineBlocks:
        return blocks.AffineBlocks(np.asarray(self.S_scale), np.asarray(self.S_left),
                                   np.asarray(self.S_right))

    def dense_L(self) -> np.ndarray:
        """``L`` as a (G h, p) array."""
        k = self.L_left.shape[2]
        G, h = self.L_left.shape[:2]
        return (np.matmul(self.L_left, self.Vt[:k])).reshape(G * h, -1)

    def dense_S(self, D: PairContrasts) -> np.ndarray:
        """``S`` as a (G h, p) array."""
        return blocks.dense(D, self._S)


def _singular_parts(UL, V):
    """Exact SVD data of ``L = UL V^T`` (``V`` orthonormal): from the k x k Gram of ``UL``,
    ``L = (UL Q) Q^T V^T`` with ``UL^T UL = Q diag(σ^2) Q^T``; returns ``(UL Q, V Q, σ)``,
    σ decreasing (``||L||_* = sum σ`` whatever route produced ``UL``)."""
    k = UL.shape[2]
    if k == 0:
        return UL, V, np.zeros(0)
    Uf = UL.reshape(-1, k)
    ev, Q = np.linalg.eigh(Uf.T @ Uf)
    ev, Q = ev[::-1], Q[:, ::-1]
    return blocks.times(UL, Q), V @ Q, np.sqrt(np.maximum(ev, 0.0))


def _svt_block(D, B, tau, V_prev, rtol=1e-12, report=None, pieces=None):
    """``SVT(B; τ)`` by subspace iteration warm-started from ``V_prev``
    (:func:`lowrank_fl.clair.subspace.eigenpairs_above`); None when not established (then
    ``report["above"]``: how many values it last saw above ``τ``)."""
    found = eigenpairs_above(_gram_operator(D, B, pieces).matmat, D.p, tau * tau, V_prev,
                             rtol=rtol, max_block=D.p // 4, report=report)
    return None if found is None else _svt_parts(D, B, tau, *found)


def _svt_step(D, B, tau, svt, hint, V_last, rtol=1e-12, pieces=None):
    """One SVT of ``B``: the block route (warm-started from ``V_last``) or the partial
    (Lanczos) route when asked and possible, else the Gram route. ``pieces``: ``B``'s
    :func:`_operator_pieces` when the caller has them."""
    if (V_last is None or not V_last.shape[1]) and not blocks.width(B) and np.all(B.a == 1.0):
        # B = D (a cold start): every value of D above τ is kept, many at the λ path's λ_L
        # (K = 100, r = 16: 84, where the block route grows to 128 columns and fails, 0.7 s),
        # and D's Gram is op_norm's anyway
        return _svt(D, B, tau)
    if svt in ("partial", "block") and pieces is None:
        pieces = _operator_pieces(D, B)
    if svt == "block":
        seen = {}
        parts = _svt_block(D, B, tau, V_last, rtol, seen, pieces)
        if parts is not None:
            return parts
        if seen.get("above", 0) > _LANCZOS_MAX_ABOVE:
            return _svt(D, B, tau)        # many values near τ: Lanczos would restart often
        hint = max(hint, seen.get("above", 0))
    if svt in ("partial", "block"):
        parts = _svt_partial(D, B, tau, hint, start_vector(V_last, D.p), pieces)
        if parts is not None:
            return parts
    return _svt(D, B, tau)


def _top_gram_eigenvalue(D, X: blocks.AffineBlocks, V, pieces=None) -> float:
    """The largest eigenvalue of ``X^T X``: from the p × p structured Gram (LAPACK) below
    ``p = 384``, else a Lanczos upper bound on the structured operator
    (:func:`~lowrank_fl.clair.subspace.top_eigenvalue_bound`, started from ``V``; at K = 100,
    r = 16 about 10x cheaper than forming the 1600 × 1600 Gram), the Gram if ARPACK fails."""
    if D.p >= _PARTIAL_AUTO_P:
        top = top_eigenvalue_bound(_gram_operator(D, X, pieces), D.p, start_vector(V, D.p))
        if top is not None:
            return top
    return top_eigenvalue(blocks.gram(D, X))


def _certify(D, S: blocks.AffineBlocks, w, lam_L, lam_S, tau, svt="full", hint=0, V_last=None,
             S_norms=None):
    """(7) at ``(SVT(D - S; τ), S)``: ``(objective, dual, c, L parts)``; ``S_norms``: the
    block norms ``||S_g||_F`` when known (the BST step's ``f_g ||D_g - L_g||``).

    With ``B = D - S`` and ``L = B W``, ``W = V diag(1 - τ/s) V^T``, the residual is
    ``R = B N``, ``N = I - W``: it is evaluated on the projected contrasts ``D N`` (clients'
    coordinates ``X_k N``) so that its block norms and Gram carry rounding errors relative to
    ``R`` itself, as on a formed residual (expanding ``B - L`` would leave errors of
    ``eps ||B||^2`` in ``||R||_op^2 ~ τ^2``)."""
    B = blocks.AffineBlocks(1.0 - S.a, S.U, -S.V, None, blocks.left_parts(S), S.UtU)   # D - S (sign on V: no copy)
    pieces = _operator_pieces(D, B) if svt in ("partial", "block") else None
    parts = _svt_step(D, B, tau, svt, hint, V_last, pieces=pieces)
    if parts is None:
        return None
    UL, V, snew = parts
    Fw = snew / (snew + tau)                                            # W = V diag(Fw) V^T
    L_parts = _singular_parts(UL, V)
    DN = D.projected(V, Fw)
    R = blocks.AffineBlocks(B.a, B.U, B.V - (V * Fw) @ (V.T @ B.V))                # R = B N on D N
    if pieces is not None:
        # R's operator on D N from B's: the same H (it depends on T and a only), U^T U, and
        # (D N)^T diag(a) U = N P
        H, P, UtU = pieces
        pieces = (H, None if P is None else P - (V * Fw) @ (V.T @ P), UtU)
    rn2 = blocks.sq_norms(DN, R)
    G = D.n_pairs
    # <R, D> = sum_g a_g <D_g N, D_g> + <U_g, D_g N^T V_B>
    DV = D.apply(V)
    lin = float(R.a @ (D.block_sq_norms - np.einsum("ghk,ghk->g", DV * Fw, DV)))
    if R.U.shape[2]:
        lin += float(np.einsum("ghm,ghm->", D.apply(R.V), R.U))
    lin *= w
    gram_top = w * w * _top_gram_eigenvalue(DN, R, V, pieces)
    c, dual = dual_scale_from_summaries(w * w * rn2, lin, gram_top, np.full(G, w), lam_L,
                                        lam_S)
    UL, V, sig = L_parts
    objective = 0.5 * w * float(rn2.sum()) + lam_L * float(sig.sum()) \
        + lam_S * float((np.sqrt(blocks.sq_norms(D, S)) if S_norms is None else S_norms).sum())
    return objective, dual, c, (UL, V, sig)


def solve_penalized_factored(D: PairContrasts, lam_L, lam_S, *, weight: float | None = None,
                             tol: float = 1e-8, max_iter: int = 10000, init=None,
                             check_every: int = 5, svt: str = "auto",
                             stall_window: float | None = 4.0) -> FactoredResult:
    """Solve program (7) on pair-factored contrasts with equal pair weights (module docstring).

    Parameters
    ----------
    D : PairContrasts
    lam_L, lam_S : float, > 0
    weight : float, optional
        The common pair weight ``w`` (default ``1/K`` as in §7).
    tol, max_iter : float, int
        Relative duality gap ``gap / F(0, 0)`` at which to stop (as ``solve_penalized``) and
        iteration cap (status ``"max_iter"`` and a ``ConvergenceWarning`` when hit).
    stall_window : float > 1 or None
        The stall rule of :mod:`lowrank_fl.stall` (FISTA's window 4; None: off).
    init : FactoredResult, optional
        Warm start from its ``S`` (a solve on the same ``D``); at the init's ``λ_L`` and weight
        its certified ``L = SVT(D - S; τ)`` is the first iteration's ``L_y``.
    check_every : int
        Certificate period (each check costs two structured Grams and an eigenproblem).
    svt : {"auto", "full", "partial"}
        How each iteration's SVT finds the singular values above ``τ``: ``"full"`` the exact
        Gram route (p x p Gram from the structure, LAPACK ``syevr`` on the values above
        ``τ^2``), ``"partial"`` Lanczos (ARPACK) on the structured operator ``B^T B``, falling
        back to the Gram route when ``τ`` lies below many singular values (more than ``p/4``
        asked for) or below ``1e-6 σ_1``; ``"block"`` warm-started subspace iteration first,
        then as ``"partial"``; ``"auto"``: block when ``p >= 384`` (measured in
        ``benchmarks/bench_k_scaling.py``). Either way the certificate (the gap reported)
        is computed from the structured Gram of the residual.
    Returns
    -------
    FactoredResult
        ``status``: ``"optimal"`` (``|gap| <= tol``, relative), ``"max_iter"``, ``"stalled"``, or
        ``"inaccurate"`` (a gap below ``-tol``: the certificate is rounding, which the Grams of
        nearly equal clients' factors produce; :meth:`lowrank_fl.stall.StallRule.broken`).
    """
    t0 = time.perf_counter()
    if not isinstance(D, PairContrasts):
        raise TypeError(f"D must be a PairContrasts, got {type(D).__name__}")
    lam_L = check_positive(lam_L, "lam_L")
    lam_S = check_positive(lam_S, "lam_S")
    w = 1.0 / D.n_clients if weight is None else check_positive(weight, "weight")
    tol = check_gap_tolerance(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    check_every = check_int(check_every, "check_every", minimum=1)
    check_choice(svt, "svt", SVT_MODES)
    stall = StallRule(check_stall_window(stall_window), tol)
    if svt == "auto":
        svt = "block" if D.p >= _PARTIAL_AUTO_P else "full"
    G = D.n_pairs
    if init is None:
        S = blocks.zero_blocks(D)
    elif isinstance(init, FactoredResult):
        S = init._S
        if S.a.shape != (G,) or S.U.shape[:2] != (G, D.q) or S.V.shape[0] != D.p:
            raise ValueError(f"init was solved on another problem: S_left {S.U.shape}, "
                             f"S_right {S.V.shape} for D of {G} pairs, h = {D.q}, p = {D.p}")
    else:
        raise TypeError(f"init must be a FactoredResult or None, got {type(init).__name__}")
    tau, theta = lam_L / w, lam_S / w
    scale = 0.5 * w * float(D.block_sq_norms.sum())
    scale = scale if scale > 0 else 1.0
    y, mom = S, 1.0
    # y = cy[0] S + cy[1] S_prev; the restart test is expanded in the iterates' inner products
    # (<S, S> and <S_prev, S> carried from the last iteration: two narrow products per step
    # instead of one between (3k)- and (2k)-column combinations)
    S_prev, cy, g_SS, g_PS = None, (1.0, 0.0), None, None
    q_S = q_P = None                       # their cross_terms, carried like the products
    hint, V_last = S.V.shape[1], S.V
    # a warm start at the same τ: the first L_y = SVT(D - S_init; τ) is init's L (its
    # certificate's SVT of that very matrix, to 1e-12): the λ path and the final solve share λ_L
    first = None
    if init is not None and init.lam_L == lam_L and float(init.weights[0]) == w:
        k0 = init.L_left.shape[2]
        first = (init.L_left, init.Vt[:k0].T, init.singular_values[:k0])
    objs, gaps, gap_its = [], [], []
    status, cert, it = "max_iter", None, 0
    with np.errstate(over="ignore", invalid="ignore"):
        for it in range(1, max_iter + 1):
            parts = first if it == 1 and first is not None else _svt_step(
                D, blocks.AffineBlocks(1.0 - y.a, y.U, -y.V, None, blocks.left_parts(y), y.UtU), tau, svt, hint, V_last,
                _LOOP_RTOL)                                             # L_y = SVT(D - y)
            if parts is None:
                status = "diverged"
                break
            UL, V, _ = parts
            hint, V_last = V.shape[1], V
            n2, e = blocks.residual_sq_norms(D, UL, V)
            n = np.sqrt(n2)                                                # ||D_g - L_g||
            with np.errstate(divide="ignore"):
                f = np.where(n > theta, 1.0 - theta / n, 0.0)
            Sn = blocks.AffineBlocks(f, UL * (-f)[:, None, None], V)               # BST(D - L_y; θ)
            mom_n = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * mom * mom))
            beta = (mom - 1.0) / mom_n
            # gradient restart: <y - S⁺, S⁺ - S> > 0 means the momentum points uphill
            q_N = -f * e                                                   # cross_terms(Sn)
            Uf = Sn.U.reshape(G * D.q, Sn.U.shape[2])
            Sn = Sn._replace(UtU=Uf.T @ Uf)
            UU_SN = S.U.reshape(G * D.q, S.U.shape[2]).T @ Uf            # S.U^T Sn.U
            g_SN = blocks.inner(D, S, Sn, q_S, q_N, UU_SN)
            g_NN = blocks.inner(D, Sn, Sn, q_N, q_N, Sn.UtU)
            restart = False
            if cy[1]:
                g_PN = blocks.inner(D, S_prev, Sn, q_P, q_N)
                restart = (cy[0] * g_SN + cy[1] * g_PN) - (cy[0] * g_SS + cy[1] * g_PS) \
                    - g_NN + g_SN > 0
            if restart or beta <= 0:
                mom, y, cy = (1.0 if restart else mom_n), Sn, (1.0, 0.0)
            else:
                mom, y, cy = mom_n, blocks.combine(1.0 + beta, Sn, -beta, S, UU_SN), (1.0 + beta, -beta)
            S_prev, S, g_PS, g_SS = S, Sn, g_SN, g_NN
            q_P, q_S = q_S, q_N
            if it % check_every == 0 or it == max_iter:
                cert = _certify(D, S, w, lam_L, lam_S, tau, svt, hint, V_last, f * n)
                if cert is None or not np.isfinite(cert[0]):
                    status = "diverged"
                    break
                objs.append(cert[0])
                gaps.append(cert[0] - cert[1])
                gap_its.append(it)
                g = (cert[0] - cert[1]) / scale
                status = "optimal" if abs(g) <= tol else INACCURATE if stall.broken(g) else "stalled" \
                    if stall.check(it, g, cert[0] / scale) else status
                if status != "max_iter":
                    break
    if status == "diverged":
        raise FloatingPointError(f"solve_penalized_factored: non-finite values at iteration {it}")
    objective, dual, c, (UL, V, snew) = cert
    gap = objective - dual
    k = snew.size
    Vt = V.T if k == D.p else np.vstack([V.T, scipy.linalg.null_space(V.T).T]) if k \
        else np.eye(D.p)
    sv = np.concatenate([snew, np.zeros(D.p - k)])
    if status == "max_iter":
        message = (f"solve_penalized_factored stopped at max_iter={max_iter} with relative "
                   f"duality gap {gap / scale:.3e} > tol={tol:.1e}")
        warnings.warn(message, ConvergenceWarning, stacklevel=2)
    elif status == "stalled":
        message = stall.warn("solve_penalized_factored", it, gap / scale)
    elif status == INACCURATE:
        message = stall.warn_broken("solve_penalized_factored", it, gap / scale)
    else:
        message = (f"factored FISTA reached relative duality gap {gap / scale:.2e} <= "
                   f"tol={tol:.1e} after {it} iterations")
    return FactoredResult(
        L_left=UL, S_scale=S.a, S_left=S.U, S_right=S.V, dual=float(dual), dual_scale=float(c),
        singular_values=sv, Vt=Vt, q=D.q, lam_L=lam_L, lam_S=lam_S, weights=np.full(G, w),
        data_norm=D.op_norm, objective=float(objective), gap=float(gap), iterations=it,
        status=status, solver="fista-factored", seconds=time.perf_counter() - t0,
        history={"objective": np.asarray(objs), "gap": np.asarray(gaps),
                 "gap_iteration": np.asarray(gap_its, dtype=int)},
        gap_scale=scale, message=message + ".")
