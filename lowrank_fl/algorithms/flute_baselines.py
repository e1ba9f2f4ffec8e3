"""Linear baselines of FLUTE's synthetic experiments (FLUTE note §2.7, Figs. 1 and 3).

* FedRep (Collins et al. 2021, Alg. 2) on an :class:`UnderparameterizedProblem`: method-of-moments
  initialization (clients send their d x d moment matrices), then per round exact least-squares
  heads and one averaged gradient step on ``B`` followed by QR. The round itself is FedRep's own
  :func:`lowrank_fl.algorithms.fedrep.fedrep_round` (batched over clients); this module only
  adapts it to FLUTE's problem and metrics.
* FedRep(RI): the same with FLUTE's data-independent ``N(0, alpha^2)`` initialization ("the same
  initialization as FLUTE but otherwise identical to FedRep"), orthonormalized by the first QR.

FedRep's step size and round counts in FLUTE's experiments are not reported (note §2.7).
"""
from __future__ import annotations

import numpy as np

from .._validation import as_generator, check_choice, check_int, check_positive
from ..exact.multitask import method_of_moments
from ..problems.underparameterized import UnderparameterizedProblem
from ._trace import TraceRecorder
from .fedrep import fedrep_round, head_least_squares

__all__ = ["fedrep_flute_baseline"]


def fedrep_flute_baseline(problem: UnderparameterizedProblem, rounds: int, step_size: float, *,
                          init: str = "moments", init_scale: float | None = None,
                          fresh_samples: bool = False, seed=None):
    """FedRep / FedRep(RI) on FLUTE's under-parameterized linear problem.

    Parameters
    ----------
    problem : UnderparameterizedProblem
        Must carry data (``samples_per_client``): FedRep's heads are fitted on samples.
    rounds : int
    step_size : float
        ``eta`` of FedRep's representation step (gradient averaged over clients, Collins eq. (14)).
    init : {"moments", "random"}
        ``"moments"``: FedRep's spectral initialization; ``"random"``: FedRep(RI), entries
        ``N(0, init_scale^2)`` then QR.
    init_scale : float, optional
        ``alpha`` for ``init="random"`` (default ``1/(10 d)``, as FLUTE).
    fresh_samples : bool
        False (default): reuse the fixed dataset every round (FLUTE's experiments); True: draw
        ``N`` fresh samples per client per round.
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance``: principal-angle distance of ``B`` to ``span(U_k)``; ``loss``: population
        MSE ``(1/M) ||B W - Phi||_F^2 + noise^2`` of the model ``(B^(t-1), w_i^t)`` clients hold
        after round t (round 0: heads fitted on ``B^0``); final ``B`` (d, k) and ``heads`` (M, k)
        least-squares heads refitted on the final ``B`` and the last data; ``extra["error_truth"]``,
        ``extra["error_target"]`` as in :func:`lowrank_fl.algorithms.flute.flute`.
        Bytes: ``M d k`` entries each way per round (heads stay local), plus
        ``extra["init_bytes_up"]`` for the moment matrices.
    """
    if not isinstance(problem, UnderparameterizedProblem):
        raise TypeError(f"problem must be an UnderparameterizedProblem, got {type(problem).__name__}")
    if problem.X is None:
        raise ValueError("problem must carry a dataset (samples_per_client=N): FedRep fits heads "
                         "on samples")
    rounds = check_int(rounds, "rounds", minimum=1)
    step_size = check_positive(step_size, "step_size")
    check_choice(init, "init", ("moments", "random"))
    rng = as_generator(seed, stream="fedrep_flute_baseline")
    d, M, k, N = problem.d, problem.n_clients, problem.k, problem.samples_per_client
    Phi, Phi_k = problem.Phi, problem.target
    init_bytes = 0
    if init == "moments":
        B = method_of_moments(problem.X, problem.y, k)
        init_bytes = M * d * d * 8
    else:
        alpha = 1.0 / (10 * d) if init_scale is None else check_positive(init_scale, "init_scale")
        B = np.linalg.qr(alpha * rng.standard_normal((d, k)))[0]
    rec = TraceRecorder("fedrep" if init == "moments" else "fedrep[RI]", rounds, truth=problem.U_k)

    def record(t, Bm, W):
        Z = Bm @ W.T
        loss = float(np.sum((Z - Phi) ** 2)) / M + problem.noise ** 2
        if not rec.record(t, Bm, loss, W=W):
            return False
        rec.record_extra("error_target", t, float(np.mean(np.linalg.norm(Z - Phi_k, axis=0))))
        rec.record_extra("error_truth", t, float(np.mean(np.linalg.norm(Z - Phi, axis=0))))
        return True

    W = head_least_squares(problem.X @ B, problem.y)
    record(0, B, W)
    last = (problem.X, problem.y)
    for t in range(1, rounds + 1):
        X, y = problem.sample(N, rng) if fresh_samples else (problem.X, problem.y)
        with np.errstate(over="ignore", invalid="ignore"):
            out = fedrep_round(B, X, y, step_size)
        rec.communicate(t, up=M * d * k, down=M * d * k)
        if not record(t, B, out.heads):
            break
        B, W = out.B, out.heads
        last = (X, y)
    # final heads refitted on the final (post-QR) B: the QR may rotate the basis, so the heads of
    # the last round do not pair with it
    if rec.diverged_at is None:
        W = head_least_squares(last[0] @ B, last[1])
    return rec.finish(B=B, heads=W, init_bytes_up=init_bytes)
