"""Deliberately broken variants that the claim tests feed through a claim's injection points
(keyword options) to check that its verdict can turn to "fails".

Each one breaks one property a claim checks; none is part of the verifier.
"""
from __future__ import annotations

import math

from types import SimpleNamespace

import numpy as np

from lowrank_fl.algorithms.fedrep_baselines import fedsgd
from lowrank_fl.exact.multitask import method_of_moments
from lowrank_fl.problems.multitask import MultitaskProblem


# ----------------------------------------------------------------------------- FLUTE
def slowed(algorithm, factor):
    """``algorithm`` with the step divided by ``factor`` and ``factor`` times more rounds (same horizon
    in 'time', so it converges, but each round contracts ``factor`` times less)."""
    def run(problem, rounds, step_size, **kw):
        return algorithm(problem, factor * rounds, step_size / factor, **kw)
    return run


def gram_first_features(X, n_est=10):
    """The Gram matrix (M, d, d) of X (M, N, d) estimated on the first ``n_est`` features only, the
    others taken as known (identity): the gradient discrepancy stops growing with d."""
    G = np.broadcast_to(np.eye(X.shape[2]), (X.shape[0],) + (X.shape[2],) * 2).copy()
    Xs = X[:, :, :n_est]
    G[:, :n_est, :n_est] = np.swapaxes(Xs, 1, 2) @ Xs / X.shape[1]
    return G


def local_ols(problem, rounds, step_size, **kw):
    """No collaboration: each client's own least squares; the trace-like result holds the error to
    Phi_k in ``extra["error_target"]``."""
    theta = np.stack([np.linalg.lstsq(X, y, rcond=None)[0] for X, y in zip(problem.X, problem.y)], axis=1)
    err = float(np.mean(np.linalg.norm(theta - problem.target, axis=0)))
    return SimpleNamespace(status="optimal", extra={"error_target": np.array([err])})


# ----------------------------------------------------------------------------- FedRep
def fedsgd_quarter_clients(problem, rounds, step_size, **kw):
    """The shared model (FedSGD) trained on the first quarter of the clients only."""
    sub = MultitaskProblem(B_star=problem.B_star, heads=problem.heads[:max(problem.k, problem.n_clients // 4)],
                           noise=problem.noise)
    return fedsgd(sub, rounds, step_size, **kw)


def mom_first_batch(X, y, k):
    """The method of moments on the first 10 samples of every client only (ignores the rest)."""
    return method_of_moments(X[:, :10], y[:, :10], k)


def repeated_samples(problem, m, rng):
    """A dependent design: the same 5 inputs per client, repeated to size m (X (n, m, d)); the
    concentration in m of Lemmas 2, 4 and 5 no longer happens."""
    X5, _ = problem.sample(5, rng)
    return np.tile(X5, (1, int(math.ceil(m / 5)), 1))[:, :m]
