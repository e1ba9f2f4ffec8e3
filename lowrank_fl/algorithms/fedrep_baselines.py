"""Baselines of FedRep's synthetic experiments (FedRep note §2.5, Fig. 1 / Fig. 4).

* :func:`local_only` — each client fits its own d-dimensional least squares (ridge 1e-5 as in the
  official notebook); no communication.
* :func:`fedsgd` — distributed (full-batch) gradient descent on one shared model ``(B, w)``,
  problem (4); at the end every client fits a least-squares head on the learned ``B`` (Fig. 1's
  "FedSGD" is this representation plus a personalized head).

GD-GD / 10GD-GD are :func:`lowrank_fl.algorithms.fedrep.fedrep` with ``head_steps=1`` / ``10``.
FedAvg with several local steps on ``(B, w)`` is :mod:`lowrank_fl.algorithms.fedavg` (FedAvg-FT).
"""
from __future__ import annotations

import numpy as np

from .._validation import check_in_interval, check_int, check_positive, as_generator
from ..exact.multitask import fit_heads, local_least_squares
from ..problems.multitask import MultitaskProblem, haar_orthonormal
from ..results import Trace
from ._trace import TraceRecorder
from .fedrep import n_participants, safe_distance

__all__ = ["local_only", "fedsgd"]


def _check_problem(problem):
    if not isinstance(problem, MultitaskProblem):
        raise TypeError(f"problem must be a MultitaskProblem, got {type(problem).__name__}")


def local_only(problem: MultitaskProblem, *, ridge: float = 1e-5) -> np.ndarray:
    """Local Only: ``theta_i = (X_i^T X_i + ridge I)^{-1} X_i^T y_i`` on the fixed dataset.

    Returns
    -------
    Theta : ndarray, shape (n, d)
    """
    _check_problem(problem)
    if problem.X is None:
        raise ValueError("local_only needs a fixed dataset: build the problem with samples_per_client=m")
    return local_least_squares(problem.X, problem.y, ridge=ridge)


def fedsgd(problem: MultitaskProblem, rounds: int, step_size: float, *, participation: float = 1.0,
           fresh_samples: bool = False, batch_size: int | None = None, head_ridge: float = 1e-5,
           seed=None) -> Trace:
    """FedSGD on the shared model of problem (4): ``min_{B, w} 1/(2n) sum_i E(y_i - w^T B^T x_i)^2``.

    Each round the ``rn`` sampled clients send the gradient of their batch loss at the shared
    ``(B, w)``; the server averages and steps (no orthonormalization: the model is ``Bw``).
    Start: Haar-random ``B``, ``w = 0``.

    Parameters
    ----------
    problem : MultitaskProblem
    rounds : int;  step_size : float;  participation : float in (0, 1]
    fresh_samples : bool
        False (default, the experiments): the fixed dataset; True: fresh batches of ``batch_size``
        (default ``problem.samples_per_client``; if both are None, exact population gradients).
    head_ridge : float
        Ridge of the final personalized heads fitted on ``B`` (notebook: 1e-5).
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance`` dist(B^t, B*); ``loss`` population loss of the shared model ``Bw``;
        ``B`` (d, k); ``heads`` (n, k) personalized least-squares heads on ``B`` (fixed data, or a
        fresh batch); ``extra["w"]`` the shared head (k,).
    """
    _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    step_size = check_positive(step_size, "step_size")
    participation = check_in_interval(participation, "participation", 0.0, 1.0, closed="right")
    head_ridge = check_positive(head_ridge, "head_ridge", strict=False)
    rng = as_generator(seed, stream="fedsgd")
    d, k, n = problem.d, problem.k, problem.n_clients
    if fresh_samples:
        m = problem.samples_per_client if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
    elif problem.X is None:
        raise ValueError("fedsgd with fresh_samples=False needs a fixed dataset: build the problem "
                         "with samples_per_client=m")
    c = n_participants(participation, n)
    B = haar_orthonormal(d, k, rng)
    w = np.zeros(k)

    def shared_loss(B, w):
        with np.errstate(over="ignore", invalid="ignore"):     # overflow = divergence, caught by rec
            r = B @ w - problem.theta
            return 0.5 * float(np.mean(np.sum(r * r, axis=1))) + 0.5 * problem.noise ** 2

    rec = TraceRecorder("fedsgd", rounds, truth=problem.B_star)
    rec.record(0, B, shared_loss(B, w))
    for t in range(1, rounds + 1):
        idx = np.arange(n) if c == n else np.sort(rng.choice(n, size=c, replace=False))
        with np.errstate(over="ignore", invalid="ignore"):
            if fresh_samples and m is None:                      # population gradient (Pi_i = I)
                g = B @ w - problem.theta[idx].mean(axis=0)
            else:
                X, y = problem.sample(m, rng, clients=idx) if fresh_samples else (problem.X[idx], problem.y[idx])
                r = X @ (B @ w) - y                              # (c, m)
                g = np.einsum("cmd,cm->d", X, r) / r.size       # mean_i (1/m) X_i^T r_i
            B, w = B - step_size * np.outer(g, w), w - step_size * (B.T @ g)
        rec.communicate(t, up=c * (d * k + k), down=c * (d * k + k))
        finite = bool(np.all(np.isfinite(B)) and np.all(np.isfinite(w)))
        if not rec.record(t, None, shared_loss(B, w) if finite else np.nan,
                          distance=safe_distance(problem.B_star, B) if finite else np.nan, B=B, w=w):
            break
    heads = None
    if rec.diverged_at is None:
        if fresh_samples and m is None:
            heads = np.linalg.lstsq(B, problem.theta.T, rcond=None)[0].T
        else:
            Xh, yh = problem.sample(m, rng) if fresh_samples else (problem.X, problem.y)
            heads = fit_heads(B, Xh, yh, ridge=head_ridge)
    return rec.finish(B=B, heads=heads, w=w)
