"""RoLoRA (Alt-min-GD), FFA-LoRA and FedAvg-LoRA on the rank-one LoRA toy (Chen et al.).

Problem: :class:`lowrank_fl.problems.lora.RankOneLoRAProblem` — local model ``X a b^T`` with ``a``
the (unit) down-projection and ``b`` the up-projection. With sampled data (``problem.X``) the local
loss is ``l_i(a, b) = (1/m)||Y_i - X_i a b^T||_F^2`` (eq. (7)); in population mode it is
``l_i(a, b) = ||a* b_i*^T - a b^T||_F^2`` (App. A.5, eq. (246)).

* :func:`rolora` — Algorithm 2 (Alt-min-GD): exact local b, server average, one GD step on a
  at the averaged b, normalise.
* :func:`ffa_lora` — a frozen at a0, only b trained and averaged (App. A.4.1, eqs. (182)–(183);
  App. A.5, eqs. (275)–(276)).
* :func:`fedavg_lora` — K local GD steps jointly on (a, b), server averages a and b
  ([NOT IN PAPER] for the toy; notes §2.4).

All three are batched over the client axis and return a :class:`~lowrank_fl.results.Trace` whose
``distance`` is the angle distance ``|sin theta(a_t, a*)|`` (Def. 5.2, eq. (8)) and whose ``loss``
is the global *population* loss (eq. (246); exact for any data because the truth is known).
The empirical training loss is in ``extra["empirical_loss"]`` when data are present. A zero ``a``
is at distance 1 (:func:`~lowrank_fl.problems.lora.angle_distance`). On divergence (a NaN/inf or a
value above 1e150) the run stops with status ``"diverged"`` and the returned ``a``, ``b`` are the
last finite iterate (round ``diverged_at - 1``).
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from ..validation import (as_float_array, as_generator, check_choice, check_instance, check_int,
                           check_positive)
from ..exact.rolora import _local_b, _population_b, step_size_bound
from ..problems.lora import RankOneLoRAProblem, angle_distance, init_at_angle, random_unit
from .recorder import TraceRecorder

__all__ = ["rolora", "ffa_lora", "fedavg_lora", "grad_a_clients", "grad_b_clients",
           "resolve_step_size", "MAX_LOCAL_STEPS"]

MAX_LOCAL_STEPS = 100_000


# --------------------------------------------------------------------------------------------
# shared pieces
# --------------------------------------------------------------------------------------------
def _check_problem(problem) -> RankOneLoRAProblem:
    return check_instance(problem, "problem", RankOneLoRAProblem)


def _initial_a(problem, a0, delta0, rng) -> np.ndarray:
    """a0 given (normalised), at a chosen angle, or uniform on the sphere (paper: random init)."""
    if a0 is not None and delta0 is not None:
        raise ValueError("give at most one of a0 and delta0")
    if a0 is not None:
        a0 = as_float_array(a0, "a0", shape=(problem.d,))
        norm = np.linalg.norm(a0)
        if norm == 0:
            raise ValueError("a0 must be non-zero (it is normalised to a unit vector)")
        return a0 / norm
    if delta0 is not None:
        return init_at_angle(problem.a_star, delta0, rng)
    return random_unit(problem.d, rng)


def resolve_step_size(step_size, problem: RankOneLoRAProblem, L_max: float | None = None) -> float:
    """A positive float, or ``"paper"`` / ``"corrected"``: the theorem's largest step.

    The theorem is Thm 5.4 (homogeneous) for sampled data and Thm A.14 (heterogeneous) in
    population mode; see :func:`lowrank_fl.exact.rolora.step_size_bound` and notes §3.9.
    ``L_max`` defaults to ``||bbar*||``.
    """
    if isinstance(step_size, str):
        check_choice(step_size, "step_size", ("paper", "corrected"))
        L = problem.L_max if L_max is None else check_positive(L_max, "L_max")
        setting = "heterogeneous" if problem.population else "homogeneous"
        return step_size_bound(L, setting=setting, variant=step_size)
    if not isinstance(step_size, numbers.Real) or isinstance(step_size, bool):
        raise TypeError(f"step_size must be a positive number or 'paper'/'corrected', got {step_size!r}")
    return check_positive(step_size, "step_size")


def grad_a_clients(problem: RankOneLoRAProblem, a, b, X=None, Y=None) -> np.ndarray:
    """Per-client ``grad_a l_i(a, b)``, shape (N, d); ``a``, ``b`` shape (d,) shared or (N, d);
    ``X``, ``Y`` shape (N, m, d) (the samples of this step) or None for the population gradient.

    Data (eqs. (45)–(47)): ``(2/m) X_i^T (X_i a ||b||^2 - Y_i b)``.
    Population (eq. (251)): ``2 (a ||b||^2 - a* (b_i*^T b))``.
    """
    n, d = problem.n_clients, problem.d
    a = np.broadcast_to(a, (n, d))
    b = np.broadcast_to(b, (n, d))
    bb = np.einsum("nd,nd->n", b, b)
    if X is None:
        return 2.0 * (a * bb[:, None] - problem.a_star[None, :] * np.einsum("nd,nd->n", problem.b_star, b)[:, None])
    m = X.shape[1]
    r = np.einsum("nmd,nd->nm", X, a) * bb[:, None] - np.einsum("nmd,nd->nm", Y, b)   # X_i a ||b||^2 - Y_i b
    return (2.0 / m) * np.einsum("nmd,nm->nd", X, r)


def grad_b_clients(problem: RankOneLoRAProblem, a, b, X=None, Y=None) -> np.ndarray:
    """Per-client ``grad_b l_i(a, b)``, shape (N, d); ``a`` and ``b`` shape (d,) or (N, d);
    ``X``, ``Y`` shape (N, m, d) or None (population).

    Data: ``(2/m)(||X_i a||^2 b - Y_i^T X_i a)``. Population: ``2 (||a||^2 b - b_i* (a*^T a))``.
    """
    n, d = problem.n_clients, problem.d
    a = np.broadcast_to(a, (n, d))
    b = np.broadcast_to(b, (n, d))
    if X is None:
        aa = np.einsum("nd,nd->n", a, a)
        return 2.0 * (b * aa[:, None] - problem.b_star * (a @ problem.a_star)[:, None])
    m = X.shape[1]
    u = np.einsum("nmd,nd->nm", X, a)
    return (2.0 / m) * (b * np.einsum("nm,nm->n", u, u)[:, None] - np.einsum("nmd,nm->nd", Y, u))


class _Data:
    """Where the samples of each update step come from (population / reuse / fresh)."""

    def __init__(self, problem, sample_mode, rng):
        check_choice(sample_mode, "sample_mode", ("reuse", "fresh"))
        if problem.population and sample_mode == "fresh":
            raise ValueError("sample_mode='fresh' needs a problem with samples_per_client set")
        self.problem, self.mode, self.rng = problem, sample_mode, rng

    def draw(self):
        p = self.problem
        if p.population:
            return None, None
        if self.mode == "reuse":
            return p.X, p.Y
        q = p.sample(p.samples_per_client, self.rng)
        return q.X, q.Y

    def b_step(self, a) -> np.ndarray:
        """Exact local b (eq. (14) or (249)), shape (N, d)."""
        X, Y = self.draw()
        if X is None:   # unchecked kernels: a non-finite a must reach the TraceRecorder
            return _population_b(self.problem.b_star, self.problem.a_star, a)
        return _local_b(X, Y, a)


def _check_bool(value, name) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _record_common(rec, problem, t, a, b, *, b_iter=None):
    rec.record_extra("model_error", t, problem.model_error(a, b))
    if not problem.population:
        rec.record_extra("empirical_loss", t, problem.empirical_loss(a, b))
    if b_iter is not None:
        rec.record_extra("iterate_loss", t, problem.population_loss(a, b_iter))


def _nonfinite_is_divergence(fn):
    """Silence numpy's overflow/invalid warnings: a non-finite iterate is reported by the
    TraceRecorder as status "diverged" with its round, which is the documented outcome."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return fn(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------------------------
