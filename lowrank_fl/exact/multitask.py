"""Closed-form and exact references for multi-task linear regression (FedRep, Sec. 4-5).

* :func:`moment_matrix` / :func:`method_of_moments` — FedRep's initialization (Alg. 2, Theorem 2):
  top-k eigenvectors of ``(1/(nm)) sum_{i,j} y_ij^2 x_ij x_ij^T``; :func:`population_moment_matrix`
  is its expectation ``mean_i ||theta_i||^2 I + 2 Theta^T Theta / n + noise^2 I`` (Gaussian x).
* :func:`fit_heads` — per-client least-squares heads for a fixed representation (Alg. 2's head
  step, FedRep's new-client fine-tuning).
* :func:`local_least_squares` — Local Only (per-client OLS/ridge in d dimensions);
  :func:`ols_then_svd` — the local-then-SVD estimator of ``col(B*)``;
  :func:`pooled_least_squares` — the exact target of FedAvg/FedSGD on the linear model (problem (4)).
* :func:`altmin` — exact alternating least squares for the empirical rank-k problem.
* :func:`population_optimum`, :func:`fedavg_population_error` — the closed forms of Sec. 2.1.
* :func:`lemma1_decomposition` — the exact quantities of Lemma 1 (eq. (16), (35)).

Per-client data are stacked: ``X`` (n, m, d), ``y`` (n, m).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..validation import as_float_array, as_generator, check_int, check_positive
from ..linalg import orth, truncated_svd
from ..results import ConvergenceWarning, SolverResult

__all__ = [
    "moment_matrix", "population_moment_matrix", "method_of_moments", "projected_gd_init", "fit_heads",
    "local_least_squares", "least_squares_heads", "gram_heads", "representation_step", "ols_then_svd", "pooled_least_squares", "AltMinResult", "altmin",
    "population_optimum", "fedavg_population_error", "lemma1_decomposition",
]


def _check_data(X, y):
    X = as_float_array(X, "X", ndim=3)
    if 0 in X.shape:
        raise ValueError(f"X must hold at least one client, one sample and one feature, "
                         f"got shape {X.shape}")
    y = as_float_array(y, "y", shape=X.shape[:2])
    return X, y


def _batched_solve(G, b):
    """Solve ``G[c] x[c] = b[c]`` for a stack of symmetric PSD systems ``G`` (c, k, k), ``b`` (c, k).

    If any system is exactly singular (fewer samples than unknowns, a degenerate batch) the whole
    stack gets the minimum-norm least-squares solution ``pinv(G) b`` (which equals the solve for
    the non-singular ones). Ill-conditioned but non-singular systems are solved as they are.
    """
    try:
        return np.linalg.solve(G, b[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return np.einsum("cij,cj->ci", np.linalg.pinv(G, hermitian=True), b)


def least_squares_heads(XB, y, *, ridge: float = 0.0) -> np.ndarray:
    """Batched heads ``w_c = (A_c^T A_c + ridge I)^{-1} A_c^T y_c`` for features ``A = XB``.

    The one batched head solver of the package (FedRep's head step, :func:`fit_heads`). Shapes and
    ``ridge`` are checked; finiteness is the caller's (it sits on FedRep's hot path).

    Parameters
    ----------
    XB : ndarray, shape (c, m, k)
    y : ndarray, shape (c, m)
    ridge : float >= 0

    Returns
    -------
    ndarray, shape (c, k); the minimum-norm solution when a system is singular (``m < k``).
    """
    XB = as_float_array(XB, "XB", ndim=3, finite=False)
    y = as_float_array(y, "y", shape=XB.shape[:2], finite=False)
    ridge = check_positive(ridge, "ridge", strict=False)
    G = np.swapaxes(XB, 1, 2) @ XB                          # (c, k, k); matmul ~8x faster than einsum
    if ridge:
        G = G + ridge * np.eye(XB.shape[2])
    return _batched_solve(G, (y[:, None, :] @ XB)[:, 0, :])


def gram_heads(B, gram, xty) -> np.ndarray:
    """Heads from per-client sufficient statistics: ``w_c = (B^T G_c B)^{-1} B^T (X_c^T y_c)``.

    Parameters
    ----------
    B : ndarray, shape (d, k)
    gram : ndarray, shape (c, d, d)
        ``X_c^T X_c``.
    xty : ndarray, shape (c, d)
        ``X_c^T y_c``.

    Returns
    -------
    ndarray, shape (c, k) (minimum-norm when singular).
    """
    B = as_float_array(B, "B", ndim=2, finite=False)
    gram = as_float_array(gram, "gram", shape=(None, B.shape[0], B.shape[0]), finite=False)
    xty = as_float_array(xty, "xty", shape=(gram.shape[0], B.shape[0]), finite=False)
    GB = gram @ B                                             # (c, d, k)
    return _batched_solve(B.T @ GB, xty @ B)


def representation_step(W, gram, xty) -> np.ndarray:
    """Exact minimizer over ``B`` of ``sum_c ||X_c B w_c - y_c||^2`` for fixed heads ``W`` (c, k).

    Normal equations ``sum_c (w_c w_c^T ⊗ X_c^T X_c) vec(B) = sum_c vec(X_c^T y_c w_c^T)``, a
    (dk, dk) system solved by least squares (minimum norm if singular). Shared by :func:`altmin`
    and :func:`lowrank_fl.exact.flute.altmin_erm`.

    Parameters
    ----------
    W : ndarray, shape (c, k);  gram : ndarray, shape (c, d, d);  xty : ndarray, shape (c, d)

    Returns
    -------
    B : ndarray, shape (d, k) (not orthonormalized)
    """
    W = as_float_array(W, "W", ndim=2, finite=False)
    gram = as_float_array(gram, "gram", shape=(W.shape[0], None, None), finite=False)
    k, d = W.shape[1], gram.shape[1]
    if gram.shape[2] != d:
        raise ValueError(f"gram must have shape ({W.shape[0]}, d, d), got {gram.shape}")
    xty = as_float_array(xty, "xty", shape=(W.shape[0], d), finite=False)
    # H[(a,p),(b,q)] = sum_c w_ca w_cb (X_c^T X_c)_pq; unknown vec index (a,p) = B[p, a]
    H = np.einsum("na,nb,npq->apbq", W, W, gram, optimize=True).reshape(k * d, k * d)
    rhs = (W.T @ xty).reshape(k * d)
    return np.linalg.lstsq(H, rhs, rcond=None)[0].reshape(k, d).T


# ---------------------------------------------------------------------- method of moments
def moment_matrix(X, y) -> np.ndarray:
    """``(1/(nm)) sum_{i,j} y_ij^2 x_ij x_ij^T`` (Alg. 2 initialization), shape (d, d).

    Parameters
    ----------
    X : array_like, shape (n, m, d)
    y : array_like, shape (n, m)
    """
    X, y = _check_data(X, y)
    n, m, d = X.shape
    Z = (X * np.abs(y)[..., None]).reshape(n * m, d)     # rows |y_ij| x_ij: Z^T Z = sum y^2 x x^T
    return Z.T @ Z / (n * m)


def population_moment_matrix(theta, noise: float = 0.0) -> np.ndarray:
    """``E[moment_matrix]`` for ``x ~ N(0, I_d)``: ``(mean ||theta_i||^2 + noise^2) I + (2/n) Theta^T Theta``.

    Its top-k eigenspace is ``col(Theta^T)`` with eigengap ``2 sigma_min(Theta^T Theta / n)``
    (the expectation behind Theorem 2's method-of-moments bound). ``theta`` has shape (n, d).
    """
    theta = as_float_array(theta, "theta", ndim=2)
    noise = check_positive(noise, "noise", strict=False)
    n, d = theta.shape
    return ((np.sum(theta * theta) / n + noise ** 2) * np.eye(d)
            + 2.0 * theta.T @ theta / n)


def method_of_moments(X, y, k: int) -> np.ndarray:
    """FedRep's initialization ``B^0``: top-k eigenvectors of :func:`moment_matrix`, shape (d, k)."""
    M = moment_matrix(X, y)
    k = check_int(k, "k", minimum=1, maximum=M.shape[0] - 1)
    _, vecs = np.linalg.eigh(M)
    return vecs[:, ::-1][:, :k].copy()


def projected_gd_init(X, y, k: int, *, steps: int = 10, step_size: float = 0.5, seed=None) -> np.ndarray:
    """The experiments' initialization (App. A.1; Tu et al. 2016, Alg. 1): projected gradient descent
    on the unfactorized objective ``1/(2m) sum_{i,j} (y_ij - x_ij^T M_i)^2`` over rank-k ``M`` (n, d).

    Start from the rank-k truncation of a Gaussian (n, d) matrix; each step takes a gradient step
    ``M_i <- M_i - step_size (1/m) X_i^T (X_i M_i - y_i)`` and re-truncates to rank k. Returns the
    top-k right singular vectors (d, k) of the final ``M`` (the official notebook takes ``Vh[:, :k]``
    instead, an indexing slip that is not this subspace).
    """
    X, y = _check_data(X, y)
    n, m, d = X.shape
    k = check_int(k, "k", minimum=1, maximum=min(n, d - 1))
    steps = check_int(steps, "steps", minimum=0)
    step_size = check_positive(step_size, "step_size")
    rng = as_generator(seed)
    U, s, Vt = truncated_svd(rng.standard_normal((n, d)), k)
    M = (U * s) @ Vt
    for _ in range(steps):
        resid = np.einsum("nmd,nd->nm", X, M) - y
        M = M - step_size * np.einsum("nmd,nm->nd", X, resid) / m
        U, s, Vt = truncated_svd(M, k)
        M = (U * s) @ Vt
    return Vt.T.copy()


# ---------------------------------------------------------------------- least squares
def fit_heads(B, X, y, *, ridge: float = 0.0) -> np.ndarray:
    """Per-client least-squares heads ``w_i = (B^T X_i^T X_i B + ridge I)^{-1} B^T X_i^T y_i``.

    The head step of Alg. 2 (``argmin_w f_i(w, B)``) and the new-client fine-tuning of Sec. 5
    (the notebook uses ridge 1e-5). Batched over clients.

    Parameters
    ----------
    B : array_like, shape (d, k)
    X : array_like, shape (n, m, d)
    y : array_like, shape (n, m)
    ridge : float >= 0

    Returns
    -------
    W : ndarray, shape (n, k)
    """
    X, y = _check_data(X, y)
    B = as_float_array(B, "B", shape=(X.shape[2], None))
    ridge = check_positive(ridge, "ridge", strict=False)
    return least_squares_heads(X @ B, y, ridge=ridge)


def local_least_squares(X, y, *, ridge: float = 0.0) -> np.ndarray:
    """Local Only: per-client ``theta_i = (X_i^T X_i + ridge I)^{-1} X_i^T y_i``, shape (n, d).

    With ``ridge = 0`` and ``m < d`` the systems are singular and the minimum-norm least-squares
    solution is returned.
    """
    X, y = _check_data(X, y)
    ridge = check_positive(ridge, "ridge", strict=False)
    G = np.einsum("nmd,nme->nde", X, X) + ridge * np.eye(X.shape[2])
    return _batched_solve(G, np.einsum("nmd,nm->nd", X, y))


def ols_then_svd(X, y, k: int, *, ridge: float = 0.0) -> np.ndarray:
    """Local-then-SVD estimate of ``col(B*)``: top-k right singular vectors of the stacked
    per-client estimates ``Theta_hat`` (n, d). Returns (d, k)."""
    theta = local_least_squares(X, y, ridge=ridge)
    k = check_int(k, "k", minimum=1, maximum=min(theta.shape))
    return truncated_svd(theta, k)[2].T.copy()


def pooled_least_squares(X, y) -> np.ndarray:
    """``theta = (sum_i X_i^T X_i)^{-1} sum_i X_i^T y_i`` (d,): the exact minimizer of the
    empirical problem (4), the target of FedAvg/FedSGD with one shared model."""
    X, y = _check_data(X, y)
    G = np.einsum("nmd,nme->de", X, X)
    return np.linalg.lstsq(G, np.einsum("nmd,nm->d", X, y), rcond=None)[0]


# ---------------------------------------------------------------------- AltMin
@dataclass(frozen=True, kw_only=True)
class AltMinResult(SolverResult):
    """Alternating least squares result. ``B`` (d, k) orthonormal, ``heads`` (n, k);
    ``history["objective"]`` is the empirical loss (8) after every full sweep. The problem is not
    convex, so ``gap`` is ``nan``; ``status`` is ``"optimal"`` when the relative decrease fell
    below ``tol``."""

    B: np.ndarray
    heads: np.ndarray


def _objective(B, W, X, y):
    r = y - np.einsum("nmd,nd->nm", X, W @ B.T)
    return 0.5 * float(np.mean(r * r))


def altmin(X, y, k: int, *, B0=None, max_iter: int = 500, tol: float = 1e-12,
           **deprecated) -> AltMinResult:
    """Exact alternating minimization of the empirical objective (8),
    ``1/(2nm) sum_{i,j} (y_ij - x_ij^T B w_i)^2``.

    Each sweep solves the head problems exactly (:func:`fit_heads`), then the representation
    problem exactly through its normal equations
    ``sum_i (w_i w_i^T) ⊗ (X_i^T X_i) vec(B) = sum_i vec(X_i^T y_i w_i^T)`` (a dk × dk system),
    and orthonormalizes ``B`` (the heads are re-solved next, so the objective is unaffected).

    Parameters
    ----------
    X : array_like, shape (n, m, d);  y : array_like, shape (n, m)
    k : int
    B0 : array_like (d, k), optional
        Start (default: :func:`method_of_moments`).
    max_iter : int;  tol : float
        Stop when ``(obj_prev - obj) <= tol * max(obj_prev, tiny)`` or the objective is below
        ``tol**2`` in absolute terms (exact fit).
    **deprecated
        ``seed`` was accepted and ignored (the start is deterministic): it now warns
        (``DeprecationWarning``) and will be removed.

    Returns
    -------
    AltMinResult
        ``B`` (d, k) orthonormal, ``heads`` (n, k), ``objective`` the final loss (8),
        ``history["objective"]`` per sweep, ``status`` ``"optimal"``, ``"max_iter"`` or
        ``"diverged"`` (the representation step lost rank), the last two with a
        :class:`ConvergenceWarning`.
    """
    for name in deprecated:
        if name != "seed":
            raise TypeError(f"altmin() got an unexpected keyword argument {name!r}")
        warnings.warn("altmin(): the keyword 'seed' is deprecated and ignored (the start is "
                      "deterministic: the method of moments, or B0); it will be removed in the next "
                      "release", DeprecationWarning, stacklevel=2)
    X, y = _check_data(X, y)
    n, m, d = X.shape
    k = check_int(k, "k", minimum=1, maximum=d - 1)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_positive(tol, "tol")
    start = time.perf_counter()
    B = method_of_moments(X, y, k) if B0 is None else orth(as_float_array(B0, "B0", shape=(d, k)),
                                                             name="B0")
    gram = np.einsum("nmd,nme->nde", X, X)           # (n, d, d) computed once
    xty = np.einsum("nmd,nm->nd", X, y)
    W = gram_heads(B, gram, xty)
    hist = [_objective(B, W, X, y)]
    status = "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        try:
            B = orth(representation_step(W, gram, xty), name="B")
        except ValueError:      # rank-deficient update (e.g. a head collapsed): stop here
            status = "diverged"
            break
        W = gram_heads(B, gram, xty)
        hist.append(_objective(B, W, X, y))
        if hist[-2] - hist[-1] <= tol * max(hist[-2], np.finfo(float).tiny) or hist[-1] <= tol ** 2:
            status = "optimal"
            break
    if status == "max_iter":
        warnings.warn(f"altmin stopped at max_iter={max_iter} before tol={tol:g}", ConvergenceWarning,
                      stacklevel=2)
    elif status == "diverged":
        warnings.warn(f"altmin stopped at sweep {it}: the representation step lost rank (a head "
                      f"collapsed); the last full-rank iterate is returned", ConvergenceWarning,
                      stacklevel=2)
    return AltMinResult(objective=hist[-1], gap=float("nan"), iterations=it, status=status,
                        solver="altmin", seconds=time.perf_counter() - start,
                        history={"objective": np.asarray(hist)}, B=B, heads=W)


# ---------------------------------------------------------------------- population closed forms
def population_optimum(theta, k: int) -> np.ndarray:
    """Global minimizer of problem (3) in closed form (Eckart–Young): the top-k right singular
    vectors of ``Theta*`` (n, d). Returns an orthonormal (d, k) basis of ``col(B*)``."""
    theta = as_float_array(theta, "theta", ndim=2)
    k = check_int(k, "k", minimum=1, maximum=min(theta.shape))
    return truncated_svd(theta, k)[2].T.copy()


def fedavg_population_error(heads) -> float:
    """Population error of the best single shared model, problem (4) (Sec. 2.1):
    ``1/(2n) sum_i ||w_i* - mean(w*)||^2`` (``B*`` orthonormal); heads (n, k)."""
    W = as_float_array(heads, "heads", ndim=2)
    return 0.5 * float(np.mean(np.sum((W - W.mean(axis=0)) ** 2, axis=1)))


# ---------------------------------------------------------------------- Lemma 1
def lemma1_decomposition(B, B_star, heads_star, X) -> dict:
    """The exact quantities of Lemma 1 for one noiseless round (eqs. (16), (35), Lemma 3).

    With ``Pi_i = X_i^T X_i / m``, ``G_i = B^T Pi_i B``, ``C_i = B^T Pi_i B*``, ``D_i = B^T B*``,
    ``f_i = G_i^{-1}(G_i D_i - C_i) w_i*`` and ``H_i = G_i D_i - C_i = B^T Pi_i (B B^T - I) B*``,
    Lemma 1 states ``W^{t+1} = W* B*^T B - F`` for the exact LS heads on noiseless labels.

    Parameters
    ----------
    B : (d, k) orthonormal current iterate;  B_star : (d, k);  heads_star : (n, k);  X : (n, m, d)

    Returns
    -------
    dict with ``W_next`` (n, k) (heads from :func:`fit_heads`), ``F`` (n, k), ``G``, ``C``, ``H``
    (n, k, k) and ``D`` (k, k).
    """
    X = as_float_array(X, "X", ndim=3)
    n, m, d = X.shape
    B = as_float_array(B, "B", shape=(d, None))
    k = B.shape[1]
    B_star = as_float_array(B_star, "B_star", shape=(d, k))
    Ws = as_float_array(heads_star, "heads_star", shape=(n, k))
    y = np.einsum("nmd,nd->nm", X, Ws @ B_star.T)
    XB, XBs = X @ B, X @ B_star
    G = np.einsum("nmk,nml->nkl", XB, XB) / m
    C = np.einsum("nmk,nml->nkl", XB, XBs) / m
    D = B.T @ B_star
    H = G @ D - C
    F = np.linalg.solve(G, np.einsum("nkl,nl->nk", H, Ws)[..., None])[..., 0]
    return {"W_next": fit_heads(B, X, y), "F": F, "G": G, "C": C, "D": D, "H": H}
