"""RoLoRA (Alt-min-GD), FFA-LoRA and FedAvg-LoRA on the rank-one LoRA toy (Chen et al.).

Problem: :class:`lowrank_fl.problems.lora.RankOneLoRAProblem` — local model ``X a b^T`` with ``a``
the (unit) down-projection and ``b`` the up-projection (the paper's names; in PEFT's letters ``a``
is the A side, ``A = a^T`` reading the input, and ``b`` the B side, ``B = b`` writing the output,
``DeltaW = b a^T``). With sampled data the local loss is ``l_i(a, b) = (1/m)||Y_i - X_i a b^T||_F^2``
(eq. (7)); with population gradients it is ``l_i(a, b) = ||a* b_i*^T - a b^T||_F^2`` (App. A.5,
eq. (246)).

* :func:`rolora` — Algorithm 2 (Alt-min-GD): exact local b, server average, one GD step on a
  at the averaged b, normalise.
* :func:`ffa_lora` — a frozen at its initial value, only b trained and averaged (App. A.4.1,
  eqs. (182)–(183); App. A.5, eqs. (275)–(276)).
* :func:`fedavg_lora` — local GD steps jointly on (a, b), server averages a and b (§3.2, eq. (2);
  [NOT IN PAPER] for the toy, where the paper defines no FedAvg-LoRA).

Shared settings (the library's vocabulary, :mod:`lowrank_fl.algorithms.common`):

* ``data``: ``"population"`` (exact expected gradients, the setting of App. A.5), ``"fixed"`` (the
  problem's samples, reused every step: Algorithm 2 as written) or ``"fresh"`` (``batch_size``
  new samples per client for every update step, the independence Lemma 5.3's proof assumes).
  Default: ``"fixed"`` when the problem carries samples, else ``"population"``.
* ``clients_per_round``: participants per iteration, drawn without replacement (default all).
* ``local_steps``: local GD steps per communication round (for RoLoRA: on ``a`` at the averaged b;
  1 is Algorithm 2).
* ``init``: ``"random"`` (a uniform on the sphere, b = 0: the paper's random start), a float
  ``delta0`` in [0, 1] (a at exactly that angle from ``a*``), an array ``a0`` (d,), or a pair
  ``(a0, b0)`` (``a0`` any of the previous, ``b0`` (d,)) where the method uses a starting b.

All three are batched over the client axis and return a :class:`~lowrank_fl.results.Trace` whose
``distance`` is the angle distance ``|sin theta(a_t, a*)|`` (Def. 5.2, eq. (8)) and whose ``loss``
is the global *population* loss (eq. (246); exact for any data because the truth is known).
The empirical training loss is in ``extra["empirical_loss"]`` when the problem has samples. A zero
``a`` is at distance 1 (:func:`~lowrank_fl.problems.lora.angle_distance`). On divergence (a
NaN/inf or a value above 1e150) the run stops with status ``"diverged"`` and a
``ConvergenceWarning``; the returned ``a``, ``b`` are the last finite iterate (round
``diverged_at - 1``). ``Trace.config`` records the resolved settings.
"""
from __future__ import annotations

import functools
import numbers
import warnings

import numpy as np

from ..validation import (as_float_array, as_generator, check_choice, check_instance, check_int,
                          check_positive)
from ..exact.rolora import local_b_solve, population_b, step_size_bound
from ..problems.lora import RankOneLoRAProblem, angle_distance, init_at_angle, random_unit
from .common import (MAX_LOCAL_STEPS, check_clients_per_round, check_local_steps, choose_clients,
                     resolve_data)
from .recorder import TraceRecorder

__all__ = ["rolora", "ffa_lora", "fedavg_lora", "grad_a_clients", "grad_b_clients",
           "resolve_step_size", "resolve_deprecated", "MAX_LOCAL_STEPS"]

#: Old keyword -> new keyword of the LoRA methods (deprecated aliases, one release).
_SAMPLE_MODES = {"reuse": "fixed", "fresh": "fresh"}


