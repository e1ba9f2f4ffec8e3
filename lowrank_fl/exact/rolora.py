"""Closed forms and least-squares references for RoLoRA's rank-one toy (Chen et al.).

Everything the iterative methods of :mod:`lowrank_fl.algorithms.rolora` can be checked against:

* the exact per-client b-step (eq. (14); population eq. (249)) and the global LS b for a fixed a;
* global-loss expressions of the heterogeneous population model (App. A.5, eq. (246)): zero
  model, optimum ``gamma^2``, angle loss ``gamma^2 + ||bbar*||^2 sin^2 theta`` (FFA's floor,
  Prop. A.17 eq. (274));
* FFA-LoRA's exact finite-sample expected loss (Prop. 5.5, eqs. (242)–(244));
* the exact population recursion of RoLoRA's angle (Lemma A.16, eqs. (259)–(267), equality form);
* the theorems' step-size bounds (as stated, and corrected so that proof step (101) holds), rate
  factors (eqs. (9), (254)) and iteration counts (Thm 5.4 / A.14);
* reduced-rank regression (the global rank-r optimum of the federated objective, Eckart–Young in
  the design-weighted norm) and the rank-r frozen-A optimum (FFA-LoRA's best, in PEFT letters).

Every scalar argument is validated (finite, in range) with a ``ValueError`` naming it.
"""
from __future__ import annotations

import numpy as np

from typing import NamedTuple

from ..validation import as_float_array, check_choice, check_in_interval, check_int, check_positive
from ..linalg import truncated_svd

__all__ = [
    "local_b_solve", "population_b", "global_b_solve", "expected_gradient_a",
    "angle_loss", "zero_model_loss", "ffa_population_loss", "ffa_lstsq_loss",
    "c_tilde", "ffa_expected_loss", "rolora_population_recursion",
    "step_size_bound", "rate_bound_homogeneous", "rate_bound_heterogeneous", "iterations_bound",
    "reduced_rank_regression", "ffa_matrix_optimum", "FrozenAOptimum", "FixedAOptimum",
]


class FixedAOptimum(NamedTuple):
    """Least-squares ``b`` for a fixed ``a`` and its loss (:func:`ffa_lstsq_loss`)."""

    b: np.ndarray
    loss: float


class FrozenAOptimum(NamedTuple):
    """Best up-projection ``B`` (d_out, r) for a frozen ``A`` and its loss (:func:`ffa_matrix_optimum`)."""

    B: np.ndarray
    loss: float


# --------------------------------------------------------------------------------------------
# b-steps
# --------------------------------------------------------------------------------------------
def _data(X, Y, a):
    X = as_float_array(X, "X", ndim=3)
    Y = as_float_array(Y, "Y", shape=X.shape)
    a = as_float_array(a, "a", shape=(X.shape[2],))
    Xa = X @ a                                                   # (N, m)
    norms = np.einsum("nm,nm->n", Xa, Xa)
    return Y, Xa, norms


def local_b_solve(X, Y, a, *, check_input: bool = True) -> np.ndarray:
    """Exact local least squares ``b_i = argmin_b (1/m)||Y_i - X_i a b^T||^2`` (eq. (14)).

    ``b_i = Y_i^T X_i a / ||X_i a||^2``, batched over clients.

    Parameters
    ----------
    X : ndarray, shape (N, m, d)
    Y : ndarray, shape (N, m, d)
    a : ndarray, shape (d,), with every ``X_i a != 0``
    check_input : bool
        ``False`` skips every check (the algorithms' hot path: a non-finite ``a`` must flow
        through to the trace recorder, which reports the divergence).

    Returns
    -------
    ndarray, shape (N, d)
    """
    if not check_input:
        Xa = X @ a
        return np.einsum("nmd,nm->nd", Y, Xa) / np.einsum("nm,nm->n", Xa, Xa)[:, None]
    Y, Xa, norms = _data(X, Y, a)
    if not np.all(norms > 0):
        raise ValueError(f"X_i a must be non-zero for every client (the local b-step divides by "
                         f"||X_i a||^2), got zero for clients {np.flatnonzero(~(norms > 0)).tolist()}")
    return np.einsum("nmd,nm->nd", Y, Xa) / norms[:, None]


