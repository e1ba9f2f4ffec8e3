"""Exact references for FLUTE's linear model (Liu, Shen & Yang, ICML 2024).

* Targets: the Eckart–Young truncation ``Phi_k`` (eq. (3)), balanced optimal factors and the
  misspecification value ``sum_(j > k) lambda_j^2``.
* FLUTE's objective eq. (4), its gradients (data term, regularizer), the regularizer identity
  ``-g1 ||BW||^2 + g2 (||B^T B||^2 + ||W W^T||^2) = g2 ||B^T B - W W^T||^2 + (2 g2 - g1) ||BW||^2``
  and the closed-form population minimizer ``BW = a/(a + 2 g2 - g1) Phi_k`` with its divergence
  boundary (``g1 >= 2 g2 + a``; App. C states ``2 g2``).
* The symmetric embedding ``Theta`` of App. A.1 (eq. (13)), the region quantities of Prop. A.2 /
  A.9 and the entry time ``T_R`` (eq. (16)).
* Empirical references: per-client OLS then truncated SVD, the empirical rank-k ERM by
  alternating minimization and the nuclear-norm convex relaxation truncated to rank k (solved by
  :mod:`lowrank_fl.exact.nuclear`).

Normalizations (the paper's main text and App. A.1 differ by a factor 2). The data term of eq. (4)
is written ``a * S * sum_i L_i`` with
``L_i = (1/N) ||X_i B w_i - y_i||^2`` and

* ``a = 1/2`` for ``"appendix"`` (App. A.1: the data gradient has no factor 2 — the version the
  theorems analyse), ``a = 1`` for ``"main"`` (Alg. 1 with the main-text L_i);
* ``S = 1`` for ``aggregation="sum"`` (eq. (5) sums client gradients), ``S = 1/M`` for ``"mean"``
  (eq. (4) read literally, with its 1/M).

Shapes: ``B`` (d, k), ``W`` (M, k) — the heads, client axis first: row i is client i's ``w_i``
(the transpose of the paper's (k, M) ``W``, so the paper's ``BW`` is ``B @ W.T`` here) — ``Phi``
(d, M) (the paper's matrix, one column per client), ``X`` (M, N, d), ``y`` (M, N). Formulas in the
docstrings keep the paper's notation (``BW``, ``W W^T`` for the paper's (k, M) ``W``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..validation import as_float_array, as_generator, check_choice, check_int, check_positive
from ..linalg import thin_svd, truncated_svd
from ..results import ConvergenceWarning, SolverResult
from .multitask import gram_heads, local_least_squares, representation_step

__all__ = [
    "NORMALIZATIONS", "AGGREGATIONS", "data_weight", "TruncatedTarget", "truncated_target",
    "balanced_factors", "regularizer", "regularizer_balanced_form", "flute_objective",
    "population_objective", "data_gradients", "population_data_gradients",
    "regularizer_gradients", "regularized_minimizer", "divergence_boundary", "is_unbounded",
    "theta_embedding", "embed_factors", "lambda_tilde", "theta_step", "region_quantities", "entry_time_bound",
    "ols_truncated_svd", "ErmResult", "altmin_erm", "nuclear_relaxation_estimate",
    "NuclearEstimate", "check_gammas", "padded_svd", "data_gradients_unchecked",
    "regularizer_gradients_unchecked",
]

NORMALIZATIONS = ("appendix", "main")
AGGREGATIONS = ("sum", "mean")


def data_weight(normalization: str = "appendix", aggregation: str = "sum",
                n_clients: int | None = None) -> float:
    """Weight ``a * S`` of the data term ``sum_i ||B w_i - phi_i||^2`` in the population objective.

    ``a = 1/2`` (``"appendix"``) or ``1`` (``"main"``); ``S = 1`` (``"sum"``) or ``1/M``
    (``"mean"``, which needs ``n_clients``).
    """
    check_choice(normalization, "normalization", NORMALIZATIONS)
    check_choice(aggregation, "aggregation", AGGREGATIONS)
    a = 0.5 if normalization == "appendix" else 1.0
    if aggregation == "mean":
        if n_clients is None:
            raise ValueError("n_clients is required with aggregation='mean'")
        a /= check_int(n_clients, "n_clients", minimum=1)
    return a


# --------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class TruncatedTarget:
    """Eckart–Young target of ``Phi`` (d, M) at rank k.

    Attributes
    ----------
    Phi_k : ndarray (d, M)
        ``U_k Lambda_k V_k^T``.
    U_k : ndarray (d, k)
        Optimal representation basis.
    s : ndarray (min(d, M),)
        All singular values of ``Phi``.
    Vt_k : ndarray (k, M)
    value : float
        Optimal value of eq. (3): ``||Phi - Phi_k||_F^2 = sum_(j > k) s_j^2``.
    gap : float
        ``Delta = 2 (s_k - s_(k+1))`` (0 past the rank).
    """

    Phi_k: np.ndarray
    U_k: np.ndarray
    s: np.ndarray
    Vt_k: np.ndarray
    value: float
    gap: float


def _check_Phi_k(Phi, k):
    Phi = as_float_array(Phi, "Phi", ndim=2)
    k = check_int(k, "k", minimum=1, maximum=min(Phi.shape))
    return Phi, k


def truncated_target(Phi, k: int) -> TruncatedTarget:
    """Best rank-k approximation of ``Phi`` (d, M), eq. (3) (Eckart–Young–Mirsky)."""
    Phi, k = _check_Phi_k(Phi, k)
    U, s, Vt = thin_svd(Phi, name="Phi")
    Phi_k = (U[:, :k] * s[:k]) @ Vt[:k]
    nxt = s[k] if k < s.shape[0] else 0.0
    return TruncatedTarget(Phi_k=Phi_k, U_k=U[:, :k], s=s, Vt_k=Vt[:k],
                           value=float(np.sum(s[k:] ** 2)), gap=2.0 * float(s[k - 1] - nxt))


def balanced_factors(Phi, k: int):
    """Balanced optimal factors ``B* = U_k Lambda_k^(1/2)`` (d, k) and heads ``W*`` (M, k), the
    transpose of the paper's ``Lambda_k^(1/2) V_k^T``: ``B* W*^T = Phi_k`` and
    ``B*^T B* = W*^T W* = Lambda_k`` (the balanced minimizers of eq. (4) with ``g1 = 2 g2``)."""
    Phi = as_float_array(Phi, "Phi", ndim=2)
    k = check_int(k, "k", minimum=1, maximum=min(Phi.shape))
    U, s, Vt = truncated_svd(Phi, k, name="Phi")
    r = np.sqrt(s)
    return U * r, Vt.T * r


# --------------------------------------------------------------------------- objective
def _check_BW(B, W, d=None, M=None):
    """``B`` (d, k) and heads ``W`` (M, k), checked; returns ``B`` and the paper's (k, M) ``W``
    (a transposed view) for the formulas below."""
    B = as_float_array(B, "B", shape=(d, None))
    W = as_float_array(W, "W", shape=(M, B.shape[1]))
    return B, W.T


def check_gammas(gamma1, gamma2) -> tuple[float, float]:
    """``gamma1``, ``gamma2`` of eq. (4) as finite floats >= 0 (``ValueError`` naming the argument:
    a NaN or negative weight would silently turn the penalty into something else)."""
    return (check_positive(gamma1, "gamma1", strict=False),
            check_positive(gamma2, "gamma2", strict=False))


def _check_data(X, y, B, W):
    X = as_float_array(X, "X", shape=(W.shape[1], None, B.shape[0]))
    y = as_float_array(y, "y", shape=X.shape[:2])
    return X, y


def regularizer(B, W, gamma1: float, gamma2: float) -> float:
    """Penalty of eq. (4): ``-g1 ||BW||_F^2 + g2 (||B^T B||_F^2 + ||W W^T||_F^2)``."""
    B, W = _check_BW(B, W)
    gamma1, gamma2 = check_gammas(gamma1, gamma2)
    return float(-gamma1 * np.sum((B @ W) ** 2)
                 + gamma2 * (np.sum((B.T @ B) ** 2) + np.sum((W @ W.T) ** 2)))


def regularizer_balanced_form(B, W, gamma1: float, gamma2: float) -> float:
    """Same penalty written ``g2 ||B^T B - W W^T||_F^2 + (2 g2 - g1) ||BW||_F^2`` (expanding
    ``||B^T B - W W^T||_F^2`` with ``tr(B^T B W W^T) = ||BW||_F^2``). With ``g1 = 2 g2`` it is the
    balancing penalty."""
    B, W = _check_BW(B, W)
    gamma1, gamma2 = check_gammas(gamma1, gamma2)
    return float(gamma2 * np.sum((B.T @ B - W @ W.T) ** 2)
                 + (2 * gamma2 - gamma1) * np.sum((B @ W) ** 2))


def _residuals(B, W, X, y):
    """Per-client residuals ``X_i B w_i - y_i`` (M, N) and projected features ``X_i B`` (M, N, k)."""
    XB = X @ B
    return np.einsum("mnk,km->mn", XB, W) - y, XB


def flute_objective(B, W, X, y, *, gamma1: float = 0.25, gamma2: float = 0.125,
                    normalization: str = "appendix", aggregation: str = "sum") -> float:
    """Empirical FLUTE objective, eq. (4): ``a S sum_i (1/N) ||X_i B w_i - y_i||^2 + penalty``.

    Parameters
    ----------
    B : (d, k); W : (M, k); X : (M, N, d); y : (M, N).
    """
    B, W = _check_BW(B, W)
    X, y = _check_data(X, y, B, W)
    w = data_weight(normalization, aggregation, W.shape[1])
    res, _ = _residuals(B, W, X, y)
    return w * float(np.sum(res ** 2)) / X.shape[1] + regularizer(B, W.T, gamma1, gamma2)


def population_objective(B, W, Phi, *, noise: float = 0.0, gamma1: float = 0.25,
                         gamma2: float = 0.125, normalization: str = "appendix",
                         aggregation: str = "sum") -> float:
    """Expectation of :func:`flute_objective` for ``x ~ N(0, I)``:
    ``a S (||BW - Phi||_F^2 + M noise^2) + penalty``."""
    Phi = as_float_array(Phi, "Phi", ndim=2)
    B, W = _check_BW(B, W, *Phi.shape)
    noise = check_positive(noise, "noise", strict=False)
    w = data_weight(normalization, aggregation, W.shape[1])
    return (w * (float(np.sum((B @ W - Phi) ** 2)) + Phi.shape[1] * noise ** 2)
            + regularizer(B, W.T, gamma1, gamma2))


def data_gradients(B, W, X, y, *, normalization: str = "appendix", aggregation: str = "sum"):
    """Gradients of the data term ``a S sum_i (1/N) ||X_i B w_i - y_i||^2``, batched over clients.

    Appendix normalization (App. A.1): ``(1/N) sum_i X_i^T (X_i B w_i - y_i) w_i^T`` for ``B`` and
    ``(1/N) B^T X_i^T (X_i B w_i - y_i)`` for ``w_i`` — the client messages of Alg. 1 line 6.

    Returns
    -------
    gB : ndarray (d, k) — already summed over clients as in eq. (5);
    gW : ndarray (M, k) — row i is client i's head gradient.
    """
    B, Wk = _check_BW(B, W)
    X, y = _check_data(X, y, B, Wk)
    return data_gradients_unchecked(B, Wk.T, X, y,
                                    2.0 * data_weight(normalization, aggregation, Wk.shape[1]))


def data_gradients_unchecked(B, W, X, y, scale: float):
    """:func:`data_gradients` (heads ``W`` (M, k)) with the factor ``scale = 2 a S`` given and no
    input checks (the hot path of :func:`lowrank_fl.algorithms.flute.flute`)."""
    W = W.T                                                 # the paper's (k, M) layout
    res, XB = _residuals(B, W, X, y)
    M, N, d = X.shape
    c = scale / N
    # sum_(i, j) x_ij r_ij w_i^T as one (d, MN) @ (MN, k) product (no einsum path search per call)
    gB = c * (X.reshape(M * N, d).T @ (res[:, :, None] * W.T[:, None, :]).reshape(M * N, -1))
    gW = c * np.einsum("mnk,mn->mk", XB, res)
    return gB, gW


def population_data_gradients(B, W, Phi, *, normalization: str = "appendix",
                              aggregation: str = "sum"):
    """Population gradients (``N -> inf``, ``Q = Q~ = 0``): ``2aS (BW - Phi) W^T`` and
    ``2aS B^T (BW - Phi)``; shapes (d, k) and (M, k) (row i: client i's head gradient)."""
    Phi = as_float_array(Phi, "Phi", ndim=2)
    B, W = _check_BW(B, W, *Phi.shape)
    scale = 2.0 * data_weight(normalization, aggregation, W.shape[1])
    R = B @ W - Phi
    return scale * (R @ W.T), scale * (R.T @ B)


def regularizer_gradients(B, W, gamma1: float = 0.25, gamma2: float = 0.125):
    """Gradients of the penalty of eq. (4), the terms of eq. (6):
    ``-2 g1 B W W^T + 4 g2 B B^T B`` (d, k) and ``-2 g1 B^T B W + 4 g2 W W^T W``, returned as
    (M, k) heads gradients (its transpose).

    With ``g1 = 1/4``, ``g2 = 1/8`` these are ``(1/2) B (B^T B - W W^T)`` and
    ``-(1/2) (B^T B - W W^T) W`` (App. A.1)."""
    B, Wk = _check_BW(B, W)
    return regularizer_gradients_unchecked(B, Wk.T, *check_gammas(gamma1, gamma2))


def regularizer_gradients_unchecked(B, W, gamma1: float, gamma2: float):
    """:func:`regularizer_gradients` without input checks (the hot path of
    :func:`lowrank_fl.algorithms.flute.flute`, which validates once per run); heads ``W``
    (M, k), gradients (d, k) and (M, k)."""
    BtB, WWt = B.T @ B, W.T @ W
    return (-2 * gamma1 * B @ WWt + 4 * gamma2 * B @ BtB,
            -2 * gamma1 * W @ BtB + 4 * gamma2 * W @ WWt)


# --------------------------------------------------------------------------- gamma analysis
def regularized_minimizer(Phi, k: int, *, gamma1: float = 0.25, gamma2: float = 0.125,
                          normalization: str = "appendix", aggregation: str = "sum") -> np.ndarray:
    """Global minimizer of the population objective: ``BW = a/(a + c) Phi_k``, ``c = 2 g2 - g1``
    (on balanced factors the objective is ``a ||BW - Phi||^2 + c ||BW||^2``, minimized along the
    top-k singular directions), with balanced factors; (d, M).

    Raises
    ------
    ValueError
        If ``a + c <= 0``: the objective is unbounded below (no minimizer).
    """
    Phi, k = _check_Phi_k(Phi, k)
    gamma1, gamma2 = check_gammas(gamma1, gamma2)
    a = data_weight(normalization, aggregation, Phi.shape[1])
    c = 2 * gamma2 - gamma1
    if a + c <= 0:
        raise ValueError(f"gamma1 = {gamma1} >= 2 gamma2 + a = {2 * gamma2 + a}: the objective is "
                         f"unbounded below (no minimizer); need gamma1 < {2 * gamma2 + a}")
    return a / (a + c) * truncated_target(Phi, k).Phi_k


def divergence_boundary(gamma2: float, *, normalization: str = "appendix",
                        aggregation: str = "sum", n_clients: int | None = None,
                        statement: str = "correct") -> float:
    """The ``gamma1`` above which FLUTE's objective has no minimizer.

    ``statement="paper"``: App. C's "we do not set g1 > 2 g2 because ... ||BW||_F usually
    diverges", i.e. ``2 g2``. ``statement="correct"``: on balanced factors the quartic
    coefficient of ``||BW||`` is ``a + 2 g2 - g1``, so the objective is unbounded below iff
    ``g1 >= 2 g2 + a`` (``a`` from :func:`data_weight`).
    """
    check_choice(statement, "statement", ("paper", "correct"))
    gamma2 = check_positive(gamma2, "gamma2", strict=False)
    if statement == "paper":
        return 2 * gamma2
    return 2 * gamma2 + data_weight(normalization, aggregation, n_clients)


def is_unbounded(gamma1: float, gamma2: float, *, normalization: str = "appendix",
                 aggregation: str = "sum", n_clients: int | None = None) -> bool:
    """True iff the population objective is unbounded below (``g1 >= 2 g2 + a``)."""
    gamma1 = check_positive(gamma1, "gamma1", strict=False)
    return gamma1 >= divergence_boundary(gamma2, normalization=normalization,
                                         aggregation=aggregation, n_clients=n_clients)


# --------------------------------------------------------------------------- Theta embedding
def padded_svd(Phi):
    """Full SVD of ``Phi`` padded to (D, D), ``D = max(d, M)``: ``U_*`` (D, D), ``s`` (D,), ``V_*``."""
    d, M = Phi.shape
    D = max(d, M)
    P = np.zeros((D, D))
    P[:d, :M] = Phi
    U, s, Vt = np.linalg.svd(P)
    return U, s, Vt.T


def lambda_tilde(Phi) -> np.ndarray:
    """Eigenvalues of ``Lambda~ = diag(2 Lambda_*, -2 Lambda_*)`` (2D,), App. A.1, in that order."""
    Phi = as_float_array(Phi, "Phi", ndim=2)
    s = padded_svd(Phi)[1]
    return np.concatenate([2 * s, -2 * s])


def embed_factors(B, W, U_s, V_s) -> np.ndarray:
    """``Theta`` (2D, k) from ``B`` (d, k), heads ``W`` (M, k) and the padded singular bases ``U_s``,
    ``V_s`` (D, D) of :func:`padded_svd` — shapes checked only, no finiteness check and no SVD
    (used every round by :func:`lowrank_fl.algorithms.flute.flute` with ``record_theta=True``)."""
    B = as_float_array(B, "B", ndim=2, finite=False)
    d, k = B.shape
    W = as_float_array(W, "W", shape=(None, k), finite=False)
    M = W.shape[0]
    U_s = as_float_array(U_s, "U_s", ndim=2, finite=False)
    D = U_s.shape[0]
    if U_s.shape != (D, D) or D < max(d, M):
        raise ValueError(f"U_s must be square with at least max(d, M) = {max(d, M)} rows, got "
                         f"shape {U_s.shape}")
    V_s = as_float_array(V_s, "V_s", shape=(D, D), finite=False)
    Bt = U_s[:d].T @ B                                      # = U_*^T [B; 0]
    Wt = V_s[:M].T @ W                                      # = V_*^T [W^T; 0] (paper's W)
    return np.vstack([(Bt + Wt) / np.sqrt(2), (Bt - Wt) / np.sqrt(2)])


def theta_embedding(B, W, Phi) -> np.ndarray:
    """Symmetric embedding ``Theta`` (2D, k) of App. A.1 (before eq. (13)), ``D = max(d, M)``.

    ``B~ = U_*^T B_*``, ``W~ = W_* V_*`` (padded to D) and
    ``Theta = [(B~ + W~^T)/sqrt 2 ; (B~ - W~^T)/sqrt 2]``. Rows follow :func:`lambda_tilde`, so
    ``Theta[:k]`` is ``Theta_k`` and the rest is ``Theta_res``. Population FLUTE (appendix
    normalization, g1 = 1/4, g2 = 1/8) is exactly :func:`theta_step` in these coordinates.

    Parameters
    ----------
    B : array_like, shape (d, k);  W : array_like, shape (M, k);  Phi : array_like, shape (d, M)
    """
    Phi = as_float_array(Phi, "Phi", ndim=2)
    d, M = Phi.shape
    B, Wk = _check_BW(B, W, d, M)
    U, _, V = padded_svd(Phi)
    return embed_factors(B, Wk.T, U, V)


def theta_step(Theta, lam_tilde, step_size: float) -> np.ndarray:
    """Population recursion (13) with ``R = 0``:
    ``Theta + (eta/2) Lambda~ Theta - (eta/2) Theta Theta^T Theta``, ``eta = step_size``.

    Parameters
    ----------
    Theta : array_like, shape (2D, k)
    lam_tilde : array_like, shape (2D,)
        Diagonal of ``Lambda~`` (:func:`lambda_tilde`).
    step_size : float > 0

    Returns
    -------
    ndarray, shape (2D, k)
    """
    Theta = as_float_array(Theta, "Theta", ndim=2)
    lam = as_float_array(lam_tilde, "lam_tilde", shape=(Theta.shape[0],))
    eta = check_positive(step_size, "step_size")
    return Theta + 0.5 * eta * lam[:, None] * Theta - 0.5 * eta * Theta @ (Theta.T @ Theta)


def region_quantities(Theta, k: int) -> dict:
    """``sigma_1(Theta)``, ``sigma_1(Theta_res)`` and ``sigma_k(Theta_k)`` (regions R, R_s of
    App. A.2, Prop. A.2 / A.9).

    Parameters
    ----------
    Theta : array_like, shape (2D, k)
        The embedding of :func:`theta_embedding`; ``Theta[:k]`` is ``Theta_k``.
    k : int

    Returns
    -------
    dict of floats ``sigma1``, ``sigma1_res``, ``sigmak_k``.
    """
    Theta = as_float_array(Theta, "Theta", ndim=2)
    k = check_int(k, "k", minimum=1, maximum=Theta.shape[1])
    sv = np.linalg.svd
    return {"sigma1": float(sv(Theta, compute_uv=False)[0]),
            "sigma1_res": float(sv(Theta[k:], compute_uv=False)[0]),
            "sigmak_k": float(sv(Theta[:k], compute_uv=False)[k - 1])}


def entry_time_bound(spectrum, k: int, step_size: float, sigmak0: float) -> float:
    """``T_R = log(Delta / (4 sigma_k^2(Theta_k^0))) / (2 log(1 + (eta/2)(lambda*_k - Delta/2)))``
    (eq. (16)), with ``lambda*_j = 2 lambda_j``, ``Delta = lambda*_k - lambda*_(k+1)`` and
    ``eta = step_size``.

    Parameters
    ----------
    spectrum : (r,) singular values of Phi.
    sigmak0 : ``sigma_k(Theta_k^0)`` of the initialization.
    """
    s = as_float_array(spectrum, "spectrum", ndim=1)
    k = check_int(k, "k", minimum=1, maximum=s.shape[0])
    eta = check_positive(step_size, "step_size")
    sigmak0 = check_positive(sigmak0, "sigmak0")
    lk = 2 * s[k - 1]
    delta = lk - (2 * s[k] if k < s.shape[0] else 0.0)
    return float(np.log(delta / (4 * sigmak0 ** 2)) / (2 * np.log1p(0.5 * eta * (lk - delta / 2))))


# --------------------------------------------------------------------------- empirical references
def ols_truncated_svd(X, y, k: int):
    """Per-client least squares then truncated SVD: a consistent estimator of ``Phi_k`` (the
    baseline FLUTE's Example 1 / Remark 5.2 compare against).

    Parameters
    ----------
    X : (M, N, d) with N >= d; y : (M, N).

    Returns
    -------
    Phi_hat_k : ndarray (d, M)
        Rank-k truncation of ``[phi_hat_1 ... phi_hat_M]``.
    """
    X = as_float_array(X, "X", ndim=3)
    y = as_float_array(y, "y", shape=X.shape[:2])
    M, N, d = X.shape
    if N < d:
        raise ValueError(f"X must have N >= d samples per client for least squares, got N = {N}, "
                         f"d = {d}")
    Phi_hat = local_least_squares(X, y).T                  # (d, M): one column per client
    return truncated_target(Phi_hat, k).Phi_k


@dataclass(frozen=True, kw_only=True)
class ErmResult(SolverResult):
    """Empirical rank-k ERM ``min_(rank Z <= k) (1/2) sum_i (1/N) ||X_i z_i - y_i||^2``.

    Attributes
    ----------
    Z : ndarray (d, M)
    B : ndarray (d, k), orthonormal columns
    W : ndarray (M, k)
        The heads, client axis first (``Z = B W^T``).
    ``gap`` is ``nan``: the problem is non-convex (no dual certificate).
    """

    Z: np.ndarray
    B: np.ndarray
    W: np.ndarray


def altmin_erm(X, y, k: int, *, restarts: int = 3, max_iter: int = 5000, tol: float = 1e-11,
               seed=None) -> ErmResult:
    """Empirical rank-k ERM by alternating exact minimization (the empirical version of eq. (3),
    Remark 4.1's target when a dataset is reused).

    Heads: batched least squares given ``B`` (:func:`lowrank_fl.exact.multitask.gram_heads`).
    Representation: the (dk, dk) normal equations
    ``sum_i (w_i w_i^T ⊗ X_i^T X_i) vec(B) = sum_i vec(X_i^T y_i w_i^T)``
    (:func:`lowrank_fl.exact.multitask.representation_step`, shared with FedRep's ``altmin``). ``B`` is
    re-orthonormalized each sweep (``BW`` unchanged). The first start is the OLS–truncated-SVD
    estimate (when N >= d), the others random; the best objective is kept.

    Parameters
    ----------
    X : (M, N, d) with N >= k; y : (M, N); k : rank.
    restarts : int
        Number of starts.
    tol : float
        Stop when a sweep changes ``Z = BW`` by less than ``tol * max(1, ||Z||_F)``.

    Returns
    -------
    ErmResult
        Status ``"optimal"`` (tolerance met) or ``"max_iter"`` (with a ConvergenceWarning).
    """
    import time

    X = as_float_array(X, "X", ndim=3)
    y = as_float_array(y, "y", shape=X.shape[:2])
    M, N, d = X.shape
    k = check_int(k, "k", minimum=1, maximum=min(d - 1, M))
    if N < k:
        raise ValueError(f"X must have N >= k samples per client (the heads are least-squares fits "
                         f"in k unknowns), got N = {N}, k = {k}")
    restarts = check_int(restarts, "restarts", minimum=1)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_positive(tol, "tol")
    rng = as_generator(seed)
    t0 = time.perf_counter()
    G = np.swapaxes(X, 1, 2) @ X                       # (M, d, d)
    Xty = np.einsum("mnd,mn->md", X, y)                # (M, d)
    yy = float(np.sum(y ** 2))

    def objective(B, W):
        # (1/2N) sum_i ||X_i B w_i - y_i||^2 via Gram matrices: no (M, N) residual needed
        Z = B @ W
        quad = np.einsum("dm,mde,em->", Z, G, Z)
        return 0.5 * (quad - 2 * np.einsum("md,dm->", Xty, Z) + yy) / N

    best = None
    for r in range(restarts):
        if r == 0 and N >= d:
            B = np.linalg.svd(ols_truncated_svd(X, y, k), full_matrices=False)[0][:, :k]
        else:
            B = np.linalg.qr(rng.standard_normal((d, k)))[0]
        W = gram_heads(B, G, Xty).T
        Z_old = B @ W
        status, it = "max_iter", max_iter
        for it in range(1, max_iter + 1):
            B = np.linalg.qr(representation_step(W.T, G, Xty))[0]
            W = gram_heads(B, G, Xty).T
            Z = B @ W
            done = np.linalg.norm(Z - Z_old) <= tol * max(1.0, np.linalg.norm(Z))
            Z_old = Z
            if done:
                status = "optimal"
                break
        f = objective(B, W)
        if best is None or f < best[0]:
            best = (f, B, W, status, it)
    f, B, W, status, it = best
    if status == "max_iter":
        warnings.warn(f"altmin_erm stopped at max_iter = {max_iter} before tol = {tol}",
                      ConvergenceWarning, stacklevel=2)
    return ErmResult(objective=float(f), gap=float("nan"), iterations=int(it), status=status,
                     solver="altmin", seconds=time.perf_counter() - t0, Z=B @ W, B=B, W=W.T)


class NuclearEstimate(NamedTuple):
    """Result of :func:`nuclear_relaxation_estimate`: ``Z_k`` (d, M) the rank-k truncation, and
    ``result`` the convex solve (a :class:`~lowrank_fl.exact.nuclear.NuclearResult`)."""

    Z_k: np.ndarray
    result: object


def nuclear_relaxation_estimate(X, y, k: int, mu: float, *, method: str = "prox",
                                tol: float = 1e-9, solver: str | None = None) -> NuclearEstimate:
    """Nuclear-norm relaxation then rank-k truncation: an independent convex estimator of
    ``Phi_k`` and ``span(U_k)`` (the convex surrogate of the rank constraint in eq. (3)).

    Solves ``min_Z sum_i (1/(2N)) ||X_i z_i - y_i||^2 + mu ||Z||_*`` with
    :func:`lowrank_fl.exact.nuclear.solve_nuclear_prox` (duality-gap certified) or
    :func:`~lowrank_fl.exact.nuclear.solve_nuclear_cvxpy`, then truncates to rank k.

    Parameters
    ----------
    X : (M, N, d); y : (M, N); k : rank; mu : float > 0
    method : {"prox", "cvxpy"}
        The algorithm (``solver`` is a deprecated alias: in this package ``solver`` names a CVXPY
        backend only).
    tol : float > 0
        Relative duality-gap tolerance of ``method="prox"``.

    Returns
    -------
    NuclearEstimate
        ``Z_k`` (d, M), rank-k truncation of the relaxation's solution (FLUTE's orientation: one
        column per client); ``result`` the convex solve (``Theta`` is (M, d) in that module's
        layout).
    """
    from .nuclear import solve_nuclear_cvxpy, solve_nuclear_prox

    if solver is not None:
        warnings.warn("nuclear_relaxation_estimate(): the keyword 'solver' is deprecated and will be "
                      "removed in the next release; use 'method' instead", DeprecationWarning,
                      stacklevel=2)
        method = solver
    check_choice(method, "method", ("prox", "cvxpy"))
    X = as_float_array(X, "X", ndim=3)
    y = as_float_array(y, "y", shape=X.shape[:2])
    k = check_int(k, "k", minimum=1, maximum=min(X.shape[0], X.shape[2]))
    mu = check_positive(mu, "mu")
    tol = check_positive(tol, "tol")
    res = (solve_nuclear_prox(X, y, mu, tol=tol) if method == "prox"
           else solve_nuclear_cvxpy(X, y, mu))
    return NuclearEstimate(truncated_target(res.Theta.T, k).Phi_k, res)
