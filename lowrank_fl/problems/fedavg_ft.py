"""Instances of "FedAvg with fine tuning" (Collins et al., 2022), built on :mod:`.multitask`.

* :func:`paper_instance` -- the linear experiment of Sec. 5.1 / App. C.1: ``d = 100, k = 5,
  M = 40`` clients, ``B*`` the Q factor of a Gaussian matrix, heads ``w_i* ~ N(0, I_k)``, and the
  initialization ``B_0 = orth(N(0,1)^{d x k}) / sqrt(alpha)``, ``w_0 = 0`` (so
  ``Delta_0 = I - alpha B_0^T B_0 = 0``, Theorem 1 condition (ii), and ``w_0`` meets (iii)). The
  head statistics of Assumptions 1-2 / Definition 1 come with it.
* :func:`new_client` -- the fine-tuning client of App. C.1: ``w*_{M+1} ~ N(0, I_k)``,
  ``x ~ N(0, I_d)`` (the appendix prints ``I_k``, a typo), ``y = <B* w*_{M+1}, x> + zeta`` with
  ``zeta ~ N(0, 0.01)`` read as a variance (noise std 0.1).
* :func:`proposition1_instance` -- Proposition 1's construction (App. B.2): ``B*`` and its
  reflection ``B*'`` with the same ``B* wbar* ∈ col(B_0)``, both at distance δ0 from ``col(B_0)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import (as_float_array, as_generator, check_in_interval, check_instance,
                           check_int, check_positive)
from ..exact.fedavg_ft import HeadStatistics, head_statistics
from ..linalg import orth, subspace_distance
from .dataset import renamed_size
from .multitask import MultitaskProblem, multitask_linear

__all__ = ["FedAvgFTInstance", "paper_instance", "paper_init", "NewClient", "new_client",
           "Proposition1Instance", "proposition1_instance"]


def paper_init(*, d: int, rank: int, step_size: float, seed=None):
    """App. C.1 initialization: ``B_0 = Q / sqrt(alpha)`` with ``Q`` the QR factor of an
    N(0, 1) (d, rank) matrix, ``w_0 = 0``. Returns ``B0`` (d, rank), ``w0`` (rank,). Keywords only."""
    d = check_int(d, "d", minimum=2)
    k = check_int(rank, "rank", minimum=1, maximum=d - 1)
    alpha = check_positive(step_size, "step_size")
    rng = as_generator(seed)
    Q = orth(rng.standard_normal((d, k)))
    return Q / np.sqrt(alpha), np.zeros(k)


@dataclass(frozen=True)
class FedAvgFTInstance:
    """A FedAvg-FT experiment: the multitask problem, the initialization and the step size.

    Attributes
    ----------
    problem : MultitaskProblem
        ``B_star`` (d, k), ``heads`` (M, k) and, for finite samples, ``X`` (M, n, d), ``y`` (M, n).
    B0 : ndarray, shape (d, k);  w0 : ndarray, shape (k,)
    step_size : float
        alpha of the initialization (``alpha B_0^T B_0 = I``).
    stats : HeadStatistics
        Assumptions 1-2 / Definition 1 quantities of the heads.
    """

    problem: MultitaskProblem
    B0: np.ndarray
    w0: np.ndarray
    step_size: float
    stats: HeadStatistics

    @property
    def delta0(self) -> float:
        """Initial distance ``dist(B_0, B*)``."""
        return subspace_distance(self.problem.B_star, self.B0)

    @property
    def init(self):
        """``(B0, w0)``, ready for ``fedavg(..., init=instance.init)``."""
        return self.B0, self.w0


def paper_instance(*, d: int = 100, rank: int | None = None, n_clients: int = 40,
                   step_size: float = 0.4, heads="gaussian", samples_per_client: int | None = None,
                   noise: float = 0.0, seed=None, k: int | None = None) -> FedAvgFTInstance:
    """The linear experiment of Sec. 5.1 / App. C.1 (defaults are the paper's).

    Parameters
    ----------
    d, rank, n_clients : int
        Ambient dimension, representation dimension (the paper's k, ``rank < d``; default 5) and
        number of clients M. Keywords only (``k`` is a deprecated alias of ``rank``).
    step_size : float
        alpha; sets the scale of ``B_0`` (0.4 in the paper).
    heads : {"gaussian", "normalized", "qr"} or array_like (n_clients, k)
        ``"gaussian"`` (``N(0, I_k)``) is the paper's.
    samples_per_client : int or None
        ``None`` = population gradients (the paper's experiment); an int draws a fixed dataset.
    noise : float
        Label-noise standard deviation for the finite-sample mode.
    seed : int or Generator
        Draw order: the problem (B*, heads, data), then ``B_0``.
    """
    k = 5 if rank is None and k is None else renamed_size("paper_instance", rank, k, "rank", "k")
    rng = as_generator(seed)
    problem = multitask_linear(d=d, rank=k, n_clients=n_clients,
                               samples_per_client=samples_per_client, noise=noise, heads=heads,
                               seed=rng)
    B0, w0 = paper_init(d=problem.d, rank=problem.k, step_size=step_size, seed=rng)
    return FedAvgFTInstance(problem=problem, B0=B0, w0=w0, step_size=float(step_size),
                            stats=head_statistics(problem.heads))


@dataclass(frozen=True)
class NewClient:
    """A new client for fine-tuning (App. C.1).

    Attributes
    ----------
    X : ndarray, shape (n, d);  y : ndarray, shape (n,)
    head : ndarray, shape (k,)
        ``w*_{M+1}``.
    beta : ndarray, shape (d,)
        ``B* w*_{M+1}``, the regression vector the fine-tuned ``B w`` is compared with.
    noise : float
        Label-noise standard deviation.
    """

    X: np.ndarray
    y: np.ndarray
    head: np.ndarray
    beta: np.ndarray
    noise: float


def new_client(problem: MultitaskProblem, *, samples_per_client: int | None = None,
               noise: float = 0.1, head=None, seed=None, n: int | None = None) -> NewClient:
    """Draw the fine-tuning client of App. C.1 for ``problem``'s ``B*``.

    Parameters
    ----------
    problem : MultitaskProblem
    samples_per_client : int
        The new client's number of fine-tuning samples (the paper's n; ``n`` is a deprecated
        alias). Keyword only.
    noise : float
        Noise standard deviation; 0.1 is the paper's ``N(0, 0.01)`` read as a variance.
    head : array_like, shape (k,), optional
        ``w*_{M+1}``; drawn from ``N(0, I_k)`` by default.
    seed : int or Generator
    """
    n = renamed_size("new_client", samples_per_client, n, "samples_per_client", "n")
    check_instance(problem, "problem", MultitaskProblem)
    if not problem.has_truth:
        raise ValueError("new_client draws a client for problem.B_star; this problem was built "
                         "from data and has none")
    n = check_int(n, "samples_per_client", minimum=1)
    noise = check_positive(noise, "noise", strict=False)
    rng = as_generator(seed)
    h = rng.standard_normal(problem.k) if head is None else \
        as_float_array(head, "head", shape=(problem.k,))
    beta = problem.B_star @ h
    X = rng.standard_normal((n, problem.d))
    y = X @ beta + noise * rng.standard_normal(n)
    return NewClient(X=X, y=y, head=h, beta=beta, noise=noise)


@dataclass(frozen=True)
class Proposition1Instance:
    """Proposition 1's pair of ground truths (App. B.2).

    Attributes
    ----------
    problem, reflected : MultitaskProblem
        Same heads; ``B_star`` is ``B*`` resp. its reflection ``B*'`` (eq. (66)).
    B0 : ndarray, shape (d, k);  w0 : ndarray, shape (k,)
    delta0 : float
        ``dist(B_0, B*) = dist(B_0, B*')``.
    step_size : float
    """

    problem: MultitaskProblem
    reflected: MultitaskProblem
    B0: np.ndarray
    w0: np.ndarray
    delta0: float
    step_size: float

    @property
    def init(self):
        return self.B0, self.w0


def proposition1_instance(*, d: int | None = None, rank: int | None = None,
                          n_clients: int | None = None, delta0: float | None = None,
                          step_size: float = 0.4, heads="gaussian", B0=None,
                          seed=None, k: int | None = None) -> Proposition1Instance:
    """Build Proposition 1's instance (App. B.2: the pair of ground truths of eq. (66)).

    With ``Q_0 = orth(B_0)``, a unit ``c``, ``u = Q_0 c``, ``B~_0 = Q_0 [c^perp basis]`` and an
    orthonormal (d, k-1) block ``N`` orthogonal to ``col(B_0)``, set
    ``B~* = B~_0 cos(theta) + N sin(theta)`` with ``sin(theta) = delta0`` and
    ``B* = u wbar*^T / ||wbar*|| + B~* V~*^T`` (``V~*`` an orthonormal basis of ``wbar*^perp``), so
    ``B*^T B* = I``, ``B* wbar* = ||wbar*|| u ∈ col(B_0)`` and ``dist(B_0, B*) = delta0``. The
    reflection (66) is ``B*' = u wbar*^T/||wbar*|| + (2 B~_0 B~_0^T B~* - B~*) V~*^T``.

    Parameters
    ----------
    d, rank, n_clients : int
        Keywords only; needs ``rank >= 2`` (the paper's k) and ``d >= 2 rank - 1`` (room for
        ``N``). ``k`` is a deprecated alias of ``rank``.
    delta0 : float in (0, 1/2]
        Initial distance (Proposition 1's range).
    step_size : float
        alpha, for the default ``B_0 = Q/sqrt(alpha)``.
    heads : {"gaussian", "normalized"} or array_like (n_clients, k)
        Ground-truth heads; their mean must be nonzero.
    B0 : array_like, shape (d, k), optional
        Any full-rank initialization (default: the paper's ``orth(Gaussian)/sqrt(alpha)``).
    seed : int or Generator
    """
    k = renamed_size("proposition1_instance", rank, k, "rank", "k")
    if d is None or n_clients is None or delta0 is None:
        raise TypeError("proposition1_instance() needs the keywords d, rank, n_clients and delta0")
    d = check_int(d, "d", minimum=3)
    k = check_int(k, "rank", minimum=2)
    if 2 * k - 1 > d:
        raise ValueError(f"d must be at least 2k - 1 = {2 * k - 1} for Proposition 1's "
                         f"construction, got d={d}")
    n = check_int(n_clients, "n_clients", minimum=1)
    d0 = check_in_interval(delta0, "delta0", 0.0, 0.5, closed="right")
    alpha = check_positive(step_size, "step_size")
    rng = as_generator(seed)
    heads_problem = multitask_linear(d=d, rank=k, n_clients=n, heads=heads, seed=rng)
    W = heads_problem.heads
    wbar = W.mean(axis=0)
    if not np.linalg.norm(wbar) > 1e-12:
        raise ValueError("heads must have a nonzero mean (wbar* != 0) for Proposition 1")
    if B0 is None:
        B0, w0 = paper_init(d=d, rank=k, step_size=alpha, seed=rng)
    else:
        B0, w0 = as_float_array(B0, "B0", shape=(d, k)), np.zeros(k)
    Q0 = orth(B0, name="B0")
    c = rng.standard_normal(k)
    c /= np.linalg.norm(c)
    Cperp = _complement_basis(c[:, None])                                   # (k, k-1)
    u, Bt0 = Q0 @ c, Q0 @ Cperp
    G = rng.standard_normal((d, k - 1))
    N = orth(G - Q0 @ (Q0.T @ G))
    Bt_star = Bt0 * np.sqrt(1 - d0 ** 2) + N * d0
    Vt = _complement_basis(wbar[:, None] / np.linalg.norm(wbar))           # (k, k-1)
    rank_one = np.outer(u, wbar / np.linalg.norm(wbar))
    B_star = rank_one + Bt_star @ Vt.T
    B_refl = rank_one + (2 * Bt0 @ (Bt0.T @ Bt_star) - Bt_star) @ Vt.T
    # the construction is orthonormal to rounding; re-orthonormalize away the ~1e-16 drift
    # through a polar factor (keeps B* wbar* exactly in the same direction up to rounding)
    return Proposition1Instance(
        problem=MultitaskProblem(B_star=_polar(B_star), heads=W),
        reflected=MultitaskProblem(B_star=_polar(B_refl), heads=W),
        B0=B0, w0=w0, delta0=d0, step_size=alpha)


def _complement_basis(A) -> np.ndarray:
    """Orthonormal basis (k, k - r) of the orthogonal complement of ``col(A)`` for ``A`` (k, r)."""
    Q, _ = np.linalg.qr(A, mode="complete")
    return Q[:, A.shape[1]:]


def _polar(B) -> np.ndarray:
    U, _, Vt = np.linalg.svd(B, full_matrices=False)
    return U @ Vt