# RoLoRA, Algorithm 2
# --------------------------------------------------------------------------------------------
@_nonfinite_is_divergence
def rolora(problem: RankOneLoRAProblem, rounds: int, step_size, *, a0=None, delta0: float | None = None,
           sample_mode: str = "reuse", normalize: bool = True, L_max: float | None = None, seed=None):
    """RoLoRA for the linear regressor — Algorithm 2 (Alt-min-GD), exactly as the paper writes it.

    Iteration t (lines 3–12): ``b~_i = argmin_b l_i(a, b)`` (eq. (14) / (249)); ``bbar = mean b~_i``;
    ``a^+ = a - (eta/N) sum_i grad_a l_i(a, bbar)`` (eqs. (45)–(47) / (251)–(252));
    ``a = a^+/||a^+||`` (eq. (248)); ``b^t = bbar``. One iteration is two communication rounds.

    Parameters
    ----------
    problem : RankOneLoRAProblem
        Population mode (no data) is the setting of Lemma A.16 / Thm A.14; sampled data that of
        Lemma 5.3 / Thm 5.4.
    rounds : int >= 0
        Iterations T.
    step_size : float > 0 or {"paper", "corrected"}
        ``eta``; the strings resolve to the theorem's largest step (:func:`resolve_step_size`):
        ``"paper"`` is what the theorem states (``1/L_max^2`` homogeneous, ``1/(2 L_max^2)``
        heterogeneous), ``"corrected"`` is ``1/(2 L_max^2)`` (notes §3.9).
    a0 : array_like, shape (d,), optional
        Initial down-projection (normalised). Default: ``delta0`` if given, else uniform on the sphere.
    delta0 : float in [0, 1], optional
        Draw ``a0`` at exactly this angle from ``a*``.
    sample_mode : {"reuse", "fresh"}
        ``"reuse"``: Algorithm 2 as written, one dataset. ``"fresh"``: new m samples per client for
        every update step (b-step and a-step), the independence Lemma 5.3's proof assumes.
    normalize : bool
        Line 11's normalisation (default True; False is a deliberately non-paper variant).
    L_max : float, optional
        For the string step sizes; default ``||bbar*||``.
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance[t] = delta_t``; ``loss[t]`` = population loss of the model the theorems score,
        ``(a^t, b^{t+1})`` (b refitted at a^t); ``a`` = a^T (d,), ``b`` = b^{T+1} (d,).
        ``extra``: ``"iterate_loss"`` (loss at (a^t, b^t), b^0 = 0), ``"model_error"``
        (``||a^t b^{t+1 T} - a* bbar*^T|| / ||a* bbar*^T||``), ``"b_deviation"``
        (``||b^{t+1} - bbar* a*^T a^t|| / (delta_t ||bbar*||)``, the epsilon' of Lemma A.9),
        ``"empirical_loss"`` (with data), ``"b_iterate"`` (b^T), ``"step_size"``.
    """
    problem = _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    normalize = _check_bool(normalize, "normalize")
    eta = resolve_step_size(step_size, problem, L_max)
    rng = as_generator(seed, stream="lora")  # one stream: RoLoRA, FFA-LoRA, FedAvg-LoRA share a0
    data = _Data(problem, sample_mode, rng)
    a = _initial_a(problem, a0, delta0, rng)
    n, d = problem.n_clients, problem.d
    bs_norm = np.linalg.norm(problem.b_bar)

    rec = TraceRecorder(f"rolora[{sample_mode}]" + ("" if normalize else "[no-normalize]"), rounds)
    b_iter = np.zeros(d)
    b_next = data.b_step(a).mean(axis=0)                 # b^1 = b-step at a^0

    def record(t):
        delta = angle_distance(a, problem.a_star)
        ok = rec.record(t, loss=problem.population_loss(a, b_next), distance=delta, a=a, b=b_next)
        if ok:
            _record_common(rec, problem, t, a, b_next, b_iter=b_iter)
            g = problem.b_bar * (problem.a_star @ a) / (a @ a)
            rec.record_extra("b_deviation", t, np.linalg.norm(b_next - g) / (delta * bs_norm) if delta > 0 else np.nan)
        return ok

    if record(0):
        for t in range(1, rounds + 1):
            last = (a, b_next, b_iter)
            b_bar = b_next                                               # lines 4–7
            X, Y = data.draw()
            grad = grad_a_clients(problem, a, b_bar, X, Y).mean(axis=0)  # lines 8–10
            a_plus = a - eta * grad                                      # line 11
            norm = np.linalg.norm(a_plus)
            a = a_plus / norm if (normalize and norm > 0) else a_plus
            b_iter = b_bar                                               # line 12
            rec.communicate(t, up=2 * n * d, down=2 * n * d)             # b~_i, grad_i up; bbar, a down
            b_next = data.b_step(a).mean(axis=0)                         # next iteration's b-step
            if not record(t):
                a, b_next, b_iter = last                                 # keep the last finite iterate
                break
    return rec.finish(a=a, b=b_next, b_iterate=b_iter, step_size=eta)


