"""FedAvg with local updates on a global two-layer linear model, D-GD, and fine-tuning.

Collins, Hassani, Mokhtari, Shakkottai (2022), "FedAvg with fine tuning: local updates lead to
representation learning". One *global* pair ``(B, w)`` (``B`` (d, k), ``w`` (k,)) predicts
``x -> <B w, x>``; there are no per-client heads during training.

* :func:`fedavg` -- eqs. (2)-(3) as analysed in App. B.1: each of the m sampled clients runs
  ``tau`` simultaneous gradient steps on ``(B, w)`` with one step size alpha (``s = 0..tau-1``; the
  paper's "s = 1..tau-1" in (2) is an off-by-one: App. B.1 runs tau steps), then the server averages both
  ``B`` and ``w`` with equal weights. Population gradients (the theory and the Sec. 5.1 experiment)
  use ``f_i = 1/2 ||B w - B* w_i*||^2``; the finite-sample mode uses full-batch gradients of
  ``f_i = 1/(2 n) sum_j (y_ij - <B w, x_ij>)^2`` (eq. (5)).
* :func:`dgd` -- the named special case ``tau = 1``, full participation (eq. (70)); the paper's
  experiments call it "D-SGD".
* :func:`fine_tune` -- a new client (eq. (4), App. C.1): full ``(B, w)`` gradient descent (200 steps,
  lr 0.01, the paper's) and head-only least
  squares on ``orth(B)`` (only the head moves), both reported.

Batching: the local models of all sampled clients differ from the global ``B_t`` by a rank-<= s
update, ``B_{t,i,s} = B_t - alpha sum_{r<s} g_{t,i,r} w_{t,i,r}^T`` (``g`` the gradient with respect
to the product ``B w``). The round keeps only the (m, tau, d) gradients and (m, tau+1, k) heads, so
it never forms m copies of ``B``; the τ local steps are a loop over steps (each folding in all earlier
steps ``r < s`` with one batched einsum), not over clients. With
``n <= d`` samples per client the finite-sample round runs in sample space (Gram matrices
``X_i X_i^T``, cached by :func:`fedavg`), keeping only (m, n) residuals.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..validation import (as_float_array, as_generator, check_choice, check_instance, check_int,
                           check_positive)
from ..exact.fedavg_ft import head_only_least_squares
from ..linalg import orth
from ..problems.fedavg_ft import new_client, paper_init
from ..problems.multitask import MultitaskProblem
from ..results import ConvergenceWarning, Trace
from .common import (MAX_LOCAL_STEPS, check_clients_per_round, check_local_steps, choose_clients,
                     deprecated_keywords, resolve_data)
from .recorder import TraceRecorder

__all__ = ["fedavg", "dgd", "fedavg_round", "FedAvgRound", "fine_tune", "FineTuneResult",
           "MAX_LOCAL_STEPS"]

_MODES = {"population": "population", "empirical": "fixed"}     # the old ``mode`` values


class FedAvgRound(NamedTuple):
    """One FedAvg round: the new global ``B`` (d, k) and ``w`` (k,); ``path`` the local path
    (dict, see :func:`fedavg_round`) or ``None`` without ``return_path``."""

    B: np.ndarray
    w: np.ndarray
    path: dict | None = None


# ----------------------------------------------------------------------------- one round
def fedavg_round(B, w, step_size: float, *, local_steps: int = 1, targets=None, X=None, y=None,
                 gram=None, return_path: bool = False) -> FedAvgRound:
    """One FedAvg round on m clients (eqs. (2)-(3) as analysed in App. B.1), batched over clients.

    For each client ``i`` and ``s = 0..tau-1`` (simultaneous update from the old ``(B, w)``)::

        e      = B_{i,s} w_{i,s} - beta_i*        (population)   or  (1/n) X_i^T (X_i B w - y_i)
        B_{i,s+1} = B_{i,s} - alpha e w_{i,s}^T,    w_{i,s+1} = w_{i,s} - alpha B_{i,s}^T e

    then ``B_{t+1} = mean_i B_{i,tau}``, ``w_{t+1} = mean_i w_{i,tau}`` (eq. (3), equal weights).

    Parameters
    ----------
    B : ndarray, shape (d, k);  w : ndarray, shape (k,)
        Global model ``(B_t, w_t)``, ``k < d``.
    step_size : float
        alpha > 0.
    local_steps : int
        tau >= 1 (keyword).
    targets : ndarray, shape (m, d), optional
        Population mode: the clients' ``beta_i* = B* w_i*``.
    X : ndarray, shape (m, n, d);  y : ndarray, shape (m, n), optional
        Finite-sample mode: the clients' datasets (full-batch gradients). With ``n <= d`` the round
        runs in sample space (kernel form, below), never forming a (m, d) gradient.
    gram : ndarray, shape (m, n, n), optional
        ``X_i X_i^T`` for the kernel form (computed if not given; :func:`fedavg` caches it).
    return_path : bool
        Also return the local path: ``{"w": (m, tau+1, k) w_{t,i,s}, "B": (m, tau+1, d, k)
        B_{t,i,s}, "grad": (m, tau, d) the gradients e}``.

    Returns
    -------
    FedAvgRound
        ``B`` (d, k), ``w`` (k,), ``path`` (dict with ``return_path``, else None).
    """
    B = as_float_array(B, "B", ndim=2)
    d, k = B.shape
    if k >= d:
        raise ValueError(f"B must have fewer columns than rows (k < d, a low-rank representation), "
                         f"got shape {B.shape}")
    w = as_float_array(w, "w", shape=(k,))
    tau = check_local_steps(local_steps)
    alpha = check_positive(step_size, "step_size")
    if (targets is None) == (X is None):
        raise ValueError("give either targets (population mode) or X and y (finite-sample mode), "
                         "not both or neither")
    if targets is not None:
        targets = as_float_array(targets, "targets", shape=(None, d))
    else:
        if y is None:
            raise ValueError("X and y must be given together")
        X = as_float_array(X, "X", shape=(None, None, d))
        y = as_float_array(y, "y", shape=X.shape[:2])
        if gram is not None:
            gram = as_float_array(gram, "gram", shape=(X.shape[0], X.shape[1], X.shape[1]))
    return FedAvgRound(*_round(B, w, tau, alpha, targets, X, y, gram, return_path))


def _round(B, w, tau, alpha, targets, X, y, gram, return_path):
    """:func:`fedavg_round` without input checks (the hot path of :func:`fedavg`)."""
    if targets is None and X.shape[1] <= B.shape[0]:
        return _kernel_round(B, w, tau, alpha, X, y, gram, return_path)
    population = targets is not None
    m = targets.shape[0] if population else X.shape[0]
    d, k = B.shape
    # step-major layout: Ws[s] (m, k) and Gs[s] (m, d) are contiguous blocks, so the rank-s
    # corrections below are a few fused (m, d) multiply-adds per earlier step
    Ws = np.empty((tau + 1, m, k))
    Gs = np.empty((tau, m, d))
    Ws[0] = w
    for s in range(tau):
        ws = Ws[s]
        beta = ws @ B.T                                  # B_t w_{i,s}, (m, d)
        if s:        # local B_{i,s} = B_t - alpha sum_{r<s} g_r w_r^T: one batched sum over r < s
            coef = np.einsum("rmk,mk->rm", Ws[:s], ws)
            beta -= alpha * np.einsum("rm,rmd->md", coef, Gs[:s])
        if population:
            g = beta - targets
        else:
            resid = np.einsum("mnd,md->mn", X, beta) - y
            g = np.einsum("mnd,mn->md", X, resid) / X.shape[1]
        Btg = g @ B                                      # B_t^T g, (m, k)
        if s:
            coef = np.einsum("rmd,md->rm", Gs[:s], g)
            Btg -= alpha * np.einsum("rm,rmk->mk", coef, Ws[:s])
        Gs[s] = g
        np.subtract(ws, alpha * Btg, out=Ws[s + 1])
    B_next = B - (alpha / m) * (Gs.reshape(tau * m, d).T @ Ws[:tau].reshape(tau * m, k))
    w_next = Ws[tau].mean(axis=0)
    if not return_path:
        return B_next, w_next
    return B_next, w_next, _path(B, alpha, Ws, Gs)


def _path(B, alpha, Ws, Gs):
    """Materialize the local path from the step-major heads (tau+1, m, k) and gradients (tau, m, d)."""
    tau, m, d = Gs.shape
    k = B.shape[1]
    Wc = np.ascontiguousarray(np.swapaxes(Ws, 0, 1))    # (m, tau+1, k)
    Gc = np.ascontiguousarray(np.swapaxes(Gs, 0, 1))    # (m, tau, d)
    steps = np.einsum("msd,msk->msdk", Gc, Wc[:, :tau])
    Bpath = np.empty((m, tau + 1, d, k))
    Bpath[:, 0] = B
    Bpath[:, 1:] = B - alpha * np.cumsum(steps, axis=1)
    return {"w": Wc, "B": Bpath, "grad": Gc}


def _kernel_round(B, w, tau, alpha, X, y, gram, return_path):
    """Finite-sample round in sample space (n <= d): with ``g_{i,s} = X_i^T r_{i,s} / n``,

    ``X_i B_{i,s} w_s = (X_i B) w_s - alpha sum_{r<s} (K_i r_r / n)(w_r . w_s)``,
    ``B_{i,s}^T g_s = (X_i B)^T r_s / n - alpha sum_{r<s} w_r (r_r . K_i r_s) / n^2`` with
    ``K_i = X_i X_i^T``; only (m, n) residuals and (m, k) heads are kept. Same iterates as the
    direct form up to rounding.
    """
    m, n, d = X.shape
    k = B.shape[1]
    if gram is None:
        gram = np.einsum("mad,mbd->mab", X, X)
    XB = (X.reshape(m * n, d) @ B).reshape(m, n, k)
    Ws = np.empty((tau + 1, m, k))
    R = np.empty((tau, m, n))            # residuals X B w - y
    KR = np.empty((tau, m, n))           # X g = K r / n
    Ws[0] = w
    for s in range(tau):
        ws = Ws[s]
        xb = np.einsum("mnk,mk->mn", XB, ws)
        if s:                                            # all r < s at once
            xb -= alpha * np.einsum("rm,rmn->mn", np.einsum("rmk,mk->rm", Ws[:s], ws), KR[:s])
        R[s] = xb - y
        KR[s] = np.einsum("mab,mb->ma", gram, R[s]) / n
        Btg = np.einsum("mnk,mn->mk", XB, R[s]) / n
        if s:
            coef = np.einsum("rmn,mn->rm", R[:s], KR[s]) / n
            Btg -= alpha * np.einsum("rm,rmk->mk", coef, Ws[:s])
        np.subtract(ws, alpha * Btg, out=Ws[s + 1])
    # B_next = B - alpha/m sum_{i,s} g_{i,s} w_{i,s}^T = B - alpha/(m n) sum_i X_i^T sum_s r_s w_s^T
    RW = np.einsum("smn,smk->mnk", R, Ws[:tau])
    B_next = B - (alpha / (m * n)) * (RW.reshape(m * n, k).T @ X.reshape(m * n, d)).T
    w_next = Ws[tau].mean(axis=0)
    if not return_path:
        return B_next, w_next
    Gs = np.einsum("mnd,smn->smd", X, R) / n
    return B_next, w_next, _path(B, alpha, Ws, Gs)


# ----------------------------------------------------------------------------- validation
def _check_problem(problem) -> MultitaskProblem:
    return check_instance(problem, "problem", MultitaskProblem)


def _initial(init, problem, alpha, rng):
    d, k = problem.d, problem.k
    if isinstance(init, str):
        check_choice(init, "init", ("paper",))
        return paper_init(d=d, rank=k, step_size=alpha, seed=rng)
    if not isinstance(init, (tuple, list)) or len(init) != 2:
        raise TypeError(f"init must be 'paper' or a pair (B0, w0), got {type(init).__name__}")
    B0 = as_float_array(init[0], "init B0", shape=(d, k))
    w0 = as_float_array(init[1], "init w0", shape=(k,))
    orth(B0, name="init B0")                      # rejects a rank-deficient B0
    return B0.copy(), w0.copy()


# ----------------------------------------------------------------------------- FedAvg
_FEDAVG_RENAMES = {"mode": "data"}


def fedavg(problem: MultitaskProblem, rounds: int, step_size: float, *, data: str | None = None,
           batch_size: int | None = None, clients_per_round: int | None = None,
           local_steps: int = 1, init="paper", method: str | None = None, seed=None,
           **deprecated) -> Trace:
    """FedAvg with ``tau`` local GD steps on the global ``(B, w)`` (eqs. (2)-(3), App. B.1).

    Parameters
    ----------
    problem : MultitaskProblem
        ``B_star`` (d, k), ``heads`` (M, k); ``X`` (M, n, d) / ``y`` (M, n) for ``data="fixed"``.
    rounds : int
        T >= 0 (``T = 0``: the trace of the initialization).
    step_size : float
        alpha > 0, the same for ``B`` and ``w`` (the paper has a single step size).
    data : {"population", "fixed", "fresh"} or None
        Population gradients (theory, Sec. 5.1), full-batch gradients of (5) on the problem's
        dataset, or a fresh batch of ``batch_size`` samples per client per round. ``None``:
        ``"fixed"`` if the problem carries a dataset, else ``"population"``.
    batch_size : int, optional
        Only with ``data="fresh"`` (default ``problem.samples_per_client``).
    clients_per_round : int, optional
        m in ``[1, M]``, sampled uniformly without replacement each round (the model of Lemma 1);
        default ``M`` (full participation, deterministic).
    local_steps : int
        tau, ``1 <= tau <= MAX_LOCAL_STEPS``; ``tau = 1`` is D-GD.
    init : "paper" or (B0, w0)
        ``"paper"``: ``B_0 = orth(N(0,1)^{d x k}) / sqrt(alpha)``, ``w_0 = 0`` (App. C.1, so
        ``Delta_0 = 0``); or explicit arrays (d, k) and (k,) (a zero or rank-deficient ``B0``
        raises ``ValueError`` naming ``init``).
    method : str, optional
        Name stored in the trace (default ``"fedavg[tau=...]"``).
    seed : int or Generator
        Draw order: the ``"paper"`` init, then the client sample (and fresh batch) of each round.
    **deprecated
        ``mode`` (``"population"``/``"empirical"``; use ``data="population"``/``"fixed"``).

    Returns
    -------
    Trace
        ``distance`` (T+1,) = ``dist(B_t, B*)`` (``subspace_distance(..., rank_deficient="span")``:
        1 once ``B_t`` loses rank). ``loss`` (T+1,) = the toolkit-wide convention for a
        MultitaskProblem, ``problem.population_loss(B_t, W)`` with every client's head the global
        ``w_t`` (FedRep eq. (6): ``1/2 mean_i ||B_t w_t - B* w_i*||^2 + noise^2/2``), so FedAvg,
        FedRep and FedSGD losses compare on one model. The paper's objective (7)
        ``(1/M) sum_i ||B_t w_t - B* w_i*||^2`` (no 1/2, no noise; its optimum is ``gamma^2``) is
        ``extra["objective"]``. Bytes per round ``m (dk + k)`` each way; ``B`` the final ``B_T``;
        ``extra``: ``"w"`` (k,) final head, per-round ``"grad_norm"`` (Fig. 3 left formula),
        ``"w_norm"``, ``"delta_norm"`` ``||I - alpha B_t^T B_t||``, ``"complement_norm"``
        ``||(I - B* B*^T) B_t||_2`` (= ``||B*_perp^T B_t||``), and ``"empirical_loss"`` (eq. (5))
        with ``data="fixed"``. A NaN/inf (or a value above 1e150) stops the run with status
        ``"diverged"`` and a ``ConvergenceWarning``; ``B`` and ``extra["w"]`` are then the last
        finite iterate (round ``diverged_at - 1``).
    """
    problem = _check_problem(problem)
    old = deprecated_keywords("fedavg", deprecated, _FEDAVG_RENAMES)
    if "mode" in old:
        if data is not None:
            raise TypeError("fedavg() got both data and its deprecated alias mode")
        data = _MODES[check_choice(old["mode"], "mode", tuple(_MODES))]
    if not problem.has_truth:
        raise ValueError("fedavg records the paper's objective (7) against B* and w_i*; this "
                         "problem was built from data and has none")
    rounds = check_int(rounds, "rounds", minimum=0)
    tau = check_local_steps(local_steps)
    alpha = check_positive(step_size, "step_size")
    M = problem.n_clients
    m = check_clients_per_round(clients_per_round, M)
    mode = resolve_data(data, has_dataset=problem.X is not None, can_sample=True,
                        batch_size=batch_size, method="fedavg")
    n_fresh = None
    if mode == "fresh":
        n_fresh = problem.samples_per_client if batch_size is None else batch_size
        if n_fresh is None:
            raise ValueError("data='fresh' needs batch_size (the problem has no samples_per_client "
                             "to default to)")
    rng = as_generator(seed, stream="fedavg")
    B, w = _initial(init, problem, alpha, rng)
    Bs = problem.B_star
    theta = problem.theta
    # (1/M) sum_i ||Bw - theta_i||^2 = ||Bw - theta_bar||^2 + spread: O(d) per round
    target = theta.mean(axis=0)
    spread = float(np.mean(np.sum((theta - target) ** 2, axis=1)))      # = gamma^2 (B* orthonormal)
    noise_term = 0.5 * problem.noise ** 2
    name = method or ("dgd" if tau == 1 and m == M else f"fedavg[tau={tau}]")
    rec = TraceRecorder(name, rounds, truth=Bs,
                        config={"data": mode, "batch_size": n_fresh, "clients_per_round": m,
                                "local_steps": tau,
                                "init": init if isinstance(init, str) else "array"})
    eye = np.eye(problem.k)
    gram = None
    if mode == "fixed" and problem.X.shape[1] <= problem.d:
        gram = np.einsum("mad,mbd->mab", problem.X, problem.X)     # fixed data: once per run

    def record(t):
        e = B @ w - target
        objective = float(e @ e) + spread                 # eq. (7)
        if not rec.record(t, B, 0.5 * objective + noise_term, w=w):
            return False
        rec.record_extra("objective", t, objective)
        gB2 = float(e @ e) * float(w @ w)
        gw = B.T @ e
        rec.record_extra("grad_norm", t, np.sqrt(gB2 + gw @ gw))
        rec.record_extra("w_norm", t, np.linalg.norm(w))
        rec.record_extra("delta_norm", t, np.linalg.norm(eye - alpha * B.T @ B, 2))
        rec.record_extra("complement_norm", t, np.linalg.norm(B - Bs @ (Bs.T @ B), 2))
        if mode == "fixed":
            resid = problem.y - np.einsum("nmd,d->nm", problem.X, B @ w)
            rec.record_extra("empirical_loss", t, 0.5 * float(np.mean(resid * resid)))
        return True

    entries = m * (problem.d * problem.k + problem.k)
    with np.errstate(over="ignore", invalid="ignore"):
        if record(0):
            for t in range(1, rounds + 1):
                B_prev, w_prev = B, w
                sel = choose_clients(rng, M, m)
                idx = np.arange(M) if sel is None else sel
                if mode == "population":
                    B, w = _round(B, w, tau, alpha, theta[idx], None, None, None, False)
                elif mode == "fresh":
                    X, y = problem.sample(n_fresh, rng, clients=idx)
                    B, w = _round(B, w, tau, alpha, None, X, y, None, False)
                else:
                    B, w = _round(B, w, tau, alpha, None, problem.X[idx], problem.y[idx],
                                  None if gram is None else gram[idx], False)
                rec.communicate(t, up=entries, down=entries)
                if not record(t):
                    B, w = B_prev, w_prev          # keep the last finite iterate
                    break
    return rec.finish(B=B, w=w)


def dgd(problem: MultitaskProblem, rounds: int, step_size: float, *, data: str | None = None,
        batch_size: int | None = None, init="paper", seed=None, **deprecated) -> Trace:
    """D-GD: FedAvg with one local step and full participation (eq. (70); "D-SGD" in App. C).

    ``B_{t+1} = B_t - alpha (B_t w_t - B* wbar*) w_t^T``, ``w_{t+1} = w_t - alpha B_t^T (B_t w_t -
    B* wbar*)``. Same parameters and trace as :func:`fedavg` (method name ``"dgd"``); ``mode`` is
    a deprecated alias of ``data``.
    """
    old = deprecated_keywords("dgd", deprecated, _FEDAVG_RENAMES)
    if "mode" in old:
        if data is not None:
            raise TypeError("dgd() got both data and its deprecated alias mode")
        data = _MODES[check_choice(old["mode"], "mode", tuple(_MODES))]
    return fedavg(problem, rounds, step_size, data=data, batch_size=batch_size, local_steps=1,
                  clients_per_round=None, init=init, seed=seed, method="dgd")


# ----------------------------------------------------------------------------- fine-tuning
@dataclass(frozen=True)
class FineTuneResult:
    """Fine-tuning of a trained ``(B, w)`` on a new client, both variants.

    Attributes
    ----------
    head_ls_beta : ndarray, shape (d,)
        ``Q w_hat``: head-only least squares on ``Q = orth(B)`` (closed form).
    head_ls_w : ndarray, shape (k,)
        ``w_hat`` in the basis ``Q``.
    full_B : ndarray, shape (d, k);  full_w : ndarray, shape (k,)
        After ``steps`` full-batch GD steps on ``(B, w)`` (eq. (4), App. C.1).
    full_loss : ndarray, shape (steps + 1,)
        Empirical loss ``1/(2n) ||X B w - y||^2`` along the GD run (``nan`` after a divergence).
    head_ls_error, full_error : float
        ``||beta_hat - beta*||^2`` when the client's ``beta*`` is known, else ``nan``.
    status : str
        ``"completed"`` or ``"diverged"`` (full GD; a ``ConvergenceWarning`` is issued).
    diverged_at : int or None
        GD step at which a non-finite value appeared.
    """

    head_ls_beta: np.ndarray
    head_ls_w: np.ndarray
    full_B: np.ndarray
    full_w: np.ndarray
    full_loss: np.ndarray
    head_ls_error: float
    full_error: float
    status: str = "completed"
    diverged_at: int | None = None

    @property
    def full_beta(self) -> np.ndarray:
        """``B w`` after full fine-tuning, shape (d,)."""
        return self.full_B @ self.full_w


def _client_data(client):
    if hasattr(client, "X") and hasattr(client, "y"):
        return client.X, client.y, getattr(client, "beta", None)
    if isinstance(client, (tuple, list)) and len(client) in (2, 3):
        return client[0], client[1], client[2] if len(client) == 3 else None
    raise TypeError("client must be a NewClient (lowrank_fl.problems.fedavg_ft.new_client) or a "
                    f"tuple (X, y) / (X, y, beta_star), got {type(client).__name__}")


def fine_tune(client, B, w, *, steps: int = 200, step_size: float = 0.01,
              samples_per_client: int | None = None, noise: float = 0.1, seed=None,
              **deprecated) -> FineTuneResult:
    """Fine-tune ``(B, w)`` on a new client's data (eq. (4); App. C.1) and, beside it, fit the head
    alone by least squares on ``orth(B)``.

    Parameters
    ----------
    client : NewClient, tuple or MultitaskProblem
        ``X`` (n, d), ``y`` (n,) and optionally ``beta*`` (d,) for the reported errors; or a
        problem, from which a new client with ``n`` samples is drawn (App. C.1,
        :func:`lowrank_fl.problems.fedavg_ft.new_client` with ``noise`` and ``seed``).
    B : array_like, shape (d, k);  w : array_like, shape (k,)
        The trained global model.
    steps : int
        tau' full-batch GD iterations on ``(B, w)`` (200 in the paper).
    step_size : float
        Fine-tuning learning rate (0.01 in the paper).
    samples_per_client, noise, seed
        Only when ``client`` is a problem: samples (``n`` is a deprecated alias), noise std and
        seed of the drawn client.

    Returns
    -------
    FineTuneResult
    """
    n = deprecated_keywords("fine_tune", deprecated, {"n": "samples_per_client"}).get("n")
    noise = check_positive(noise, "noise", strict=False)
    if n is not None:
        if samples_per_client is not None:
            raise TypeError("fine_tune() got both 'samples_per_client' and its deprecated alias 'n'")
        samples_per_client = n
    if isinstance(client, MultitaskProblem):
        if samples_per_client is None:
            raise ValueError("samples_per_client (the new client's number of samples) is required "
                             "when client is a MultitaskProblem")
        client = new_client(client, samples_per_client=samples_per_client, noise=noise, seed=seed)
    elif samples_per_client is not None or seed is not None:
        raise ValueError("samples_per_client and seed only apply when client is a MultitaskProblem "
                         "(a client is drawn); got a client with its data")
    X, y, beta = _client_data(client)
    X = as_float_array(X, "X", ndim=2)
    n, d = X.shape
    y = as_float_array(y, "y", shape=(n,))
    B = as_float_array(B, "B", shape=(d, None))
    k = B.shape[1]
    w = as_float_array(w, "w", shape=(k,))
    if beta is not None:
        beta = as_float_array(beta, "beta_star", shape=(d,))
    steps = check_int(steps, "steps", minimum=0)
    lr = check_positive(step_size, "step_size")

    _, w_hat, beta_ls = head_only_least_squares(X, y, B)
    loss = np.full(steps + 1, np.nan)
    Bf, wf = B.copy(), w.copy()
    status, at = "completed", None
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(steps + 1):
            r = X @ (Bf @ wf) - y
            val = 0.5 * float(r @ r) / n
            if not np.isfinite(val) or not np.all(np.isfinite(Bf)):
                status, at = "diverged", s
                break
            loss[s] = val
            if s == steps:
                break
            g = X.T @ r / n                                   # gradient w.r.t. the product B w
            Bf, wf = Bf - lr * np.outer(g, wf), wf - lr * (Bf.T @ g)
    if status == "diverged":
        warnings.warn(f"fine_tune's full gradient descent diverged at step {at} (step_size="
                      f"{lr:g}); the head-only least squares is unaffected", ConvergenceWarning,
                      stacklevel=2)
    err = (lambda b: float(np.sum((b - beta) ** 2))) if beta is not None else (lambda b: np.nan)
    return FineTuneResult(head_ls_beta=beta_ls, head_ls_w=w_hat, full_B=Bf, full_w=wf,
                          full_loss=loss, head_ls_error=err(beta_ls),
                          full_error=err(Bf @ wf) if status == "completed" else np.nan,
                          status=status, diverged_at=at)
