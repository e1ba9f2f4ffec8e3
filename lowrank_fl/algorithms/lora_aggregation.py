"""Server aggregation of rank-r LoRA factors and the matrix-form federated LoRA methods.

Letters follow PEFT (Hu et al.; HF ``peft``): a LoRA update is ``DeltaW = B A`` with the
down-projection ``A`` (r, in) (``lora_A.weight``) and the up-projection ``B`` (out, r)
(``lora_B.weight``); the ``scaling`` factor of PEFT is left to the caller. Client factors are
stacked client-first: ``A`` (K, r, in), ``B`` (K, out, r). (RoLoRA writes the transpose,
``A B`` with A (d × r), B (r × d), because it multiplies rows ``x W``, §3.1: the same objects.)

* :func:`mean_product` — the exact aggregate ``sum_k w_k B_k A_k`` (eq. (1)).
* :func:`fedavg_factors` — FedAvg of factors ``(Abar, Bbar)``; ``Bbar Abar`` is eq. (2)'s
  aggregate. Its error is the factor cross-covariance
  ``sum_k w_k B_k A_k - Bbar Abar = sum_k w_k (B_k - Bbar)(A_k - Abar)`` ([elementary identity]:
  expand the right-hand side), zero when all A_k or all B_k coincide — RoLoRA's rounds,
  eqs. (3)–(4).
* :func:`flexlora_aggregate` — FlexLoRA's server step: truncated SVD of the mean update
  (Eckart–Young optimal rank-r), split back into factors.
* :func:`federated_lora_matrix`: RoLoRA (alternating: B round, then A round), FFA-LoRA (B only),
  FedAvg-LoRA (both, averaged) and FlexLoRA (both, SVD aggregate) on a
  :class:`~lowrank_fl.problems.lora.LoRAMatrixProblem`, recording the aggregation error
  ``||mean_k B_k A_k - B_server A_server||_F`` of every communication round.

The kernels take any stack of factors (they are what :mod:`lowrank_fl.adapters` applies to real
PEFT adapters module by module), are batched over the client axis (one GEMM for the aggregate)
and take optional client ``weights`` (e.g. sample counts), normalised to sum to one.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from ..validation import as_float_array, as_generator, check_choice, check_instance, check_int, check_positive
from ..linalg import thin_svd, truncated_svd
from ..problems.lora import LoRAMatrixProblem
from .common import check_clients_per_round, check_local_steps, choose_clients, resolve_data
from .recorder import TraceRecorder
from .rolora import resolve_deprecated

__all__ = ["LoRAFactors", "check_factors", "mean_product", "fedavg_factors", "interference",
           "cross_covariance", "flexlora_aggregate", "eckart_young_tail", "federated_lora_matrix",
           "rolora_matrix", "METHODS"]

METHODS = ("rolora", "ffa", "fedavg", "flexlora")


class LoRAFactors(NamedTuple):
    """One LoRA pair in PEFT's letters: ``A`` (r, in), ``B`` (out, r), update ``B @ A``."""

    A: np.ndarray
    B: np.ndarray


def check_factors(A, B, weights=None):
    """Validate stacked client factors; returns ``(A, B, w)`` as float64 with ``w`` summing to 1.

    ``A`` (K, r, in), ``B`` (K, out, r) with the same K and r; ``weights`` (K,) finite, >= 0, with
    a positive sum (default uniform). ``ValueError`` naming the argument otherwise.
    """
    A = as_float_array(A, "A", ndim=3)
    B = as_float_array(B, "B", ndim=3)
    K, r, _ = A.shape
    if B.shape[0] != K or B.shape[2] != r:
        raise ValueError(f"B must have shape ({K}, out, {r}) to match A of shape {A.shape} "
                         f"(A is (clients, r, in), B is (clients, out, r)), got {B.shape}")
    if K == 0:
        raise ValueError("A and B must hold at least one client, got 0")
    if weights is None:
        return A, B, np.full(K, 1.0 / K)
    w = as_float_array(weights, "weights", shape=(K,))
    if np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {w.tolist()}")
    return A, B, w / w.sum()


