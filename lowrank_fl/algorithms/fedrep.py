"""FedRep for multi-task linear regression (Collins et al., ICML 2021, Algorithm 2).

Each round ``t = 0..T-1`` (the paper's ``t = 1..T`` uses ``B^t`` to produce ``B^{t+1}``
with ``B^0`` from the init, so the loop runs ``t = 0..T-1``):

1. the server samples ``rn`` clients ``I^t`` uniformly without replacement and sends ``B^t``;
2. each client draws a batch (fresh every round: the theory; or its fixed dataset: the experiments)
   and computes the exact least-squares head ``w_i^{t+1} = argmin_w f_i^t(w, B^t)`` (eq. (7), (13));
3. it takes one gradient step ``B_i^{t+1} = B^t - eta grad_B f_i^t(w_i^{t+1}, B^t)`` on the *same*
   batch, ``grad_B f_i = (1/m) X_i^T (X_i B w_i - y_i) w_i^T``;
4. the server averages, ``Bbar^{t+1} = mean_{i in I^t} B_i^{t+1}`` (eq. (14)), and orthonormalizes,
   ``B^{t+1} R^{t+1} = QR(Bbar^{t+1})`` (eq. (15); the paper's QR(Bbar^t) is a typo).

Initialization (Alg. 2): method of moments on a batch of its own (``init="moments"``), a
Haar-random ``B^0`` (``"random"``), the experiments' projected-GD start (``"pgd"``) or a given
(d, k) matrix (warm start).

Variants, each a named option (default = what Theorem 1 analyses):

* ``head_steps=tau``: ``tau`` gradient steps on the head (warm-started from the client's last head)
  instead of the exact argmin — GD-GD (``tau=1``) and 10GD-GD (``tau=10``) of Fig. 3.
* ``batch="split"``: head on the first half of the batch, gradient on the second half (the
  independence between head and gradient batch that the proof of Lemma 5 uses without stating).
* ``orthonormalize=False``: no QR (the notebook's variant; a broken variant for the verifier).

Data regimes (``data``, shared by every federated method): ``"fresh"`` — a new batch of
``batch_size`` samples per participant per round (what Theorem 1 analyses); ``"fixed"`` — every
round reuses the problem's dataset (the paper's experiments, App. A.1); ``"population"`` — exact
population quantities (``Pi_i = I`` in the proof of Theorem 1: the deterministic ``m -> inf``
recursion).

Units. Everything here is in the paper's units: inputs ``x ~ N(0, I_d)``, local loss
``f_i(w, B) = (1/(2m)) sum_j (y_ij - w^T B^T x_ij)^2`` (eq. (7)), label noise a standard deviation
on ``y``. FedRep's official notebook scales its inputs by ``1/sqrt(m)`` (``x_nb = x / sqrt(m)``)
and uses summed squared errors; converting its settings to ours: a noise level ``s`` on its labels
is ``noise = s * sqrt(m)`` here, and its ridge ``rho`` (on ``sum_j (y - theta^T x_nb)^2``) is
``ridge = rho * m`` here (the ridge of :func:`~lowrank_fl.algorithms.fedrep_baselines.local_only`
multiplies ``||theta||^2`` next to ``||X_i theta - y_i||^2``).

Problems: any problem exposing ``d``, ``rank``, ``n_clients``, the dataset ``X``/``y``,
``theta`` and ``sample(m, seed, clients=...)`` where a population exists, and the evaluation hook
``evaluate(B, heads)`` / ``fitted_heads(B, data=...)`` — :class:`~lowrank_fl.problems.MultitaskProblem`
(with truth or from data) and FLUTE's :class:`~lowrank_fl.problems.UnderparameterizedProblem`.

The round itself is :func:`fedrep_round`, batched over clients (einsum and batched solves).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..validation import as_float_array, as_generator, check_choice, check_int, check_positive
from ..exact.multitask import (least_squares_heads, method_of_moments, population_moment_matrix,
                               projected_gd_init)
from ..linalg import orth
from ..problems.multitask import MultitaskProblem, haar_orthonormal
from ..problems.underparameterized import UnderparameterizedProblem
from ..results import Trace
from .common import (check_clients_per_round, choose_clients, deprecated_keywords,
                     legacy_participation_and_data, participation_to_clients, resolve_data)
from .recorder import TraceRecorder

__all__ = ["fedrep", "fedrep_round", "RoundOutput", "head_least_squares", "n_participants",
           "method_heads", "check_bool", "REPRESENTATION_PROBLEMS"]

#: Problem families FedRep (and its baselines) run on: both expose the evaluation hook.
REPRESENTATION_PROBLEMS = (MultitaskProblem, UnderparameterizedProblem)


class RoundOutput(NamedTuple):
    """One FedRep round: ``B`` (d, k) the new representation (after QR if requested), ``heads``
    (c, k) the participants' new heads, ``R`` (k, k) the QR factor (identity without QR),
    ``grad`` (d, k) the averaged gradient ``G^t``, ``batch_loss`` the mean of ``f_i^t(w_i^{t+1}, B^t)``."""

    B: np.ndarray
    heads: np.ndarray
    R: np.ndarray
    grad: np.ndarray
    batch_loss: float


def head_least_squares(XB, y):
    """Exact heads ``(XB_i^T XB_i)^{-1} XB_i^T y_i`` for a stack ``XB`` (c, m, k), ``y`` (c, m) → (c, k).

    Alias of :func:`lowrank_fl.exact.multitask.least_squares_heads` (the package's one batched head
    solver): singular systems (``m < k`` or a degenerate batch) get the minimum-norm solution.
    """
    return least_squares_heads(XB, y)


def fedrep_round(B, X, y, step_size: float, *, head_steps: int | None = None, heads=None,
                 head_step_size: float | None = None, batch: str = "same",
                 orthonormalize: bool = True) -> RoundOutput:
    """One round of Algorithm 2 on the participants' batches, batched over clients.

    Parameters
    ----------
    B : array_like, shape (d, k)
        Current representation ``B^t``.
    X : array_like, shape (c, m, d)
        The ``c = rn`` participants' batches.
    y : array_like, shape (c, m)
    step_size : float
        ``eta`` of eq. (14).
    head_steps : int or None
        ``None``: exact least-squares heads (Alg. 2). ``tau``: ``tau`` GD steps from ``heads``.
    heads : array_like, shape (c, k), optional
        Warm start of the head GD (default zeros); only with ``head_steps``.
    head_step_size : float, optional
        Head GD step (default ``step_size``); only with ``head_steps``.
    batch : {"same", "split"}
        Same batch for head and gradient (Alg. 2) or head on the first ``m // 2`` samples and
        gradient on the rest.
    orthonormalize : bool
        QR after averaging (eq. (15)).

    Returns
    -------
    RoundOutput
    """
    B = as_float_array(B, "B", ndim=2)
    d, k = B.shape
    if k >= d:
        raise ValueError(f"B must have k < d columns (a (d, k) representation), got shape {B.shape}")
    X = as_float_array(X, "X", shape=(None, None, d))
    y = as_float_array(y, "y", shape=X.shape[:2])
    step_size = check_positive(step_size, "step_size")
    check_choice(batch, "batch", ("same", "split"))
    check_bool(orthonormalize, "orthonormalize")
    if head_steps is None:
        _only_with_head_steps(heads=heads, head_step_size=head_step_size)
    c, m, _ = X.shape
    if batch == "split":
        if m < 2:
            raise ValueError(f"batch='split' needs at least 2 samples per client, got m={m}")
        h = m // 2
        Xh, yh, Xg, yg = X[:, :h], y[:, :h], X[:, h:], y[:, h:]
    else:
        Xh, yh, Xg, yg = X, y, X, y
    XBh = Xh @ B                                            # (c, mh, k)
    if head_steps is None:
        W = head_least_squares(XBh, yh)
    else:
        head_steps = check_int(head_steps, "head_steps", minimum=1)
        alpha = step_size if head_step_size is None else check_positive(head_step_size, "head_step_size")
        W = (np.zeros((c, k)) if heads is None
             else as_float_array(heads, "heads", shape=(c, k)).copy())
        mh = Xh.shape[1]
        for _ in range(head_steps):                        # loop over steps, not clients
            r = np.einsum("cmk,ck->cm", XBh, W) - yh
            W = W - alpha * np.einsum("cmk,cm->ck", XBh, r) / mh
    XBg = XBh if batch == "same" else Xg @ B
    resid = np.einsum("cmk,ck->cm", XBg, W) - yg            # (c, mg)
    mg = Xg.shape[1]
    # mean_i (1/m) X_i^T r_i w_i^T, without forming the (c, d, k) stack
    grad = (resid[:, None, :] @ Xg)[:, 0, :].T @ W / (c * mg)
    Bbar = B - step_size * grad
    if orthonormalize:
        Q, R = np.linalg.qr(Bbar)
    else:
        Q, R = Bbar, np.eye(k)
    return RoundOutput(B=Q, heads=W, R=R, grad=grad, batch_loss=0.5 * float(np.mean(resid * resid)))


def _population_round(B, theta, step_size, *, head_steps, heads, head_step_size, orthonormalize):
    """:func:`fedrep_round` with ``Pi_i = I`` (``m -> inf``): heads ``(B^T B)^{-1} B^T theta_i``
    (minimum norm if ``B`` lost rank, possible without QR), gradient ``(B w_i - theta_i) w_i^T``;
    ``theta`` is (c, d)."""
    c = theta.shape[0]
    k = B.shape[1]
    BtB = B.T @ B
    if head_steps is None:
        W = np.linalg.lstsq(B, theta.T, rcond=None)[0].T
    else:
        alpha = step_size if head_step_size is None else head_step_size
        W = np.zeros((c, k)) if heads is None else heads.copy()
        for _ in range(head_steps):
            W = W - alpha * (W @ BtB - theta @ B)
    resid = W @ B.T - theta                                   # (c, d)
    grad = resid.T @ W / c
    Bbar = B - step_size * grad
    Q, R = np.linalg.qr(Bbar) if orthonormalize else (Bbar, np.eye(k))
    return RoundOutput(B=Q, heads=W, R=R, grad=grad,
                       batch_loss=0.5 * float(np.mean(np.sum(resid * resid, axis=1))))


def n_participants(participation: float, n: int) -> int:
    """``rn`` rounded to the nearest integer, at least 1 (the count ``clients_per_round`` that the
    paper's participation fraction ``r`` stands for)."""
    return participation_to_clients(participation, n)


def check_bool(value, name):
    """``value`` as a bool; ``TypeError`` naming ``name`` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _only_with_head_steps(**given):
    """Options of the head-GD variant must not be given with exact heads (they would be ignored)."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name} applies to head gradient steps only; got {name}={value!r} "
                             f"with head_steps=None (exact least-squares heads)")


