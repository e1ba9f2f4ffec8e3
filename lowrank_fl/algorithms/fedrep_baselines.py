"""Baselines of FedRep's synthetic experiments (FedRep Sec. 5, Fig. 1 / Fig. 4).

* :func:`local_only` — each client fits its own d-dimensional ridge regression; no communication.
  Units are the paper's (``x ~ N(0, I_d)``, see :mod:`lowrank_fl.algorithms.fedrep`): the official
  notebook's ridge ``rho = 1e-5`` on inputs scaled by ``1/sqrt(m)`` is ``ridge = 1e-5 * m`` here.
* :func:`fedsgd` — distributed (full-batch) gradient descent on one shared model ``(B, w)``,
  problem (4); at the end every client fits a least-squares head on the learned ``B`` (Fig. 1's
  "FedSGD" is this representation plus a personalized head).

GD-GD / 10GD-GD are :func:`lowrank_fl.algorithms.fedrep.fedrep` with ``head_steps=1`` / ``10``.
FedAvg with several local steps on ``(B, w)`` is :mod:`lowrank_fl.algorithms.fedavg` (FedAvg-FT).
"""
from __future__ import annotations

import numpy as np

from ..validation import as_float_array, as_generator, check_choice, check_int, check_positive
from ..exact.multitask import fit_heads, local_least_squares
from ..problems.multitask import haar_orthonormal
from ..results import Trace
from .common import (check_clients_per_round, choose_clients, deprecated_keywords,
                     legacy_participation_and_data, resolve_data)
from .fedrep import check_init_basis, check_problem
from .recorder import TraceRecorder

__all__ = ["local_only", "fedsgd", "FEDSGD_AGGREGATIONS"]

FEDSGD_AGGREGATIONS = ("mean", "sum")


def local_only(problem, *, ridge: float = 1e-5) -> np.ndarray:
    """Local Only (FedRep Sec. 5, Fig. 1): each client solves its own ridge regression
    ``theta_i = argmin_theta ||X_i theta - y_i||^2 + ridge ||theta||^2
    = (X_i^T X_i + ridge I)^{-1} X_i^T y_i`` on its fixed dataset.

    ``ridge`` is in the paper's units (``x ~ N(0, I_d)``, unnormalized squared error). The default
    1e-5 is the notebook's number taken as is; the notebook's inputs are scaled by ``1/sqrt(m)``,
    so its exact ridge is ``ridge = 1e-5 * m`` here (both are negligible next to ``X_i^T X_i``,
    whose eigenvalues are of order ``m``).

    Parameters
    ----------
    problem : MultitaskProblem or UnderparameterizedProblem (with a dataset)

    Returns
    -------
    Theta : ndarray, shape (n, d)
    """
    check_problem(problem)
    X, y = problem.require_dataset("local_only")
    ridge = check_positive(ridge, "ridge", strict=False)
    return local_least_squares(X, y, ridge=ridge)


_FEDSGD_RENAMES = {"participation": "clients_per_round", "fresh_samples": "data"}


