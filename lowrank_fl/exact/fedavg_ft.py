"""Exact references for FedAvg with fine-tuning (Collins, Hassani, Mokhtari, Shakkottai, 2022).

Everything here is a closed form on the population model ``f_i(B, w) = 1/2 ||B w - B* w_i*||^2``
(Sec. 3) and is used to check the iterative algorithms of :mod:`lowrank_fl.algorithms.fedavg`:

* head statistics of Assumptions 1-2 and Definition 1 (``L_max``, ``mu``, ``kappa_max``,
  ``gamma^2``, ``H``) -- :func:`head_statistics`;
* the global objective (7), its closed form ``||B w - B* wbar*||^2 + gamma^2`` and population
  optimum (minimizers ``{B w = B* wbar*}``, value ``gamma^2``) -- :func:`global_objective`,
  :func:`population_optimum`, :func:`global_gradient`;
* the one-round closed form of Sec. 4 ("prior weight" / "signal weight") and eq. (57) of Lemma 10
  -- :func:`one_round_closed_form`, :func:`complement_closed_form`;
* D-GD's invariant subspace and Proposition 1's bounds -- :func:`dgd_invariant_lower_bound`,
  :func:`proposition1_bounds`;
* Theorem 2's constants (step-size bound, contraction, round bound, participation bound) --
  :func:`theorem2_constants`;
* fine-tuning references: head-only least squares on ``orth(B)`` and its expected error, and the
  oracle representation (Eckart-Young) -- :func:`head_only_least_squares`,
  :func:`head_only_expected_error`, :func:`oracle_representation`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import as_float_array, check_in_interval, check_int, check_positive
from ..linalg import orth, truncated_svd

__all__ = [
    "HeadStatistics", "head_statistics", "population_optimum", "global_objective",
    "global_gradient", "gradient_norm", "one_round_closed_form", "complement_closed_form",
    "dgd_invariant_lower_bound", "proposition1_bounds", "Theorem2Constants", "theorem2_constants",
    "head_only_least_squares", "head_only_expected_error", "oracle_representation",
]


def _heads(heads, k=None) -> np.ndarray:
    W = as_float_array(heads, "heads", ndim=2)
    if W.shape[0] < 1 or W.shape[1] < 1:
        raise ValueError(f"heads must hold at least one client's head, got shape {W.shape}")
    if k is not None and W.shape[1] != k:
        raise ValueError(f"heads must have shape (n_clients, {k}) to match B_star, got {W.shape}")
    return W


def _basis_and_heads(B_star, heads):
    Bs = as_float_array(B_star, "B_star", ndim=2)
    d, k = Bs.shape
    if k >= d:
        raise ValueError(f"B_star must have k < d columns, got shape {Bs.shape}")
    return Bs, _heads(heads, k)


def _Bw(B, w, d, k):
    B = as_float_array(B, "B", shape=(d, k))
    w = as_float_array(w, "w", shape=(k,))
    return B, w


# ----------------------------------------------------------------------------- head statistics
@dataclass(frozen=True)
class HeadStatistics:
    """Head statistics of Assumptions 1-2, Definition 1 and Table 1.

    Attributes
    ----------
    mean : ndarray, shape (k,)
        ``wbar* = (1/M) sum_i w_i*``.
    L_max : float
        ``max_i ||w_i*||`` (Assumption 1 with equality).
    mu : float
        ``sigma_min^{1/2}`` of the centered head covariance (Assumption 2).
    kappa_max : float
        ``L_max / mu`` (``inf`` if ``mu = 0``).
    gamma2 : float
        Client variance ``gamma^2 = (1/M) sum_i ||w_i* - wbar*||^2`` (Definition 1).
    H : float
        ``H`` of Definition 1 with its typo corrected (the second moment is centered at the mean
        of the ``w_i' w_i'^T``, not at ``wbar wbar^T``):
        ``H^4 = (1/M) sum_i ||w_i* w_i*^T - (1/M) sum_i' w_i'* w_i'*^T||_2^2``.
    second_moment_min : float
        ``lambda_min((1/M) sum_i w_i* w_i*^T)``, the uncentered moment Lemma 10 actually uses.
    """

    mean: np.ndarray
    L_max: float
    mu: float
    kappa_max: float
    gamma2: float
    H: float
    second_moment_min: float


def head_statistics(heads) -> HeadStatistics:
    """Compute :class:`HeadStatistics` of heads ``(M, k)`` (Assumptions 1-2, Definition 1)."""
    W = _heads(heads)
    M, k = W.shape
    mean = W.mean(axis=0)
    C = W - mean
    cov = C.T @ C / M
    mu2 = max(float(np.linalg.eigvalsh(cov)[0]), 0.0)
    mu = float(np.sqrt(mu2))
    L_max = float(np.max(np.linalg.norm(W, axis=1)))
    second = W.T @ W / M
    outer = np.einsum("ia,ib->iab", W, W) - second
    H4 = float(np.mean(np.linalg.norm(outer, ord=2, axis=(1, 2)) ** 2))
    return HeadStatistics(
        mean=mean, L_max=L_max, mu=mu, kappa_max=L_max / mu if mu > 0 else np.inf,
        gamma2=float(np.mean(np.sum(C * C, axis=1))), H=H4 ** 0.25,
        second_moment_min=float(np.linalg.eigvalsh(second)[0]))


# ----------------------------------------------------------------------------- objective (7)
def population_optimum(B_star, heads):
    """Population optimum of the global objective (7).

    ``(1/M) sum_i ||B w - B* w_i*||^2 = ||B w - B* wbar*||^2 + gamma^2`` (bias-variance split
    around ``wbar*``), so the minimizers are exactly ``{(B, w): B w = B* wbar*}`` with value ``gamma^2``.

    Parameters
    ----------
    B_star : array_like, shape (d, k)
    heads : array_like, shape (M, k)

    Returns
    -------
    target : ndarray, shape (d,)
        ``B* wbar*``, the product every minimizer has.
    value : float
        ``gamma^2``, the minimum of (7).
    """
    Bs, W = _basis_and_heads(B_star, heads)
    mean = W.mean(axis=0)
    return Bs @ mean, float(np.mean(np.sum((W - mean) ** 2, axis=1)))


def global_objective(B, w, B_star, heads, *, closed_form: bool = False) -> float:
    """Global objective (7) ``(1/M) sum_i ||B w - B* w_i*||^2`` (no 1/2, as printed).

    ``closed_form=True`` evaluates ``||B w - B* wbar*||^2 + gamma^2`` instead (same value; the
    verifier checks the two agree).

    Parameters
    ----------
    B : array_like, shape (d, k);  w : array_like, shape (k,)
    B_star : array_like, shape (d, k);  heads : array_like, shape (M, k)
    """
    if not isinstance(closed_form, (bool, np.bool_)):
        raise TypeError(f"closed_form must be a bool, got {closed_form!r}")
    Bs, W = _basis_and_heads(B_star, heads)
    B, w = _Bw(B, w, *Bs.shape)
    if closed_form:
        target, gamma2 = population_optimum(Bs, W)
        r = B @ w - target
        return float(r @ r) + gamma2
    R = (B @ w)[None, :] - W @ Bs.T
    return float(np.mean(np.sum(R * R, axis=1)))


def global_gradient(B, w, B_star, heads):
    """Gradient of ``(1/M) sum_i f_i`` (= half of (7)) at ``(B, w)``.

    ``grad_B = (B w - B* wbar*) w^T``, ``grad_w = B^T (B w - B* wbar*)``.

    Returns
    -------
    grad_B : ndarray, shape (d, k);  grad_w : ndarray, shape (k,)
    """
    Bs, W = _basis_and_heads(B_star, heads)
    B, w = _Bw(B, w, *Bs.shape)
    e = B @ w - Bs @ W.mean(axis=0)
    return np.outer(e, w), B.T @ e


def gradient_norm(B, w, B_star, heads) -> float:
    """Frobenius norm of the gradient of (7) as plotted in Fig. 3 (left), Sec. 5.1:
    ``(||B^T (B w - B* wbar*)||^2 + ||(B w - B* wbar*) w^T||_F^2)^{1/2}``."""
    gB, gw = global_gradient(B, w, B_star, heads)
    return float(np.sqrt(np.sum(gB * gB) + gw @ gw))


# ----------------------------------------------------------------------------- one round
def _local_path(local_w, k):
    Wp = as_float_array(local_w, "local_w", ndim=3)
    if Wp.shape[2] != k:
        raise ValueError(f"local_w must have shape (m, tau, {k}), got {Wp.shape}")
    return Wp


def _factors(Wp, alpha):
    """``I - alpha w w^T`` for every (client, step): shape (m, tau, k, k)."""
    k = Wp.shape[2]
    return np.eye(k) - alpha * np.einsum("msa,msb->msab", Wp, Wp)


def one_round_closed_form(local_w, client_heads, step_size):
    """Prior and signal weights of one FedAvg round (Sec. 4, Appendix B.1).

    With ``w_{t,i,s}`` the local heads before local step ``s = 0..tau-1``,

    ``B_{t+1} = B_t P + B* S`` with
    ``P = (1/m) sum_i prod_{s=0}^{tau-1} (I - alpha w_{t,i,s} w_{t,i,s}^T)``   ("prior weight") and
    ``S = (alpha/m) sum_i w_i* sum_s w_{t,i,s}^T prod_{r=s+1}^{tau-1} (I - alpha w_{t,i,r} w_{t,i,r}^T)``
    ("signal weight"); products are ordered left to right in increasing index.

    Parameters
    ----------
    local_w : array_like, shape (m, tau, k)
        Local heads of the m participating clients before each local step.
    client_heads : array_like, shape (m, k)
        Ground-truth heads ``w_i*`` of the same clients, same order.
    step_size : float

    Returns
    -------
    prior : ndarray, shape (k, k);  signal : ndarray, shape (k, k)
    """
    alpha = check_positive(step_size, "step_size")
    Wp = as_float_array(local_w, "local_w", ndim=3)
    Hs = as_float_array(client_heads, "client_heads", shape=(Wp.shape[0], Wp.shape[2]))
    m, tau, k = Wp.shape
    F = _factors(Wp, alpha)
    # suffix[:, s] = prod_{r=s}^{tau-1} F_r (suffix[:, tau] = I), built right to left
    suffix = np.empty((m, tau + 1, k, k))
    suffix[:, tau] = np.eye(k)
    for s in range(tau - 1, -1, -1):
        suffix[:, s] = F[:, s] @ suffix[:, s + 1]
    prior = suffix[:, 0].mean(axis=0)
    inner = np.einsum("msa,msab->mb", Wp, suffix[:, 1:])          # sum_s w_s^T prod_{r>s} F_r
    signal = alpha * np.einsum("ma,mb->ab", Hs, inner) / m
    return prior, signal


def complement_closed_form(B, B_star, local_w, step_size) -> np.ndarray:
    """Right-hand side of eq. (57) (Lemma 10), in projector form.

    ``B*_perp^T B_{t+1} = B*_perp^T B_t (1/m) sum_i prod_{s=0}^{tau-1} (I - alpha w_{t,i,s} w_{t,i,s}^T)``
    (the ``s = 0`` factor is the common ``I - alpha w_t w_t^T``). Returned as
    ``(I - B* B*^T) B_t P``: since ``B*_perp B*_perp^T = I - B* B*^T`` this carries the same
    information and norms without forming a (d, d-k) basis.

    Parameters
    ----------
    B : array_like, shape (d, k);  B_star : array_like, shape (d, k)
    local_w : array_like, shape (m, tau, k);  step_size : float

    Returns
    -------
    ndarray, shape (d, k)
    """
    Bs = as_float_array(B_star, "B_star", ndim=2)
    B = as_float_array(B, "B", shape=Bs.shape)
    alpha = check_positive(step_size, "step_size")
    Wp = _local_path(local_w, Bs.shape[1])
    P = _factors(Wp, alpha)
    prod = P[:, 0]
    for s in range(1, Wp.shape[1]):
        prod = prod @ P[:, s]
    comp = B - Bs @ (Bs.T @ B)
    return comp @ prod.mean(axis=0)


# ----------------------------------------------------------------------------- D-GD / Prop 1
def dgd_invariant_lower_bound(B0, B_star, heads, *, rtol: float = 1e-10) -> float:
    """Lower bound on ``dist(B_t, B*)`` valid for every D-GD iterate (the mechanism behind
    Proposition 1: D-GD only ever adds ``B* wbar*`` directions).

    By (70) every D-GD update adds a multiple of ``B* wbar*`` to the columns, so
    ``col(B_t) ⊆ S := col(B_0) + span(B* wbar*)`` and ``dist(B_t, B*) >= ||(I - P_S) B*||_2``.
    [Not in the paper; on Proposition 1's instances, where ``B* wbar* ∈ col(B_0)``, it equals δ0.]

    Parameters
    ----------
    B0 : array_like, shape (d, k), full column rank
    B_star : array_like, shape (d, k);  heads : array_like, shape (M, k)
    rtol : float
        ``B* wbar*`` counts as lying in ``col(B_0)`` when its component outside is below
        ``rtol * ||B* wbar*||`` (then ``S = col(B_0)``).
    """
    Bs, W = _basis_and_heads(B_star, heads)
    rtol = check_positive(rtol, "rtol")
    Q = orth(as_float_array(B0, "B0", shape=Bs.shape), name="B0")
    target = Bs @ W.mean(axis=0)
    out = target - Q @ (Q.T @ target)
    scale = np.linalg.norm(target)
    if np.linalg.norm(out) > rtol * max(scale, np.finfo(float).tiny):
        Q = np.column_stack([Q, out / np.linalg.norm(out)])
    return float(np.linalg.norm(Bs - Q @ (Q.T @ Bs), 2))


def proposition1_bounds(delta0: float) -> dict:
    """Proposition 1 / 2 quantities for an initial distance ``delta0`` in (0, 1/2].

    Returns ``{"dgd_lower_bound": 0.7 delta0}`` (Prop. 1), ``"reflection_distance":
    2 delta0 sqrt(1 - delta0^2)`` (eq. (69); the appendix's one line ``2 delta0 sqrt(1 - delta0)`` is a
    typo) and ``"prop2_lower_bound": delta0`` (Prop. 2 as printed).
    """
    d0 = check_in_interval(delta0, "delta0", 0.0, 0.5, closed="right")
    return {"dgd_lower_bound": 0.7 * d0, "reflection_distance": 2 * d0 * np.sqrt(1 - d0 ** 2),
            "prop2_lower_bound": d0}


# ----------------------------------------------------------------------------- Theorem 2
@dataclass(frozen=True)
class Theorem2Constants:
    """Theorem 2's constants (App. B.1; c3 = 4800) for one instance.

    Attributes
    ----------
    step_size_bound : float
        ``(1 - delta0) / (c3 sqrt(tau) L_max kappa_max^2)``.
    step_size : float
        The step size the other quantities are evaluated at (the bound if none was given).
    contraction : float
        Per-round rate ``0.04 alpha^2 tau mu^2 E0`` (A4/A5: dist contracts by ``1 - contraction``).
    round_bound : float
        ``25 / (alpha^2 tau mu^2 E0) log(1/epsilon)``.
    init_delta_bound, init_w_bound : float
        Conditions (ii) ``alpha^2 tau L_max^2 kappa_max^2`` and (iii) ``alpha^{2.5} tau L_max^3``.
    participation_bound : float
        Theorem 1's ``min(M, 20((gamma/L)^2 + (H/L)^4)(alpha L)^{-4} log(k T))`` with T = round_bound.
    E0, delta0, local_steps, epsilon : float / int
    """

    step_size_bound: float
    step_size: float
    contraction: float
    round_bound: float
    init_delta_bound: float
    init_w_bound: float
    participation_bound: float
    E0: float
    delta0: float
    local_steps: int
    epsilon: float


def theorem2_constants(heads, delta0: float, local_steps: int, *, step_size: float | None = None,
                       epsilon: float = 1e-6, E0: float | None = None, c3: float = 4800.0
                       ) -> Theorem2Constants:
    """Evaluate Theorem 2 (explicit-constant Theorem 1) on heads ``(M, k)``.

    Parameters
    ----------
    heads : array_like, shape (M, k)
    delta0 : float in [0, 1)
        Initial distance ``dist(B_0, B*)``.
    local_steps : int >= 1
        tau (the theorem needs tau >= 2; tau = 1 is evaluated for comparison only).
    step_size : float, optional
        alpha; defaults to the bound.
    epsilon : float in (0, 1)
    E0 : float in (0, 1], optional
        Defaults to ``1 - delta0^2`` (Table 1).
    c3 : float
        The constant of the step-size bound (4800 in Theorem 2; the paper's other statements of it
        differ), > 0.
    """
    stats = head_statistics(heads)
    if not stats.mu > 0:
        raise ValueError("heads must be diverse (Assumption 2: mu > 0), got mu = 0")
    d0 = check_in_interval(delta0, "delta0", 0.0, 1.0, closed="left")
    tau = check_int(local_steps, "local_steps", minimum=1)
    eps = check_in_interval(epsilon, "epsilon", 0.0, 1.0, closed="neither")
    E0 = 1.0 - d0 ** 2 if E0 is None else check_in_interval(E0, "E0", 0.0, 1.0, closed="right")
    c3 = check_positive(c3, "c3")
    L, kap, mu = stats.L_max, stats.kappa_max, stats.mu
    bound = (1 - d0) / (c3 * np.sqrt(tau) * L * kap ** 2)
    alpha = bound if step_size is None else check_positive(step_size, "step_size")
    rate = 0.04 * alpha ** 2 * tau * mu ** 2 * E0
    T = 25.0 / (alpha ** 2 * tau * mu ** 2 * E0) * np.log(1 / eps)
    M, k = np.shape(heads)
    part = 20 * ((np.sqrt(stats.gamma2) / L) ** 2 + (stats.H / L) ** 4) * (alpha * L) ** -4 \
        * np.log(k * T)
    return Theorem2Constants(
        step_size_bound=float(bound), step_size=float(alpha), contraction=float(rate),
        round_bound=float(T), init_delta_bound=float(alpha ** 2 * tau * L ** 2 * kap ** 2),
        init_w_bound=float(alpha ** 2.5 * tau * L ** 3), participation_bound=float(min(M, part)),
        E0=float(E0), delta0=float(d0), local_steps=tau, epsilon=float(eps))


# ----------------------------------------------------------------------------- fine-tuning
def head_only_least_squares(X, y, B):
    """Head-only least squares on a fixed representation (fine-tuning of the head alone, eq. (4)
    with ``B`` frozen).

    ``Q = orth(B)``, ``w_hat = argmin ||X Q w - y||`` (LAPACK least squares), ``beta_hat = Q w_hat``.

    Parameters
    ----------
    X : array_like, shape (n, d);  y : array_like, shape (n,);  B : array_like, shape (d, k)

    Returns
    -------
    Q : ndarray (d, k);  w_hat : ndarray (k,);  beta_hat : ndarray (d,)
    """
    X = as_float_array(X, "X", ndim=2)
    y = as_float_array(y, "y", shape=(X.shape[0],))
    B = as_float_array(B, "B", shape=(X.shape[1], None))
    Q = orth(B, name="B")
    w_hat = np.linalg.lstsq(X @ Q, y, rcond=None)[0]
    return Q, w_hat, Q @ w_hat


def head_only_expected_error(Q, beta_star, noise: float, n: int) -> float:
    """``E ||Q w_hat - beta*||^2`` of head-only least squares for ``x ~ N(0, I_d)``, n > k + 1.

    ``||(I - QQ^T) beta*||^2 + (sigma^2 + ||(I - QQ^T) beta*||^2) k / (n - k - 1)`` (standard OLS
    result; not in the paper). ``Q`` (d, k) orthonormal, ``beta_star`` (d,).
    """
    Q = as_float_array(Q, "Q", ndim=2)
    b = as_float_array(beta_star, "beta_star", shape=(Q.shape[0],))
    sigma = check_positive(noise, "noise", strict=False)
    k = Q.shape[1]
    n = check_int(n, "n", minimum=k + 2)
    bias2 = float(np.sum((b - Q @ (Q.T @ b)) ** 2))
    return bias2 + (sigma ** 2 + bias2) * k / (n - k - 1)


def oracle_representation(B_star, heads) -> np.ndarray:
    """Top-k left singular vectors of ``[beta_1* ... beta_M*]`` (Eckart-Young).

    Equals ``col(B*)`` iff the uncentered head moment is full rank. Returns (d, k).
    """
    Bs, W = _basis_and_heads(B_star, heads)
    if np.linalg.matrix_rank(W) < Bs.shape[1]:
        raise ValueError(f"heads must span R^k (rank {Bs.shape[1]}) for the oracle representation "
                         f"to be unique, got rank {np.linalg.matrix_rank(W)}")
    U, _, _ = truncated_svd(Bs @ W.T, Bs.shape[1])
    return U