def check_problem(problem):
    """``problem`` must be one of :data:`REPRESENTATION_PROBLEMS`; returns it."""
    if not isinstance(problem, REPRESENTATION_PROBLEMS):
        raise TypeError(f"problem must be a MultitaskProblem or an UnderparameterizedProblem "
                        f"(lowrank_fl.problems), got {type(problem).__name__}")
    return problem


def method_heads(problem, B, *, fixed_dataset: bool) -> np.ndarray:
    """The heads Algorithm 2's exact head step gives every client for a representation ``B``
    (the problem's evaluation hook ``fitted_heads``).

    ``fixed_dataset=True``: least squares on each client's fixed dataset (eq. (7)); otherwise the
    population heads ``argmin_w ||B w - theta_i*||`` (the ``m -> inf`` limit of a fresh batch's
    least-squares head; minimum norm if ``B`` lost rank). Returns (n, k).
    """
    return problem.fitted_heads(B, data="fixed" if fixed_dataset else "population")


def _one_round(problem, B, idx, step_size, data, m, rng, batch, opts) -> RoundOutput:
    """Dispatch one round to the fixed dataset, the population recursion or fresh batches."""
    if data == "fixed":
        return fedrep_round(B, problem.X[idx], problem.y[idx], step_size, batch=batch, **opts)
    if data == "population":
        return _population_round(B, problem.theta[idx], step_size, **opts)
    X, y = problem.sample(m, rng, clients=idx)
    return fedrep_round(B, X, y, step_size, batch=batch, **opts)


