"""FLUTE, linear case: Algorithm 1 of Liu, Shen & Yang (ICML 2024).

Each round every client sends the gradients of its local loss with respect to ``B`` and its head
``w_i`` at the current iterate (clients do not update locally); the server takes the data step
eq. (5) — summing the client gradients — and then the regularizer step eq. (6), whose gradients
are evaluated at the OLD iterate ``(B^(t-1), W^(t-1))`` (a simultaneous step, not a
proximal or sequential one: eq. (6) writes both gradients at ``t-1``). Together this is one full
gradient step on eq. (4).

Options that the paper leaves open are named:

* ``normalization``: ``"appendix"`` (default, App. A.1, what Theorems 5.1/5.5 analyse): data
  gradient ``(1/N) X_i^T (X_i B w_i - y_i) w_i^T`` without a factor 2; ``"main"``: the main text's
  ``L_i = (1/N) ||.||^2`` whose gradient carries the 2. For ``g1 = 2 g2`` the fixed points agree,
  rates differ by 2 in the data term.
* ``aggregation``: ``"sum"`` (default, eq. (5)) or ``"mean"`` (eq. (4)'s 1/M read literally).
* ``data`` (the regime every federated method shares): ``"population"`` gradients
  (``Q = Q~ = 0``, App. A.1); ``"fresh"`` samples every round (what the concentration lemmas
  A.13/A.14 and Theorem 5.5 assume); or ``"fixed"``, the problem's dataset reused every round
  (what the experiments presumably do). The default ``None`` picks ``"fixed"`` when the problem
  carries a dataset, else ``"population"`` (as :func:`lowrank_fl.algorithms.fedrep` does, so both
  see the same data by default). With a reused dataset the objective is the empirical eq. (4),
  which is non-convex with spurious local minima on small instances: the small-init global
  convergence of Remark 4.1 is a population statement (the verifier's ``flute.alg1.empirical_erm``
  measures how often the empirical ERM is reached).

The trace records, per round: ``distance`` = sine of the largest principal angle between
``col(B)`` and ``span(U_k)`` (the paper's theorems use a model error instead, recorded
in ``extra``; a rank-deficient ``B`` is at distance 1), ``loss`` =
:meth:`UnderparameterizedProblem.population_loss` — the population mean squared prediction error
``(1/M) ||BW - Phi||_F^2 + noise^2`` (FLUTE's convention, no 1/2) — and in ``extra``:

* ``error_target``: ``(1/M) sum_i ||B w_i - Phi_k e_i||`` (the metric of eqs. (7)-(8));
* ``error_truth``: ``(1/M) sum_i ||B w_i - phi_i||`` (the synthetic experiments' metric, App. C);
* ``frob_target``: ``||BW - Phi_k||_F``; ``balance``: ``||B^T B - W W^T||_F`` (the paper's
  (k, M) ``W``; the code holds the heads client axis first, (M, k));
* with ``record_theta=True``: ``sigma1``, ``sigma1_res``, ``sigmak_k`` of the embedding
  ``Theta`` (App. A.2, regions R / R_s).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..validation import (as_float_array, as_generator, check_choice, check_instance, check_int,
                           check_positive)
from ..exact.flute import (AGGREGATIONS, NORMALIZATIONS, check_gammas, data_gradients_unchecked,
                           data_weight, embed_factors, padded_svd, regularizer_gradients_unchecked)
from ..linalg import subspace_distance
from ..problems.dataset import renamed_size
from ..problems.underparameterized import UnderparameterizedProblem
from .common import deprecated_keywords, resolve_data
from .recorder import TraceRecorder

__all__ = ["flute", "flute_init"]


def flute_init(*, d: int | None = None, rank: int | None = None, n_clients: int | None = None,
               init_scale: float | None = None, seed=None, k: int | None = None):
    """Data-independent initialization of Alg. 1: entries of ``B^0`` (d, rank) and of the heads
    ``W^0`` (n_clients, rank) i.i.d. ``N(0, init_scale^2)`` (Remark 4.1; theory:
    ``alpha <~ 1/(10 d)``). Returns ``(B0, W0)``, client axis first for ``W0``.

    Sizes are keywords only (``k`` is a deprecated alias of ``rank``, the paper's k); ``init_scale``
    defaults to App. C's ``1 / (10 d)``.
    """
    k = renamed_size("flute_init", rank, k, "rank", "k")
    if d is None or n_clients is None:
        raise TypeError("flute_init() needs the keyword sizes d, rank and n_clients")
    d = check_int(d, "d", minimum=1)
    k = check_int(k, "rank", minimum=1)
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    rng = as_generator(seed, stream="flute")
    init_scale = 1.0 / (10 * d) if init_scale is None else check_positive(init_scale, "init_scale")
    B0 = init_scale * rng.standard_normal((d, k))
    W0 = init_scale * rng.standard_normal((k, n_clients))  # drawn in the paper's (k, M) order
    return B0, np.ascontiguousarray(W0.T)


def _samples_schedule(samples, rounds):
    """Per-round fresh sample sizes, (rounds,) ints."""
    if np.isscalar(samples):
        return np.full(rounds, check_int(samples, "batch_size", minimum=1))
    arr = np.asarray(samples)
    if arr.shape != (rounds,) or not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 1):
        raise ValueError(f"batch_size must be a positive int or a sequence of {rounds} positive "
                         f"ints (one per round), got {samples!r}")
    return arr


_FLUTE_RENAMES = {"fresh_samples": "data", "samples": "batch_size"}


def flute(problem: UnderparameterizedProblem, rounds: int, step_size: float, *,
          data: str | None = None, batch_size: int | Sequence[int] | None = None,
          init="random", init_scale: float | None = None, gamma1: float = 0.25,
          gamma2: float = 0.125, step_size_reg: float | None = None,
          normalization: str = "appendix", aggregation: str = "sum", record_theta: bool = False,
          record_every: int = 1, divergence_threshold: float = 1e100, seed=None, **deprecated):
    """Run FLUTE linear (Algorithm 1, eqs. (5)-(6)) for ``rounds`` rounds.

    Parameters
    ----------
    problem : UnderparameterizedProblem
    rounds : int
        Number of rounds T (>= 0; a 0-round trace is the initialization).
    step_size : float
        ``eta_l`` of eq. (5) (App. C: 0.03; theory: ``eta <~ Delta^2 / (288 lambda_1^3)``).
    gamma1, gamma2 : float
        Penalty weights of eq. (4); theory ``1/4, 1/8``.
    step_size_reg : float, optional
        ``eta_r`` of eq. (6); default ``step_size`` (``eta_l = eta_r`` in the theorems).
    init_scale : float, optional
        ``alpha``; default ``1 / (10 d)`` (App. C). Only with ``init="random"``.
    normalization : {"appendix", "main"}
    aggregation : {"sum", "mean"}
    data : {"population", "fixed", "fresh"} or None
        Population gradients, the problem's dataset every round, or fresh samples every round.
        ``None`` (default): ``"fixed"`` if the problem carries a dataset, else ``"population"``.
    batch_size : int or sequence of int, optional
        Fresh samples per client (``data="fresh"`` only): one number, or one per round
        (Theorem 5.5's growing ``N_t``). Default ``problem.samples_per_client``.
    init : "random" or tuple (B0 (d, k), W0 (M, k))
        ``"random"``: :func:`flute_init` with ``init_scale``; or start at the given arrays.
    record_theta : bool
        Record the region quantities of ``Theta`` (App. A.2) every round.
    record_every : int
        Compute the metrics every ``record_every`` rounds (and at the last round); entries in
        between are ``nan``. Divergence is still checked every round.
    divergence_threshold : float
        An entry above this in absolute value stops the run with status ``"diverged"``.
    seed : int or Generator
        Initialization and fresh samples.
    **deprecated
        ``fresh_samples`` (use ``data``) and ``samples`` (use ``batch_size``), one release.

    Returns
    -------
    Trace
        ``B`` (d, k), ``heads`` (M, k) (the paper's ``W^T``; the last finite iterate if the run diverged;
        ``loss[-1] == problem.population_loss(B, heads)`` when the last round is recorded),
        per-round metrics (see module docstring);
        ``extra["data_mode"]``. Bytes per round: each client receives
        ``B, w_i`` and sends ``grad_B L_i, grad_w L_i``: ``M (dk + k)`` entries each way.
    """
    check_instance(problem, "problem", UnderparameterizedProblem)
    rounds = check_int(rounds, "rounds", minimum=0)
    eta = check_positive(step_size, "step_size")
    eta_r = eta if step_size_reg is None else check_positive(step_size_reg, "step_size_reg")
    gamma1, gamma2 = check_gammas(gamma1, gamma2)
    check_choice(normalization, "normalization", NORMALIZATIONS)
    check_choice(aggregation, "aggregation", AGGREGATIONS)
    d, M, k = problem.d, problem.n_clients, problem.k
    alpha = 1.0 / (10 * d) if init_scale is None else check_positive(init_scale, "init_scale")
    if init_scale is not None and not isinstance(init, str):
        raise ValueError("init_scale only applies to init='random' (it scales the random draw); "
                         "got it together with init arrays")
    record_every = check_int(record_every, "record_every", minimum=1)
    divergence_threshold = check_positive(divergence_threshold, "divergence_threshold")
    rng = as_generator(seed, stream="flute")
    old = deprecated_keywords("flute", deprecated, _FLUTE_RENAMES)
    if "samples" in old:
        if batch_size is not None:
            raise TypeError("flute() got both batch_size and its deprecated alias samples")
        batch_size = old["samples"]
    if "fresh_samples" in old:
        if data is not None:
            raise TypeError("flute() got both data and its deprecated alias fresh_samples")
        fs = old["fresh_samples"]
        if fs is None:          # the old default: fresh if samples given, else fixed/population
            data = "fresh" if batch_size is not None else None
        elif not isinstance(fs, (bool, np.bool_)):
            raise TypeError(f"fresh_samples must be a bool or None, got {fs!r}")
        else:
            data = "fixed" if not fs else ("fresh" if batch_size is not None
                                           or problem.samples_per_client is not None else "population")
    elif "samples" in old and data is None:
        data = "fresh"          # the old default with samples given
    if not isinstance(record_theta, (bool, np.bool_)):
        raise TypeError(f"record_theta must be a bool, got {record_theta!r}")
    if not problem.has_truth:
        raise ValueError("flute records FLUTE's metrics against Phi; this problem was built from "
                         "data and has none")
    is_sequence = batch_size is not None and not np.isscalar(batch_size)
    mode = resolve_data(data, has_dataset=problem.X is not None, can_sample=True,
                        batch_size=None if is_sequence else batch_size, method="flute")
    if is_sequence and mode != "fresh":
        raise ValueError(f"batch_size is only used with data='fresh' (got data={mode!r})")
    if mode == "fresh":
        if batch_size is None and problem.samples_per_client is None:
            raise ValueError("data='fresh' needs batch_size (the problem has no "
                             "samples_per_client to default to)")
        schedule = _samples_schedule(problem.samples_per_client if batch_size is None
                                     else batch_size, rounds)

    if isinstance(init, str):
        check_choice(init, "init", ("random",))
        B, W = flute_init(d=d, rank=k, n_clients=M, init_scale=alpha, seed=rng)
    else:
        if not isinstance(init, (tuple, list)) or len(init) != 2:
            raise TypeError(f"init must be 'random' or a tuple (B0, W0), got {type(init).__name__}")
        B = as_float_array(init[0], "init[0] (B0)", shape=(d, k)).copy()
        W = as_float_array(init[1], "init[1] (W0)", shape=(M, k)).copy()
        if not (np.any(B) or np.any(W)):
            raise ValueError("init must not be (B0, W0) = (0, 0): it is a stationary point of eq. "
                             "(4) (every gradient vanishes), so FLUTE would never move; use a small "
                             "random start (flute_init)")

    scale = 2.0 * data_weight(normalization, aggregation, M)
    Phi, Phi_k = problem.Phi, problem.target
    if record_theta:
        U_s, _, V_s = padded_svd(Phi)

    rec = TraceRecorder(f"flute[{normalization}]", rounds, truth=problem.U_k,
                        divergence_threshold=divergence_threshold,
                        config={"data": mode, "batch_size": None if mode != "fresh" else
                                (int(schedule[0]) if rounds and np.all(schedule == schedule[0])
                                 else "schedule"),
                                "init": init if isinstance(init, str) else "array",
                                "init_scale": alpha, "normalization": normalization,
                                "aggregation": aggregation})

    U_k = problem.U_k

    def record(t):
        if t % record_every and t != rounds:
            # cheap divergence check between recorded rounds (NaN fails the comparison)
            if np.max(np.abs(B)) <= divergence_threshold and np.max(np.abs(W)) <= divergence_threshold:
                return True
            return rec.record(t, None, np.nan, B=B, W=W)
        if not (np.all(np.isfinite(B)) and np.all(np.isfinite(W))):
            return rec.record(t, None, np.nan, B=B, W=W)
        Z = B @ W.T
        loss = float(np.sum((Z - Phi) ** 2)) / M + problem.noise ** 2   # = population_loss(B, W)
        if not np.isfinite(loss):
            return rec.record(t, None, loss, B=B, W=W)
        # a B that lost rank on its way to divergence is at distance 1 (linalg's "span" rule)
        dist = subspace_distance(U_k, B, rank_deficient="span")
        if not rec.record(t, None, loss, distance=dist, B=B, W=W):
            return False
        rec.record_extra("error_target", t, float(np.mean(np.linalg.norm(Z - Phi_k, axis=0))))
        rec.record_extra("error_truth", t, float(np.mean(np.linalg.norm(Z - Phi, axis=0))))
        rec.record_extra("frob_target", t, float(np.linalg.norm(Z - Phi_k)))
        rec.record_extra("balance", t, float(np.linalg.norm(B.T @ B - W.T @ W)))
        if record_theta:
            theta = embed_factors(B, W, U_s, V_s)
            rec.record_extra("sigma1", t, np.linalg.norm(theta, 2))
            rec.record_extra("sigma1_res", t, np.linalg.norm(theta[k:], 2))
            rec.record_extra("sigmak_k", t, np.linalg.svd(theta[:k], compute_uv=False)[-1])
        return True

    with np.errstate(over="ignore", invalid="ignore"):
        ok = record(0)
        for t in range(1, rounds + 1):
            if not ok:
                break
            B_old, W_old = B, W
            # client messages: gradients of L_i at (B^(t-1), w_i^(t-1)), summed for B (eq. (5))
            if mode == "population":
                R = B @ W.T - Phi
                gB, gW = scale * (R @ W), scale * (R.T @ B)
            else:
                if mode == "fresh":
                    X, y = problem.sample(int(schedule[t - 1]), rng)
                else:
                    X, y = problem.X, problem.y
                gB, gW = data_gradients_unchecked(B, W, X, y, scale)
            rB, rW = regularizer_gradients_unchecked(B, W, gamma1, gamma2)   # eq. (6): at the OLD iterate
            B, W = B - eta * gB - eta_r * rB, W - eta * gW - eta_r * rW
            rec.communicate(t, up=M * (d * k + k), down=M * (d * k + k))
            ok = record(t)
            if not ok:
                B, W = B_old, W_old          # diverged: return the last finite iterate
    return rec.finish(B=B, heads=W, data_mode=mode)
