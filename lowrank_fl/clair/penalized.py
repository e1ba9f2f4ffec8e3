"""Solvers of the penalized CLAIR program (7): Algorithm 1, FISTA, and the CVXPY reference.

The program itself (objective, dual, duality gap, KKT residuals, the result class) lives in
:mod:`~lowrank_fl.clair.program7`; every solver here is certified by its duality gap.

Solvers (:func:`solve_penalized`):

* ``"proxgrad"`` — Algorithm 1 exactly as printed: ``L^0 = S^0 = 0``, gradients (19),
  update (21) ``L <- SVT(L + t P_w R; t lam_L)``, ``S <- BST(S + t P_w R; t lam_S)`` with the
  constant step ``t = 1/(2 max_g w_g)`` (the inverse Lipschitz constant of the loss on the
  product space). ``tol=None`` runs exactly ``max_iter`` steps (the paper's fixed M); else a
  stalled certificate stops it (``"stalled"``, :mod:`lowrank_fl.stall`), like FISTA.
* ``"fista"`` — the same prox steps with Nesterov/FISTA momentum and O'Donoghue–Candès adaptive
  restart (function restart: a step that raises the objective is redone from the last iterate
  without momentum, so the objective never increases; gradient restart resets momentum when it
  points against the last step).
* ``"cvxpy"`` — the exact conic program of :mod:`lowrank_fl.clair.programs` (block-wise Schur
  form of the nuclear norm).

The hot path is one SVT per iteration. A (Gq, p) thin SVD through LAPACK costs about ten times
more than the p x p Gram eigendecomposition ``D^T D = V diag(s^2) V^T`` followed by
``SVT(M) = M V diag((s - tau)_+ / s) V^T`` (measured: 0.20 s vs 0.02 s at 158400 x 32), so the
Gram route is the default. It loses relative accuracy only for singular values below about
``sqrt(eps) * sigma_1``; those are thresholded to zero whenever ``tau > 1e-6 sigma_1``, and
otherwise (``svd="auto"``) the step falls back to LAPACK.
"""
from __future__ import annotations

import time
import warnings
from typing import Mapping
import numpy as np
import scipy.linalg

from ..validation import check_choice, check_gap_tolerance, check_int, check_positive
from ..results import ConvergenceWarning
from ..stall import DEFAULT_WINDOWS, INACCURATE, StallRule, check_stall_window
from .solver_options import DEFAULT, check_applicable
from .program7 import (LowRankMixin, PenalizedResult, block_sq_norms, certify,
                       check_problem, check_same_shape, dual_point, dual_scale_from_residual,
                       dual_value, duality_gap, frobenius_inner, kkt_residuals, op_norm,
                       penalized_objective, rescale_result, zero_objective)
from .programs import DEFAULT_TOL, solve_program7
from ..conic import safe_scale

__all__ = [
    "PenalizedResult",
    "LowRankMixin",
    "solve_penalized",
    "penalized_objective",
    "dual_point",
    "dual_value",
    "duality_gap",
    "kkt_residuals",
    "METHODS",
]

METHODS = ("fista", "proxgrad", "cvxpy")
_SVD_MODES = ("auto", "gram", "lapack")
# Gram route is accurate for singular values above ~sqrt(eps)*sigma_1 = 1.5e-8 sigma_1; keep a
# 100x margin before trusting it to decide which values survive the threshold.
_GRAM_SAFE_RATIO = 1e-6
# below this p a full p x p eigendecomposition is as cheap as a partial one
_PARTIAL_MIN_P = 48
# FISTA works on row chunks of about this many bytes per array (several live at once: they
# should stay in the last-level cache); arrays up to _SINGLE_PASS_BYTES are done in one piece
_CHUNK_BYTES = 1 << 19
_SINGLE_PASS_BYTES = 1 << 23


# --------------------------------------------------------------------------------------------
# proximal operators on the hot path (no input validation here)


