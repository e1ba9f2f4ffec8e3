"""CVXPY formulations of CLAIR's convex programs (exact references).

* :func:`nuclear_norm_block_schur` — ``||L||_*`` for a tall row-block matrix as the shared-W
  block-Schur SDP: ``||L||_* = min 1/2 (tr W + sum_g tr T_g)`` subject to
  ``[[W, L_g^T], [L_g, T_g]] ⪰ 0`` for every block. Exact (for fixed ``W ≻ 0`` the best
  ``sum_g tr T_g`` is ``tr(L W^{-1} L^T)``, minimised at ``W = (L^T L)^{1/2}``), with G cones of
  size p + q instead of one of size Gq + p (``cp.normNuc``), which is what makes CVXPY usable.
* :func:`solve_program7` — penalized program (7) (called by ``solve_penalized(method="cvxpy")``).
* :func:`solve_noiseless` — program (24), ``S`` explicit so the dual of ``L + S = D0`` is ``Q``.
* :func:`solve_oracle` — noiseless oracle (23) in the reduced form ``L = Y A``.
* :func:`solve_noisy_oracle` — noisy oracle (17) with per-block SOC constraints.

Every solve goes through :func:`lowrank_fl.conic.solve_scaled` (data rescaled to order one, the
solution scaled back) and is decided by the library's own certificate where the program has one
((7), (24)): ``"optimal"`` when the relative duality gap is within ``tol`` whatever CVXPY's status
string says, ``"inaccurate"`` with a :class:`~lowrank_fl.results.ConvergenceWarning` otherwise
(:class:`~lowrank_fl.results.SolverError` with ``on_inaccurate="raise"``). No solution at all
(infeasible, solver failure) always raises.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import scipy.sparse

from ..validation import as_float_array, check_choice, check_gap_tolerance, check_positive
from ..linalg import orth
from ..results import SolverResult
from ..conic import SOLVERS, data_scale, decide, solve_scaled
from .contrasts import check_block_rows
from .program7 import (LowRankMixin, PenalizedResult, block_sq_norms, certify, check_problem,
                       op_norm, singular_parts)

__all__ = [
    "SOLVERS",
    "nuclear_norm_block_schur",
    "block_l1",
    "solve_program7",
    "solve_noiseless",
    "solve_oracle",
    "solve_noisy_oracle",
    "NoiselessResult",
    "OracleResult",
    "oracle_inputs",
    "check_benign_in_row_space",
]

_NUCLEAR = ("schur", "normNuc")
#: Default certificate tolerance of the CVXPY solves (relative duality gap).
DEFAULT_TOL = 1e-7


@dataclass(frozen=True, kw_only=True)
class _LowRankSolution(LowRankMixin, SolverResult):
    """Fields shared by the CVXPY results: ``L``, ``S`` (G*q, p), ``singular_values`` (p,) and
    ``Vt`` (p, p) of ``L``, and ``data_norm`` (``||D0||_op``, the default reference of
    :meth:`rank`)."""

    L: np.ndarray
    S: np.ndarray
    singular_values: np.ndarray
    Vt: np.ndarray
    data_norm: float | None = None


@dataclass(frozen=True, kw_only=True)
class NoiselessResult(_LowRankSolution):
    """Solution of program (24) (``gap = objective - <Q, D0>``, the conic dual gap).

    Attributes
    ----------
    L, S : ndarray, shape (G*q, p)
    Q : ndarray, shape (G*q, p)
        Dual of ``L + S = D0``, sign fixed so that ``<Q, D0> >= 0`` (at an optimum
        ``<Q, D0>`` is the optimal value). Dual feasible to solver accuracy:
        ``||Q||_op <= lam_L``, ``max_g ||Q_g||_F <= lam_S``.
    singular_values : ndarray, shape (p,)
    Vt : ndarray, shape (p, p)
    """

    Q: np.ndarray


@dataclass(frozen=True, kw_only=True)
class OracleResult(_LowRankSolution):
    """Solution of an oracle program ((23) or (17)).

    Attributes
    ----------
    Y : ndarray, shape (G*q, r)
        Reduced coordinates, ``L = Y A``.
    L, S : ndarray, shape (G*q, p)
        ``S`` vanishes off the contaminated blocks ``I``.
    A : ndarray, shape (r, p)
        Orthonormal-row basis of the shared row space used.
    singular_values : ndarray, shape (p,)
    Vt : ndarray, shape (p, p)
    """

    Y: np.ndarray
    A: np.ndarray


# --------------------------------------------------------------------------------------------
# atoms


def _blocks_of(L_expr, q):
    if isinstance(L_expr, (list, tuple)):
        return list(L_expr)
    rows = L_expr.shape[0]
    if rows % q != 0:
        raise ValueError(f"L_expr must have a multiple of q={q} rows, got shape {L_expr.shape}")
    return [L_expr[g * q:(g + 1) * q, :] for g in range(rows // q)]


def nuclear_norm_block_schur(L_expr, q: int):
    """Block-Schur SDP form of ``||L||_*`` (G PSD cones of size n + q instead of one of size
    G q + n).

    Parameters
    ----------
    L_expr : cvxpy expression of shape (G*q, n), or a list of G expressions/arrays of shape (q, n)
        The row blocks ``L_g`` (constant blocks are allowed).
    q : int
        Block height.

    Returns
    -------
    expr : cvxpy expression
        ``1/2 (tr W + sum_g tr T_g)``; at the optimum of any program minimising it, equals
        ``||L||_*``.
    constraints : list
        ``[[W, L_g^T], [L_g, T_g]] ⪰ 0`` for each block (cones of size n + q).
    """
    import cvxpy as cp  # here, not at import: the iterative paths never need cvxpy
    blocks = _blocks_of(L_expr, q)
    n = blocks[0].shape[1]
    W = cp.Variable((n, n), symmetric=True)
    T = [cp.Variable((q, q), symmetric=True) for _ in blocks]
    cons = [cp.bmat([[W, Lg.T], [Lg, Tg]]) >> 0 for Lg, Tg in zip(blocks, T)]
    return 0.5 * (cp.trace(W) + cp.sum(cp.hstack([cp.trace(t) for t in T]))), cons


def block_l1(S_expr, q: int):
    """``||S||_{blk,1} = sum_g ||S_g||_F`` for a (G*q, p) expression (one vectorised norm; in C
    order row g of the (G, q*p) reshape is block g)."""
    import cvxpy as cp  # here, not at import: the iterative paths never need cvxpy
    rows, p = S_expr.shape
    return cp.sum(cp.norm(cp.reshape(S_expr, (rows // q, q * p), order="C"), 2, axis=1))


# --------------------------------------------------------------------------------------------
# solving with status checks


def _finish(values, raw, *, what, tol, on_inaccurate, relative_gap):
    """The library's status and message for a CVXPY answer (see :func:`lowrank_fl.conic.decide`)."""
    return decide(relative_gap, tol, raw.status, what=what, solver=raw.solver,
                  on_inaccurate=on_inaccurate, stacklevel=4)