def population_b(b_star, a_star, a, *, check_input: bool = True) -> np.ndarray:
    """Population b-step ``b_i = b_i* (a*^T a) / (a^T a)`` (eq. (249)).

    Parameters
    ----------
    b_star : ndarray, shape (N, d);  a_star : ndarray, shape (d,);  a : ndarray, shape (d,), non-zero
    check_input : bool
        ``False`` skips the checks (hot path, see :func:`local_b_solve`).

    Returns
    -------
    ndarray, shape (N, d)
    """
    if not check_input:
        return b_star * ((a_star @ a) / (a @ a))
    b_star = as_float_array(b_star, "b_star", ndim=2)
    a_star = as_float_array(a_star, "a_star", shape=(b_star.shape[1],))
    a = as_float_array(a, "a", shape=a_star.shape)
    aa = float(a @ a)
    if not aa > 0:
        raise ValueError("a must be non-zero (the b-step divides by ||a||^2)")
    return b_star * ((a_star @ a) / aa)


def global_b_solve(X, Y, a) -> np.ndarray:
    """Global LS ``argmin_b sum_i ||Y_i - X_i a b^T||^2 = sum_i Y_i^T X_i a / sum_i ||X_i a||^2``.

    Not what FFA-LoRA computes (it averages the local solutions, eq. (183)); [NOT IN PAPER].
    Shapes as :func:`local_b_solve`; returns (d,).
    """
    Y, Xa, norms = _data(X, Y, a)
    if not np.sum(norms) > 0:
        raise ValueError("X a must be non-zero on some client (the global b-step divides by "
                         "sum_i ||X_i a||^2)")
    return np.einsum("nmd,nm->d", Y, Xa) / np.sum(norms)


def expected_gradient_a(a, b_bar, a_star, b_star) -> np.ndarray:
    """``E_X[grad_a l(a, bbar)] = 2 (a bbar^T - a* b*^T) bbar`` for bbar independent of X (eq. (49)).

    Parameters
    ----------
    a, b_bar, a_star, b_star : ndarray, shape (d,)

    Returns
    -------
    ndarray, shape (d,)
    """
    a = as_float_array(a, "a", ndim=1)
    b_bar = as_float_array(b_bar, "b_bar", shape=a.shape)
    a_star = as_float_array(a_star, "a_star", shape=a.shape)
    b_star = as_float_array(b_star, "b_star", shape=a.shape)
    return 2.0 * (a * (b_bar @ b_bar) - a_star * (b_star @ b_bar))


# --------------------------------------------------------------------------------------------
# global-loss expressions (population)
# --------------------------------------------------------------------------------------------
def angle_loss(gamma: float, b_bar_norm: float, delta: float) -> float:
    """``gamma^2 + ||bbar*||^2 delta^2``: population loss (eq. (246)) of any unit a at angle
    ``delta`` with the exact b-step ``b = bbar* (a*^T a)`` (eq. (249) averaged) [derived: the two
    rank-one terms of ``a* b_i*^T - a b^T`` split along ``a`` and its complement]; RoLoRA's loss
    after T iterations with ``delta = delta_T``, FFA's floor with ``delta = delta_0``."""
    gamma = check_positive(gamma, "gamma", strict=False)
    b_bar_norm = check_positive(b_bar_norm, "b_bar_norm", strict=False)
    delta = check_in_interval(delta, "delta", 0.0, 1.0)
    return float(gamma ** 2 + b_bar_norm ** 2 * delta ** 2)


def zero_model_loss(gamma: float, b_bar_norm: float) -> float:
    """Loss of the zero model ``b = 0``: ``(1/N) sum ||b_i*||^2 = gamma^2 + ||bbar*||^2`` (eq. (246)
    at ``b = 0``, with Def. A.13's spread)."""
    gamma = check_positive(gamma, "gamma", strict=False)
    b_bar_norm = check_positive(b_bar_norm, "b_bar_norm", strict=False)
    return float(gamma ** 2 + b_bar_norm ** 2)


def ffa_population_loss(gamma: float, b_bar_norm: float, delta0: float) -> float:
    """FFA-LoRA's heterogeneous population loss ``gamma^2 + ||bbar*||^2 delta_0^2`` (Prop. A.17, eq. (274))."""
    delta0 = check_in_interval(delta0, "delta0", 0.0, 1.0)
    return angle_loss(gamma, b_bar_norm, delta0)


def ffa_lstsq_loss(a_star, b_star, a0) -> FixedAOptimum:
    """Generic least-squares reference: ``min_b (1/N) sum_i ||a* b_i*^T - a0 b^T||_F^2``.

    Solved with ``numpy.linalg.lstsq`` on the vectorised system (the linear map
    ``b -> vec(a0 b^T) = kron(a0, I_d) b``), independently of any closed form. Small d only
    (the design is (N d^2, d)).

    Parameters
    ----------
    a_star : ndarray, shape (d,)
    b_star : ndarray, shape (N, d)
    a0 : ndarray, shape (d,)

    Returns
    -------
    FixedAOptimum
        ``b`` (d,) and ``loss`` (float).
    """
    a_star = as_float_array(a_star, "a_star", ndim=1)
    b_star = as_float_array(b_star, "b_star", ndim=2)
    a0 = as_float_array(a0, "a0", shape=a_star.shape)
    n, d = b_star.shape
    K = np.kron(a0[:, None], np.eye(d))                        # (d*d, d), row-major vec
    design = np.tile(K, (n, 1))
    target = np.einsum("i,nj->nij", a_star, b_star).reshape(-1)
    b, *_ = np.linalg.lstsq(design, target, rcond=None)
    r = target - design @ b
    return FixedAOptimum(b, float(r @ r / n))


