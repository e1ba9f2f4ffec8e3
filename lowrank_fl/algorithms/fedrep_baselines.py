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

from ..validation import (as_generator, check_choice, check_in_interval, check_instance, check_int,
                           check_positive)
from ..exact.multitask import fit_heads, local_least_squares
from ..problems.multitask import MultitaskProblem, haar_orthonormal
from ..results import Trace
from .recorder import TraceRecorder
from .fedrep import _check_bool, n_participants

__all__ = ["local_only", "fedsgd", "FEDSGD_AGGREGATIONS"]

FEDSGD_AGGREGATIONS = ("mean", "sum")


def _check_problem(problem) -> MultitaskProblem:
    return check_instance(problem, "problem", MultitaskProblem)


def local_only(problem: MultitaskProblem, *, ridge: float = 1e-5) -> np.ndarray:
    """Local Only (FedRep Sec. 5, Fig. 1; note §2.5): each client solves its own ridge regression
    ``theta_i = argmin_theta ||X_i theta - y_i||^2 + ridge ||theta||^2
    = (X_i^T X_i + ridge I)^{-1} X_i^T y_i`` on its fixed dataset (notebook ridge 1e-5).

    Returns
    -------
    Theta : ndarray, shape (n, d)
    """
    _check_problem(problem)
    X, y = problem.require_dataset("local_only")
    return local_least_squares(X, y, ridge=ridge)


def fedsgd(problem: MultitaskProblem, rounds: int, step_size: float, *, participation: float = 1.0,
           fresh_samples: bool = False, batch_size: int | None = None, head_ridge: float = 1e-5,
           aggregation: str = "mean", seed=None) -> Trace:
    """FedSGD on the shared model of problem (4): ``min_{B, w} 1/(2n) sum_i E(y_i - w^T B^T x_i)^2``.

    Each round the ``rn`` sampled clients send the gradient of their batch loss at the shared
    ``(B, w)``; the server aggregates and steps (no orthonormalization: the model is ``Bw``).
    Start: Haar-random ``B``, ``w = 0``.

    Parameters
    ----------
    problem : MultitaskProblem
    rounds : int (>= 0);  step_size : float;  participation : float in (0, 1]
    fresh_samples : bool
        False (default, the experiments): the fixed dataset; True: fresh batches of ``batch_size``
        (default ``problem.samples_per_client``; if both are None, exact population gradients).
    batch_size : int, optional
        Only with ``fresh_samples=True`` (ValueError otherwise).
    head_ridge : float
        Ridge of the final personalized heads fitted on ``B`` (notebook: 1e-5).
    aggregation : {"mean", "sum"}
        ``"mean"`` (default): the gradient of problem (4)'s average over clients; ``"sum"``: the
        official notebook's summed client gradients (note §2.5 [N]), i.e. ``rn`` times larger —
        use it with the notebook's step sizes (0.005).
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance`` dist(B^t, B*) (1 if ``B`` lost rank); ``loss[t]`` =
        ``problem.population_loss(B^t, W)`` with ``W`` = the shared head ``w^t`` for every client
        (the model FedSGD trains; the package-wide convention eq. (6) ``1/(2n) sum ||B w_i -
        theta_i||^2 + noise^2/2``); ``B`` (d, k) and ``extra["w"]`` (k,) the final shared model
        (the last finite one on divergence), so ``loss[-1] == population_loss(B, tile(w))``;
        ``heads`` (n, k) the personalized least-squares heads fitted on ``B`` after training
        (fixed data, or a fresh batch; ``None`` on divergence) — Fig. 1's "FedSGD" — with their
        loss in ``extra["personalized_loss"]`` (= ``population_loss(B, heads)``).
    """
    _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    step_size = check_positive(step_size, "step_size")
    participation = check_in_interval(participation, "participation", 0.0, 1.0, closed="right")
    head_ridge = check_positive(head_ridge, "head_ridge", strict=False)
    fresh_samples = _check_bool(fresh_samples, "fresh_samples")
    check_choice(aggregation, "aggregation", FEDSGD_AGGREGATIONS)
    rng = as_generator(seed, stream="fedsgd")
    d, k, n = problem.d, problem.k, problem.n_clients
    if fresh_samples:
        m = problem.samples_per_client if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
    else:
        problem.require_dataset("fedsgd with fresh_samples=False")
        if batch_size is not None:
            raise ValueError(f"batch_size applies to fresh samples only; got batch_size={batch_size!r} "
                             f"with fresh_samples=False (the fixed dataset is used)")
    c = n_participants(participation, n)
    agg = 1.0 if aggregation == "mean" else float(c)        # sum = c x mean of client gradients
    B = haar_orthonormal(d, k, rng)
    w = np.zeros(k)

    def shared_loss(B, w):
        with np.errstate(over="ignore", invalid="ignore"):     # overflow = divergence, caught by rec
            if not (np.all(np.isfinite(B)) and np.all(np.isfinite(w))):
                return np.nan
            return problem.population_loss(B, np.broadcast_to(w, (n, k)))

    rec = TraceRecorder("fedsgd", rounds, truth=problem.B_star)
    if rec.record(0, B, shared_loss(B, w)):
        for t in range(1, rounds + 1):
            idx = np.arange(n) if c == n else np.sort(rng.choice(n, size=c, replace=False))
            with np.errstate(over="ignore", invalid="ignore"):
                if fresh_samples and m is None:                  # population gradient (Pi_i = I)
                    g = B @ w - problem.theta[idx].mean(axis=0)
                else:
                    X, y = (problem.sample(m, rng, clients=idx) if fresh_samples
                            else (problem.X[idx], problem.y[idx]))
                    r = X @ (B @ w) - y                          # (c, m)
                    g = np.einsum("cmd,cm->d", X, r) / r.size   # mean_i (1/m) X_i^T r_i
                g = agg * g
                B_new, w_new = B - step_size * np.outer(g, w), w - step_size * (B.T @ g)
            rec.communicate(t, up=c * (d * k + k), down=c * (d * k + k))
            if not rec.record(t, B_new, shared_loss(B_new, w_new), w=w_new):
                break                                    # diverged: keep the last finite (B, w)
            B, w = B_new, w_new
    heads = personalized = None
    if rec.diverged_at is None:
        if fresh_samples and m is None:
            heads = np.linalg.lstsq(B, problem.theta.T, rcond=None)[0].T
        else:
            Xh, yh = problem.sample(m, rng) if fresh_samples else (problem.X, problem.y)
            heads = fit_heads(B, Xh, yh, ridge=head_ridge)
        personalized = problem.population_loss(B, heads)
    return rec.finish(B=B, heads=heads, w=w, personalized_loss=personalized)