def solve_program7(D, q, lam_L, lam_S, weights=None, *, solver: str = "CLARABEL",
                   nuclear: str = "schur", tol: float = DEFAULT_TOL, on_inaccurate: str = "warn",
                   solver_options: Mapping | None = None,
                   verbose: bool = False) -> PenalizedResult:
    """Program (7) solved exactly with CVXPY, certified by the library's own duality gap.

    The problem is built on ``D / c`` with ``lam / c`` (``c`` a power of two near
    ``max |D|``, :func:`lowrank_fl.conic.data_scale`) and the solution scaled back, so the
    solver's absolute tolerances act on data of order one whatever the units.

    Parameters
    ----------
    D : array_like, shape (G*q, p)
    q : int
    lam_L, lam_S : float, > 0
    weights : None or array_like, shape (G,)
    solver : {"CLARABEL", "SCS"}
    nuclear : {"schur", "normNuc"}
        ``"normNuc"`` uses ``cp.normNuc`` on the tall matrix (one PSD cone of size Gq + p); it is
        ~100x slower and only kept so benchmarks can show it.
    tol : float, > 0
        The answer is ``"optimal"`` when its relative duality gap (dual point ``c P_w R`` of
        :func:`~lowrank_fl.clair.program7.dual_from_residual`, divided by ``F(0, 0)``) is at most
        ``tol``, whatever CVXPY's status string says; otherwise ``"inaccurate"``.
    on_inaccurate : {"warn", "raise"}
        An uncertified answer warns (:class:`~lowrank_fl.results.ConvergenceWarning`) or raises
        :class:`~lowrank_fl.results.SolverError`.
    solver_options : mapping, optional
        Keyword arguments for ``cvxpy.Problem.solve``.

    Returns
    -------
    PenalizedResult
        ``gap``/``relative_gap`` from the dual formula of :mod:`~lowrank_fl.clair.program7` at
        the returned point, comparable with the iterative methods; ``history["cvxpy_status"]``
        is not kept: the raw status is in ``message``.
    """
    import cvxpy as cp  # here, not at import: the iterative paths never need cvxpy
    D, q, G, lam_L, lam_S, w = check_problem(D, q, lam_L, lam_S, weights)
    check_choice(nuclear, "nuclear", _NUCLEAR)
    tol = check_gap_tolerance(tol, "tol")
    p = D.shape[1]
    sw = np.sqrt(np.repeat(w, q))[:, None]

    def build(c):
        L = cp.Variable((G * q, p))
        S = cp.Variable((G * q, p))
        loss = 0.5 * cp.sum_squares(cp.multiply(sw, D / c - L - S))
        if nuclear == "schur":
            nuc, cons = nuclear_norm_block_schur(L, q)
        else:
            nuc, cons = cp.normNuc(L), []
        obj = loss + (lam_L / c) * nuc + (lam_S / c) * block_l1(S, q)
        return cp.Problem(cp.Minimize(obj), cons), {"L": L, "S": S}

    raw = solve_scaled(build, data_scale(D), solver=solver, solver_options=solver_options,
                       verbose=verbose)
    Lv, Sv = raw.values["L"], raw.values["S"]
    s, Vt = singular_parts(Lv)
    cert = certify(D, q, Lv, Sv, lam_L, lam_S, w, singular_values=s)
    status, message = _finish(raw.values, raw, what="program (7)", tol=tol,
                              on_inaccurate=on_inaccurate, relative_gap=cert.relative_gap)
    return PenalizedResult(
        L=Lv, S=Sv, Q=cert.Q, dual=cert.dual, singular_values=s, Vt=Vt, q=q, lam_L=lam_L,
        lam_S=lam_S, weights=w, objective=cert.objective, gap=cert.gap,
        iterations=raw.iterations, status=status,
        solver=raw.solver + ("" if nuclear == "schur" else ":normNuc"), seconds=raw.seconds,
        gap_scale=cert.scale, data_norm=op_norm(D), message=message)


