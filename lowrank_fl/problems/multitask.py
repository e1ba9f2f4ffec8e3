"""Multi-task linear regression with a shared k-dimensional representation.

The model of FedRep (Collins et al., ICML 2021, Sec. 4, eqs. (5)-(6)), also used by FLUTE and
FedAvg-FT: client ``i`` observes

    x ~ N(0, I_d),   y = <B* w_i*, x> + noise * N(0, 1),

with ``B*`` a (d, k) matrix with orthonormal columns (Assumption 3) and ``w_i*`` the client's head.
``theta_i* = B* w_i*`` is the client's regression vector; stacked, ``Theta* = W* B*^T`` (n, d) has
rank k. ``noise`` is a *standard deviation* (the paper's N(., 1e-3) is ambiguous: it may be read
as a variance; the official notebook uses std 1e-3).

Heads (the scale matters: it sets sigma_min/max in Theorem 1, and the paper's text, Assumption 3
and the notebook's figures use different scales):

* ``"normalized"`` (default, Assumption 3): rows ``sqrt(k) g_i / ||g_i||`` with ``g_i ~ N(0, I_k)``,
  so ``||w_i*|| = sqrt(k)`` exactly.
* ``"gaussian"``: rows ``N(0, I_k)`` (the notebook's new-client heads, Fig. 4).
* ``"qr"``: ``sqrt(k) Q`` with ``Q`` the (n, k) QR factor of a Gaussian matrix — the paper's
  App. A.1 text read literally (rows then have norm about ``k / sqrt(n)``, which is *not*
  Assumption 3).
* an array of shape (n, k).

A problem can also be built from a user's own data without any ground truth,
:meth:`MultitaskProblem.from_data` (``X`` (n, m, d), ``y`` (n, m), ``rank``): the metrics that need
the truth (distance to ``B*``, population loss) are then absent, never computed against a dummy.

A user-given ``B_star`` must already have orthonormal columns (``|B^T B - I| <= 1e-8``): it is
*rejected* otherwise rather than silently orthonormalized, because orthonormalizing changes
``Theta* = W* B*^T`` and so the data the caller asked for. Use :func:`lowrank_fl.linalg.orth`
explicitly if a basis of the column space is what is meant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..linalg import subspace_distance
from ..validation import as_float_array, as_generator, check_choice, check_int, check_positive
from .dataset import ClientDataset, Samples, check_orthonormal, renamed_size

__all__ = ["MultitaskProblem", "multitask_linear", "haar_orthonormal", "HEADS"]

HEADS = ("normalized", "gaussian", "qr")


def haar_orthonormal(*, d: int, rank: int | None = None, seed=None, k: int | None = None) -> np.ndarray:
    """A Haar-distributed (d, rank) matrix with orthonormal columns.

    QR of a Gaussian matrix with the signs of ``diag(R)`` moved into ``Q`` (without the sign fix
    the distribution of ``Q`` is not Haar). ``k`` is a deprecated alias of ``rank``.
    """
    k = renamed_size("haar_orthonormal", rank, k, "rank", "k")
    d = check_int(d, "d", minimum=1)
    k = check_int(k, "rank", minimum=1, maximum=d)
    rng = as_generator(seed)
    Q, R = np.linalg.qr(rng.standard_normal((d, k)))
    return Q * np.where(np.diagonal(R) < 0, -1.0, 1.0)


@dataclass(frozen=True)
class MultitaskProblem(ClientDataset):
    """A multi-task linear regression instance, with ground truth or built from data.

    Attributes
    ----------
    B_star : ndarray, shape (d, k), or None
        Shared representation, orthonormal columns (``None``: built from data, no truth).
    heads : ndarray, shape (n, k), or None
        Ground-truth heads ``W*`` (rows ``w_i*``).
    noise : float
        Standard deviation of the additive label noise (0 = noiseless, as in the theory).
    X : ndarray, shape (n, m, d) or None
        The fixed per-client dataset (``None`` for the population / fresh-sample regime).
    y : ndarray, shape (n, m) or None
        Labels of ``X``.
    rank : int or None
        The representation dimension, the paper's k (taken from ``B_star`` when it is given;
        required without it).
    """

    B_star: np.ndarray | None = None
    heads: np.ndarray | None = None
    noise: float = 0.0
    X: np.ndarray | None = None
    y: np.ndarray | None = None
    rank: int | None = None

    def __post_init__(self):
        noise = check_positive(self.noise, "noise", strict=False)
        object.__setattr__(self, "noise", noise)
        if self.B_star is None:
            if self.heads is not None:
                raise ValueError("heads (the ground-truth heads) need B_star; a problem without "
                                 "ground truth has neither (use MultitaskProblem.from_data)")
            if self.X is None:
                raise ValueError("a MultitaskProblem needs a ground truth (B_star, heads) or a "
                                 "dataset (X, y); got neither")
            X = as_float_array(self.X, "X", ndim=3)
            n, _, d = X.shape
            k = check_int(self.rank, "rank", minimum=1)
            if k >= d:
                raise ValueError(f"rank must be smaller than d = {d} (rank < d), got rank={k}")
            object.__setattr__(self, "rank", k)
            self._validate_dataset(n, d)
            return
        B = as_float_array(self.B_star, "B_star", ndim=2)
        d, k = B.shape
        if k >= d:
            raise ValueError(f"k must be smaller than d (k < d): B_star must have k < d columns, "
                             f"got shape {B.shape}")
        if self.rank is not None and check_int(self.rank, "rank", minimum=1) != k:
            raise ValueError(f"rank must equal B_star's number of columns {k}, got rank={self.rank}")
        check_orthonormal(B, "B_star")
        if self.heads is None:
            raise ValueError("B_star needs its heads (n, k)")
        W = as_float_array(self.heads, "heads", shape=(None, k))
        object.__setattr__(self, "B_star", B)
        object.__setattr__(self, "heads", W)
        object.__setattr__(self, "rank", k)
        self._validate_dataset(W.shape[0], d)

    @classmethod
    def from_data(cls, X, y, *, rank: int) -> "MultitaskProblem":
        """A problem from a user's own data, without ground truth.

        Parameters
        ----------
        X : array_like, shape (n_clients, m, d)
        y : array_like, shape (n_clients, m)
        rank : int
            The representation dimension to fit (the paper's k, ``1 <= rank < d``).

        The methods then run on the fixed dataset (``data="fixed"``); their traces report the
        empirical loss (8) and no distance (``Trace.distance is None``).
        """
        return cls(X=X, y=y, rank=rank)

    # ------------------------------------------------------------------ shapes
    @property
    def d(self) -> int:
        return self.B_star.shape[0] if self.B_star is not None else self.X.shape[2]

    @property
    def k(self) -> int:
        """The representation dimension (same as :attr:`rank`)."""
        return self.rank

    @property
    def n_clients(self) -> int:
        return self.heads.shape[0] if self.heads is not None else self.X.shape[0]

    @property
    def has_truth(self) -> bool:
        """Whether the ground truth (and so a population) is known."""
        return self.B_star is not None

    @property
    def truth_basis(self) -> np.ndarray | None:
        """The representation distances are measured to: ``B_star`` (``None`` without truth)."""
        return self.B_star

    def _require_truth(self, what: str) -> None:
        if self.B_star is None:
            raise ValueError(f"{what} needs the ground truth; this problem was built from data "
                             f"(MultitaskProblem.from_data) and has none")

    @property
    def theta(self) -> np.ndarray:
        """Client regression vectors ``Theta* = W* B*^T``, shape (n, d)."""
        self._require_truth("theta")
        return self.heads @ self.B_star.T

    # ------------------------------------------------------------------ data
    def sample(self, m: int, seed=None, *, clients=None) -> Samples:
        """Draw a fresh batch of ``m`` samples per client (Alg. 2's per-round batch).

        Parameters
        ----------
        m : int
            Samples per client.
        seed : int or Generator
        clients : array_like of int, shape (c,), optional
            Which clients to sample for (default: all ``n``).

        Returns
        -------
        Samples
            ``X`` (c, m, d), ``y`` (c, m).
        """
        self._require_truth("sample")
        m = check_int(m, "m", minimum=1)
        rng = as_generator(seed)
        theta = self.theta if clients is None else self.theta[self.client_index(clients)]
        X = rng.standard_normal((theta.shape[0], m, self.d))
        y = np.einsum("cmd,cd->cm", X, theta)
        if self.noise > 0:
            y = y + self.noise * rng.standard_normal(y.shape)
        return Samples(X, y)

    # ------------------------------------------------------------------ losses
    def _check_BW(self, B, W):
        B = as_float_array(B, "B", shape=(self.d, None))
        W = as_float_array(W, "W", shape=(self.n_clients, B.shape[1]))
        return B, W

    def population_loss(self, B, W, *, excess: bool = False) -> float:
        """Global objective (6) in closed form for ``x ~ N(0, I_d)``.

        ``F(B, W) = 1/(2n) sum_i ||B w_i - theta_i*||^2 + noise^2 / 2``; ``excess=True`` drops the
        irreducible ``noise^2 / 2``.

        Parameters
        ----------
        B : array_like, shape (d, k')   (any k', orthonormal or not)
        W : array_like, shape (n, k')
        """
        self._require_truth("population_loss")
        B, W = self._check_BW(B, W)
        resid = W @ B.T - self.theta
        val = 0.5 * float(np.mean(np.sum(resid * resid, axis=1)))
        return val if excess else val + 0.5 * self.noise ** 2

    def empirical_loss(self, B, W, X=None, y=None) -> float:
        """Empirical global loss (8): ``1/(2nm) sum_{i,j} (y_ij - w_i^T B^T x_ij)^2``.

        Uses the fixed dataset unless ``X`` (n, m, d) and ``y`` (n, m) are given.
        """
        B, W = self._check_BW(B, W)
        if X is None and y is None:
            X, y = self.require_dataset("empirical_loss without X and y")
        elif X is None or y is None:
            raise ValueError("X and y must be given together")
        X = as_float_array(X, "X", shape=(self.n_clients, None, self.d))
        y = as_float_array(y, "y", shape=X.shape[:2])
        resid = y - np.einsum("nmd,nd->nm", X, W @ B.T)
        return 0.5 * float(np.mean(resid * resid))

    # ------------------------------------------------------------------ evaluation hook
    def fitted_heads(self, B, *, data: str) -> np.ndarray:
        """The heads Algorithm 2's exact head step gives every client for a representation ``B``.

        ``data="fixed"``: least squares on each client's fixed dataset (eq. (7)); otherwise the
        population heads ``argmin_w ||B w - theta_i*||`` (the ``m -> inf`` limit of a fresh
        batch's least-squares head; minimum norm if ``B`` lost rank). Returns (n, k').
        """
        from ..exact.multitask import least_squares_heads      # exact sits above problems
        if data == "fixed":
            X, y = self.require_dataset("fitted_heads(data='fixed')")
            return least_squares_heads(X @ B, y)
        return np.linalg.lstsq(B, self.theta.T, rcond=None)[0].T

    def evaluate(self, B, heads) -> dict:
        """The metrics every method records for a model ``(B, heads)`` on this problem.

        Returns ``{"loss": ..., "distance": ...}``: the population loss (6) and
        ``dist(B, B*)`` (a rank-deficient ``B`` is at distance 1) when the truth is known; the
        empirical loss (8) and ``distance=None`` for a problem built from data.
        """
        if self.B_star is None:
            return {"loss": self.empirical_loss(B, heads), "distance": None}
        return {"loss": self.population_loss(B, heads),
                "distance": subspace_distance(self.B_star, B, rank_deficient="span")}


def multitask_linear(*, d: int | None = None, rank: int | None = None, n_clients: int | None = None,
                     samples_per_client: int | None = None, noise: float = 0.0,
                     heads="normalized", B_star=None, seed=None, k: int | None = None
                     ) -> MultitaskProblem:
    """Draw a multi-task linear regression instance (FedRep Sec. 4 / App. A.1).

    Parameters
    ----------
    d, rank, n_clients : int
        Ambient dimension, representation dimension (the paper's k, ``1 <= rank < d``) and number
        of clients n. Keywords only (``k`` is a deprecated alias of ``rank``).
    samples_per_client : int or None
        ``m`` of a fixed dataset drawn once (the experiments' regime); ``None`` = population only
        (exact gradients, or fresh batches through :meth:`MultitaskProblem.sample`).
    noise : float
        Label-noise standard deviation (>= 0), in the paper's units (inputs ``x ~ N(0, I_d)``).
        FedRep's official notebook scales its inputs by ``1/sqrt(m)``: its noise level ``s`` on
        those inputs is ``noise = s * sqrt(m)`` here (see :func:`~lowrank_fl.algorithms.fedrep.fedrep`).
    heads : {"normalized", "gaussian", "qr"} or array_like of shape (n_clients, rank)
        See the module docstring.
    B_star : array_like of shape (d, rank), optional
        Must have orthonormal columns (rejected otherwise); default Haar-random.
    seed : int or Generator
        Draw order: ``B_star``, heads, dataset.

    Returns
    -------
    MultitaskProblem
    """
    k = renamed_size("multitask_linear", rank, k, "rank", "k")
    if d is None or n_clients is None:
        raise TypeError("multitask_linear() needs the keyword sizes d, rank and n_clients")
    # only what the drawing needs is checked here; the instance is validated by MultitaskProblem
    d = check_int(d, "d", minimum=2)
    k = check_int(k, "rank", minimum=1)
    if k >= d:      # before drawing: haar_orthonormal would reject k > d with a vaguer message
        raise ValueError(f"rank must be smaller than d (rank < d), got rank={k}, d={d}")
    n = check_int(n_clients, "n_clients", minimum=1)
    if samples_per_client is not None:
        samples_per_client = check_int(samples_per_client, "samples_per_client", minimum=1)
    rng = as_generator(seed)

    B = (haar_orthonormal(d=d, rank=k, seed=rng) if B_star is None
         else as_float_array(B_star, "B_star", shape=(d, k)))

    if isinstance(heads, str):
        check_choice(heads, "heads", HEADS)
        G = rng.standard_normal((n, k))
        if heads == "normalized":
            W = np.sqrt(k) * G / np.linalg.norm(G, axis=1, keepdims=True)
        elif heads == "gaussian":
            W = G
        else:  # "qr"
            if n < k:
                raise ValueError(f"heads='qr' needs n_clients >= rank, got n_clients={n}, rank={k}")
            W = np.sqrt(k) * np.linalg.qr(G)[0]
    else:
        W = as_float_array(heads, "heads", shape=(n, k))

    problem = MultitaskProblem(B_star=B, heads=W, noise=noise)
    if samples_per_client is not None:
        X, y = problem.sample(samples_per_client, rng)
        problem = MultitaskProblem(B_star=B, heads=W, noise=noise, X=X, y=y)
    return problem
