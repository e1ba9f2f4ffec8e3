"""Server aggregation of rank-r LoRA factors and the matrix-form federated LoRA methods.

Paper convention (RoLoRA §3.1, notes §1.2): update ``DeltaW = A B`` with down-projection
``A`` (d, r) and up-projection ``B`` (r, d). Client factors are stacked client-first:
``A`` (N, d, r), ``B`` (N, r, d).

* FedAvg of factors computes ``Abar Bbar`` (eq. (2)) instead of the exact ``mean_i A_i B_i``
  (eq. (1)); the error is the factor cross-covariance
  ``mean_i A_i B_i - Abar Bbar = (1/N) sum_i (A_i - Abar)(B_i - Bbar)`` ([elementary identity],
  notes §1.3), zero when all A_i or all B_i coincide — RoLoRA's rounds, eqs. (3)–(4).
* FlexLoRA's server step: truncated SVD of ``mean_i A_i B_i`` (Eckart–Young optimal rank-r).
* :func:`federated_lora_matrix`: RoLoRA (alternating: B round, then A round), FFA-LoRA (B only),
  FedAvg-LoRA (both, averaged) and FlexLoRA (both, SVD aggregate) on a
  :class:`~lowrank_fl.problems.lora.LoRAMatrixProblem`, recording the aggregation error
  ``||mean_i A_i B_i - A_server B_server||_F`` of every communication round.
"""
from __future__ import annotations

import numpy as np

from ..validation import (as_float_array, as_generator, check_choice, check_instance, check_int,
                           check_positive)
from ..linalg import thin_svd, truncated_svd
from ..problems.lora import LoRAMatrixProblem
from .recorder import TraceRecorder
from .rolora import MAX_LOCAL_STEPS

__all__ = ["mean_product", "fedavg_factors", "interference", "cross_covariance", "flexlora_aggregate",
           "eckart_young_tail", "federated_lora_matrix", "rolora_matrix", "METHODS"]

METHODS = ("rolora", "ffa", "fedavg", "flexlora")


def _factors(A, B):
    A = as_float_array(A, "A", ndim=3)
    B = as_float_array(B, "B", ndim=3)
    n, d, r = A.shape
    if B.shape[:2] != (n, r):
        raise ValueError(f"B must have shape ({n}, {r}, q) to match A of shape {A.shape}, got {B.shape}")
    return A, B


def mean_product(A, B) -> np.ndarray:
    """Exact aggregate ``(1/N) sum_i A_i B_i`` (eq. (1)); A (N, d, r), B (N, r, q) → (d, q)."""
    A, B = _factors(A, B)
    return np.einsum("ndr,nrq->dq", A, B) / A.shape[0]


def fedavg_factors(A, B) -> tuple[np.ndarray, np.ndarray]:
    """FedAvg of factors ``(Abar, Bbar)``; their product is eq. (2)'s aggregate."""
    A, B = _factors(A, B)
    return A.mean(axis=0), B.mean(axis=0)


def interference(A, B) -> np.ndarray:
    """``mean_i A_i B_i - Abar Bbar`` (eq. (1) minus eq. (2)), shape (d, q)."""
    Abar, Bbar = fedavg_factors(A, B)
    return mean_product(A, B) - Abar @ Bbar


def cross_covariance(A, B) -> np.ndarray:
    """``(1/N) sum_i (A_i - Abar)(B_i - Bbar)``, shape (d, q); equals :func:`interference`."""
    A, B = _factors(A, B)
    return np.einsum("ndr,nrq->dq", A - A.mean(axis=0), B - B.mean(axis=0)) / A.shape[0]