def solve_noiseless(D0, q, lam_L, lam_S, *, solver: str = "CLARABEL", nuclear: str = "schur",
                    tol: float = DEFAULT_TOL, on_inaccurate: str = "warn",
                    solver_options: Mapping | None = None,
                    verbose: bool = False) -> NoiselessResult:
    """Noiseless program (24): ``min lam_L ||L||_* + lam_S ||S||_{blk,1}`` s.t. ``L + S = D0``.

    Solved on ``D0 / c`` with ``lam / c`` (``c`` a power of two near ``max |D0|``) and scaled
    back. Certified by the library, not by CVXPY's status: the primal point is made exactly
    feasible (``S = D0 - L``), the dual ``Q`` of the equality is scaled into the dual ball
    (``||Q||_op <= lam_L``, ``max_g ||Q_g||_F <= lam_S``), and
    ``gap = lam_L ||L||_* + lam_S ||D0 - L||_{blk,1} - <Q, D0>`` relative to the objective
    decides: ``"optimal"`` when ``gap <= tol * objective``, else ``"inaccurate"``.

    Parameters
    ----------
    D0 : array_like, shape (G*q, p)
        Noiseless contrast ``L0 + S0`` (15).
    q : int
    lam_L, lam_S : float, > 0
    solver : {"CLARABEL", "SCS"}
    nuclear : {"schur", "normNuc"}
    tol : float, > 0
        Relative duality gap accepted as optimal.
    on_inaccurate : {"warn", "raise"}
    solver_options : mapping, optional

    Returns
    -------
    NoiselessResult
        ``Q`` is the solver's dual of the equality (feasible to solver accuracy), sign fixed so
        that ``<Q, D0> >= 0``; ``gap`` uses ``Q`` scaled into the dual ball, so it is a true
        upper bound on the suboptimality of ``(L, D0 - L)``. By Theorem 1 only the row space of
        ``L`` (``result.projector(r)``) is determined, not ``L`` itself.
    """
    import cvxpy as cp  # here, not at import: the iterative paths never need cvxpy
    D0, q, G, lam_L, lam_S = _check_unweighted(D0, q, lam_L, lam_S, "D0")
    check_choice(nuclear, "nuclear", _NUCLEAR)
    tol = check_gap_tolerance(tol, "tol")
    p = D0.shape[1]

    def build(c):
        L = cp.Variable((G * q, p))
        S = cp.Variable((G * q, p))
        if nuclear == "schur":
            nuc, cons = nuclear_norm_block_schur(L, q)
        else:
            nuc, cons = cp.normNuc(L), []
        eq = L + S == D0 / c
        prob = cp.Problem(cp.Minimize((lam_L / c) * nuc + (lam_S / c) * block_l1(S, q)),
                          cons + [eq])
        return prob, {"L": L, "Q": eq}

    raw = solve_scaled(build, data_scale(D0), solver=solver, solver_options=solver_options,
                       verbose=verbose)
    Lv, Q = raw.values["L"], raw.values["Q"]
    Sv = D0 - Lv                                   # exactly feasible
    # CVXPY's sign convention for equality duals: at an optimum <Q, D0> is the optimal value,
    # > 0 unless D0 = 0 (<Q, L> would be ~0 when L = 0 and fix nothing)
    if np.vdot(Q, D0) < 0:
        Q = -Q
    # the certificate uses Q scaled into the dual ball (the stored Q is the solver's own)
    Qf = Q / max(1.0, op_norm(Q) / lam_L, float(np.sqrt(block_sq_norms(Q, q).max())) / lam_S)
    s, Vt = singular_parts(Lv)
    objective = lam_L * float(s.sum()) + lam_S * float(np.sqrt(block_sq_norms(Sv, q)).sum())
    gap = objective - float(np.vdot(Qf, D0))
    rel = gap / objective if objective > 0 else (0.0 if gap <= 0 else float("inf"))
    status, message = _finish(raw.values, raw, what="program (24)", tol=tol,
                              on_inaccurate=on_inaccurate, relative_gap=rel)
    return NoiselessResult(
        L=Lv, S=Sv, Q=Q, singular_values=s, Vt=Vt, objective=objective, gap=gap,
        iterations=raw.iterations, status=status, solver=raw.solver, seconds=raw.seconds,
        data_norm=op_norm(D0), message=message)