# --------------------------------------------------------------------------------------------
# FFA-LoRA
# --------------------------------------------------------------------------------------------
@_nonfinite_is_divergence
def ffa_lora(problem: RankOneLoRAProblem, rounds: int, *, a0=None, delta0: float | None = None,
             local: str = "argmin", local_steps: int | None = None, step_size: float | None = None,
             sample_mode: str = "reuse", seed=None):
    """FFA-LoRA: ``a`` frozen at ``a0`` on every client, only ``b`` trained and averaged.

    ``local="argmin"`` (as analysed): ``b_i = argmin_b l_i(a0, b)`` (eq. (182) / (275)) and
    ``b^FFA = mean_i b_i`` (eq. (183) / (276)); further rounds repeat the same solve.
    ``local="gd"``: ``local_steps`` GD steps on b from the server's b with ``step_size``.
    ``local_steps`` and ``step_size`` apply to ``local="gd"`` only; giving them with
    ``local="argmin"`` is a ``ValueError`` (they would be silently ignored).

    Parameters
    ----------
    problem : RankOneLoRAProblem
    rounds : int >= 0
    a0, delta0 : as in :func:`rolora`
    local : {"argmin", "gd"}
    local_steps : int in [1, MAX_LOCAL_STEPS] or None
        ``local="gd"`` only (default 1).
    step_size : float > 0, required for ``local="gd"`` (and not accepted otherwise)
    sample_mode : {"reuse", "fresh"}
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance`` constant ``delta_0``; ``loss[t]`` population loss of ``(a0, b^t)`` (b^0 = 0);
        ``a`` = a0, ``b`` = b^T.
    """
    problem = _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    check_choice(local, "local", ("argmin", "gd"))
    if local == "gd":
        local_steps = check_int(1 if local_steps is None else local_steps, "local_steps", minimum=1,
                                maximum=MAX_LOCAL_STEPS)
        if step_size is None:
            raise ValueError("step_size is required for local='gd'")
        eta = check_positive(step_size, "step_size")
    else:
        for name, value in (("local_steps", local_steps), ("step_size", step_size)):
            if value is not None:
                raise ValueError(f"{name} applies to local='gd' only (local='argmin' solves exactly), "
                                 f"got {name}={value!r}")
    rng = as_generator(seed, stream="lora")  # one stream: RoLoRA, FFA-LoRA, FedAvg-LoRA share a0
    data = _Data(problem, sample_mode, rng)
    a = _initial_a(problem, a0, delta0, rng)
    n, d = problem.n_clients, problem.d
    delta = angle_distance(a, problem.a_star)
    rec = TraceRecorder(f"ffa_lora[{local}]", rounds)
    b = np.zeros(d)
    if rec.record(0, loss=problem.population_loss(a, b), distance=delta):
        _record_common(rec, problem, 0, a, b)
        for t in range(1, rounds + 1):
            if local == "argmin":
                b_clients = data.b_step(a)
            else:
                X, Y = data.draw()
                b_clients = np.broadcast_to(b, (n, d)).copy()
                for _ in range(local_steps):                     # local steps are sequential
                    b_clients -= eta * grad_b_clients(problem, a, b_clients, X, Y)
            b_prev, b = b, b_clients.mean(axis=0)
            rec.communicate(t, up=n * d, down=n * d)
            if not rec.record(t, loss=problem.population_loss(a, b), distance=delta, b=b):
                b = b_prev                                       # keep the last finite iterate
                break
            _record_common(rec, problem, t, a, b)
    return rec.finish(a=a, b=b)