def flexlora_aggregate(A, B, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FlexLoRA server step: best rank-r factors of ``M = mean_i A_i B_i`` (truncated SVD).

    Returns balanced factors ``A = U sqrt(S)`` (d, r), ``B = sqrt(S) V^T`` (r, q);
    ``rank`` defaults to the clients' r.
    """
    A, B = _factors(A, B)
    rank = A.shape[2] if rank is None else rank
    U, s, Vt = truncated_svd(mean_product(A, B), rank)
    root = np.sqrt(s)
    return U * root, root[:, None] * Vt


def eckart_young_tail(M, rank: int) -> float:
    """``sqrt(sum_{k > r} sigma_k(M)^2)``: the smallest ``||M - Z||_F`` over rank-r ``Z``.

    Parameters
    ----------
    M : array_like, shape (d, q)
    rank : int >= 0
    """
    M = as_float_array(M, "M", ndim=2)
    rank = check_int(rank, "rank", minimum=0)
    s = thin_svd(M)[1]
    return float(np.sqrt(np.sum(s[rank:] ** 2)))


def federated_lora_matrix(problem: LoRAMatrixProblem, rounds: int, step_size: float, *,
                          method: str = "rolora", local_steps: int = 1, A0=None, B0=None, seed=None):
    """Matrix-form federated LoRA with local GD on ``l_i(A, B) = ||DeltaW_i - A B||_F^2``.

    Gradients: ``grad_B l_i = -2 A^T (DeltaW_i - A B)``, ``grad_A l_i = -2 (DeltaW_i - A B) B^T``.
    Each client starts a communication round from the server's factors and takes
    ``local_steps`` GD steps on the factor(s) it trains:

    * ``"rolora"`` (Algorithm 1): odd rounds train B with A frozen and average B (eq. (3)); even
      rounds train A with B frozen and average A (eq. (4)).
    * ``"ffa"``: A frozen at A0 forever, B trained and averaged.
    * ``"fedavg"``: both trained (simultaneous GD steps), both averaged (eq. (2)).
    * ``"flexlora"``: both trained, server takes the rank-r truncated SVD of ``mean_i A_i B_i``.

    Parameters
    ----------
    problem : LoRAMatrixProblem
    rounds : int >= 0
        Communication rounds (for RoLoRA one iteration of Algorithm 1 is two rounds).
    step_size : float > 0
    method : one of METHODS
    local_steps : int in [1, MAX_LOCAL_STEPS]
    A0 : array_like, shape (d, r), optional
        Default Gaussian ``N(0, 1/d)`` entries (paper's experiments: A Gaussian, B = 0).
    B0 : array_like, shape (r, d), optional
        Default zero.
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance`` = principal-angle distance between ``col(A)`` and ``col(A*)``
        (``subspace_distance(..., rank_deficient="span")``: 1 once A loses rank);
        ``loss`` = population loss of the server model; ``a`` = A (d, r), ``b`` = B (r, d);
        ``extra["aggregation_error"][t] = ||mean_i A_i B_i - A B||_F`` after round t,
        ``extra["relative_aggregation_error"]`` divides by ``||mean_i A_i B_i||_F``. On
        divergence (status ``"diverged"``) ``a``, ``b`` are the last finite server factors.
    """
    check_instance(problem, "problem", LoRAMatrixProblem)
    rounds = check_int(rounds, "rounds", minimum=0)
    eta = check_positive(step_size, "step_size")
    check_choice(method, "method", METHODS)
    local_steps = check_int(local_steps, "local_steps", minimum=1, maximum=MAX_LOCAL_STEPS)
    rng = as_generator(seed, stream="federated_lora_matrix")
    n, d, r = problem.n_clients, problem.d, problem.rank
    A = rng.standard_normal((d, r)) / np.sqrt(d) if A0 is None else as_float_array(A0, "A0", shape=(d, r))
    B = np.zeros((r, d)) if B0 is None else as_float_array(B0, "B0", shape=(r, d))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # non-finite => "diverged"
        return _run_matrix(problem, rounds, eta, method, local_steps, A, B)


def _run_matrix(problem, rounds, eta, method, local_steps, A, B):
    n, d, r = problem.n_clients, problem.d, problem.rank
    M = problem.targets                                            # (N, d, d)
    rec = TraceRecorder(method, rounds, truth=problem.A_star)
    if not rec.record(0, A, problem.loss(A, B), B=B):
        return rec.finish(a=A, b=B)
    rec.record_extra("aggregation_error", 0, 0.0)
    rec.record_extra("relative_aggregation_error", 0, 0.0)
    for t in range(1, rounds + 1):
        last = (A, B)
        train_B = method != "rolora" or t % 2 == 1
        train_A = method in ("fedavg", "flexlora") or (method == "rolora" and t % 2 == 0)
        A_c = np.broadcast_to(A, (n, d, r)).copy()
        B_c = np.broadcast_to(B, (n, r, d)).copy()
        for _ in range(local_steps):                               # local steps are sequential
            R = M - A_c @ B_c                                      # (N, d, d)
            gA = -2.0 * R @ np.swapaxes(B_c, 1, 2) if train_A else 0.0
            gB = -2.0 * np.swapaxes(A_c, 1, 2) @ R if train_B else 0.0
            A_c = A_c - eta * gA
            B_c = B_c - eta * gB
        exact = mean_product(A_c, B_c) if np.all(np.isfinite(A_c)) and np.all(np.isfinite(B_c)) else None
        if method == "flexlora" and exact is not None:
            A, B = flexlora_aggregate(A_c, B_c, r)
        else:
            A, B = A_c.mean(axis=0), B_c.mean(axis=0)
        sent = (d * r) * ((train_A) + (train_B)) * n
        rec.communicate(t, up=sent, down=sent)
        if exact is None or not rec.record(t, A, problem.loss(A, B), B=B):
            rec.diverged_at = t
            A, B = last                                            # keep the last finite iterate
            break
        err = float(np.linalg.norm(exact - A @ B))
        rec.record_extra("aggregation_error", t, err)
        rec.record_extra("relative_aggregation_error", t, err / max(np.linalg.norm(exact), np.finfo(float).tiny))
    return rec.finish(a=A, b=B)


def rolora_matrix(problem: LoRAMatrixProblem, rounds: int, step_size: float, *, local_steps: int = 1,
                  A0=None, B0=None, seed=None):
    """RoLoRA (Algorithm 1) in matrix form; :func:`federated_lora_matrix` with ``method="rolora"``."""
    return federated_lora_matrix(problem, rounds, step_size, method="rolora", local_steps=local_steps,
                                 A0=A0, B0=B0, seed=seed)