def _check_unweighted(D, q, lam_L, lam_S, name):
    D = as_float_array(D, name, ndim=2)
    q, G = check_block_rows(D, q, name)
    return D, q, G, check_positive(lam_L, "lam_L"), check_positive(lam_S, "lam_S")


def oracle_inputs(D, q, A, I_mask, lam_L, lam_S, name="D0"):
    """Validate the data of an oracle program ((23) or (17)): returns
    ``(D, q, G, lam_L, lam_S, A, I_mask)`` with ``A`` (r, p) re-orthonormalised (rows spanning
    the given row space) and ``I_mask`` a (G,) bool mask of the contaminated pairs ``I``."""
    D, q, G, lam_L, lam_S = _check_unweighted(D, q, lam_L, lam_S, name)
    A = as_float_array(A, "A", ndim=2)
    if A.shape[1] != D.shape[1] or A.shape[0] >= A.shape[1]:
        raise ValueError(f"A must have shape (r, p) with r < p = {D.shape[1]}, got {A.shape}")
    A = orth(A.T, name="A (transposed)").T  # orthonormal rows spanning row(A)
    I_mask = np.asarray(I_mask)
    if I_mask.dtype != bool or I_mask.shape != (G,):
        raise ValueError(f"I_mask must be a boolean array of shape ({G},) (contaminated pairs), "
                         f"got dtype {I_mask.dtype} and shape {I_mask.shape}")
    return D, q, G, lam_L, lam_S, A, I_mask