def _weighted_product(A, B, w):
    """``sum_k w_k B_k A_k`` as one GEMM: ``[w_1 B_1 ... w_K B_K] (out, K r) @ [A_1; ...; A_K]``."""
    K, r, d_in = A.shape
    Bw = np.swapaxes(B * w[:, None, None], 0, 1).reshape(B.shape[1], K * r)
    return Bw @ A.reshape(K * r, d_in)


def mean_product(A, B, *, weights=None) -> np.ndarray:
    """Exact aggregate ``sum_k w_k B_k A_k`` (eq. (1)); ``A`` (K, r, in), ``B`` (K, out, r) → (out, in).

    ``weights`` (K,) default uniform (the plain mean); normalised to sum to one.
    """
    A, B, w = check_factors(A, B, weights)
    return _weighted_product(A, B, w)


def fedavg_factors(A, B, *, weights=None) -> LoRAFactors:
    """FedAvg of factors: ``LoRAFactors(Abar (r, in), Bbar (out, r))``, weighted means over clients;
    ``Bbar @ Abar`` is eq. (2)'s aggregate."""
    A, B, w = check_factors(A, B, weights)
    return LoRAFactors(np.tensordot(w, A, axes=1), np.tensordot(w, B, axes=1))


def interference(A, B, *, weights=None) -> np.ndarray:
    """``sum_k w_k B_k A_k - Bbar Abar`` (eq. (1) minus eq. (2)), shape (out, in)."""
    A, B, w = check_factors(A, B, weights)
    Abar, Bbar = np.tensordot(w, A, axes=1), np.tensordot(w, B, axes=1)
    return _weighted_product(A, B, w) - Bbar @ Abar


def cross_covariance(A, B, *, weights=None) -> np.ndarray:
    """``sum_k w_k (B_k - Bbar)(A_k - Abar)``, shape (out, in); equals :func:`interference`."""
    A, B, w = check_factors(A, B, weights)
    Abar, Bbar = np.tensordot(w, A, axes=1), np.tensordot(w, B, axes=1)
    return _weighted_product(A - Abar, B - Bbar, w)


def flexlora_aggregate(A, B, *, rank: int | None = None, weights=None) -> LoRAFactors:
    """FlexLoRA server step: best rank-``rank`` factors of ``M = sum_k w_k B_k A_k`` (truncated SVD).

    With ``M ≈ U S V^T`` (top ``rank`` singular triplets, Eckart–Young), the singular values are
    split evenly between the factors: ``B = U sqrt(S)`` (out, rank), ``A = sqrt(S) V^T``
    (rank, in), so ``B A`` is the best rank-``rank`` approximation of ``M`` and both factors have
    the same singular values (a balanced split; any ``B = U S^t``, ``A = S^{1-t} V^T`` gives the
    same product). ``rank`` defaults to the clients' r and is at most ``min(out, in)``.

    Returns
    -------
    LoRAFactors
        ``A`` (rank, in), ``B`` (out, rank).
    """
    A, B, w = check_factors(A, B, weights)
    rank = A.shape[1] if rank is None else rank
    U, s, Vt = truncated_svd(_weighted_product(A, B, w), rank)
    root = np.sqrt(s)
    return LoRAFactors(root[:, None] * Vt, U * root)


def eckart_young_tail(M, rank: int) -> float:
    """``sqrt(sum_{k > r} sigma_k(M)^2)``: the smallest ``||M - B A||_F`` over rank-r products.

    Parameters
    ----------
    M : array_like, shape (out, in)
    rank : int >= 0
    """
    M = as_float_array(M, "M", ndim=2)
    rank = check_int(rank, "rank", minimum=0)
    s = thin_svd(M)[1]
    return float(np.sqrt(np.sum(s[rank:] ** 2)))


def _is_pair(init) -> bool:
    return isinstance(init, tuple) and len(init) == 2