# --------------------------------------------------------------------------------------------
# FedAvg-LoRA
# --------------------------------------------------------------------------------------------
def _cross_cov_fro(Da, Db) -> float:
    """``||(1/N) sum_i da_i db_i^T||_F`` from N×N Gram matrices (no d×d matrix)."""
    n = Da.shape[0]
    val = np.sum((Da @ Da.T) * (Db @ Db.T))
    return float(np.sqrt(max(val, 0.0)) / n)


@_nonfinite_is_divergence
def fedavg_lora(problem: RankOneLoRAProblem, rounds: int, step_size: float, *, local_steps: int = 1,
                a0=None, delta0: float | None = None, b0=None, normalize: bool = False,
                sample_mode: str = "reuse", seed=None):
    """FedAvg of LoRA factors on the toy ([NOT IN PAPER] for the toy; notes §2.4, paper §3.2).

    Each client starts from the server's ``(a, b)`` and takes ``local_steps`` simultaneous GD steps
    ``a <- a - eta grad_a l_i``, ``b <- b - eta grad_b l_i``; the server averages, ``a = mean a_i``,
    ``b = mean b_i`` — the inexact aggregate of eq. (2). With ``local_steps = 1`` this equals one
    centralized GD step (gradients are linear in the client data).

    Parameters
    ----------
    problem : RankOneLoRAProblem
    rounds : int >= 0
    step_size : float > 0
    local_steps : int in [1, MAX_LOCAL_STEPS]
    a0, delta0 : as in :func:`rolora` (init: unit a0, ``b0 = 0`` as in the paper's experiments)
    b0 : array_like, shape (d,), optional
    normalize : bool
        Rescale the server model to unit ``a`` (``a b^T`` unchanged). General LoRA does not; off.
    sample_mode : {"reuse", "fresh"}
    seed : int or Generator

    Returns
    -------
    Trace
        ``distance[t]`` = angle of ``a^t``; ``loss[t]`` population loss of ``(a^t, b^t)``;
        ``extra["interference"][t] = ||mean_i a_i b_i^T - abar bbar^T||_F`` of round t (eqs. (1)–(2)).
    """
    problem = _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    eta = check_positive(step_size, "step_size")
    local_steps = check_int(local_steps, "local_steps", minimum=1, maximum=MAX_LOCAL_STEPS)
    normalize = _check_bool(normalize, "normalize")
    rng = as_generator(seed, stream="lora")  # one stream: RoLoRA, FFA-LoRA, FedAvg-LoRA share a0
    data = _Data(problem, sample_mode, rng)
    a = _initial_a(problem, a0, delta0, rng)
    n, d = problem.n_clients, problem.d
    b = np.zeros(d) if b0 is None else as_float_array(b0, "b0", shape=(d,))
    rec = TraceRecorder(f"fedavg_lora[K={local_steps}]", rounds)

    def record(t):
        ok = rec.record(t, loss=problem.population_loss(a, b), distance=angle_distance(a, problem.a_star),
                        a=a, b=b)
        if ok:
            _record_common(rec, problem, t, a, b)
        return ok

    if record(0):
        rec.record_extra("interference", 0, 0.0)
        for t in range(1, rounds + 1):
            last = (a, b)
            X, Y = data.draw()
            A_c = np.broadcast_to(a, (n, d)).copy()
            B_c = np.broadcast_to(b, (n, d)).copy()
            for _ in range(local_steps):                         # local steps are sequential
                ga = grad_a_clients(problem, A_c, B_c, X, Y)
                gb = grad_b_clients(problem, A_c, B_c, X, Y)
                A_c -= eta * ga
                B_c -= eta * gb
            a, b = A_c.mean(axis=0), B_c.mean(axis=0)
            interference = _cross_cov_fro(A_c - a, B_c - b)
            if normalize and np.linalg.norm(a) > 0:
                nrm = np.linalg.norm(a)
                a, b = a / nrm, b * nrm
            rec.communicate(t, up=2 * n * d, down=2 * n * d)
            if not record(t):
                a, b = last                                      # keep the last finite iterate
                break
            rec.record_extra("interference", t, interference)
    return rec.finish(a=a, b=b)

