"""Linear baselines of FLUTE's synthetic experiments (FLUTE note §2.7, Figs. 1 and 3).

* FedRep (Collins et al. 2021, Alg. 2) on an :class:`UnderparameterizedProblem`: method-of-moments
  initialization (clients send their d x d moment matrices), then per round exact least-squares
  heads and one averaged gradient step on ``B`` followed by QR. The round itself is FedRep's own
  :func:`lowrank_fl.algorithms.fedrep.fedrep_round` (batched over clients); this module only
  adapts it to FLUTE's problem and metrics.
* FedRep(RI): the same with FLUTE's data-independent Gaussian initialization ("the same
  initialization as FLUTE but otherwise identical to FedRep"), orthonormalized by QR — FLUTE's
  scale ``alpha`` plays no role (QR removes it), so there is no ``init_scale`` option.

FedRep's step size and round counts in FLUTE's experiments are not reported (note §2.7).
"""
from __future__ import annotations

import numpy as np

from ..validation import as_generator, check_choice, check_instance, check_int, check_positive
from ..exact.multitask import least_squares_heads, method_of_moments
from ..problems.underparameterized import UnderparameterizedProblem
from .recorder import TraceRecorder
from .fedrep import _check_bool, fedrep_round

__all__ = ["fedrep_flute_baseline"]


def fedrep_flute_baseline(problem: UnderparameterizedProblem, rounds: int, step_size: float, *,
                          init: str = "moments", fresh_samples: bool = False, seed=None):
    """FedRep / FedRep(RI) on FLUTE's under-parameterized linear problem.

    Parameters
    ----------
    problem : UnderparameterizedProblem
        Must carry data (``samples_per_client``): FedRep's heads are fitted on samples.
    rounds : int
        >= 0 (a 0-round trace is the initialization with its fitted heads).
    step_size : float
        ``eta`` of FedRep's representation step (gradient averaged over clients, Collins eq. (14)).
    init : {"moments", "random"}
        ``"moments"``: FedRep's spectral initialization (on the fixed dataset, or on a fresh batch
        with ``fresh_samples=True``); ``"random"``: FedRep(RI), a Gaussian (d, k) matrix then QR.
    fresh_samples : bool
        False (default, as :func:`lowrank_fl.algorithms.flute.flute`'s default on a problem with
        data, FLUTE's experiments): reuse the fixed dataset every round; True: draw ``N`` fresh
        samples per client per round.
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance[t]``: principal-angle distance of ``B^t`` (the representation after round t's
        QR) to ``span(U_k)``; ``loss[t]`` = ``problem.population_loss(B^t, W^t)`` (FLUTE's MSE
        convention ``(1/M) ||B W^T - Phi||_F^2 + noise^2``) with ``W^t`` the least-squares heads
        fitted on ``B^t`` and round t's data — the model the clients hold after the round, so
        ``loss[-1]`` and ``distance[-1]`` belong to the returned ``B`` (d, k) and ``heads``
        (M, k); ``extra["error_truth"]``, ``extra["error_target"]`` as in
        :func:`lowrank_fl.algorithms.flute.flute`. On divergence, the last finite pair is
        returned. Bytes: ``M d k`` entries each way per round (heads stay local), plus
        ``extra["init_bytes_up"]`` for the moment matrices.
    """
    check_instance(problem, "problem", UnderparameterizedProblem)
    if problem.X is None:
        raise ValueError("problem must carry a dataset (samples_per_client=N): FedRep fits heads "
                         "on samples")
    rounds = check_int(rounds, "rounds", minimum=0)
    step_size = check_positive(step_size, "step_size")
    check_choice(init, "init", ("moments", "random"))
    fresh_samples = _check_bool(fresh_samples, "fresh_samples")
    rng = as_generator(seed, stream="fedrep_flute_baseline")
    d, M, k, N = problem.d, problem.n_clients, problem.k, problem.samples_per_client
    Phi, Phi_k = problem.Phi, problem.target

    def data():
        return problem.sample(N, rng) if fresh_samples else (problem.X, problem.y)

    init_bytes = 0
    if init == "moments":
        B = method_of_moments(*data(), k)
        init_bytes = M * d * d * 8
    else:
        B = np.linalg.qr(rng.standard_normal((d, k)))[0]
    rec = TraceRecorder("fedrep" if init == "moments" else "fedrep[RI]", rounds, truth=problem.U_k)

    def record(t, B, W):
        if not (np.all(np.isfinite(B)) and np.all(np.isfinite(W))):
            return rec.record(t, B, np.nan, W=W)
        if not rec.record(t, B, problem.population_loss(B, W), W=W):
            return False
        Z = B @ W.T
        rec.record_extra("error_target", t, float(np.mean(np.linalg.norm(Z - Phi_k, axis=0))))
        rec.record_extra("error_truth", t, float(np.mean(np.linalg.norm(Z - Phi, axis=0))))
        return True

    X, y = data()
    W = least_squares_heads(X @ B, y)
    if record(0, B, W):
        for t in range(1, rounds + 1):
            X, y = data()
            with np.errstate(over="ignore", invalid="ignore"):
                B_new = fedrep_round(B, X, y, step_size).B
                # heads refitted on the new (post-QR) B: the round's own heads were fitted on the
                # old B, and the QR may rotate the basis
                W_new = least_squares_heads(X @ B_new, y)
            rec.communicate(t, up=M * d * k, down=M * d * k)
            if not record(t, B_new, W_new):
                break
            B, W = B_new, W_new
    return rec.finish(B=B, heads=W, init_bytes_up=init_bytes)
