"""Nuclear-norm-penalized multi-task least squares: the convex relaxation of the rank-k
multi-task model of FedRep, FLUTE and FedAvg-FT (an exact reference for their representations).

    minimize_Theta  P(Theta) = sum_i 1/(2 m_i) ||X_i theta_i - y_i||^2 + mu ||Theta||_*

``Theta`` is (n, d): row ``i`` is client ``i``'s regression vector ``theta_i`` (the same layout as
``MultitaskProblem.theta = W* B*^T``). Clients may have different sample sizes ``m_i``.

Two solvers:

* :func:`solve_nuclear_cvxpy` — CVXPY (Clarabel by default) through :mod:`lowrank_fl.conic`
  (rescaled data), its status decided by the duality gap below;
* :func:`solve_nuclear_prox` — accelerated proximal gradient (FISTA with adaptive restart) with
  singular value thresholding, certified by the same gap.

Both state relative gaps: ``gap / P(0)`` with ``P(0) = sum_i ||y_i||^2 / (2 m_i)`` (the
results' ``gap_scale``), invariant under rescaling ``(y, mu)``.

Both reduce the data to per-client sufficient statistics ``S_i = X_i^T X_i / m_i`` (d, d),
``b_i = X_i^T y_i / m_i`` (d,) and ``c_i = ||y_i||^2 / (2 m_i)``, so the smooth part is
``f(Theta) = sum_i (1/2 theta_i^T S_i theta_i - b_i^T theta_i + c_i)``, batched over clients.

Duality gap
-----------
Write ``f(Theta) = sum_i h_i(X_i theta_i)`` with ``h_i(z) = ||z - y_i||^2 / (2 m_i)``, whose conjugate
is ``h_i*(u) = m_i ||u||^2 / 2 + u^T y_i``. The conjugate of ``mu ||.||_*`` is the indicator of the
spectral-norm ball of radius ``mu``. Fenchel duality gives the dual

    maximize_u  D(u) = - sum_i (m_i ||u_i||^2 / 2 + u_i^T y_i)
    subject to  ||V(u)||_2 <= mu,   V(u) = [X_1^T u_1, ..., X_n^T u_n]^T  (n, d),

with ``u_i = (X_i theta_i - y_i) / m_i`` at the optimum, where ``V = grad f(Theta)``. From any
primal point we take ``u_i = s (X_i theta_i - y_i) / m_i`` with ``s = min(1, mu / ||grad f||_2)``
(dual feasible), which in sufficient statistics is
``D = - sum_i (s^2 f_i(theta_i) + s (theta_i^T b_i - 2 c_i))``. The gap ``P - D >= 0`` bounds the
suboptimality ``P(Theta) - P*``.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..conic import check_solver, data_scale, decide, solve_scaled
from ..validation import as_float_array, check_int, check_positive
from ..linalg import svt
from ..results import ConvergenceWarning, SolverResult
from ..stall import StallRule, check_stall_window

__all__ = ["NuclearResult", "nuclear_statistics", "nuclear_objective", "nuclear_duality_gap",
           "solve_nuclear_cvxpy", "solve_nuclear_prox"]


@dataclass(frozen=True, kw_only=True)
class NuclearResult(SolverResult):
    """Solution ``Theta`` (n, d) of the nuclear-norm-penalized multi-task least squares, with
    its numerical ``rank``: singular values above ``1e-8 * max`` for the proximal solver (its SVT
    sets the others exactly to 0), above ``sqrt(tol) * max`` for CVXPY (an interior point within
    ``tol`` of the optimum in objective is within about ``sqrt(tol)`` of it in ``Theta``, the
    smooth part being strongly convex: its zero singular values are left at that size)."""

    Theta: np.ndarray
    rank: int


def _check_sizes(n: int, m_min: int, d: int) -> None:
    if n < 1 or m_min < 1 or d < 1:
        raise ValueError(f"X must hold at least one client, one sample per client and one feature, got "
                         f"{n} client(s), {m_min} sample(s) at the fewest and {d} feature(s)")


def _as_client_list(X, y):
    """Accept X (n, m, d) / y (n, m) or sequences of (m_i, d) / (m_i,) arrays."""
    if isinstance(X, np.ndarray) and X.ndim == 3:
        X = as_float_array(X, "X", ndim=3)
        y = as_float_array(y, "y", shape=X.shape[:2])
        _check_sizes(*X.shape)
        return list(X), list(y)
    if not isinstance(X, (list, tuple)) or not isinstance(y, (list, tuple)):
        raise TypeError("X and y must be arrays of shape (n, m, d) and (n, m) or lists of per-client "
                        f"arrays, got {type(X).__name__} and {type(y).__name__}")
    if len(X) != len(y) or len(X) == 0:
        raise ValueError(f"X and y must list the same (positive) number of clients, got {len(X)} and {len(y)}")
    Xs = [as_float_array(Xi, f"X[{i}]", ndim=2) for i, Xi in enumerate(X)]
    d = Xs[0].shape[1]
    Xs = [as_float_array(Xi, f"X[{i}]", shape=(None, d)) for i, Xi in enumerate(Xs)]
    ys = [as_float_array(yi, f"y[{i}]", shape=(Xi.shape[0],)) for i, (Xi, yi) in enumerate(zip(Xs, y))]
    _check_sizes(len(Xs), min(Xi.shape[0] for Xi in Xs), d)
    return Xs, ys


def nuclear_statistics(X, y):
    """Sufficient statistics ``S`` (n, d, d), ``b`` (n, d), ``c`` (n,) of the smooth part."""
    Xs, ys = _as_client_list(X, y)
    if isinstance(X, np.ndarray):
        Xa, ya = np.asarray(Xs), np.asarray(ys)
        m = Xa.shape[1]
        return (np.einsum("nmd,nme->nde", Xa, Xa) / m, np.einsum("nmd,nm->nd", Xa, ya) / m,
                np.sum(ya * ya, axis=1) / (2 * m))
    S = np.stack([Xi.T @ Xi / len(yi) for Xi, yi in zip(Xs, ys)])
    b = np.stack([Xi.T @ yi / len(yi) for Xi, yi in zip(Xs, ys)])
    c = np.array([yi @ yi / (2 * len(yi)) for yi in ys])
    return S, b, c


def _smooth(Theta, S, b, c):
    """Per-client smooth values f_i (n,) and the gradient (n, d)."""
    STheta = np.einsum("nde,ne->nd", S, Theta)
    f = 0.5 * np.einsum("nd,nd->n", Theta, STheta) - np.einsum("nd,nd->n", b, Theta) + c
    return f, STheta - b


def _gap(Theta, mu, S, b, c):
    f, grad = _smooth(Theta, S, b, c)
    sv = np.linalg.svd(Theta, compute_uv=False)
    primal = float(f.sum() + mu * sv.sum())
    gnorm = float(np.linalg.norm(grad, 2))
    s = 1.0 if gnorm <= mu else mu / gnorm
    dual = -float(np.sum(s * s * f + s * (np.einsum("nd,nd->n", Theta, b) - 2 * c)))
    return primal, dual


def nuclear_objective(Theta, X, y, mu: float) -> float:
    """``P(Theta)``; Theta (n, d)."""
    S, b, c = nuclear_statistics(X, y)
    Theta = as_float_array(Theta, "Theta", shape=b.shape)
    return _gap(Theta, check_positive(mu, "mu", strict=False), S, b, c)[0]


def nuclear_duality_gap(Theta, X, y, mu: float) -> float:
    """Duality gap ``P(Theta) - D(u(Theta))`` (module docstring) at any ``Theta`` (n, d)."""
    S, b, c = nuclear_statistics(X, y)
    Theta = as_float_array(Theta, "Theta", shape=b.shape)
    primal, dual = _gap(Theta, check_positive(mu, "mu", strict=False), S, b, c)
    return primal - dual


def _rank(Theta, rtol: float = 1e-8):
    sv = np.linalg.svd(Theta, compute_uv=False)
    return int(np.count_nonzero(sv > rtol * max(sv.max(initial=0.0), np.finfo(float).tiny)))


def _zero_objective(c) -> float:
    """``P(0) = sum_i ||y_i||^2 / (2 m_i)``, the scale of relative gaps (1 when ``y = 0``).

    ``P`` is homogeneous of degree 2 in ``(y, mu)`` and ``P* <= P(0)``, so ``gap / P(0)`` does not
    depend on the units of ``y`` and bounds the relative suboptimality."""
    f0 = float(np.sum(c))
    return f0 if f0 > 0 else 1.0


def solve_nuclear_cvxpy(X, y, mu: float, *, solver: str = "CLARABEL", tol: float = 1e-7,
                        on_inaccurate: str = "warn", solver_options: Mapping | None = None,
                        verbose: bool = False) -> NuclearResult:
    """Solve the program exactly with CVXPY (``cp.normNuc``), certified by the duality gap.

    Built on ``y / c`` with ``mu / c`` (``c`` a power of two near ``max |y|``; the solution is
    ``Theta / c``) and scaled back, so the backend's absolute tolerances act on data of order one
    (:mod:`lowrank_fl.conic`). The status is decided by the certificate of the module docstring
    at the returned ``Theta``, not by CVXPY's status string: ``"optimal"`` when
    ``gap <= tol * P(0)`` (``P(0) = sum_i ||y_i||^2 / (2 m_i)``, the result's ``gap_scale``),
    otherwise ``"inaccurate"``.

    Parameters
    ----------
    X : array (n, m, d) or list of (m_i, d) arrays;  y : array (n, m) or list of (m_i,) arrays
    mu : float > 0
    solver : {"CLARABEL", "SCS"}
        The CVXPY backend.
    tol : float > 0
        Relative duality gap accepted as optimal.
    on_inaccurate : {"warn", "raise"}
        An uncertified answer warns (:class:`~lowrank_fl.results.ConvergenceWarning`) or raises
        :class:`~lowrank_fl.results.SolverError`.
    solver_options : mapping, optional
        Keyword arguments for ``cvxpy.Problem.solve``.

    Returns
    -------
    NuclearResult
        ``gap`` is the certificate at the returned ``Theta``; ``relative_gap = gap / P(0)``.

    Raises
    ------
    SolverError
        No solution (infeasible, solver failure), or an uncertified one with
        ``on_inaccurate="raise"``.
    """
    import cvxpy as cp

    mu = check_positive(mu, "mu")
    tol = check_positive(tol, "tol")
    check_solver(solver, solver_options)
    Xs, ys = _as_client_list(X, y)
    n, d = len(Xs), Xs[0].shape[1]

    def build(scale):
        Theta = cp.Variable((n, d))
        loss = sum(cp.sum_squares(Xi @ Theta[i] - yi / scale) / (2 * len(yi))
                   for i, (Xi, yi) in enumerate(zip(Xs, ys)))
        return cp.Problem(cp.Minimize(loss + (mu / scale) * cp.normNuc(Theta))), {"Theta": Theta}

    raw = solve_scaled(build, data_scale(*ys), solver=solver, solver_options=solver_options,
                       verbose=verbose)
    T = raw.values["Theta"]
    S, b, c = nuclear_statistics(X, y)
    primal, dual = _gap(T, mu, S, b, c)
    scale = _zero_objective(c)
    status, message = decide((primal - dual) / scale, tol, raw.status,
                             what="nuclear-norm least squares", solver=raw.solver,
                             on_inaccurate=on_inaccurate)
    return NuclearResult(objective=primal, gap=primal - dual, iterations=raw.iterations,
                         status=status, solver=raw.solver, seconds=raw.seconds, Theta=T,
                         rank=_rank(T, max(1e-8, np.sqrt(tol))), gap_scale=scale, message=message)


def solve_nuclear_prox(X, y, mu: float, *, tol: float = 1e-8, max_iter: int = 5000,
                       init=None, Theta0=None, stall_window: float | None = 4.0) -> NuclearResult:
    """Accelerated proximal gradient (FISTA) with SVT and gradient-based adaptive restart.

    Step ``1/L`` with ``L = max_i lambda_max(S_i)`` (the smooth part is block diagonal over
    clients). Stops when the duality gap (module docstring) satisfies ``gap <= tol * P(0)``,
    ``P(0) = sum_i ||y_i||^2 / (2 m_i)`` (status ``"optimal"``): a relative gap, invariant under
    rescaling ``(y, mu)``, recorded as the result's ``gap_scale`` (so ``relative_gap`` is the
    quantity compared with ``tol``). Otherwise ``"max_iter"`` with a
    :class:`~lowrank_fl.results.ConvergenceWarning`, or ``"stalled"`` (a ``StalledWarning``) when
    the stall rule of :mod:`lowrank_fl.stall` fires.

    Parameters
    ----------
    X, y : as in :func:`solve_nuclear_cvxpy`
    mu : float > 0;  tol : float > 0;  max_iter : int
    init : array (n, d), optional
        Starting ``Theta`` (default zeros).
    Theta0 : array (n, d), optional
        Deprecated alias of ``init``.
    stall_window : float > 1 or None
        The stall rule's window (FISTA's default 4; None: off).

    Returns
    -------
    NuclearResult
        ``history`` holds ``"objective"`` and ``"gap"`` per iteration.
    """
    if Theta0 is not None:
        warnings.warn("solve_nuclear_prox(Theta0=...) is deprecated; use init=...",
                      DeprecationWarning, stacklevel=2)
        if init is not None:
            raise TypeError("pass init only (Theta0 is its deprecated alias), not both")
        init, init_name = Theta0, "Theta0"
    else:
        init_name = "init"
    mu = check_positive(mu, "mu")
    tol = check_positive(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    stall = StallRule(check_stall_window(stall_window), tol)
    S, b, c = nuclear_statistics(X, y)
    n, d = b.shape
    Theta = np.zeros((n, d)) if init is None else as_float_array(init, init_name, shape=(n, d)).copy()
    scale = _zero_objective(c)
    L = float(np.max(np.linalg.eigvalsh(S)[:, -1]))
    if L <= 0:
        L = 1.0                             # all-zero data: f is constant, any step works
    start = time.perf_counter()
    Z, t_mom = Theta.copy(), 1.0
    objs, gaps = [], []
    status = "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        _, grad = _smooth(Z, S, b, c)
        new, _ = svt(Z - grad / L, mu / L)
        # restart momentum when the step goes against the proximal-gradient direction
        if np.sum((Z - new) * (new - Theta)) > 0:
            t_mom = 1.0
            Z = new
        else:
            t_next = 0.5 * (1 + np.sqrt(1 + 4 * t_mom * t_mom))
            Z = new + ((t_mom - 1) / t_next) * (new - Theta)
            t_mom = t_next
        Theta = new
        primal, dual = _gap(Theta, mu, S, b, c)
        objs.append(primal)
        gaps.append(primal - dual)
        if gaps[-1] <= tol * scale:
            status = "optimal"
            break
        if stall.check(it, gaps[-1] / scale, objs[-1] / scale):
            status = "stalled"
            break
    if status == "max_iter":
        message = (f"solve_nuclear_prox stopped at max_iter={max_iter} with relative gap "
                   f"{gaps[-1] / scale:.2e} > tol={tol:g}.")
        warnings.warn(message, ConvergenceWarning, stacklevel=2)
    elif status == "stalled":
        message = stall.warn("solve_nuclear_prox", it, gaps[-1] / scale) + "."
    else:
        message = (f"FISTA reached relative duality gap {gaps[-1] / scale:.2e} <= tol={tol:g} "
                   f"after {it} iterations.")
    return NuclearResult(objective=objs[-1], gap=gaps[-1], iterations=it, status=status,
                         solver="fista-svt", seconds=time.perf_counter() - start,
                         history={"objective": np.asarray(objs), "gap": np.asarray(gaps)},
                         Theta=Theta, rank=_rank(Theta), gap_scale=scale, message=message)