def check_benign_in_row_space(D0, q, A, I_mask, check_tol) -> None:
    """(23) is infeasible unless ``D0_g = D0_g P_A`` on benign blocks: raise ``ValueError`` when
    ``||P_{I^c}(D0) P_{A⊥}||_F > check_tol * ||D0||_F`` (relative: no dependence on units)."""
    B = D0.reshape(D0.shape[0] // q, q, -1)[~I_mask]
    viol = float(np.linalg.norm(B - (B @ A.T) @ A))
    if viol > check_tol * float(np.linalg.norm(D0)):
        raise ValueError(f"D0 has benign blocks outside row(A) (relative norm "
                         f"{viol / max(float(np.linalg.norm(D0)), np.finfo(float).tiny):.3g} > "
                         f"check_tol={check_tol:g}); the oracle (23) is infeasible: D0 must "
                         "satisfy D0_g = D0_g P_A for g not in I_mask")


def solve_oracle(D0, q, A, I_mask, lam_L, lam_S, *, solver: str = "CLARABEL",
                 on_inaccurate: str = "warn", solver_options: Mapping | None = None,
                 verbose: bool = False, check_tol: float = 1e-8) -> OracleResult:
    """Noiseless oracle (23) in reduced form.

    ``L = Y A`` (so ``L = L P_A``), ``Y_g = D0_g A^T`` fixed on benign blocks ``I^c`` (where
    ``S = 0`` forces ``L_g = D0_g``), free on ``I``; ``||Y A||_* = ||Y||_*`` because ``A`` has
    orthonormal rows, so the block-Schur cones have size ``r + q``::

        min_{Y_I}  lam_L ||Y||_* + lam_S sum_{g in I} ||D0_g - Y_g A||_F

    Solved on ``D0 / c`` with ``lam / c`` (``c`` a power of two near ``max |D0|``) and scaled
    back. No duality certificate is formed: CVXPY's ``optimal`` gives ``"optimal"``,
    ``optimal_inaccurate`` gives ``"inaccurate"`` (warning, or ``SolverError`` with
    ``on_inaccurate="raise"``).

    Parameters
    ----------
    D0 : array_like, shape (G*q, p)
    q : int
    A : array_like, shape (r, p)
        Shared row factor (orthonormalised here).
    I_mask : ndarray of bool, shape (G,)
        Contaminated pairs ``I``.
    lam_L, lam_S : float, > 0
    check_tol : float, > 0
        (23) is infeasible unless ``D0_g = D0_g P_A`` on ``I^c``; violations above
        ``check_tol * ||D0||_F`` raise ``ValueError``.

    Returns
    -------
    OracleResult
    """
    import cvxpy as cp  # here, not at import: the iterative paths never need cvxpy
    D0, q, G, lam_L, lam_S, A, I_mask = oracle_inputs(D0, q, A, I_mask, lam_L, lam_S)
    check_tol = check_positive(check_tol, "check_tol")
    check_benign_in_row_space(D0, q, A, I_mask, check_tol)
    B = D0.reshape(G, q, -1)
    Z = B @ A.T                                        # (G, q, r)
    idx_I = np.flatnonzero(I_mask)
    r = A.shape[0]
    # ||D0_g - Y_g A||_F^2 = ||Z_g - Y_g||_F^2 + c_g^2 with c_g = ||D0_g P_A⊥||_F
    cg = np.linalg.norm((B[idx_I] - Z[idx_I] @ A).reshape(idx_I.size, -1), axis=1)

    def build(c):
        Y_I = cp.Variable((idx_I.size * q, r)) if idx_I.size else None
        pos = {g: i for i, g in enumerate(idx_I)}
        blocks = [Y_I[pos[g] * q:(pos[g] + 1) * q, :] if I_mask[g] else Z[g] / c
                  for g in range(G)]
        nuc, cons = nuclear_norm_block_schur(blocks, q)
        obj = (lam_L / c) * nuc
        if idx_I.size:
            resid = cp.reshape(Z[idx_I].reshape(-1, r) / c - Y_I, (idx_I.size, q * r),
                               order="C")
            stacked = cp.hstack([resid, cg[:, None] / c])
            obj = obj + (lam_S / c) * cp.sum(cp.norm(stacked, 2, axis=1))
        return cp.Problem(cp.Minimize(obj), cons), ({"Y_I": Y_I} if idx_I.size else {})

    raw = solve_scaled(build, data_scale(D0), solver=solver, solver_options=solver_options,
                       verbose=verbose)
    status, message = _finish(raw.values, raw, what="oracle (23)", tol=0.0,
                              on_inaccurate=on_inaccurate, relative_gap=None)
    Y = Z.copy()
    if idx_I.size:
        Y[idx_I] = raw.values["Y_I"].reshape(idx_I.size, q, r)
    Y = Y.reshape(G * q, r)
    L = Y @ A
    S = D0 - L
    S.reshape(G, q, -1)[~I_mask] = 0.0
    s, Vt = singular_parts(L)
    objective = lam_L * float(s.sum()) + lam_S * float(np.sqrt(block_sq_norms(S, q)).sum())
    return OracleResult(Y=Y, L=L, S=S, A=A, singular_values=s, Vt=Vt, objective=objective,
                        gap=float("nan"), iterations=raw.iterations, status=status,
                        solver=raw.solver, seconds=raw.seconds, data_norm=op_norm(D0),
                        message=message)


def solve_noisy_oracle(D_hat, q, A, I_mask, lam_L, lam_S, eps, weights=None, *,
                       solver: str = "CLARABEL", on_inaccurate: str = "warn",
                       solver_options: Mapping | None = None,
                       verbose: bool = False) -> OracleResult:
    """Noisy oracle (17): ``min lam_L ||L||_* + lam_S ||S||_{blk,1}`` subject to ``L = L P_A``,
    ``P_I(S) = S`` and ``w_g ||P_g(D̂ - L - S)||_F^2 <= eps_g^2`` for every pair ``g``.

    ``L = Y A`` with ``Y`` free (``A`` orthonormalised); the data constraints are G second-order
    cones ``sqrt(w_g) ||D̂_g - L_g - S_g||_F <= eps_g``. The true ``(L0, S0)`` is feasible only
    when ``w_g <= 1`` (the paper's (17) uses unweighted constraints); an infeasible instance
    raises ``SolverError``. Solved on rescaled data (``D̂ / c``, ``eps / c``, ``lam / c``) and
    scaled back; status from CVXPY's (no certificate), as in :func:`solve_oracle`.

    Parameters
    ----------
    D_hat : array_like, shape (G*q, p)
    q : int
    A : array_like, shape (r, p)
    I_mask : ndarray of bool, shape (G,)
    lam_L, lam_S : float, > 0
    eps : array_like, shape (G,)
        ``eps_g = ||P_g(E)||_F`` (non-negative).
    weights : None or array_like, shape (G,)

    Returns
    -------
    OracleResult
    """
    import cvxpy as cp  # here, not at import: the iterative paths never need cvxpy
    D, q, G, lam_L, lam_S, A, I_mask = oracle_inputs(D_hat, q, A, I_mask, lam_L, lam_S,
                                                      name="D_hat")
    from .contrasts import check_weights

    w = check_weights(weights, G)
    eps = as_float_array(eps, "eps", shape=(G,))
    if np.any(eps < 0):
        raise ValueError(f"eps must be non-negative, got minimum {eps.min()}")
    r, p = A.shape
    idx_I = np.flatnonzero(I_mask)
    # residual blocks: D_g - Y_g A - S_g (S_g = 0 off I)
    rows_I = (idx_I[:, None] * q + np.arange(q)).reshape(-1)
    # sparse scatter of S_I into the I rows (never a dense (Gq, sq) matrix)
    sel = scipy.sparse.csr_matrix((np.ones(rows_I.size), (rows_I, np.arange(rows_I.size))),
                                  shape=(G * q, rows_I.size))
    sw = np.sqrt(np.repeat(w, q))[:, None]

    def build(c):
        Y = cp.Variable((G * q, r))
        S_I = cp.Variable((idx_I.size * q, p)) if idx_I.size else None
        nuc, cons = nuclear_norm_block_schur(Y, q)
        Rexpr = D / c - Y @ A - (sel @ S_I if idx_I.size else 0)
        Rw = cp.reshape(cp.multiply(sw, Rexpr), (G, q * p), order="C")
        cons = cons + [cp.norm(Rw, 2, axis=1) <= eps / c]
        obj = (lam_L / c) * nuc + ((lam_S / c) * block_l1(S_I, q) if idx_I.size else 0)
        out = {"Y": Y} if not idx_I.size else {"Y": Y, "S_I": S_I}
        return cp.Problem(cp.Minimize(obj), cons), out

    raw = solve_scaled(build, data_scale(D, eps), solver=solver, solver_options=solver_options,
                       verbose=verbose)
    status, message = _finish(raw.values, raw, what="noisy oracle (17)", tol=0.0,
                              on_inaccurate=on_inaccurate, relative_gap=None)
    Yv = raw.values["Y"]
    L = Yv @ A
    S = np.zeros_like(D)
    if idx_I.size:
        S[rows_I] = raw.values["S_I"]
    s, Vt = singular_parts(L)
    objective = lam_L * float(s.sum()) + lam_S * float(np.sqrt(block_sq_norms(S, q)).sum())
    return OracleResult(Y=Yv, L=L, S=S, A=A, singular_values=s, Vt=Vt, objective=objective,
                        gap=float("nan"), iterations=raw.iterations, status=status,
                        solver=raw.solver, seconds=raw.seconds, data_norm=op_norm(D),
                        message=message)