# --------------------------------------------------------------------------------------------
# FFA-LoRA finite-sample expectation (Prop. 5.5)
# --------------------------------------------------------------------------------------------
def c_tilde(n_clients: int, m: int) -> float:
    """``c~ = (N(4 - m) - 2) / (N^2 m (m - 2))`` (App. A.4.1, eq. (242)); needs ``m > 2``."""
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    m = check_int(m, "m", minimum=3)
    return (n_clients * (4 - m) - 2) / (n_clients ** 2 * m * (m - 2))


def ffa_expected_loss(delta0: float, b_norm: float, n_clients: int, m: int) -> float:
    """``E[(1/(Nm)) sum_i ||X_i a* b*^T - X_i a0 b_FFA^T||^2] = (1 + c~) ||b*||^2 delta_0^2``
    (Prop. 5.5, eq. (11); exact constant from eqs. (242)–(244))."""
    delta0 = check_in_interval(delta0, "delta0", 0.0, 1.0)
    b_norm = check_positive(b_norm, "b_norm", strict=False)
    return float((1.0 + c_tilde(n_clients, m)) * b_norm ** 2 * delta0 ** 2)


# --------------------------------------------------------------------------------------------
# RoLoRA dynamics and the theorems' constants
# --------------------------------------------------------------------------------------------
def rolora_population_recursion(delta0: float, s: float, step_size: float, rounds: int) -> np.ndarray:
    """Exact angle trajectory of population Algorithm 2 (Lemma A.16, equality form of (259)–(267)).

    ``delta_{t+1} = delta_t |1 - 2 eta c_t^2 s| / sqrt(1 + 4 eta^2 c_t^2 s^2 (1 - c_t^2))`` with
    ``c_t^2 = 1 - delta_t^2``, ``s = ||bbar*||^2`` and ``eta = step_size`` [derived: the
    inequalities of (259)–(267) hold with equality in population, where ``bbar = bbar* c_t``].
    Independent of gamma.

    Returns
    -------
    ndarray, shape (rounds + 1,)
    """
    delta0 = check_in_interval(delta0, "delta0", 0.0, 1.0)
    s = check_positive(s, "s")
    eta = check_positive(step_size, "step_size")
    rounds = check_int(rounds, "rounds", minimum=0)
    out = np.empty(rounds + 1)
    out[0] = delta = delta0
    for t in range(rounds):  # scalar recursion, inherently sequential
        c2 = 1.0 - delta ** 2
        delta = delta * abs(1.0 - 2 * eta * c2 * s) / np.sqrt(1.0 + 4 * eta ** 2 * c2 * s ** 2 * (1 - c2))
        out[t + 1] = delta
    return out


def step_size_bound(L_max: float, *, setting: str = "homogeneous", variant: str = "paper") -> float:
    """Largest step the convergence theorems allow.

    ``setting="homogeneous"`` (Lemma 5.3 / Thm 5.4): the paper states ``eta <= 1/L_max^2``; the
    proof's step (101) needs ``2 eta ||bbar||^2 <= 1``, i.e. ``eta <= 1/(2 L_max^2)``
    (``variant="corrected"``: at ``eta = 1/||b*||^2`` the contraction factor ``|1 - 2 eta ||bbar||^2|``
    tends to 1 and the decay is sublinear). ``setting="heterogeneous"`` (Lemma A.16 / Thm A.14):
    ``eta <= 1/(2 L_max^2)`` in both variants.
    """
    L_max = check_positive(L_max, "L_max")
    check_choice(setting, "setting", ("homogeneous", "heterogeneous"))
    check_choice(variant, "variant", ("paper", "corrected"))
    if setting == "homogeneous" and variant == "paper":
        return 1.0 / L_max ** 2
    return 1.0 / (2.0 * L_max ** 2)


def _rate_args(step_size, delta0, norm, norm_name):
    return (check_positive(step_size, "step_size"), check_in_interval(delta0, "delta0", 0.0, 1.0),
            check_positive(norm, norm_name, strict=False))