def resolve_deprecated(method: str, deprecated: dict, *, init_names=(), init_default="random",
                       init=None, data=None, data_alias: bool = True, stacklevel: int = 3):
    """Map the LoRA methods' old keywords to the new ones, warning once per keyword.

    ``sample_mode="reuse"|"fresh"`` becomes ``data="fixed"|"fresh"``; the names in ``init_names``
    (e.g. ``("a0", "delta0", "b0")``) are collected into a dict ``{name: value}`` returned in
    place of ``init`` (the caller turns it into its ``init``). Unknown keywords are a
    ``TypeError``; an old keyword together with its new one is a ``ValueError``.

    Returns ``(init, data, old_init)`` where ``old_init`` is the dict of old init keywords given.
    ``stacklevel`` is that of the public function's caller as seen from here.
    """
    allowed = set(init_names) | ({"sample_mode"} if data_alias else set())
    unknown = sorted(set(deprecated) - allowed)
    if unknown:
        raise TypeError(f"{method}() got unexpected keyword argument(s) {unknown}")
    old_init = {k: deprecated[k] for k in init_names if k in deprecated}
    for k in old_init:
        warnings.warn(f"{method}: {k}= is deprecated, use init= (see the {method} docstring)",
                      DeprecationWarning, stacklevel=stacklevel)
    if old_init and not (isinstance(init, str) and init == init_default):
        raise ValueError(f"{method}: give init= or the deprecated {sorted(old_init)}, not both")
    if "sample_mode" in deprecated:
        mode = check_choice(deprecated["sample_mode"], "sample_mode", tuple(_SAMPLE_MODES))
        warnings.warn(f"{method}: sample_mode= is deprecated, use data={_SAMPLE_MODES[mode]!r}",
                      DeprecationWarning, stacklevel=stacklevel)
        if data is not None:
            raise ValueError(f"{method}: give data= or the deprecated sample_mode=, not both")
        data = _SAMPLE_MODES[mode]
    return init, data, old_init


# --------------------------------------------------------------------------------------------
# shared pieces
# --------------------------------------------------------------------------------------------
def _check_problem(problem) -> RankOneLoRAProblem:
    return check_instance(problem, "problem", RankOneLoRAProblem)


def _is_pair(init) -> bool:
    """``init`` is ``(a-spec, b0)``: a 2-tuple whose second entry is an array or None (a plain
    2-tuple of numbers is an ``a0`` of length 2)."""
    return isinstance(init, tuple) and len(init) == 2 and (init[1] is None or np.ndim(init[1]) >= 1)


def _initial_a(problem, spec, rng) -> tuple[np.ndarray, str]:
    """Unit ``a0`` from a recipe name, an angle or an array; returns ``(a0, description)``."""
    if isinstance(spec, str):
        check_choice(spec, "init", ("random",))
        return random_unit(problem.d, rng), "random"
    if isinstance(spec, numbers.Real) and not isinstance(spec, bool):
        return init_at_angle(problem.a_star, spec, rng), f"angle={float(spec):g}"
    a0 = as_float_array(spec, "init (a0)", shape=(problem.d,))
    norm = np.linalg.norm(a0)
    if norm == 0:
        raise ValueError("init (a0) must be non-zero: a zero a is a fixed point that never moves "
                         "(and it is normalised to a unit vector)")
    return a0 / norm, "array"


def _initial_point(method, problem, init, old, rng, *, uses_b: bool):
    """``(a0, b0, description)`` from ``init`` (or the deprecated a0/delta0/b0 in ``old``)."""
    if old:
        if "a0" in old and "delta0" in old and old["a0"] is not None and old["delta0"] is not None:
            raise ValueError("give at most one of a0 and delta0 (both are deprecated: use init=)")
        a_spec = old.get("a0") if old.get("a0") is not None else old.get("delta0")
        a_spec = "random" if a_spec is None else a_spec
        init = (a_spec, old["b0"]) if old.get("b0") is not None else a_spec
    b0 = None
    if _is_pair(init):
        init, b0 = init
        if b0 is not None and not uses_b:
            raise ValueError(f"init=(a0, b0): {method} computes b by its exact b-step, so a starting "
                             f"b0 would be ignored; give a0 only")
    a0, desc = _initial_a(problem, init, rng)
    if b0 is None:
        return a0, np.zeros(problem.d), desc
    return a0, as_float_array(b0, "init (b0)", shape=(problem.d,)), desc + "+b0"