def _svt(M, tau, mode, out=None):
    """SVT(M; tau) = U diag((s - tau)_+) V^T. Returns X, the new singular values, and their
    right singular vectors as rows: (p,) and (p, p) — or, on the partial route, only the
    ``k`` values above the threshold, (k,) and (k, p) (complete them with
    :func:`_complete_right_basis`). ``out``: optional array of M's shape (not M itself) that
    receives X. Gram route: :func:`_gram_svt`."""
    if mode != "lapack":
        C = M.T @ M
        if not np.all(np.isfinite(C)):
            return None, None, None                     # overflow: the caller stops ("diverged")
        parts = _gram_svt(C, tau, mode)
        if parts is not None:
            V, f, snew, Vt = parts
            if V.shape[1] == 0:                         # s_1 <= tau: SVT(M) = 0
                if out is None:
                    return np.zeros_like(M), snew, Vt
                out.fill(0.0)
                return out, snew, Vt
            return _shrink(M, V, f, out), snew, Vt
    if not np.all(np.isfinite(M)):
        return None, None, None
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    snew = np.maximum(s - tau, 0.0)
    k = int(np.count_nonzero(snew))
    X = np.matmul(U[:, :k] * snew[:k], Vt[:k], out=out)
    snew, Vt = _complete_right_basis(snew, Vt)
    return X, snew, Vt


def _gram_svt(C, tau, mode):
    """The SVT of M from its p x p Gram ``C = M^T M``: ``(V, f, snew, Vt)`` with
    ``SVT(M) = M V diag(f) V^T`` (``V`` (p, k): the kept right singular vectors), the new
    singular values and right singular vectors as rows — or None when the Gram cannot resolve
    the kept values (``mode="auto"`` and ``tau <= 1e-6 sigma_1``: use LAPACK on M).

    Partial route (``p >= _PARTIAL_MIN_P``, ``tau > 0``): only the eigenpairs of the Gram above
    ``tau^2`` are computed (LAPACK ``syevr`` with a value range), which is all the SVT needs;
    consecutive iterates keep few singular values above the threshold, so this skips most of
    the eigenvector work; ``snew`` and ``Vt`` then hold only those ``k`` values."""
    p = C.shape[0]
    if tau > 0 and p >= _PARTIAL_MIN_P:
        ev, V = scipy.linalg.eigh(C, subset_by_value=(tau * tau, np.inf), driver="evr",
                                  check_finite=False)
        s = np.sqrt(np.maximum(ev[::-1], 0.0))
        V = V[:, ::-1]
        if s.size == 0:
            return V, s, s, V.T
        if mode == "gram" or tau > _GRAM_SAFE_RATIO * s[0]:
            snew = s - tau
            return V, snew / s, snew, V.T
        return None
    ev, V = np.linalg.eigh(C)
    ev, V = ev[::-1], V[:, ::-1]
    s = np.sqrt(np.maximum(ev, 0.0))
    if mode == "gram" or tau > _GRAM_SAFE_RATIO * s[0]:
        keep = s > tau
        snew = np.where(keep, s - tau, 0.0)
        return V[:, keep], snew[keep] / s[keep], snew, V.T
    return None


def _shrink(M, V, f, out):
    """``M V diag(f) V^T`` (the SVT output from the Gram route), written into ``out``.

    With many kept values (``2k >= p``) it is one product with the p x p matrix
    ``V diag(f) V^T``: no (n, k) temporary. Fresh multi-MB arrays page-fault on first touch and
    cost several passes each (measured 0.9 s for a 636800 x 32 temporary vs 0.14 s for the
    product into a recycled buffer), so the hot path avoids them. With few kept values the
    (n, k) temporary is small and two thin products are cheaper."""
    if 2 * V.shape[1] >= M.shape[1]:
        return np.matmul(M, (V * f) @ V.T, out=out)
    Y = M @ V
    Y *= f
    return np.matmul(Y, np.ascontiguousarray(V.T), out=out)