def check_init_basis(init, d: int, k: int) -> np.ndarray:
    """A user's starting representation (d, k) as an orthonormal basis of its column space.

    ``ValueError`` naming ``init`` for a zero, rank-deficient or non-finite matrix: replacing it
    by an arbitrary basis would silently change the start the caller asked for.
    """
    B0 = as_float_array(init, "init", shape=(d, k))
    try:
        return orth(B0, name="init")
    except ValueError:
        raise ValueError(f"init must be a full-column-rank (d, k) = ({d}, {k}) matrix, got one of "
                         f"rank {np.linalg.matrix_rank(B0)} (a zero or rank-deficient start has "
                         f"no k-dimensional column space to start from)") from None


_FEDREP_RENAMES = {"participation": "clients_per_round", "fresh_samples": "data"}


def fedrep(problem, rounds: int, step_size: float, *, data: str | None = None,
           batch_size: int | None = None, clients_per_round: int | None = None,
           init="moments", init_samples: int | None = None, head_steps: int | None = None,
           head_step_size: float | None = None, batch: str = "same", orthonormalize: bool = True,
           tol: float | None = None, seed=None, **deprecated) -> Trace:
    """Run FedRep (Algorithm 2) on a multi-task linear problem.

    Parameters
    ----------
    problem : MultitaskProblem or UnderparameterizedProblem
        With ground truth or built from data (``from_data``; no distance is then recorded).
    rounds : int
        ``T`` (>= 0; a 0-round trace is the initialization).
    step_size : float
        ``eta``; Theorem 1 needs ``eta <= 1/(4 sigma_max*^2)`` (<= 1/(4k) always suffices).
    data : {"population", "fixed", "fresh"} or None
        The data regime (module docstring). ``None``: ``"fixed"`` if the problem carries a
        dataset, else ``"population"``.
    batch_size : int, optional
        ``m`` of the fresh per-round batches (default ``problem.samples_per_client``). Only with
        ``data="fresh"``.
    clients_per_round : int, optional
        ``rn`` clients per round, sampled uniformly without replacement (default: all). Fewer
        than ``rank`` is allowed with a warning (one round then cannot span the representation;
        FedRep's Fig. 3 runs one client per round).
    init : {"moments", "random", "pgd"} or array_like of shape (d, k)
        Method of moments on its own batch (Alg. 2), Haar-random, 10 steps of projected GD on the
        unfactorized objective (the experiments' init, App. A.1; see
        :func:`~lowrank_fl.exact.multitask.projected_gd_init`), or a given start of full column
        rank (orthonormalized by QR; a zero or rank-deficient matrix raises ``ValueError``).
    init_samples : int, optional
        Per-client batch of the method of moments / projected GD (default ``batch_size``; the
        population moment matrix if there are no samples). Not with ``data="fixed"`` (the fixed
        dataset is used).
    head_steps, head_step_size, batch, orthonormalize
        Variants, see :func:`fedrep_round` (``head_step_size`` only with ``head_steps``).
    tol : float, optional
        Stop once ``dist(B^t, B*) <= tol``: status ``"optimal"`` (later entries stay ``nan``;
        ``final_distance`` is the distance at the stop). Never reached within ``rounds``: status
        ``"max_iter"`` and a ``ConvergenceWarning``. Needs a problem with ground truth.
    seed : int or Generator
        Client sampling, fresh batches and the random init (stream ``"fedrep"``, independent of
        the problem's own draws even for the same int).
    **deprecated
        ``participation`` (a fraction r; use ``clients_per_round = round(r n)``) and
        ``fresh_samples`` (use ``data``) are accepted for one release with a
        ``DeprecationWarning``.

    Returns
    -------
    Trace
        ``distance`` dist(B^t, B*) for t = 0..T (a rank-deficient iterate, possible without QR,
        is at distance 1; ``None`` without truth); ``loss[t]`` = ``problem.evaluate(B^t, W^t)``
        — for a MultitaskProblem the population loss (6) ``1/(2n) sum_i ||B w_i - theta_i*||^2 +
        noise^2/2`` (the empirical loss (8) when built from data), for an UnderparameterizedProblem
        FLUTE's MSE — with ``W^t`` = :func:`method_heads`, the exact head step of Alg. 2 applied
        to ``B^t`` for every client: least squares on the fixed dataset with ``data="fixed"``,
        the population heads otherwise (so in the population regime ``loss = min_W F(B^t, W)``;
        the same evaluation is used for the ``head_steps`` variants); ``bytes_up``/``bytes_down``
        = ``rn d k`` floats each per round; ``B`` (d, k) the final representation (the last finite
        one if the run diverged) and ``heads`` (n, k) = ``W^T`` for it, so ``loss[-1] ==
        evaluate(B, heads)["loss"]``. ``extra``: ``round_heads`` (n, k) the heads clients computed
        in their last round (zeros for clients never sampled; fitted on the *previous* B),
        ``sigma_min_R`` (T+1, nan at 0) the smallest singular value of ``R^{t}``, ``batch_loss``
        (T+1, nan at 0) the participants' loss (7) at their new heads, ``init_bytes_up`` (the
        d × d moment matrices sent at initialization), ``participants`` (T, rn), and any further
        metric the problem's ``evaluate`` returns (FLUTE's ``error_target``, ``error_truth``).
        ``config`` records the resolved ``data``, ``batch_size``, ``clients_per_round``, ``init``.
    """
    check_problem(problem)
    old = deprecated_keywords("fedrep", deprecated, _FEDREP_RENAMES)
    rounds = check_int(rounds, "rounds", minimum=0)
    step_size = check_positive(step_size, "step_size")
    d, k, n = problem.d, problem.rank, problem.n_clients
    clients_per_round, data = legacy_participation_and_data(
        "fedrep", old, clients_per_round=clients_per_round, data=data, batch_size=batch_size,
        problem=problem)
    check_choice(batch, "batch", ("same", "split"))
    if head_steps is not None:
        head_steps = check_int(head_steps, "head_steps", minimum=1)
    if head_step_size is not None:
        head_step_size = check_positive(head_step_size, "head_step_size")
        if head_steps is None:
            _only_with_head_steps(head_step_size=head_step_size)
    if tol is not None:
        tol = check_positive(tol, "tol")
        if not problem.has_truth:
            raise ValueError("tol stops on the distance to the ground truth; this problem was "
                             "built from data and has none (use tol=None)")
    orthonormalize = check_bool(orthonormalize, "orthonormalize")
    data = resolve_data(data, has_dataset=problem.X is not None, can_sample=problem.has_truth,
                        has_population=problem.has_truth, batch_size=batch_size, method="fedrep")
    c = check_clients_per_round(clients_per_round, n, rank=k)
    rng = as_generator(seed, stream="fedrep")

    if data == "fresh":
        m = problem.samples_per_client if batch_size is None else batch_size
        if m is None:
            raise ValueError("data='fresh' needs batch_size (the problem has no samples_per_client "
                             "to default to)")
        m0 = m if init_samples is None else check_int(init_samples, "init_samples", minimum=1)
    elif data == "fixed":
        if init_samples is not None:
            raise ValueError(f"init_samples applies to drawn samples only; got "
                             f"init_samples={init_samples!r} with data='fixed' (the fixed dataset "
                             f"is used)")
        m = m0 = problem.samples_per_client
    else:
        m = None
        m0 = None if init_samples is None else check_int(init_samples, "init_samples", minimum=1)

    # ---- initialization
    init_bytes = 0
    if isinstance(init, str):
        check_choice(init, "init", ("moments", "random", "pgd"))
        init_name = init
        if init == "random":
            B = haar_orthonormal(d=d, rank=k, seed=rng)
        elif init == "pgd":
            if data == "fixed":
                B = projected_gd_init(problem.X, problem.y, k, seed=rng)
            elif m0 is None:
                raise ValueError("init='pgd' needs samples: give batch_size or init_samples")
            else:
                B = projected_gd_init(*problem.sample(m0, rng), k, seed=rng)
        else:
            init_bytes = n * d * d * 8
            if data == "fixed":
                B = method_of_moments(problem.X, problem.y, k)
            elif m0 is None:
                vals, vecs = np.linalg.eigh(population_moment_matrix(problem.theta, problem.noise))
                B = vecs[:, ::-1][:, :k].copy()
            else:
                B = method_of_moments(*problem.sample(m0, rng), k)
    else:
        init_name = "array"
        B = check_init_basis(init, d, k)

    def evaluate(B):
        """(metrics, heads) of the convention above; nan loss if B is not finite."""
        if not np.all(np.isfinite(B)):
            return {"loss": np.nan, "distance": None}, None
        with np.errstate(over="ignore", invalid="ignore"):
            W = method_heads(problem, B, fixed_dataset=data == "fixed")
            if not np.all(np.isfinite(W)):
                return {"loss": np.nan, "distance": None}, W
            return problem.evaluate(B, W), W

    def record(t, B, metrics, **params):
        if not rec.record(t, B, metrics["loss"], distance=metrics["distance"], **params):
            return False
        for name, value in metrics.items():
            if name not in ("loss", "distance"):
                rec.record_extra(name, t, value)
        return True

    W_round = np.zeros((n, k))
    name = "fedrep" if head_steps is None else f"fedrep[head_steps={head_steps}]"
    config = {"data": data, "batch_size": m if data == "fresh" else None, "clients_per_round": c,
              "init": init_name, "head_steps": head_steps, "batch": batch,
              "orthonormalize": orthonormalize, "tol": tol}
    rec = TraceRecorder(name, rounds, truth=problem.truth_basis, config=config)
    metrics, W_eval = evaluate(B)
    participants = np.zeros((rounds, c), dtype=np.int64)
    stopped = False
    if record(0, B, metrics):
        stopped = tol is not None and rec.distance[0] <= tol
        for t in range(1, 0 if stopped else rounds + 1):
            sel = choose_clients(rng, n, c)
            idx = np.arange(n) if sel is None else sel
            participants[t - 1] = idx
            opts = dict(head_steps=head_steps, heads=W_round[idx] if head_steps else None,
                        head_step_size=head_step_size, orthonormalize=orthonormalize)
            with np.errstate(over="ignore", invalid="ignore"):  # divergence is detected below
                out = _one_round(problem, B, idx, step_size, data, m, rng, batch, opts)
            rec.communicate(t, up=c * d * k, down=c * d * k)
            metrics, W_next = evaluate(out.B)
            if not record(t, out.B, metrics, heads=out.heads):
                break                       # diverged: B and W_eval stay the last finite ones
            B, W_eval = out.B, W_next
            W_round[idx] = out.heads
            rec.record_extra("sigma_min_R", t, float(np.linalg.svd(out.R, compute_uv=False)[-1]))
            rec.record_extra("batch_loss", t, out.batch_loss)
            if tol is not None and rec.distance[t] <= tol:
                stopped = True
                break
    status = None if tol is None else ("optimal" if stopped else "max_iter")
    return rec.finish(status=status, B=B, heads=W_eval, round_heads=W_round,
                      init_bytes_up=init_bytes, participants=participants)