def resolve_step_size(step_size, problem: RankOneLoRAProblem, *, L_max: float | None = None,
                      data: str | None = None) -> float:
    """A positive float, or ``"paper"`` / ``"corrected"``: the theorem's largest step.

    The theorem is Thm 5.4 (homogeneous, sampled data) unless ``data="population"`` (default:
    ``"population"`` for a problem without samples), where it is Thm A.14 (heterogeneous
    population); see :func:`lowrank_fl.exact.rolora.step_size_bound`. ``L_max`` defaults to
    ``||bbar*||``; it only applies to those two (``ValueError`` with a number).
    """
    if L_max is not None and not isinstance(step_size, str):
        raise ValueError(f"L_max only applies to step_size='paper' or 'corrected' (the theorem's "
                         f"step); got it with step_size={step_size!r}")
    if isinstance(step_size, str):
        check_choice(step_size, "step_size", ("paper", "corrected"))
        L = problem.L_max if L_max is None else check_positive(L_max, "L_max")
        if data is None:
            data = "population" if problem.population else "fixed"
        setting = "heterogeneous" if data == "population" else "homogeneous"
        return step_size_bound(L, setting=setting, variant=step_size)
    if not isinstance(step_size, numbers.Real) or isinstance(step_size, bool):
        raise TypeError(f"step_size must be a positive number or 'paper'/'corrected', got {step_size!r}")
    return check_positive(step_size, "step_size")


def _grad_a(a_star, b_star, a, b, X=None, Y=None) -> np.ndarray:
    """Per-client ``grad_a l_i`` for the clients of ``b_star`` (n, d); ``a``, ``b`` (d,) or (n, d)."""
    n, d = b_star.shape
    a = np.broadcast_to(a, (n, d))
    b = np.broadcast_to(b, (n, d))
    bb = np.einsum("nd,nd->n", b, b)
    if X is None:
        return 2.0 * (a * bb[:, None] - a_star[None, :] * np.einsum("nd,nd->n", b_star, b)[:, None])
    m = X.shape[1]
    r = np.einsum("nmd,nd->nm", X, a) * bb[:, None] - np.einsum("nmd,nd->nm", Y, b)   # X_i a ||b||^2 - Y_i b
    return (2.0 / m) * np.einsum("nmd,nm->nd", X, r)


def _grad_b(a_star, b_star, a, b, X=None, Y=None) -> np.ndarray:
    """Per-client ``grad_b l_i`` (see :func:`_grad_a`)."""
    n, d = b_star.shape
    a = np.broadcast_to(a, (n, d))
    b = np.broadcast_to(b, (n, d))
    if X is None:
        aa = np.einsum("nd,nd->n", a, a)
        return 2.0 * (b * aa[:, None] - b_star * (a @ a_star)[:, None])
    m = X.shape[1]
    u = np.einsum("nmd,nd->nm", X, a)
    return (2.0 / m) * (b * np.einsum("nm,nm->n", u, u)[:, None] - np.einsum("nmd,nm->nd", Y, u))


def grad_a_clients(problem: RankOneLoRAProblem, a, b, X=None, Y=None) -> np.ndarray:
    """Per-client ``grad_a l_i(a, b)``, shape (N, d); ``a``, ``b`` shape (d,) shared or (N, d);
    ``X``, ``Y`` shape (N, m, d) (the samples of this step) or None for the population gradient.

    Data (eqs. (45)–(47)): ``(2/m) X_i^T (X_i a ||b||^2 - Y_i b)``.
    Population (eq. (251)): ``2 (a ||b||^2 - a* (b_i*^T b))``.
    """
    return _grad_a(problem.a_star, problem.b_star, a, b, X, Y)


def grad_b_clients(problem: RankOneLoRAProblem, a, b, X=None, Y=None) -> np.ndarray:
    """Per-client ``grad_b l_i(a, b)``, shape (N, d); ``a`` and ``b`` shape (d,) or (N, d);
    ``X``, ``Y`` shape (N, m, d) or None (population).

    Data: ``(2/m)(||X_i a||^2 b - Y_i^T X_i a)``. Population: ``2 (||a||^2 b - b_i* (a*^T a))``.
    """
    return _grad_b(problem.a_star, problem.b_star, a, b, X, Y)


