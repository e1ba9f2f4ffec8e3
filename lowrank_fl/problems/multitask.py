"""Multi-task linear regression with a shared k-dimensional representation.

The model of FedRep (Collins et al., ICML 2021, Sec. 4, eqs. (5)-(6)), also used by FLUTE and
FedAvg-FT: client ``i`` observes

    x ~ N(0, I_d),   y = <B* w_i*, x> + noise * N(0, 1),

with ``B*`` a (d, k) matrix with orthonormal columns (Assumption 3) and ``w_i*`` the client's head.
``theta_i* = B* w_i*`` is the client's regression vector; stacked, ``Theta* = W* B*^T`` (n, d) has
rank k. ``noise`` is a *standard deviation* (the paper's N(., 1e-3) is ambiguous, see the FedRep
note, errata 5).

Heads (the scale matters: it sets sigma_min/max in Theorem 1, see note errata 6):

* ``"normalized"`` (default, Assumption 3): rows ``sqrt(k) g_i / ||g_i||`` with ``g_i ~ N(0, I_k)``,
  so ``||w_i*|| = sqrt(k)`` exactly.
* ``"gaussian"``: rows ``N(0, I_k)`` (the notebook's new-client heads, Fig. 4).
* ``"qr"``: ``sqrt(k) Q`` with ``Q`` the (n, k) QR factor of a Gaussian matrix — the paper's
  App. A.1 text read literally (rows then have norm about ``k / sqrt(n)``, which is *not*
  Assumption 3).
* an array of shape (n, k).

A user-given ``B_star`` must already have orthonormal columns (``|B^T B - I| <= 1e-8``): it is
*rejected* otherwise rather than silently orthonormalized, because orthonormalizing changes
``Theta* = W* B*^T`` and so the data the caller asked for. Use :func:`lowrank_fl.linalg.orth`
explicitly if a basis of the column space is what is meant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import as_float_array, as_generator, check_choice, check_int, check_positive
from .dataset import ClientDataset, check_orthonormal

__all__ = ["MultitaskProblem", "multitask_linear", "haar_orthonormal", "HEADS"]

HEADS = ("normalized", "gaussian", "qr")


def haar_orthonormal(d: int, k: int, seed=None) -> np.ndarray:
    """A Haar-distributed (d, k) matrix with orthonormal columns.

    QR of a Gaussian matrix with the signs of ``diag(R)`` moved into ``Q`` (without the sign fix
    the distribution of ``Q`` is not Haar).
    """
    d = check_int(d, "d", minimum=1)
    k = check_int(k, "k", minimum=1, maximum=d)
    rng = as_generator(seed)
    Q, R = np.linalg.qr(rng.standard_normal((d, k)))
    return Q * np.where(np.diagonal(R) < 0, -1.0, 1.0)


@dataclass(frozen=True)
class MultitaskProblem(ClientDataset):
    """A multi-task linear regression instance with ground truth.

    Attributes
    ----------
    B_star : ndarray, shape (d, k)
        Shared representation, orthonormal columns.
    heads : ndarray, shape (n, k)
        Ground-truth heads ``W*`` (rows ``w_i*``).
    noise : float
        Standard deviation of the additive label noise (0 = noiseless, as in the theory).
    X : ndarray, shape (n, m, d) or None
        The fixed per-client dataset (``None`` for the population / fresh-sample regime).
    y : ndarray, shape (n, m) or None
        Labels of ``X``.
    """

    B_star: np.ndarray
    heads: np.ndarray
    noise: float = 0.0
    X: np.ndarray | None = None
    y: np.ndarray | None = None

    def __post_init__(self):
        B = as_float_array(self.B_star, "B_star", ndim=2)
        d, k = B.shape
        if k >= d:
            raise ValueError(f"k must be smaller than d (k < d): B_star must have k < d columns, "
                             f"got shape {B.shape}")
        check_orthonormal(B, "B_star")
        W = as_float_array(self.heads, "heads", shape=(None, k))
        noise = check_positive(self.noise, "noise", strict=False)
        object.__setattr__(self, "B_star", B)
        object.__setattr__(self, "heads", W)
        object.__setattr__(self, "noise", noise)
        self._validate_dataset(W.shape[0], d)

    # ------------------------------------------------------------------ shapes
    @property
    def d(self) -> int:
        return self.B_star.shape[0]

    @property
    def k(self) -> int:
        return self.B_star.shape[1]

    @property
    def n_clients(self) -> int:
        return self.heads.shape[0]

    @property
    def theta(self) -> np.ndarray:
        """Client regression vectors ``Theta* = W* B*^T``, shape (n, d)."""
        return self.heads @ self.B_star.T

    # ------------------------------------------------------------------ data
    def sample(self, m: int, seed=None, *, clients=None):
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
        X : ndarray, shape (c, m, d)
        y : ndarray, shape (c, m)
        """
        m = check_int(m, "m", minimum=1)
        rng = as_generator(seed)
        theta = self.theta if clients is None else self.theta[self.client_index(clients)]
        X = rng.standard_normal((theta.shape[0], m, self.d))
        y = np.einsum("cmd,cd->cm", X, theta)
        if self.noise > 0:
            y = y + self.noise * rng.standard_normal(y.shape)
        return X, y

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