def _initial_factors(method, problem, init, old, rng):
    """``(A0 (r, in), B0 (out, r), description)`` from ``init`` or the deprecated A0 / B0."""
    r, d_in, d_out = problem.rank, problem.d_in, problem.d_out
    if old:
        init = (old.get("A0"), old.get("B0"))
    A0 = B0 = None
    if _is_pair(init):
        A0, B0 = init
    elif not isinstance(init, str):
        A0 = init
    else:
        check_choice(init, "init", ("random",))
    desc = "random" if A0 is None else "array"
    # the paper's (and PEFT's) start: A Gaussian, B zero. Drawn (in, r) and transposed, so a seed
    # gives the transpose of the paper-letter draw.
    A = rng.standard_normal((d_in, r)).T / np.sqrt(d_in) if A0 is None else \
        as_float_array(A0, "init (A0)", shape=(r, d_in))
    B = np.zeros((d_out, r)) if B0 is None else as_float_array(B0, "init (B0)", shape=(d_out, r))
    if B0 is not None:
        desc += "+B0"
    # degenerate starts that can never move
    if not np.any(A) and not np.any(B):
        raise ValueError("init: A0 and B0 are both zero, a stationary point of every method (both "
                         "gradients vanish): nothing would ever move; give a non-zero A0 (PEFT: "
                         "A random, B zero)")
    if method == "ffa":
        if not np.any(A):
            raise ValueError("init (A0) is zero with method='ffa': A stays frozen at 0, so the "
                             "gradient in B vanishes and B never moves")
        if np.linalg.matrix_rank(A) < r:
            warnings.warn(f"init (A0) has rank {np.linalg.matrix_rank(A)} < {r} with method='ffa': "
                          f"A stays frozen, so the model never reaches rank {r}", UserWarning,
                          stacklevel=3)
    return A, B, desc


def federated_lora_matrix(problem: LoRAMatrixProblem, rounds: int, step_size: float, *,
                          data: str | None = None, batch_size: int | None = None,
                          clients_per_round: int | None = None, local_steps: int = 1, init="random",
                          method: str = "rolora", seed=None, **deprecated):
    """Matrix-form federated LoRA with local GD on ``l_i(A, B) = ||DeltaW_i - B A||_F^2``.

    Gradients: ``grad_B l_i = -2 (DeltaW_i - B A) A^T``, ``grad_A l_i = -2 B^T (DeltaW_i - B A)``.
    Each participating client starts a communication round from the server's factors and takes
    ``local_steps`` GD steps on the factor(s) it trains:

    * ``"rolora"`` (Algorithm 1): odd rounds train B with A frozen and average B (eq. (3)); even
      rounds train A with B frozen and average A (eq. (4)).
    * ``"ffa"``: A frozen at its initial value forever, B trained and averaged.
    * ``"fedavg"``: both trained (simultaneous GD steps), both averaged (eq. (2)).
    * ``"flexlora"``: both trained, server takes the rank-r truncated SVD of ``mean_i B_i A_i``
      (:func:`flexlora_aggregate`).

    Parameters
    ----------
    problem : LoRAMatrixProblem
    rounds : int >= 0
        Communication rounds (for RoLoRA one iteration of Algorithm 1 is two rounds).
    step_size : float > 0
    data : {"population"} or None
        The targets are known exactly (no samples): the only regime is ``"population"``.
    batch_size : None
        Not used (no samples); giving it is a ``ValueError``.
    clients_per_round : int, optional
        Participants per round, without replacement (default all); the server averages over them.
    local_steps : int in [1, MAX_LOCAL_STEPS]
    init : "random", array (r, in), or (A0, B0)
        ``"random"``: A with i.i.d. ``N(0, 1/d_in)`` entries, B = 0 (the paper's experiments and
        PEFT's default); an array is ``A0`` with ``B0 = 0``; a pair gives both (either may be
        None for its default). Both zero (a stationary point) is a ``ValueError``, and so is a
        zero ``A0`` with ``method="ffa"``.
    method : one of METHODS
    seed : int or Generator
    A0, B0 :
        Deprecated aliases of ``init=(A0, B0)`` (in PEFT shapes: A0 (r, in), B0 (out, r)).

    Returns
    -------
    Trace
        ``distance`` = principal-angle distance between the row spaces of ``A`` and ``A*``
        (``subspace_distance(A*^T, A^T, rank_deficient="span")``: 1 once A loses rank);
        ``loss`` = population loss of the server model; ``a`` = A (r, in), ``b`` = B (out, r);
        ``extra["aggregation_error"][t] = ||mean_i B_i A_i - B A||_F`` after round t (over its
        participants), ``extra["relative_aggregation_error"]`` divides by
        ``||mean_i B_i A_i||_F``. On divergence (status ``"diverged"``, ``ConvergenceWarning``)
        ``a``, ``b`` are the last finite server factors.
    """
    init, data, old = resolve_deprecated("federated_lora_matrix", deprecated, init_names=("A0", "B0"),
                                         init=init, data=data, data_alias=False)
    check_instance(problem, "problem", LoRAMatrixProblem)
    rounds = check_int(rounds, "rounds", minimum=0)
    eta = check_positive(step_size, "step_size")
    check_choice(method, "method", METHODS)
    local_steps = check_local_steps(local_steps)
    data = resolve_data(data, has_dataset=False, can_sample=False, batch_size=batch_size,
                        method="federated_lora_matrix")
    per_round = check_clients_per_round(clients_per_round, problem.n_clients)
    rng = as_generator(seed, stream="federated_lora_matrix")
    A, B, desc = _initial_factors(method, problem, init, old, rng)
    config = {"data": data, "batch_size": None, "clients_per_round": per_round,
              "local_steps": local_steps, "init": desc, "step_size": eta, "method": method}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # non-finite => "diverged"
        return _run_matrix(problem, rounds, eta, method, local_steps, per_round, A, B, rng, config)


