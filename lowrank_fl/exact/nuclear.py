"""Nuclear-norm-penalized multi-task least squares (FedRep note §6.6; also used by FLUTE/FedAvg-FT).

    minimize_Theta  P(Theta) = sum_i 1/(2 m_i) ||X_i theta_i - y_i||^2 + mu ||Theta||_*

``Theta`` is (n, d): row ``i`` is client ``i``'s regression vector ``theta_i`` (the same layout as
``MultitaskProblem.theta = W* B*^T``). Clients may have different sample sizes ``m_i``.

Two solvers:

* :func:`solve_nuclear_cvxpy` — CVXPY (Clarabel by default), status checked;
* :func:`solve_nuclear_prox` — accelerated proximal gradient (FISTA with adaptive restart) with
  singular value thresholding, certified by a duality gap.

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

import numpy as np

from ..validation import as_float_array, check_choice, check_int, check_positive
from ..linalg import svt
from ..results import ConvergenceWarning, SolverError, SolverResult

__all__ = ["NuclearResult", "nuclear_statistics", "nuclear_objective", "nuclear_duality_gap",
           "solve_nuclear_cvxpy", "solve_nuclear_prox"]


@dataclass(frozen=True, kw_only=True)
class NuclearResult(SolverResult):
    """Solution ``Theta`` (n, d) of the nuclear-norm-penalized multi-task least squares, with
    its numerical ``rank`` (singular values above ``1e-8 * max``)."""

    Theta: np.ndarray
    rank: int


def _as_client_list(X, y):
    """Accept X (n, m, d) / y (n, m) or sequences of (m_i, d) / (m_i,) arrays."""
    if isinstance(X, np.ndarray) and X.ndim == 3:
        X = as_float_array(X, "X", ndim=3)
        y = as_float_array(y, "y", shape=X.shape[:2])
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


def _rank(Theta):
    sv = np.linalg.svd(Theta, compute_uv=False)
    return int(np.count_nonzero(sv > 1e-8 * max(sv.max(initial=0.0), np.finfo(float).tiny)))


def solve_nuclear_cvxpy(X, y, mu: float, *, solver: str = "CLARABEL",
                        accept_inaccurate: bool = False, **solver_options) -> NuclearResult:
    """Solve the program exactly with CVXPY (``cp.normNuc``).

    Parameters
    ----------
    X : array (n, m, d) or list of (m_i, d) arrays;  y : array (n, m) or list of (m_i,) arrays
    mu : float > 0
    solver : {"CLARABEL", "SCS"}
    accept_inaccurate : bool
        If False (default) a status ``optimal_inaccurate`` raises :class:`SolverError`; if True it
        is returned with that status.

    Returns
    -------
    NuclearResult
        ``gap`` is the certificate of the module docstring evaluated at the returned ``Theta``.

    Raises
    ------
    SolverError
        On any status other than optimal (and optimal_inaccurate unless accepted).
    """
    import cvxpy as cp

    mu = check_positive(mu, "mu")
    check_choice(solver, "solver", ("CLARABEL", "SCS"))
    Xs, ys = _as_client_list(X, y)
    n, d = len(Xs), Xs[0].shape[1]
    Theta = cp.Variable((n, d))
    loss = sum(cp.sum_squares(Xi @ Theta[i] - yi) / (2 * len(yi)) for i, (Xi, yi) in enumerate(zip(Xs, ys)))
    prob = cp.Problem(cp.Minimize(loss + mu * cp.normNuc(Theta)))
    start = time.perf_counter()
    try:
        prob.solve(solver=solver, **solver_options)
    except cp.error.SolverError as exc:
        raise SolverError(f"CVXPY solver {solver} failed: {exc}", status="solver_error") from exc
    status = prob.status
    if status == cp.OPTIMAL_INACCURATE and accept_inaccurate:
        status_out = "optimal_inaccurate"
    elif status == cp.OPTIMAL:
        status_out = "optimal"
    else:
        raise SolverError("nuclear-norm least squares was not solved to optimality", status=status)
    T = np.asarray(Theta.value, dtype=np.float64)
    S, b, c = nuclear_statistics(X, y)
    primal, dual = _gap(T, mu, S, b, c)
    iters = prob.solver_stats.num_iters if prob.solver_stats and prob.solver_stats.num_iters else -1
    return NuclearResult(objective=primal, gap=primal - dual, iterations=int(iters), status=status_out,
                         solver=f"cvxpy:{solver}", seconds=time.perf_counter() - start, Theta=T,
                         rank=_rank(T))


def solve_nuclear_prox(X, y, mu: float, *, tol: float = 1e-8, max_iter: int = 5000,
                       Theta0=None) -> NuclearResult:
    """Accelerated proximal gradient (FISTA) with SVT and gradient-based adaptive restart.

    Step ``1/L`` with ``L = max_i lambda_max(S_i)`` (the smooth part is block diagonal over
    clients). Stops when the duality gap (module docstring) satisfies
    ``gap <= tol * max(1, |P|)`` (status ``"optimal"``), else ``"max_iter"`` with a
    :class:`~lowrank_fl.results.ConvergenceWarning`.

    Parameters
    ----------
    X, y : as in :func:`solve_nuclear_cvxpy`
    mu : float > 0;  tol : float > 0;  max_iter : int
    Theta0 : array (n, d), optional start (default zeros)

    Returns
    -------
    NuclearResult
        ``history`` holds ``"objective"`` and ``"gap"`` per iteration.
    """
    mu = check_positive(mu, "mu")
    tol = check_positive(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    S, b, c = nuclear_statistics(X, y)
    n, d = b.shape
    Theta = np.zeros((n, d)) if Theta0 is None else as_float_array(Theta0, "Theta0", shape=(n, d)).copy()
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
        if gaps[-1] <= tol * max(1.0, abs(primal)):
            status = "optimal"
            break
    if status == "max_iter":
        warnings.warn(f"solve_nuclear_prox stopped at max_iter={max_iter} with relative gap "
                      f"{gaps[-1] / max(1.0, abs(objs[-1])):.2e} > tol={tol:g}", ConvergenceWarning)
    return NuclearResult(objective=objs[-1], gap=gaps[-1], iterations=it, status=status,
                         solver="fista-svt", seconds=time.perf_counter() - start,
                         history={"objective": np.asarray(objs), "gap": np.asarray(gaps)},
                         Theta=Theta, rank=_rank(Theta))