def multitask_linear(d: int, k: int, n_clients: int, *, samples_per_client: int | None = None,
                     noise: float = 0.0, heads="normalized", B_star=None, seed=None
                     ) -> MultitaskProblem:
    """Draw a multi-task linear regression instance (FedRep Sec. 4 / App. A.1).

    Parameters
    ----------
    d, k, n_clients : int
        Ambient dimension, representation dimension (``1 <= k < d``) and number of clients.
    samples_per_client : int or None
        ``m`` of a fixed dataset drawn once (the experiments' regime); ``None`` = population only
        (exact gradients, or fresh batches through :meth:`MultitaskProblem.sample`).
    noise : float
        Label-noise standard deviation (>= 0).
    heads : {"normalized", "gaussian", "qr"} or array_like of shape (n_clients, k)
        See the module docstring.
    B_star : array_like of shape (d, k), optional
        Must have orthonormal columns (rejected otherwise); default Haar-random.
    seed : int or Generator
        Draw order: ``B_star``, heads, dataset.

    Returns
    -------
    MultitaskProblem
    """
    # only what the drawing needs is checked here; the instance is validated by MultitaskProblem
    d = check_int(d, "d", minimum=2)
    k = check_int(k, "k", minimum=1)
    if k >= d:      # before drawing: haar_orthonormal would reject k > d with a vaguer message
        raise ValueError(f"k must be smaller than d (k < d), got k={k}, d={d}")
    n = check_int(n_clients, "n_clients", minimum=1)
    if samples_per_client is not None:
        samples_per_client = check_int(samples_per_client, "samples_per_client", minimum=1)
    rng = as_generator(seed)

    B = haar_orthonormal(d, k, rng) if B_star is None else as_float_array(B_star, "B_star", shape=(d, k))

    if isinstance(heads, str):
        check_choice(heads, "heads", HEADS)
        G = rng.standard_normal((n, k))
        if heads == "normalized":
            W = np.sqrt(k) * G / np.linalg.norm(G, axis=1, keepdims=True)
        elif heads == "gaussian":
            W = G
        else:  # "qr"
            if n < k:
                raise ValueError(f"heads='qr' needs n_clients >= k, got n_clients={n}, k={k}")
            W = np.sqrt(k) * np.linalg.qr(G)[0]
    else:
        W = as_float_array(heads, "heads", shape=(n, k))

    problem = MultitaskProblem(B_star=B, heads=W, noise=noise)
    if samples_per_client is not None:
        X, y = problem.sample(samples_per_client, rng)
        problem = MultitaskProblem(B_star=B, heads=W, noise=noise, X=X, y=y)
    return problem
