"""CVXPY formulations of CLAIR's convex programs (exact references).

* :func:`nuclear_norm_block_schur` — ``||L||_*`` for a tall row-block matrix as the shared-W
  block-Schur SDP (notes §7.2): ``||L||_* = min 1/2 (tr W + sum_g tr T_g)`` subject to
  ``[[W, L_g^T], [L_g, T_g]] ⪰ 0`` for every block. Exact (for fixed ``W ≻ 0`` the best
  ``sum_g tr T_g`` is ``tr(L W^{-1} L^T)``, minimised at ``W = (L^T L)^{1/2}``), with G cones of
  size p + q instead of one of size Gq + p (``cp.normNuc``), which is what makes CVXPY usable.
* :func:`solve_program7` — penalized program (7) (called by ``solve_penalized(method="cvxpy")``).
* :func:`solve_noiseless` — program (24), ``S`` explicit so the dual of ``L + S = D0`` is ``Q``.
* :func:`solve_oracle` — noiseless oracle (23) in the reduced form ``L = Y A`` (notes §7.3).
* :func:`solve_noisy_oracle` — noisy oracle (17) with per-block SOC constraints.

Every solve checks the CVXPY status: anything but ``optimal`` raises
:class:`~lowrank_fl.results.SolverError`; ``optimal_inaccurate`` is returned (with a warning) only
when ``accept_inaccurate=True``.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse

from ..validation import as_float_array, check_choice, check_positive
from ..linalg import orth
from ..results import ConvergenceWarning, SolverError, SolverResult
from .contrasts import check_block_rows
from .program7 import (LowRankMixin, PenalizedResult, block_sq_norms, check_problem,
                       dual_from_residual, op_norm, singular_parts, zero_objective)

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

SOLVERS = ("CLARABEL", "SCS")
_NUCLEAR = ("schur", "normNuc")
# SCS is first order: its default eps (1e-4) blurs rank decisions (notes §7.7).
_SCS_DEFAULTS = {"eps_abs": 1e-9, "eps_rel": 1e-9, "max_iters": 200_000}


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
    """Block-Schur SDP form of ``||L||_*`` (notes §7.2).

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
    blocks = _blocks_of(L_expr, q)
    n = blocks[0].shape[1]
    W = cp.Variable((n, n), symmetric=True)
    T = [cp.Variable((q, q), symmetric=True) for _ in blocks]
    cons = [cp.bmat([[W, Lg.T], [Lg, Tg]]) >> 0 for Lg, Tg in zip(blocks, T)]
    return 0.5 * (cp.trace(W) + cp.sum(cp.hstack([cp.trace(t) for t in T]))), cons