def fedsgd(problem, rounds: int, step_size: float, *, data: str | None = None,
           batch_size: int | None = None, clients_per_round: int | None = None, init="random",
           head_ridge: float = 1e-5, aggregation: str = "mean", seed=None, **deprecated) -> Trace:
    """FedSGD on the shared model of problem (4): ``min_{B, w} 1/(2n) sum_i E(y_i - w^T B^T x_i)^2``.

    Each round the sampled clients send the gradient of their batch loss at the shared
    ``(B, w)``; the server aggregates and steps (no orthonormalization: the model is ``Bw``).
    Start: ``B^0`` from ``init``, ``w = 0``.

    Parameters
    ----------
    problem : MultitaskProblem or UnderparameterizedProblem
    rounds : int (>= 0);  step_size : float
    data : {"population", "fixed", "fresh"} or None
        ``None``: ``"fixed"`` (the experiments) when the problem carries a dataset, else
        ``"population"`` (exact population gradients).
    batch_size : int, optional
        Fresh batch size (default ``problem.samples_per_client``); only with ``data="fresh"``.
    clients_per_round : int, optional
        Clients per round, sampled without replacement (default: all).
    init : "random" or array_like of shape (d, k)
        Haar-random ``B^0`` (default) or a given full-column-rank start (used as is: FedSGD does
        not orthonormalize).
    head_ridge : float
        Ridge of the final personalized heads fitted on ``B`` (in the paper's units; the
        notebook's 1e-5 on inputs scaled by ``1/sqrt(m)`` is ``1e-5 * m`` here).
    aggregation : {"mean", "sum"}
        ``"mean"`` (default): the gradient of problem (4)'s average over clients; ``"sum"``: the
        official notebook's summed client gradients, i.e. ``clients_per_round`` times larger —
        use it with the notebook's step sizes (0.005).
    seed : int or Generator
    **deprecated
        ``participation`` (fraction; use ``clients_per_round``), ``fresh_samples`` (use ``data``).

    Returns
    -------
    Trace
        ``distance`` dist(B^t, B*) (1 if ``B`` lost rank; ``None`` without truth); ``loss[t]`` =
        ``problem.evaluate(B^t, W)["loss"]`` with ``W`` = the shared head ``w^t`` for every client
        (the model FedSGD trains; for a MultitaskProblem eq. (6) ``1/(2n) sum ||B w_i -
        theta_i||^2 + noise^2/2``); ``B`` (d, k) and ``extra["w"]`` (k,) the final shared model
        (the last finite one on divergence); ``heads`` (n, k) the personalized least-squares
        heads fitted on ``B`` after training (fixed data, or a fresh batch; ``None`` on
        divergence) — Fig. 1's "FedSGD" — with their loss in ``extra["personalized_loss"]``.
    """
    check_problem(problem)
    old = deprecated_keywords("fedsgd", deprecated, _FEDSGD_RENAMES)
    rounds = check_int(rounds, "rounds", minimum=0)
    step_size = check_positive(step_size, "step_size")
    head_ridge = check_positive(head_ridge, "head_ridge", strict=False)
    check_choice(aggregation, "aggregation", FEDSGD_AGGREGATIONS)
    d, k, n = problem.d, problem.rank, problem.n_clients
    clients_per_round, data = legacy_participation_and_data(
        "fedsgd", old, clients_per_round=clients_per_round, data=data, batch_size=batch_size,
        problem=problem)
    data = resolve_data(data, has_dataset=problem.X is not None, can_sample=problem.has_truth,
                        has_population=problem.has_truth, batch_size=batch_size, method="fedsgd")
    m = None
    if data == "fresh":
        m = problem.samples_per_client if batch_size is None else batch_size
        if m is None:
            raise ValueError("data='fresh' needs batch_size (the problem has no samples_per_client "
                             "to default to)")
    c = check_clients_per_round(clients_per_round, n)
    rng = as_generator(seed, stream="fedsgd")
    agg = 1.0 if aggregation == "mean" else float(c)        # sum = c x mean of client gradients
    if isinstance(init, str):
        check_choice(init, "init", ("random",))
        B = haar_orthonormal(d=d, rank=k, seed=rng)
    else:
        B = as_float_array(init, "init", shape=(d, k)).copy()
        check_init_basis(B, d, k)                 # rejects a zero or rank-deficient start
    w = np.zeros(k)

    def shared_metrics(B, w):
        with np.errstate(over="ignore", invalid="ignore"):     # overflow = divergence, caught by rec
            if not (np.all(np.isfinite(B)) and np.all(np.isfinite(w))):
                return np.nan, None
            ev = problem.evaluate(B, np.broadcast_to(w, (n, k)))
            return ev["loss"], ev["distance"]

    rec = TraceRecorder("fedsgd", rounds, truth=problem.truth_basis,
                        config={"data": data, "batch_size": m, "clients_per_round": c,
                                "init": init if isinstance(init, str) else "array",
                                "aggregation": aggregation})
    if rec.record(0, B, *shared_metrics(B, w)[:1]):
        for t in range(1, rounds + 1):
            sel = choose_clients(rng, n, c)
            idx = np.arange(n) if sel is None else sel
            with np.errstate(over="ignore", invalid="ignore"):
                if data == "population":                         # population gradient (Pi_i = I)
                    g = B @ w - problem.theta[idx].mean(axis=0)
                else:
                    X, y = (problem.sample(m, rng, clients=idx) if data == "fresh"
                            else (problem.X[idx], problem.y[idx]))
                    r = X @ (B @ w) - y                          # (c, m)
                    g = np.einsum("cmd,cm->d", X, r) / r.size   # mean_i (1/m) X_i^T r_i
                g = agg * g
                B_new, w_new = B - step_size * np.outer(g, w), w - step_size * (B.T @ g)
            rec.communicate(t, up=c * (d * k + k), down=c * (d * k + k))
            if not rec.record(t, B_new, shared_metrics(B_new, w_new)[0], w=w_new):
                break                                    # diverged: keep the last finite (B, w)
            B, w = B_new, w_new
    heads = personalized = None
    if rec.diverged_at is None:
        if data == "population":
            heads = problem.fitted_heads(B, data="population")
        else:
            Xh, yh = problem.sample(m, rng) if data == "fresh" else (problem.X, problem.y)
            heads = fit_heads(B, Xh, yh, ridge=head_ridge)
        personalized = problem.evaluate(B, heads)["loss"]
    return rec.finish(B=B, heads=heads, w=w, personalized_loss=personalized)