def _run_matrix(problem, rounds, eta, method, local_steps, per_round, A, B, rng, config):
    n, r = problem.n_clients, problem.rank
    targets = problem.targets                                      # (N, out, in)
    rec = TraceRecorder(method, rounds, truth=problem.A_star.T, config=config)
    if not rec.record(0, A.T, problem.loss(A, B), B=B):
        return rec.finish(a=A, b=B)
    rec.record_extra("aggregation_error", 0, 0.0)
    rec.record_extra("relative_aggregation_error", 0, 0.0)
    for t in range(1, rounds + 1):
        last = (A, B)
        train_B = method != "rolora" or t % 2 == 1
        train_A = method in ("fedavg", "flexlora") or (method == "rolora" and t % 2 == 0)
        S = choose_clients(rng, n, per_round)
        M = targets if S is None else targets[S]
        k = M.shape[0]
        A_c = np.broadcast_to(A, (k,) + A.shape).copy()
        B_c = np.broadcast_to(B, (k,) + B.shape).copy()
        for _ in range(local_steps):                               # local steps are sequential
            R = M - B_c @ A_c                                      # (k, out, in)
            gA = -2.0 * np.swapaxes(B_c, 1, 2) @ R if train_A else 0.0
            gB = -2.0 * R @ np.swapaxes(A_c, 1, 2) if train_B else 0.0
            A_c = A_c - eta * gA
            B_c = B_c - eta * gB
        finite = np.all(np.isfinite(A_c)) and np.all(np.isfinite(B_c))
        exact = _weighted_product(A_c, B_c, np.full(k, 1.0 / k)) if finite else None
        if method == "flexlora" and finite:
            A, B = flexlora_aggregate(A_c, B_c, rank=r)
        else:
            A, B = A_c.mean(axis=0), B_c.mean(axis=0)
        sent = (A.size * train_A + B.size * train_B) * k
        rec.communicate(t, up=sent, down=sent)
        if exact is None or not rec.record(t, A.T, problem.loss(A, B), B=B):
            rec.diverged_at = t
            A, B = last                                            # keep the last finite iterate
            break
        err = float(np.linalg.norm(exact - B @ A))
        rec.record_extra("aggregation_error", t, err)
        rec.record_extra("relative_aggregation_error", t, err / max(np.linalg.norm(exact), np.finfo(float).tiny))
    return rec.finish(a=A, b=B)


def rolora_matrix(problem: LoRAMatrixProblem, rounds: int, step_size: float, *, data: str | None = None,
                  batch_size: int | None = None, clients_per_round: int | None = None, local_steps: int = 1,
                  init="random", seed=None, **deprecated):
    """RoLoRA (Algorithm 1) in matrix form; :func:`federated_lora_matrix` with ``method="rolora"``."""
    return federated_lora_matrix(problem, rounds, step_size, data=data, batch_size=batch_size,
                                 clients_per_round=clients_per_round, local_steps=local_steps, init=init,
                                 method="rolora", seed=seed, **deprecated)
