"""FedRep for multi-task linear regression (Collins et al., ICML 2021, Algorithm 2).

Each round ``t = 0..T-1`` (the paper's ``t = 1..T``, re-indexed as its note errata 1 says):

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
  independence Lemma 5's proof silently assumes; note §3.4).
* ``orthonormalize=False``: no QR (the notebook's variant; a broken variant for the verifier).
* ``fresh_samples=False``: the fixed-dataset regime of the experiments (note errata 7).

With no samples at all (population problem and ``batch_size=None``) the rounds use exact
population quantities (``Pi_i = I``): the deterministic ``m -> inf`` recursion of note §2.2.

The round itself is :func:`fedrep_round`, batched over clients (einsum and batched solves).
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..validation import (as_float_array, as_generator, check_choice, check_in_interval,
                           check_instance, check_int, check_positive)
from ..exact.multitask import (least_squares_heads, method_of_moments, population_moment_matrix,
                               projected_gd_init)
from ..problems.multitask import MultitaskProblem, haar_orthonormal
from ..results import Trace
from .recorder import TraceRecorder

__all__ = ["fedrep", "fedrep_round", "RoundOutput", "head_least_squares", "n_participants",
           "method_heads"]


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
    _check_bool(orthonormalize, "orthonormalize")
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
    """``rn`` rounded to the nearest integer, at least 1."""
    return max(1, int(round(participation * n)))


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _only_with_head_steps(**given):
    """Options of the head-GD variant must not be given with exact heads (they would be ignored)."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name} applies to head gradient steps only; got {name}={value!r} "
                             f"with head_steps=None (exact least-squares heads)")


def method_heads(problem: MultitaskProblem, B, *, fixed_dataset: bool) -> np.ndarray:
    """The heads Algorithm 2's exact head step gives every client for a representation ``B``.

    ``fixed_dataset=True``: least squares on each client's fixed dataset (eq. (7)); otherwise the
    population heads ``argmin_w ||B w - theta_i*||`` (the ``m -> inf`` limit of a fresh batch's
    least-squares head; minimum norm if ``B`` lost rank).

    Parameters
    ----------
    problem : MultitaskProblem
    B : ndarray, shape (d, k)

    Returns
    -------
    W : ndarray, shape (n, k)
    """
    if fixed_dataset:
        return least_squares_heads(problem.X @ B, problem.y)
    return np.linalg.lstsq(B, problem.theta.T, rcond=None)[0].T


def _one_round(problem, B, idx, step_size, fresh_samples, m, rng, batch, opts) -> RoundOutput:
    """Dispatch one round to the fixed dataset, the population recursion or fresh batches."""
    if not fresh_samples:
        return fedrep_round(B, problem.X[idx], problem.y[idx], step_size, batch=batch, **opts)
    if m is None:
        return _population_round(B, problem.theta[idx], step_size, **opts)
    X, y = problem.sample(m, rng, clients=idx)
    return fedrep_round(B, X, y, step_size, batch=batch, **opts)