def block_l1(S_expr, q: int):
    """``||S||_{blk,1} = sum_g ||S_g||_F`` for a (G*q, p) expression (one vectorised norm; in C
    order row g of the (G, q*p) reshape is block g, notes §7.3)."""
    rows, p = S_expr.shape
    return cp.sum(cp.norm(cp.reshape(S_expr, (rows // q, q * p), order="C"), 2, axis=1))


# --------------------------------------------------------------------------------------------
# solving with status checks


def _solve(problem: cp.Problem, solver: str, accept_inaccurate: bool, options, verbose):
    check_choice(solver, "solver", SOLVERS)
    opts = dict(_SCS_DEFAULTS) if solver == "SCS" else {}
    opts.update(options or {})
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # CVXPY's own "Solution may be inaccurate" warning is replaced by our status handling
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            problem.solve(solver=solver, verbose=verbose, **opts)
    except cp.error.SolverError as exc:
        raise SolverError(f"CVXPY/{solver} failed: {exc}", status="solver_error") from exc
    seconds = time.perf_counter() - t0
    status = problem.status
    if status == cp.OPTIMAL_INACCURATE and accept_inaccurate:
        warnings.warn(f"CVXPY/{solver} returned optimal_inaccurate; the solution is not exact",
                      ConvergenceWarning, stacklevel=3)
    elif status != cp.OPTIMAL:
        raise SolverError(f"CVXPY/{solver} did not solve the problem to optimality",
                          status=status)
    stats = problem.solver_stats
    iters = -1 if stats is None or stats.num_iters is None else int(stats.num_iters)
    return status, iters, seconds


def solve_program7(D, q, lam_L, lam_S, weights=None, *, solver: str = "CLARABEL",
                   nuclear: str = "schur", accept_inaccurate: bool = False,
                   solver_options: dict | None = None, verbose: bool = False) -> PenalizedResult:
    """Program (7) solved exactly with CVXPY.

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

    Returns
    -------
    PenalizedResult
        With ``gap`` from the dual formula of notes §7.6 at the returned point, so it is
        comparable with the iterative methods.
    """
    D, q, G, lam_L, lam_S, w = check_problem(D, q, lam_L, lam_S, weights)
    check_choice(solver, "solver", SOLVERS)
    check_choice(nuclear, "nuclear", _NUCLEAR)
    p = D.shape[1]
    L = cp.Variable((G * q, p))
    S = cp.Variable((G * q, p))
    sw = np.sqrt(np.repeat(w, q))[:, None]
    loss = 0.5 * cp.sum_squares(cp.multiply(sw, D - L - S))
    if nuclear == "schur":
        nuc, cons = nuclear_norm_block_schur(L, q)
    else:
        nuc, cons = cp.normNuc(L), []
    prob = cp.Problem(cp.Minimize(loss + lam_L * nuc + lam_S * block_l1(S, q)), cons)
    status, iters, seconds = _solve(prob, solver, accept_inaccurate, solver_options, verbose)
    Lv, Sv = np.asarray(L.value, dtype=float), np.asarray(S.value, dtype=float)
    s, Vt = singular_parts(Lv)
    R = D - Lv - Sv
    objective = 0.5 * float(w @ block_sq_norms(R, q)) + lam_L * float(s.sum()) \
        + lam_S * float(np.sqrt(block_sq_norms(Sv, q)).sum())
    Q, dual = dual_from_residual(D, q, R, w, lam_L, lam_S)
    return PenalizedResult(
        L=Lv, S=Sv, Q=Q, dual=float(dual), singular_values=s, Vt=Vt, q=q, lam_L=lam_L,
        lam_S=lam_S, weights=w, objective=objective, gap=objective - dual, iterations=iters,
        status=status, solver=f"cvxpy:{solver}" + ("" if nuclear == "schur" else ":normNuc"),
        seconds=seconds, gap_scale=zero_objective(D, q, w), data_norm=op_norm(D))


def solve_noiseless(D0, q, lam_L, lam_S, *, solver: str = "CLARABEL", nuclear: str = "schur",
                    accept_inaccurate: bool = False, solver_options: dict | None = None,
                    verbose: bool = False) -> NoiselessResult:
    """Noiseless program (24): ``min lam_L ||L||_* + lam_S ||S||_{blk,1}`` s.t. ``L + S = D0``.

    Parameters
    ----------
    D0 : array_like, shape (G*q, p)
        Noiseless contrast ``L0 + S0`` (15).
    q : int
    lam_L, lam_S : float, > 0
    solver : {"CLARABEL", "SCS"}

    Returns
    -------
    NoiselessResult
        ``Q`` is the dual of the equality (sign fixed: ``<Q, L> >= 0``); by Theorem 1 only the
        row space of ``L`` (``result.projector(r)``) is determined, not ``L`` itself.
    """
    D0, q, G, lam_L, lam_S = _check_unweighted(D0, q, lam_L, lam_S, "D0")
    check_choice(nuclear, "nuclear", _NUCLEAR)
    p = D0.shape[1]
    L = cp.Variable((G * q, p))
    S = cp.Variable((G * q, p))
    if nuclear == "schur":
        nuc, cons = nuclear_norm_block_schur(L, q)
    else:
        nuc, cons = cp.normNuc(L), []
    eq = L + S == D0
    prob = cp.Problem(cp.Minimize(lam_L * nuc + lam_S * block_l1(S, q)), cons + [eq])
    status, iters, seconds = _solve(prob, solver, accept_inaccurate, solver_options, verbose)
    Lv, Sv = np.asarray(L.value, dtype=float), np.asarray(S.value, dtype=float)
    Q = np.asarray(eq.dual_value, dtype=float)
    # CVXPY's sign convention for equality duals (notes §7.7): at an optimum <Q, D0> is the
    # optimal value, > 0 unless D0 = 0 (<Q, L> would be ~0 when L = 0 and fix nothing)
    if np.vdot(Q, D0) < 0:
        Q = -Q
    s, Vt = singular_parts(Lv)
    objective = lam_L * float(s.sum()) + lam_S * float(np.sqrt(block_sq_norms(Sv, q)).sum())
    return NoiselessResult(
        L=Lv, S=Sv, Q=Q, singular_values=s, Vt=Vt, objective=objective,
        gap=objective - float(np.vdot(Q, D0)), iterations=iters, status=status,
        solver=f"cvxpy:{solver}", seconds=seconds, data_norm=op_norm(D0))


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
                 accept_inaccurate: bool = False, solver_options: dict | None = None,
                 verbose: bool = False, check_tol: float = 1e-8) -> OracleResult:
    """Noiseless oracle (23) in reduced form (notes §7.3).

    ``L = Y A`` (so ``L = L P_A``), ``Y_g = D0_g A^T`` fixed on benign blocks ``I^c`` (where
    ``S = 0`` forces ``L_g = D0_g``), free on ``I``; ``||Y A||_* = ||Y||_*`` because ``A`` has
    orthonormal rows, so the block-Schur cones have size ``r + q``::

        min_{Y_I}  lam_L ||Y||_* + lam_S sum_{g in I} ||D0_g - Y_g A||_F

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
    D0, q, G, lam_L, lam_S, A, I_mask = oracle_inputs(D0, q, A, I_mask, lam_L, lam_S)
    check_tol = check_positive(check_tol, "check_tol")
    check_benign_in_row_space(D0, q, A, I_mask, check_tol)
    B = D0.reshape(G, q, -1)
    Z = B @ A.T                                        # (G, q, r)
    idx_I = np.flatnonzero(I_mask)
    r = A.shape[0]
    Y_I = cp.Variable((idx_I.size * q, r)) if idx_I.size else None
    pos = {g: i for i, g in enumerate(idx_I)}
    blocks = [Y_I[pos[g] * q:(pos[g] + 1) * q, :] if I_mask[g] else Z[g] for g in range(G)]
    nuc, cons = nuclear_norm_block_schur(blocks, q)
    obj = lam_L * nuc
    if idx_I.size:
        # ||D0_g - Y_g A||_F^2 = ||Z_g - Y_g||_F^2 + c_g^2 with c_g = ||D0_g P_A⊥||_F
        c = np.linalg.norm((B[idx_I] - Z[idx_I] @ A).reshape(idx_I.size, -1), axis=1)
        resid = cp.reshape(Z[idx_I].reshape(-1, r) - Y_I, (idx_I.size, q * r), order="C")
        stacked = cp.hstack([resid, c[:, None]])
        obj = obj + lam_S * cp.sum(cp.norm(stacked, 2, axis=1))
    prob = cp.Problem(cp.Minimize(obj), cons)
    status, iters, seconds = _solve(prob, solver, accept_inaccurate, solver_options, verbose)
    Y = Z.copy()
    if idx_I.size:
        Y[idx_I] = np.asarray(Y_I.value, dtype=float).reshape(idx_I.size, q, r)
    Y = Y.reshape(G * q, r)
    L = Y @ A
    S = D0 - L
    S.reshape(G, q, -1)[~I_mask] = 0.0
    s, Vt = singular_parts(L)
    objective = lam_L * float(s.sum()) + lam_S * float(np.sqrt(block_sq_norms(S, q)).sum())
    return OracleResult(Y=Y, L=L, S=S, A=A, singular_values=s, Vt=Vt, objective=objective,
                        gap=float("nan"), iterations=iters, status=status,
                        solver=f"cvxpy:{solver}", seconds=seconds, data_norm=op_norm(D0))


def solve_noisy_oracle(D_hat, q, A, I_mask, lam_L, lam_S, eps, weights=None, *,
                       solver: str = "CLARABEL", accept_inaccurate: bool = False,
                       solver_options: dict | None = None, verbose: bool = False) -> OracleResult:
    """Noisy oracle (17): ``min lam_L ||L||_* + lam_S ||S||_{blk,1}`` subject to ``L = L P_A``,
    ``P_I(S) = S`` and ``w_g ||P_g(D̂ - L - S)||_F^2 <= eps_g^2`` for every pair ``g``.

    ``L = Y A`` with ``Y`` free (``A`` orthonormalised); the data constraints are G second-order
    cones ``sqrt(w_g) ||D̂_g - L_g - S_g||_F <= eps_g``. The true ``(L0, S0)`` is feasible only
    when ``w_g <= 1`` (notes §8 flag 9); an infeasible instance raises ``SolverError``.

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
    D, q, G, lam_L, lam_S, A, I_mask = oracle_inputs(D_hat, q, A, I_mask, lam_L, lam_S,
                                                      name="D_hat")
    from .contrasts import check_weights

    w = check_weights(weights, G)
    eps = as_float_array(eps, "eps", shape=(G,))
    if np.any(eps < 0):
        raise ValueError(f"eps must be non-negative, got minimum {eps.min()}")
    r, p = A.shape
    Y = cp.Variable((G * q, r))
    idx_I = np.flatnonzero(I_mask)
    S_I = cp.Variable((idx_I.size * q, p)) if idx_I.size else None
    nuc, cons = nuclear_norm_block_schur(Y, q)
    # residual blocks: D_g - Y_g A - S_g (S_g = 0 off I)
    rows_I = (idx_I[:, None] * q + np.arange(q)).reshape(-1)
    # sparse scatter of S_I into the I rows (never a dense (Gq, sq) matrix)
    sel = scipy.sparse.csr_matrix((np.ones(rows_I.size), (rows_I, np.arange(rows_I.size))),
                                  shape=(G * q, rows_I.size))
    Rexpr = D - Y @ A - (sel @ S_I if idx_I.size else 0)
    sw = np.sqrt(np.repeat(w, q))[:, None]
    Rw = cp.reshape(cp.multiply(sw, Rexpr), (G, q * p), order="C")
    cons = cons + [cp.norm(Rw, 2, axis=1) <= eps]
    obj = lam_L * nuc + (lam_S * block_l1(S_I, q) if idx_I.size else 0)
    prob = cp.Problem(cp.Minimize(obj), cons)
    status, iters, seconds = _solve(prob, solver, accept_inaccurate, solver_options, verbose)
    Yv = np.asarray(Y.value, dtype=float)
    L = Yv @ A
    S = np.zeros_like(D)
    if idx_I.size:
        S[rows_I] = np.asarray(S_I.value, dtype=float)
    s, Vt = singular_parts(L)
    objective = lam_L * float(s.sum()) + lam_S * float(np.sqrt(block_sq_norms(S, q)).sum())
    return OracleResult(Y=Yv, L=L, S=S, A=A, singular_values=s, Vt=Vt, objective=objective,
                        gap=float("nan"), iterations=iters, status=status,
                        solver=f"cvxpy:{solver}", seconds=seconds, data_norm=op_norm(D))