def rate_bound_homogeneous(step_size: float, delta0: float, b_norm: float) -> float:
    """Per-iteration factor of eq. (9): ``sqrt(1 - eta (1 - delta_0^2) ||b*||^2)`` with
    ``eta = step_size`` (nan if the radicand is negative: the step is outside the lemma)."""
    eta, delta0, b_norm = _rate_args(step_size, delta0, b_norm, "b_norm")
    x = 1.0 - eta * (1.0 - delta0 ** 2) * b_norm ** 2
    return float(np.sqrt(x)) if x >= 0 else float("nan")


def rate_bound_heterogeneous(step_size: float, delta0: float, b_bar_norm: float) -> float:
    """Per-iteration factor of eq. (254): ``1 - 2 eta (1 - delta_0^2) ||bbar*||^2``, ``eta = step_size``."""
    eta, delta0, b_bar_norm = _rate_args(step_size, delta0, b_bar_norm, "b_bar_norm")
    return float(1.0 - 2.0 * eta * (1.0 - delta0 ** 2) * b_bar_norm ** 2)


def iterations_bound(c: float, delta0: float, eps: float, *, setting: str = "homogeneous") -> float:
    """``T`` of Thm 5.4 ``(2/(c(1-delta0^2))) log(delta0/eps)`` or Thm A.14 (without the 2)."""
    c = check_in_interval(c, "c", 0.0, 1.0, closed="right")
    delta0 = check_in_interval(delta0, "delta0", 0.0, 1.0, closed="neither")
    eps = check_positive(eps, "eps")
    check_choice(setting, "setting", ("homogeneous", "heterogeneous"))
    factor = 2.0 if setting == "homogeneous" else 1.0
    return float(factor / (c * (1 - delta0 ** 2)) * np.log(delta0 / eps))


# --------------------------------------------------------------------------------------------
# rank-r references
# --------------------------------------------------------------------------------------------
def reduced_rank_regression(X, Y, rank: int) -> np.ndarray:
    """Global rank-r minimiser of ``sum_i ||Y_i - X_i W||_F^2`` (reduced-rank regression).

    ``W_r = S^{-1/2} [S^{1/2} W_ols]_r`` with ``S = sum_i X_i^T X_i`` (Eckart–Young in the
    ``S``-weighted norm).

    Parameters
    ----------
    X : ndarray, shape (N, m, d)
    Y : ndarray, shape (N, m, q)
    rank : int

    Returns
    -------
    W : ndarray, shape (d, q)
    """
    X = as_float_array(X, "X", ndim=3)
    Y = as_float_array(Y, "Y", ndim=3)
    if Y.shape[:2] != X.shape[:2]:
        raise ValueError(f"Y must have shape ({X.shape[0]}, {X.shape[1]}, q), got {Y.shape}")
    S = np.einsum("nmd,nme->de", X, X)
    w, V = np.linalg.eigh(S)
    if w[0] <= 1e-12 * w[-1]:
        raise ValueError("sum_i X_i^T X_i must be positive definite (need N m >= d samples in general position)")
    S_half = (V * np.sqrt(w)) @ V.T
    S_mhalf = (V / np.sqrt(w)) @ V.T
    W_ols = np.linalg.solve(S, np.einsum("nmd,nmq->dq", X, Y))
    U, s, Vt = truncated_svd(S_half @ W_ols, rank)
    return S_mhalf @ ((U * s) @ Vt)


def ffa_matrix_optimum(targets, A) -> FrozenAOptimum:
    """Best frozen-A update (PEFT letters, ``DeltaW = B A``): ``B = Mbar A^T (A A^T)^{-1}``
    minimising ``(1/N) sum_i ||M_i - B A||_F^2``.

    The loss is ``(1/N) sum ||M_i - Mbar||_F^2 + ||Mbar (I - P_A)||_F^2`` with ``P_A`` the
    projector onto the row space of ``A`` (the rank-r analogue of Prop. A.17 [extension]).

    Parameters
    ----------
    targets : ndarray, shape (N, d_out, d_in)
    A : ndarray, shape (r, d_in), full row rank

    Returns
    -------
    FrozenAOptimum
        ``B`` (d_out, r) and ``loss`` (float).
    """
    M = as_float_array(targets, "targets", ndim=3)
    A = as_float_array(A, "A", ndim=2)
    if A.shape[1] != M.shape[2]:
        raise ValueError(f"A must have {M.shape[2]} columns (d_in of targets), got shape {A.shape}")
    M_bar = M.mean(axis=0)
    Bt, *_ = np.linalg.lstsq(A.T, M_bar.T, rcond=None)          # A^T B^T = Mbar^T
    B = Bt.T
    R = M - B @ A
    return FrozenAOptimum(B, float(np.sum(R * R) / M.shape[0]))