def fedrep(problem: MultitaskProblem, rounds: int, step_size: float, *, participation: float = 1.0,
           init="moments", batch_size: int | None = None, init_samples: int | None = None,
           head_steps: int | None = None, head_step_size: float | None = None,
           fresh_samples: bool = True, batch: str = "same", orthonormalize: bool = True,
           tol: float | None = None, seed=None) -> Trace:
    """Run FedRep (Algorithm 2) on a multi-task linear problem.

    Parameters
    ----------
    problem : MultitaskProblem
    rounds : int
        ``T`` (>= 0; a 0-round trace is the initialization).
    step_size : float
        ``eta``; Theorem 1 needs ``eta <= 1/(4 sigma_max*^2)`` (<= 1/(4k) always suffices).
    participation : float in (0, 1]
        ``r``; ``round(r n)`` clients per round, sampled uniformly without replacement.
    init : {"moments", "random", "pgd"} or array_like of shape (d, k)
        Method of moments on its own batch (Alg. 2), Haar-random, 10 steps of projected GD on the
        unfactorized objective (the experiments' init, App. A.1; see
        :func:`~lowrank_fl.exact.multitask.projected_gd_init`), or a given start (orthonormalized).
    batch_size : int, optional
        ``m`` of the fresh per-round batches (default ``problem.samples_per_client``; if both are
        None: exact population rounds). Only with ``fresh_samples=True`` (ValueError otherwise).
    init_samples : int, optional
        Per-client batch of the method of moments / projected GD (default ``batch_size``;
        population moment matrix if there are no samples). Only with ``fresh_samples=True``: with
        ``fresh_samples=False`` the fixed dataset is used.
    head_steps, head_step_size, batch, orthonormalize
        Variants, see :func:`fedrep_round` (``head_step_size`` only with ``head_steps``).
    fresh_samples : bool
        True: a fresh batch per participant per round (Theorem 1). False: every round reuses the
        problem's fixed dataset (the paper's experiments); requires ``problem.X``.
    tol : float, optional
        Stop once ``dist(B^t, B*) <= tol`` (status ``"optimal"``; later entries stay ``nan``).
    seed : int or Generator
        Client sampling, fresh batches and the random init (stream ``"fedrep"``, independent of
        the problem's own draws even for the same int).

    Returns
    -------
    Trace
        ``distance`` dist(B^t, B*) for t = 0..T (a rank-deficient iterate, possible without QR,
        is at distance 1); ``loss[t]`` = ``problem.population_loss(B^t, W^t)`` (eq. (6):
        ``1/(2n) sum_i ||B w_i - theta_i*||^2 + noise^2/2``, the package-wide convention for
        multi-task problems), with ``W^t`` = :func:`method_heads` — the exact head step of Alg. 2
        applied to ``B^t`` for every client: least squares on the fixed dataset with
        ``fresh_samples=False``, the population heads otherwise (so in the population regime
        ``loss = min_W F(B^t, W)``; the same evaluation is used for the ``head_steps`` variants);
        ``bytes_up``/``bytes_down`` = ``rn d k`` floats each per round; ``B`` (d, k) the final
        representation (the last finite one if the run diverged) and ``heads`` (n, k) =
        ``W^T`` for it, so ``loss[-1] == population_loss(B, heads)``. ``extra``:
        ``round_heads`` (n, k) the heads clients computed in their last round (zeros for clients
        never sampled; fitted on the *previous* B), ``sigma_min_R`` (T+1, nan at 0) the smallest
        singular value of ``R^{t}``, ``batch_loss`` (T+1, nan at 0) the participants' loss (7)
        at their new heads, ``init_bytes_up`` (the d × d moment matrices sent at
        initialization), ``participants`` (T, rn).
    """
    check_instance(problem, "problem", MultitaskProblem)
    rounds = check_int(rounds, "rounds", minimum=0)
    step_size = check_positive(step_size, "step_size")
    participation = check_in_interval(participation, "participation", 0.0, 1.0, closed="right")
    check_choice(batch, "batch", ("same", "split"))
    if head_steps is not None:
        head_steps = check_int(head_steps, "head_steps", minimum=1)
    if head_step_size is not None:
        head_step_size = check_positive(head_step_size, "head_step_size")
        if head_steps is None:
            _only_with_head_steps(head_step_size=head_step_size)
    if tol is not None:
        tol = check_positive(tol, "tol")
    fresh_samples = _check_bool(fresh_samples, "fresh_samples")
    orthonormalize = _check_bool(orthonormalize, "orthonormalize")
    rng = as_generator(seed, stream="fedrep")
    d, k, n = problem.d, problem.k, problem.n_clients

    if fresh_samples:
        m = problem.samples_per_client if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        m0 = m if init_samples is None else check_int(init_samples, "init_samples", minimum=1)
    else:
        problem.require_dataset("fresh_samples=False")
        for name, value in (("batch_size", batch_size), ("init_samples", init_samples)):
            if value is not None:
                raise ValueError(f"{name} applies to fresh samples only; got {name}={value!r} with "
                                 f"fresh_samples=False (the fixed dataset is used)")
        m = m0 = problem.samples_per_client

    # ---- initialization
    init_bytes = 0
    if isinstance(init, str):
        check_choice(init, "init", ("moments", "random", "pgd"))
        if init == "random":
            B = haar_orthonormal(d, k, rng)
        elif init == "pgd":
            if not fresh_samples:
                B = projected_gd_init(problem.X, problem.y, k, seed=rng)
            elif m0 is None:
                raise ValueError("init='pgd' needs samples: give batch_size or init_samples")
            else:
                B = projected_gd_init(*problem.sample(m0, rng), k, seed=rng)
        else:
            init_bytes = n * d * d * 8
            if not fresh_samples:
                B = method_of_moments(problem.X, problem.y, k)
            elif m0 is None:
                vals, vecs = np.linalg.eigh(population_moment_matrix(problem.theta, problem.noise))
                B = vecs[:, ::-1][:, :k].copy()
            else:
                B = method_of_moments(*problem.sample(m0, rng), k)
    else:
        B0 = as_float_array(init, "init", shape=(d, k))
        B = np.linalg.qr(B0)[0]

    c = n_participants(participation, n)
    if c < k:
        raise ValueError(f"participation * n_clients = {c} clients per round must be >= k = {k} "
                         "(Assumption 2: the sampled heads must span R^k)")

    def evaluate(B):
        """(loss, heads) of the convention above; nan loss if B is not finite."""
        if not np.all(np.isfinite(B)):
            return np.nan, None
        with np.errstate(over="ignore", invalid="ignore"):
            W = method_heads(problem, B, fixed_dataset=not fresh_samples)
            return problem.population_loss(B, W) if np.all(np.isfinite(W)) else np.nan, W

    W_round = np.zeros((n, k))
    rec = TraceRecorder("fedrep" if head_steps is None else f"fedrep[head_steps={head_steps}]",
                        rounds, truth=problem.B_star)
    loss, W_eval = evaluate(B)
    participants = np.zeros((rounds, c), dtype=np.int64)
    stopped = False
    if rec.record(0, B, loss):
        for t in range(1, rounds + 1):
            idx = np.arange(n) if c == n else np.sort(rng.choice(n, size=c, replace=False))
            participants[t - 1] = idx
            opts = dict(head_steps=head_steps, heads=W_round[idx] if head_steps else None,
                        head_step_size=head_step_size, orthonormalize=orthonormalize)
            with np.errstate(over="ignore", invalid="ignore"):  # divergence is detected below
                out = _one_round(problem, B, idx, step_size, fresh_samples, m, rng, batch, opts)
            rec.communicate(t, up=c * d * k, down=c * d * k)
            loss, W_next = evaluate(out.B)
            if not rec.record(t, out.B, loss, heads=out.heads):
                break                       # diverged: B and W_eval stay the last finite ones
            B, W_eval = out.B, W_next
            W_round[idx] = out.heads
            rec.record_extra("sigma_min_R", t, float(np.linalg.svd(out.R, compute_uv=False)[-1]))
            rec.record_extra("batch_loss", t, out.batch_loss)
            if tol is not None and rec.distance[t] <= tol:
                stopped = True
                break
    trace = rec.finish(B=B, heads=W_eval, round_heads=W_round, init_bytes_up=init_bytes,
                       participants=participants)
    return replace(trace, status="optimal") if stopped else trace