def _complete_right_basis(s, Vt):
    """Pad a thin SVD's ``s`` (m,) and ``Vt`` (m, p) with ``m < p`` (fewer rows than columns) to
    ``p`` values (zeros) and an orthonormal (p, p) basis."""
    p = Vt.shape[1]
    if Vt.shape[0] == 0:
        return np.zeros(p), np.eye(p)
    if Vt.shape[0] < p:
        Vt = np.vstack([Vt, scipy.linalg.null_space(Vt).T])
        s = np.concatenate([s, np.zeros(p - s.size)])
    return s, Vt


def _svd_parts(L):
    """Singular values (p,) and a full (p, p) right basis of a tall ``L`` (thin SVD only: the
    full left factor would be Gq x Gq)."""
    _, s, Vt = np.linalg.svd(L, full_matrices=False)
    return _complete_right_basis(s, Vt)


def _bst(M, q, tau, inplace=False):
    """Block soft threshold of a (G*q, p) matrix; returns X and the new block norms (G,).
    ``inplace=True`` overwrites ``M`` (a temporary on the hot path)."""
    B = M.reshape(-1, q, M.shape[1])
    # not linalg.block_norms: its finiteness check would cost a pass and raise on an overflow
    # that the loop must report as "diverged"
    n = np.sqrt(np.einsum("gij,gij->g", B, B))
    nnew = np.maximum(n - tau, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(n > tau, nnew / n, 0.0)
    if inplace:
        B *= f[:, None, None]
        return M, nnew
    return (B * f[:, None, None]).reshape(M.shape), nnew


# --------------------------------------------------------------------------------------------
# the solver


#: Default relative-gap tolerance of the iterative methods.
ITERATIVE_TOL = 1e-8
#: a step_size this many times below 1/(2 max w) is named in a max_iter or stall warning as a
#: likely cause (it moves the iterates that much less per iteration)
SMALL_STEP = 100.0


def solve_penalized(D, q, lam_L, lam_S, *, weights=None, method: str = "fista",
                    solver: str | None = None, tol=DEFAULT, max_iter: int = 10000,
                    step_size: float | None = None, init=None,
                    solver_options: Mapping | None = None, check_every: int = 5,
                    svd: str = "auto", nuclear: str = "schur", on_inaccurate: str = "warn",
                    verbose: bool = False, step=DEFAULT, stall_window=DEFAULT) -> PenalizedResult:
    """Solve the penalized CLAIR program (7).

    Parameters
    ----------
    D : array_like, shape (G*q, p)
        Stacked contrasts ``D̂`` (eq. (6)), e.g. from :func:`~lowrank_fl.clair.contrasts.contrasts`.
    q : int
        Block height (rows per pair).
    lam_L, lam_S : float, > 0
        Penalties of the nuclear and block-l1 norms.
    weights : None, float or array_like of shape (G,)
        Pair weights ``w_g`` (``None``: ``1/K`` as in §7).
    method : {"fista", "proxgrad", "cvxpy"}
        The algorithm: ``"proxgrad"`` is Algorithm 1 as printed (eqs. (19)–(21)); ``"fista"`` adds
        momentum with adaptive restart; ``"cvxpy"`` solves the conic program exactly.
    solver : {"CLARABEL", "SCS"} or None
        The CVXPY backend for ``method="cvxpy"`` (default CLARABEL); must be None otherwise.
    tol : float or None
        Relative duality gap ``gap / F(0, 0)``, ``F(0, 0) = 1/2 sum_g w_g ||D_g||_F^2`` (the
        result's ``relative_gap``, independent of the data's units). Iterative methods stop when
        it is reached (checked every ``check_every`` iterations; default 1e-8); ``None`` runs
        exactly ``max_iter`` steps (status ``"completed"``: the paper's fixed M). For
        ``method="cvxpy"`` it is the certificate that makes the answer ``"optimal"`` (default
        1e-7), whatever CVXPY's status string says; otherwise the status is ``"inaccurate"``.
    max_iter : int
        Iteration cap (iterative methods); hitting it before ``tol`` gives status ``"max_iter"``
        and a :class:`~lowrank_fl.results.ConvergenceWarning`.
    step_size : float or None
        Step ``t``; default ``1/(2 max_g w_g)``, Algorithm 1's choice (the loss gradient is
        ``2 max w``-Lipschitz on the product space (L, S)). Larger steps may not descend.
    init : tuple (L0, S0) of arrays (G*q, p), optional
        Warm start (default zeros, as in Algorithm 1).

    Units: data whose largest entry lies outside ``1e-100..1e100`` (where squares leave
    float64) are solved as ``(D / c, lam / c)`` and the solution scaled back (``L``, ``S``, ``Q``
    by ``c``; objective and gaps by ``c^2``, which over- or underflows beyond about
    ``1e+-154``: ``message`` states the certified relative gap either way).
    solver_options : mapping, optional
        Keyword arguments for ``cvxpy.Problem.solve`` (``method="cvxpy"`` only).
    check_every : int
        Duality-gap evaluation period (each costs one p x p Gram of ``P_w R``).
    svd : {"auto", "gram", "lapack"}
        How the SVT is computed (module docstring).
    nuclear : {"schur", "normNuc"}
        CVXPY nuclear-norm formulation; ``"normNuc"`` (one PSD cone of size Gq + p) is slow and
        kept for benchmarks only.
    on_inaccurate : {"warn", "raise"}
        CVXPY: an answer whose certified gap misses ``tol`` warns (status ``"inaccurate"``) or
        raises :class:`~lowrank_fl.results.SolverError`.
    verbose : bool
        CVXPY solver output (``method="cvxpy"`` only).
    step : float
        Deprecated alias of ``step_size``.
    stall_window : float > 1 or None
        Stop with status ``"stalled"`` (``StalledWarning``) when the best certified relative gap,
        above ``2 tol``, fell less than 2x from iteration ``k / stall_window`` to ``k`` (from
        ``k / stall_window >= 25`` on; :mod:`lowrank_fl.stall`); default 4 for FISTA (rate 1/k^2:
        ~16 over the window), 8 for ``"proxgrad"`` (1/k: ~8); None: off.

    Options of the other family (``max_iter``, ``step_size``, ``init``, ``check_every``,
    ``stall_window``, ``svd`` for the iterative methods; ``solver``, ``nuclear``, ``on_inaccurate``,
    ``solver_options``, ``verbose`` for CVXPY) must keep their defaults: a ``ValueError`` names
    any that would be ignored.

    Returns
    -------
    PenalizedResult
        ``.L, .S`` (G*q, p), ``.objective``, ``.gap``, ``.relative_gap``, ``.iterations``,
        ``.status``, ``.message``, ``.history`` (``"objective"`` per iteration, ``"gap"`` at
        ``"gap_iteration"``). The iterative methods' status: ``"optimal"`` (``|gap| <= tol``,
        relative), ``"max_iter"``, ``"stalled"``, ``"inaccurate"`` (a gap below ``-tol``, which
        weak duality forbids: the certificate is rounding, :meth:`lowrank_fl.stall.StallRule.broken`;
        it stops at once and warns), ``"diverged"``, ``"completed"`` (``tol=None``).

    Raises
    ------
    ValueError, TypeError
        Bad input (named). ``SolverError`` for a CVXPY failure.
    """
    t0 = time.perf_counter()
    if step is not DEFAULT:
        warnings.warn("solve_penalized(step=...) is deprecated; use step_size=...",
                      DeprecationWarning, stacklevel=2)
        if step_size is not None:
            raise TypeError("pass step_size only (step is its deprecated alias), not both")
        step_size = step
    D, q, G, lam_L, lam_S, w = check_problem(D, q, lam_L, lam_S, weights)
    check_choice(method, "method", METHODS)
    check_applicable(method, max_iter=max_iter, solver=solver, step_size=step_size, init=init,
                     check_every=check_every, svd=svd, nuclear=nuclear,
                     on_inaccurate=on_inaccurate, solver_options=solver_options,
                     verbose=verbose, stall_window=stall_window)
    if method == "cvxpy":
        if tol is None:
            raise ValueError("tol=None (a fixed number of iterations) needs an iterative method; "
                             "method='cvxpy' needs a positive tol for its certificate")
        return solve_program7(D, q, lam_L, lam_S, w, solver="CLARABEL" if solver is None else solver,
                              nuclear=nuclear, tol=DEFAULT_TOL if tol is DEFAULT else tol,
                              on_inaccurate=on_inaccurate, solver_options=solver_options,
                              verbose=verbose)
    if tol is DEFAULT:
        tol = ITERATIVE_TOL
    elif tol is not None:
        tol = check_gap_tolerance(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    check_every = check_int(check_every, "check_every", minimum=1)
    check_choice(svd, "svd", _SVD_MODES)
    stall = StallRule(DEFAULT_WINDOWS[method] if stall_window is DEFAULT
                      else check_stall_window(stall_window), tol)
    t_max = 1.0 / (2.0 * float(w.max()))
    t = t_max if step_size is None else check_positive(step_size, "step_size")
    if t > t_max * (1 + 1e-12):
        warnings.warn(f"step_size={t:.4g} is above 1/(2 max w) = {t_max:.4g}, the step for which "
                      f"{method} provably descends: it may diverge", UserWarning, stacklevel=2)
    if init is not None and not (isinstance(init, (tuple, list)) and len(init) == 2):
        raise TypeError(f"init must be a pair (L0, S0) of arrays, got {type(init).__name__}")
    # (7) is homogeneous: data whose squares would leave float64 (the Gram route of the SVT,
    # the objective) are solved as D / c, lam / c (c a power of two: exact) and scaled back
    c = safe_scale(D)
    if c != 1.0:
        D, lam_L, lam_S = D / c, lam_L / c, lam_S / c
    if init is None:
        L = np.zeros_like(D)
        S = np.zeros_like(D)
    else:
        L = check_same_shape(init[0], "init[0] (L0)", D) / c
        S = check_same_shape(init[1], "init[1] (S0)", D) / c
    scale = zero_objective(D, q, w)
    # where the iterates start: a solve that stalls above it diverged (the stall rule's check)
    stall.start_objective = scale if init is None else penalized_objective(D, q, L, S, lam_L, lam_S, w)
    loop = _fista if method == "fista" else _proxgrad
    with np.errstate(over="ignore", invalid="ignore"):  # blow-ups are caught as "diverged"
        out = loop(D, q, w, lam_L, lam_S, t, L, S, tol, max_iter, check_every, svd, scale, stall)
    L, S, sv, Vt, it, status, hist, div_at = out
    sv, Vt = _complete_right_basis(sv, Vt)              # the partial SVT keeps only s > tau
    cert = certify(D, q, L, S, lam_L, lam_S, w, singular_values=sv)
    # a step far below the largest safe one moves the iterates little per iteration: name it
    slow = (f"; step_size t={t:.3g} is {t_max / t:.3g}x below 1/(2 max w) = {t_max:.3g} (the default), "
            "which moves the iterates that much less per iteration" if t < t_max / SMALL_STEP else "")
    if status == "max_iter":
        message = (f"solve_penalized(method={method!r}) stopped at max_iter={max_iter} with "
                   f"relative duality gap {cert.relative_gap:.3e} > tol={tol:.1e}" + slow)
        warnings.warn(message, ConvergenceWarning, stacklevel=2)
    elif status == "stalled":
        message = stall.warn(f"solve_penalized(method={method!r})", it, cert.relative_gap, slow)
    elif status == INACCURATE:
        message = stall.warn_broken(f"solve_penalized(method={method!r})", it, cert.relative_gap)
    elif status == "diverged":
        why = ("non-finite objective" if not np.isfinite(cert.objective) or not hist["objective"].size
               or not np.isfinite(hist["objective"][-1]) else
               "its objective stopped falling above its value at the start")
        message = (f"solve_penalized(method={method!r}) diverged at iteration {div_at} "
                   f"({why}; step_size t={t:.3g}, 1/(2 max w) = {t_max:.3g})")
        warnings.warn(message, ConvergenceWarning, stacklevel=2)
    elif status == "optimal":
        message = (f"{method} reached relative duality gap {cert.relative_gap:.2e} <= "
                   f"tol={tol:.1e} after {it} iterations")
    else:
        message = (f"{method} ran the requested {it} iterations (tol=None); relative duality "
                   f"gap {cert.relative_gap:.2e}")
    return rescale_result(PenalizedResult(
        L=L, S=S, Q=cert.Q, dual=cert.dual, singular_values=sv, Vt=Vt, q=q, lam_L=lam_L,
        lam_S=lam_S, weights=w, diverged_at=div_at, objective=cert.objective, gap=cert.gap,
        iterations=it, status=status, solver=method, seconds=time.perf_counter() - t0,
        history=hist, gap_scale=cert.scale, data_norm=op_norm(D), message=message + "."), c)


def _history(objs, gaps, gap_its):
    return {"objective": np.asarray(objs, dtype=float), "gap": np.asarray(gaps, dtype=float),
            "gap_iteration": np.asarray(gap_its, dtype=int)}


def _initial_sv(L, svd):
    """Singular values and right singular vectors of the starting ``L`` (no SVT product)."""
    if svd != "lapack":
        C = L.T @ L
        if np.all(np.isfinite(C)):
            _, _, s, Vt = _gram_svt(C, 0.0, "gram")
            return s, Vt
    _, s, Vt = _svt(L, 0.0, "lapack" if svd == "lapack" else "gram")
    return s, Vt


def _converged(D, q, R, w, lam_L, lam_S, F, it, tol, scale, gaps, gap_its, r2=None) -> bool:
    """Record the duality gap at iteration ``it``; True when ``|gap| <= tol * F(0, 0)`` (a gap
    below ``-tol * F(0, 0)`` is a broken certificate, :meth:`lowrank_fl.stall.StallRule.broken`).
    ``r2``: the residual's block norms ``||R^(g)||_F^2`` when already known."""
    _, dual = dual_scale_from_residual(D, q, R, w, lam_L, lam_S, sq_norms=r2)
    gaps.append(F - dual)
    gap_its.append(it)
    return tol is not None and abs(F - dual) <= tol * scale


def _proxgrad(D, q, w, lam_L, lam_S, t, L, S, tol, max_iter, check_every, svd, scale, stall):
    """Algorithm 1, eqs. (19)–(21), with constant step t."""
    twr = t * np.repeat(w, q)[:, None]
    R = D - L - S
    sv, Vt = _initial_sv(L, svd)
    objs, gaps, gap_its = [], [], []
    status = "completed" if tol is None else "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        G = R * twr                                         # t P_w R^m, the gradient step (19)
        Ln, sv_n, Vt_n = _svt(L + G, t * lam_L, svd)        # (21), L-update
        if Ln is None:
            return (L, S, sv, Vt, it - 1, "diverged", _history(objs, gaps, gap_its), it)
        G += S
        Sn, sn = _bst(G, q, t * lam_S, inplace=True)        # (21), S-update
        del G
        Rn = D - Ln
        Rn -= Sn
        F = 0.5 * float(w @ block_sq_norms(Rn, q)) + lam_L * float(sv_n.sum()) + lam_S * float(sn.sum())
        if not np.isfinite(F):
            return (L, S, sv, Vt, it - 1, "diverged", _history(objs, gaps, gap_its), it)
        L, S, R, sv, Vt = Ln, Sn, Rn, sv_n, Vt_n
        objs.append(F)
        if it % check_every == 0 or it == max_iter:
            if _converged(D, q, R, w, lam_L, lam_S, F, it, tol, scale, gaps, gap_its):
                status = "optimal"
                break
            if stall.broken(gaps[-1] / scale):                      # lowrank_fl.stall
                status = INACCURATE
                break
            if stall.check(it, gaps[-1] / scale, F / scale):
                # stuck above where it started: the iterates moved away (a step too large)
                status = "diverged" if stall.above_start(F) else "stalled"
                break
    return L, S, sv, Vt, it, status, _history(objs, gaps, gap_its), it if status == "diverged" else None


def _spans(n, q, p):
    """Row ranges ``[a, b)`` of whole q-row blocks, about ``_CHUNK_BYTES`` per (rows, p) slice;
    one range when the arrays are small enough to stay in cache anyway."""
    if n * p * 8 <= _SINGLE_PASS_BYTES:
        return [(0, n)]
    step = max(1, _CHUNK_BYTES // (q * p * 8)) * q
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _fista(D, q, w, lam_L, lam_S, t, L, S, tol, max_iter, check_every, svd, scale, stall):
    """FISTA on the product space with O'Donoghue–Candès function and gradient restarts.

    Written for memory traffic and footprint (the (Gq, p) arrays dominate):

    * the extrapolated point ``y = x + m`` is never stored: the state is ``x = (L, S)``, its
      residual ``R = D - L - S`` and the momentum ``m = y - x`` (``None``: ``y = x``); the
      SVT/BST inputs ``L + m_L + t P_w R(y)``, ``S + m_S + t P_w R(y)`` with
      ``R(y) = R - m_L - m_S`` are built directly;
    * each step is three passes over row chunks of whole blocks that fit in cache (about
      ``_CHUNK_BYTES`` per array): (1) the prox inputs, the BST and the SVT input's p x p Gram;
      (2) after the small eigenproblem, the SVT output (in place of its input), the new
      residual, its block norms and the inner products of the gradient-restart test
      ``<y - x+, x+ - x> = <m, d> - ||d||^2`` (``d = x+ - x``); (3) the new momentum
      ``beta d`` (in place of the old ``x``). Elementwise numpy on whole arrays would stream
      every operand from memory once per operation;
    * at most nine (Gq, p) arrays are alive, ``D`` included; they come from a small pool of
      recycled buffers (fresh multi-MB allocations page-fault and cost a third more per pass).
    """
    pool = []

    def take():
        return pool.pop() if pool else np.empty_like(D)

    n, p = D.shape
    spans = _spans(n, q, p)
    rows = spans[0][1]
    gbuf, dbuf = np.empty((rows, p)), np.empty((rows, p))   # chunk temporaries
    twr = t * np.repeat(w, q)[:, None]
    tau_L, tau_S = t * lam_L, t * lam_S
    gram = svd != "lapack"
    R = D - L - S
    sv, Vt = _initial_sv(L, svd)
    r2 = block_sq_norms(R, q)
    F = 0.5 * float(w @ r2) + lam_L * float(sv.sum()) \
        + lam_S * float(np.sqrt(block_sq_norms(S, q)).sum())
    mL = mS = None                       # momentum y - x (None: y == x, a plain prox step)
    theta = 1.0
    objs, gaps, gap_its = [], [], []
    status = "completed" if tol is None else "max_iter"
    it = 0
    G = D.shape[0] // q
    for it in range(1, max_iter + 1):
        # pass 1: A = y_L + t P_w R(y) (the SVT input), Sn = BST(y_S + t P_w R(y)), C = A^T A
        A, Sn = take(), take()
        sn = np.empty(G)
        C = np.zeros((p, p))
        for a, b in spans:
            g = gbuf[:b - a]
            if mL is None:
                np.multiply(R[a:b], twr[a:b], out=g)
            else:
                np.subtract(R[a:b], mL[a:b], out=g)
                g -= mS[a:b]
                g *= twr[a:b]
            Ac, Sc = A[a:b], Sn[a:b]
            if mL is None:
                np.add(L[a:b], g, out=Ac)
                np.add(g, S[a:b], out=Sc)
            else:
                np.add(L[a:b], mL[a:b], out=Ac)
                Ac += g
                np.add(g, S[a:b], out=Sc)
                Sc += mS[a:b]
            if gram:
                C += Ac.T @ Ac
            sn[a // q:b // q] = _bst(Sc, q, tau_S, inplace=True)[1]
        # the SVT from the Gram (or LAPACK on A when the Gram cannot resolve it)
        parts = None
        if gram:
            if not np.all(np.isfinite(C)):
                pool.extend((A, Sn))
                return (L, S, sv, Vt, it - 1, "diverged", _history(objs, gaps, gap_its), it)
            parts = _gram_svt(C, tau_L, svd)
        if parts is None:
            Ln, sv_n, Vt_n = _svt(A, tau_L, "lapack", out=take())
            pool.append(A)
            if Ln is None:
                return (L, S, sv, Vt, it - 1, "diverged", _history(objs, gaps, gap_its), it)
            V = None
        else:
            Ln = A                                          # the SVT is written over its input
            V, f, sv_n, Vt_n = parts
            k = V.shape[1]
            if 2 * k >= p:
                W = (V * f) @ V.T
            elif k:
                Vf, VT = V * f, np.ascontiguousarray(V.T)
        # pass 2: Ln = SVT(A), Rn = D - Ln - Sn and its block norms, the restart test's <m, d>, |d|^2
        Rn = take()
        rn2 = np.empty(G)
        md = dd = 0.0
        for a, b in spans:
            Lc = Ln[a:b]
            if V is not None:
                if k == 0:
                    Lc.fill(0.0)
                elif 2 * k >= p:
                    np.matmul(Lc, W, out=dbuf[:b - a])
                    Lc[...] = dbuf[:b - a]
                else:
                    np.matmul(Lc @ Vf, VT, out=Lc)
            r = Rn[a:b]
            np.subtract(D[a:b], Lc, out=r)
            r -= Sn[a:b]
            rn2[a // q:b // q] = block_sq_norms(r, q)
            if mL is not None:
                d = np.subtract(Lc, L[a:b], out=dbuf[:b - a])
                md += frobenius_inner(mL[a:b], d)
                dd += frobenius_inner(d, d)
                np.subtract(Sn[a:b], S[a:b], out=d)
                md += frobenius_inner(mS[a:b], d)
                dd += frobenius_inner(d, d)
        Fn = 0.5 * float(w @ rn2) + lam_L * float(sv_n.sum()) + lam_S * float(sn.sum())
        if not np.isfinite(Fn):
            return (L, S, sv, Vt, it - 1, "diverged", _history(objs, gaps, gap_its), it)
        if mL is not None and Fn > F + 1e-15 * abs(F):
            # function restart: drop the step, restart from x without momentum (x unchanged, so
            # the gap check below still applies to it)
            pool.extend((Ln, Sn, Rn, mL, mS))
            theta, mL, mS = 1.0, None, None
        else:
            # gradient restart: <y - x+, x+ - x> = <m - d, d> > 0 means momentum points uphill
            restart = mL is not None and md - dd > 0
            if mL is not None:
                pool.extend((mL, mS))
            pool.append(R)
            theta_n = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * theta * theta))
            beta = (theta - 1.0) / theta_n
            if restart or beta <= 0:
                theta = 1.0 if restart else theta_n
                pool.extend((L, S))
                mL = mS = None
            else:
                # pass 3: m = beta (x+ - x), written over x
                theta = theta_n
                for a, b in spans:
                    for X, Xn in ((L, Ln), (S, Sn)):
                        Xc = X[a:b]
                        np.subtract(Xn[a:b], Xc, out=Xc)
                        Xc *= beta
                mL, mS = L, S
            L, S, R, sv, Vt, F, r2 = Ln, Sn, Rn, sv_n, Vt_n, Fn, rn2
        objs.append(F)
        if it % check_every == 0 or it == max_iter:
            if _converged(D, q, R, w, lam_L, lam_S, F, it, tol, scale, gaps, gap_its, r2):
                status = "optimal"
                break
            if stall.broken(gaps[-1] / scale):                      # lowrank_fl.stall
                status = INACCURATE
                break
            if stall.check(it, gaps[-1] / scale, F / scale):
                # stuck above where it started: the iterates moved away (a step too large)
                status = "diverged" if stall.above_start(F) else "stalled"
                break
    return L, S, sv, Vt, it, status, _history(objs, gaps, gap_its), it if status == "diverged" else None