class _Round:
    """One round's participants and where their samples come from (population / fixed / fresh)."""

    def __init__(self, method, problem, data, batch_size, clients_per_round, rng):
        self.problem, self.rng = problem, rng
        self.data = resolve_data(data, has_dataset=not problem.population, can_sample=True,
                                 batch_size=batch_size, method=method)
        self.batch = None
        if self.data == "fresh":
            self.batch = batch_size if batch_size is not None else problem.samples_per_client
            if self.batch is None:
                raise ValueError(f"data='fresh' on a problem without samples needs batch_size (the "
                                 f"samples per client drawn for every step); {method} got neither")
        self.per_round = check_clients_per_round(clients_per_round, problem.n_clients)
        self.clients = None

    def choose(self):
        """Draw this round's participants (all clients: no random number is used)."""
        self.clients = choose_clients(self.rng, self.problem.n_clients, self.per_round)

    @property
    def n(self) -> int:
        return self.per_round

    def draw(self):
        """``(b_star, X, Y)`` of the participants for one update step (X, Y None in population)."""
        p, S = self.problem, self.clients
        b_star = p.b_star if S is None else p.b_star[S]
        if self.data == "population":
            return b_star, None, None
        if self.data == "fixed":
            X, Y = p.X, p.Y
        else:
            q = p.sample(self.batch, self.rng)
            X, Y = q.X, q.Y
        return (b_star, X, Y) if S is None else (b_star, X[S], Y[S])

    def b_step(self, a) -> np.ndarray:
        """Exact local b of the participants (eq. (14) or (249)), shape (n, d); unchecked kernels:
        a non-finite ``a`` must reach the TraceRecorder."""
        b_star, X, Y = self.draw()
        if X is None:
            return population_b(b_star, self.problem.a_star, a, check_input=False)
        return local_b_solve(X, Y, a, check_input=False)

    def config(self, **more) -> dict:
        return {"data": self.data, "batch_size": self.batch, "clients_per_round": self.per_round, **more}


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
    TraceRecorder as status "diverged" with its round (and a ConvergenceWarning)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return fn(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------------------------
# RoLoRA, Algorithm 2
# --------------------------------------------------------------------------------------------
@_nonfinite_is_divergence
def rolora(problem: RankOneLoRAProblem, rounds: int, step_size, *, data: str | None = None,
           batch_size: int | None = None, clients_per_round: int | None = None, local_steps: int = 1,
           init="random", normalize: bool = True, L_max: float | None = None, seed=None, **deprecated):
    """RoLoRA for the linear regressor — Algorithm 2 (Alt-min-GD), exactly as the paper writes it.

    Iteration t (lines 3–12): ``b~_i = argmin_b l_i(a, b)`` (eq. (14) / (249)); ``bbar = mean b~_i``;
    ``a^+ = a - (eta/N) sum_i grad_a l_i(a, bbar)`` (eqs. (45)–(47) / (251)–(252));
    ``a = a^+/||a^+||`` (eq. (248)); ``b^t = bbar``. One iteration is two communication rounds.

    Parameters
    ----------
    problem : RankOneLoRAProblem
    rounds : int >= 0
        Iterations T.
    step_size : float > 0 or {"paper", "corrected"}
        ``eta``; the strings resolve to the theorem's largest step (:func:`resolve_step_size`):
        ``"paper"`` is what the theorem states (``1/L_max^2`` homogeneous, Thm 5.4;
        ``1/(2 L_max^2)`` heterogeneous, Thm A.14), ``"corrected"`` is ``1/(2 L_max^2)`` (proof
        step (101) needs ``2 eta ||bbar||^2 <= 1``).
    data : {"population", "fixed", "fresh"}, optional
        Population gradients are the setting of Lemma A.16 / Thm A.14; sampled data (``"fixed"``:
        Algorithm 2 as written; ``"fresh"``: new samples for the b-step and the a-step of every
        iteration) that of Lemma 5.3 / Thm 5.4. Default: ``"fixed"`` with samples, else
        ``"population"``.
    batch_size : int, optional
        Samples per client per step with ``data="fresh"`` (default ``problem.samples_per_client``).
    clients_per_round : int, optional
        Participants of each iteration (b-step and a-step), without replacement; default all.
    local_steps : int in [1, MAX_LOCAL_STEPS]
        GD steps each client takes on ``a`` at the averaged ``bbar`` before the server averages
        the ``a_i`` (the local-GD flavour of Algorithm 1); 1 is Algorithm 2 (the average of one
        step each is the step on the averaged gradient).
    init : "random", float, array (d,)
        ``a0``: uniform on the sphere, at exactly this angle ``delta0`` from ``a*``, or given
        (normalised). RoLoRA computes ``b`` by its b-step, so no ``b0``.
    normalize : bool
        Line 11's normalisation (default True; False is a deliberately non-paper variant).
    L_max : float, optional
        For the string step sizes only (``ValueError`` with a number); default ``||bbar*||``.
    seed : int or Generator
    a0, delta0, sample_mode :
        Deprecated aliases of ``init=a0``, ``init=delta0`` and ``data="fixed"|"fresh"``.

    Returns
    -------
    Trace
        ``distance[t] = delta_t``; ``loss[t]`` = population loss of the model the theorems score,
        ``(a^t, b^{t+1})`` (b refitted at a^t); ``a`` = a^T (d,), ``b`` = b^{T+1} (d,).
        ``extra``: ``"iterate_loss"`` (loss at (a^t, b^t), b^0 = 0), ``"model_error"``
        (``||a^t b^{t+1 T} - a* bbar*^T|| / ||a* bbar*^T||``), ``"b_deviation"``
        (``||b^{t+1} - bbar* a*^T a^t|| / (delta_t ||bbar*||)``, the epsilon' of Lemma A.9),
        ``"empirical_loss"`` (with samples), ``"b_iterate"`` (b^T), ``"step_size"``.
    """
    init, data, old = resolve_deprecated("rolora", deprecated, init_names=("a0", "delta0"), init=init,
                                         data=data, stacklevel=4)
    problem = _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    normalize = _check_bool(normalize, "normalize")
    local_steps = check_local_steps(local_steps)
    rng = as_generator(seed, stream="lora")  # one stream: RoLoRA, FFA-LoRA, FedAvg-LoRA share a0
    src = _Round("rolora", problem, data, batch_size, clients_per_round, rng)
    eta = resolve_step_size(step_size, problem, L_max=L_max, data=src.data)
    a, _, desc = _initial_point("rolora", problem, init, old, rng, uses_b=False)
    d = problem.d
    bs_norm = np.linalg.norm(problem.b_bar)

    rec = TraceRecorder("rolora", rounds, config=src.config(local_steps=local_steps, init=desc,
                                                            step_size=eta, normalize=normalize))
    b_iter = np.zeros(d)
    src.choose()
    b_next = src.b_step(a).mean(axis=0)                  # b^1 = b-step at a^0

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
            b_star, X, Y = src.draw()
            if local_steps == 1:                                         # lines 8–10
                a_plus = a - eta * _grad_a(problem.a_star, b_star, a, b_bar, X, Y).mean(axis=0)
            else:
                A_c = np.broadcast_to(a, b_star.shape).copy()
                for _ in range(local_steps):                             # local steps are sequential
                    A_c -= eta * _grad_a(problem.a_star, b_star, A_c, b_bar, X, Y)
                a_plus = A_c.mean(axis=0)
            norm = np.linalg.norm(a_plus)                                # line 11
            a = a_plus / norm if (normalize and norm > 0) else a_plus
            b_iter = b_bar                                               # line 12
            rec.communicate(t, up=2 * src.n * d, down=2 * src.n * d)     # b~_i, grad_i up; bbar, a down
            src.choose()
            b_next = src.b_step(a).mean(axis=0)                          # next iteration's b-step
            if not record(t):
                a, b_next, b_iter = last                                 # keep the last finite iterate
                break
    return rec.finish(a=a, b=b_next, b_iterate=b_iter, step_size=eta)


# --------------------------------------------------------------------------------------------
# FFA-LoRA
# --------------------------------------------------------------------------------------------
@_nonfinite_is_divergence
def ffa_lora(problem: RankOneLoRAProblem, rounds: int, step_size: float | None = None, *,
             data: str | None = None, batch_size: int | None = None, clients_per_round: int | None = None,
             local_steps: int = 1, init="random", local: str = "argmin", seed=None, **deprecated):
    """FFA-LoRA: ``a`` frozen at ``a0`` on every client, only ``b`` trained and averaged.

    ``local="argmin"`` (as analysed): ``b_i = argmin_b l_i(a0, b)`` (eq. (182) / (275)) and
    ``b^FFA = mean_i b_i`` (eq. (183) / (276)); further rounds repeat the same solve.
    ``local="gd"``: ``local_steps`` GD steps on b from the server's b with ``step_size``.
    ``step_size`` and ``local_steps != 1`` apply to ``local="gd"`` only; giving them with
    ``local="argmin"`` is a ``ValueError`` (they would be silently ignored).

    Parameters
    ----------
    problem : RankOneLoRAProblem
    rounds : int >= 0
    step_size : float > 0, required for ``local="gd"`` (and not accepted otherwise)
    data, batch_size, clients_per_round : as in :func:`rolora`
    local_steps : int in [1, MAX_LOCAL_STEPS]
        ``local="gd"`` only.
    init : "random", float, array (d,), or (a0, b0)
        The frozen ``a0`` as in :func:`rolora`; ``b0`` (default 0) is the starting b, scored at
        round 0 and the start of ``local="gd"``.
    local : {"argmin", "gd"}
    seed : int or Generator
    a0, delta0, sample_mode :
        Deprecated aliases (see :func:`rolora`).

    Returns
    -------
    Trace
        ``distance`` constant ``delta_0``; ``loss[t]`` population loss of ``(a0, b^t)``;
        ``a`` = a0, ``b`` = b^T.
    """
    init, data, old = resolve_deprecated("ffa_lora", deprecated, init_names=("a0", "delta0"), init=init,
                                         data=data, stacklevel=4)
    problem = _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    check_choice(local, "local", ("argmin", "gd"))
    local_steps = check_local_steps(local_steps)
    if local == "gd":
        if step_size is None:
            raise ValueError("step_size is required for local='gd'")
        eta = check_positive(step_size, "step_size")
    else:
        eta = None
        for name, value, default in (("local_steps", local_steps, 1), ("step_size", step_size, None)):
            if value != default:
                raise ValueError(f"{name} applies to local='gd' only (local='argmin' solves exactly), "
                                 f"got {name}={value!r}")
    rng = as_generator(seed, stream="lora")  # one stream: RoLoRA, FFA-LoRA, FedAvg-LoRA share a0
    src = _Round("ffa_lora", problem, data, batch_size, clients_per_round, rng)
    a, b, desc = _initial_point("ffa_lora", problem, init, old, rng, uses_b=True)
    d = problem.d
    delta = angle_distance(a, problem.a_star)
    rec = TraceRecorder("ffa_lora", rounds, config=src.config(local_steps=local_steps, init=desc,
                                                              step_size=eta, local=local))
    if rec.record(0, loss=problem.population_loss(a, b), distance=delta, b=b):
        _record_common(rec, problem, 0, a, b)
        for t in range(1, rounds + 1):
            src.choose()
            if local == "argmin":
                b_clients = src.b_step(a)
            else:
                b_star, X, Y = src.draw()
                b_clients = np.broadcast_to(b, b_star.shape).copy()
                for _ in range(local_steps):                     # local steps are sequential
                    b_clients -= eta * _grad_b(problem.a_star, b_star, a, b_clients, X, Y)
            b_prev, b = b, b_clients.mean(axis=0)
            rec.communicate(t, up=src.n * d, down=src.n * d)
            if not rec.record(t, loss=problem.population_loss(a, b), distance=delta, b=b):
                b = b_prev                                       # keep the last finite iterate
                break
            _record_common(rec, problem, t, a, b)
    return rec.finish(a=a, b=b)


# --------------------------------------------------------------------------------------------
# FedAvg-LoRA
# --------------------------------------------------------------------------------------------
def _cross_cov_fro(Da, Db) -> float:
    """``||(1/n) sum_i da_i db_i^T||_F`` from n×n Gram matrices (no d×d matrix)."""
    n = Da.shape[0]
    val = np.sum((Da @ Da.T) * (Db @ Db.T))
    return float(np.sqrt(max(val, 0.0)) / n)


@_nonfinite_is_divergence
def fedavg_lora(problem: RankOneLoRAProblem, rounds: int, step_size: float, *, data: str | None = None,
                batch_size: int | None = None, clients_per_round: int | None = None, local_steps: int = 1,
                init="random", normalize: bool = False, seed=None, **deprecated):
    """FedAvg of LoRA factors on the toy (§3.2, eq. (2); [NOT IN PAPER] for the toy).

    Each client starts from the server's ``(a, b)`` and takes ``local_steps`` simultaneous GD steps
    ``a <- a - eta grad_a l_i``, ``b <- b - eta grad_b l_i``; the server averages, ``a = mean a_i``,
    ``b = mean b_i`` — the inexact aggregate of eq. (2). With ``local_steps = 1`` and all clients
    this equals one centralized GD step (gradients are linear in the client data).

    Parameters
    ----------
    problem : RankOneLoRAProblem
    rounds : int >= 0
    step_size : float > 0
    data, batch_size, clients_per_round : as in :func:`rolora`
    local_steps : int in [1, MAX_LOCAL_STEPS]
    init : "random", float, array (d,), or (a0, b0)
        As in :func:`ffa_lora`; default a unit random ``a0`` and ``b0 = 0`` (the paper's
        experiments: A random, B zero).
    normalize : bool
        Rescale the server model to unit ``a`` (``a b^T`` unchanged). General LoRA does not; off.
    seed : int or Generator
    a0, delta0, b0, sample_mode :
        Deprecated aliases (``init=(a0, b0)``, ``data=``).

    Returns
    -------
    Trace
        ``distance[t]`` = angle of ``a^t``; ``loss[t]`` population loss of ``(a^t, b^t)``;
        ``extra["interference"][t] = ||mean_i a_i b_i^T - abar bbar^T||_F`` of round t over its
        participants (eqs. (1)–(2)).
    """
    init, data, old = resolve_deprecated("fedavg_lora", deprecated, init_names=("a0", "delta0", "b0"),
                                         init=init, data=data, stacklevel=4)
    problem = _check_problem(problem)
    rounds = check_int(rounds, "rounds", minimum=0)
    eta = check_positive(step_size, "step_size")
    local_steps = check_local_steps(local_steps)
    normalize = _check_bool(normalize, "normalize")
    rng = as_generator(seed, stream="lora")  # one stream: RoLoRA, FFA-LoRA, FedAvg-LoRA share a0
    src = _Round("fedavg_lora", problem, data, batch_size, clients_per_round, rng)
    a, b, desc = _initial_point("fedavg_lora", problem, init, old, rng, uses_b=True)
    d = problem.d
    rec = TraceRecorder("fedavg_lora", rounds, config=src.config(local_steps=local_steps, init=desc,
                                                                 step_size=eta, normalize=normalize))

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
            src.choose()
            b_star, X, Y = src.draw()
            A_c = np.broadcast_to(a, b_star.shape).copy()
            B_c = np.broadcast_to(b, b_star.shape).copy()
            for _ in range(local_steps):                         # local steps are sequential
                ga = _grad_a(problem.a_star, b_star, A_c, B_c, X, Y)
                gb = _grad_b(problem.a_star, b_star, A_c, B_c, X, Y)
                A_c -= eta * ga
                B_c -= eta * gb
            a, b = A_c.mean(axis=0), B_c.mean(axis=0)
            interference = _cross_cov_fro(A_c - a, B_c - b)
            if normalize and np.linalg.norm(a) > 0:
                nrm = np.linalg.norm(a)
                a, b = a / nrm, b * nrm
            rec.communicate(t, up=2 * src.n * d, down=2 * src.n * d)
            if not record(t):
                a, b = last                                      # keep the last finite iterate
                break
            rec.record_extra("interference", t, interference)
    return rec.finish(a=a, b=b)
