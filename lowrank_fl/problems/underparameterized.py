"""Under-parameterized federated linear regression (FLUTE, Liu, Shen & Yang, ICML 2024).

Client ``i`` of ``M`` observes

    x ~ N(0, I_d),   y = phi_i^T x + noise * N(0, 1),

with ``Phi = [phi_1 ... phi_M]`` a (d, M) matrix (the paper's orientation: one *column* per
client, Sec. 3) of rank ``r``. The model ``x^T B w_i`` has a shared (d, k) representation and
(k,) heads, so with ``k < r`` no ``(B, W)`` fits ``Phi`` exactly (Definition 3.1, the
under-parameterized regime). The target is the Eckart–Young truncation ``Phi_k = U_k Lambda_k
V_k^T`` (eq. (3), Sec. 4.1) and the optimal representation is ``span(U_k)``.

Construction (App. C.1): ``Phi = U diag(lambda) V`` with ``U`` (d, r) Haar orthonormal columns
and ``V`` (r, M) Haar orthonormal rows. The paper prints ``Phi = U Lambda V^T`` with a V that is
already (d_, M) — a dimension mismatch; ``U Lambda V`` is what is meant. The default
spectrum is App. C's ``lambda_i = 2 d_ / (i + 1)``, ``i = 1..d_``, with ``d_ = min(d, M)``.

``noise`` is a *standard deviation* (the theory's sigma_xi). App. C's ``N(0, 0.3)`` reads as a
variance (the paper's Gaussian notation is N(mean, variance) elsewhere): pass ``noise=sqrt(0.3)``
to reproduce it.

A problem can also be built from a user's own data, :meth:`UnderparameterizedProblem.from_data`
(``X`` (M, N, d), ``y`` (M, N), ``rank``): it has no ``Phi``, so the metrics that need it (distance
to ``span(U_k)``, population loss, errors to ``Phi``/``Phi_k``) are absent.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..linalg import subspace_distance
from ..validation import as_float_array, as_generator, check_int, check_positive
from .dataset import ClientDataset, Samples, check_orthonormal, renamed_size
from .multitask import haar_orthonormal

__all__ = ["UnderparameterizedProblem", "underparameterized", "appendix_c_spectrum"]

_GAP_RTOL = 1e-12


def appendix_c_spectrum(d: int, n_clients: int) -> np.ndarray:
    """FLUTE App. C.1 singular values ``lambda_i = 2 min(d, M) / (i + 1)``, ``i = 1..min(d, M)``.

    Returns
    -------
    ndarray, shape (min(d, M),), decreasing.
    """
    d = check_int(d, "d", minimum=2)
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    dmin = min(d, n_clients)
    return 2.0 * dmin / (np.arange(1, dmin + 1) + 1.0)


@dataclass(frozen=True)
class UnderparameterizedProblem(ClientDataset):
    """A FLUTE linear instance with its ground truth and (optionally) a fixed dataset, or a
    problem built from data alone (:meth:`from_data`; ``U``, ``spectrum``, ``V`` are then None).

    Attributes
    ----------
    U : ndarray, shape (d, r), or None
        Left singular vectors of ``Phi`` (orthonormal columns).
    spectrum : ndarray, shape (r,), or None
        Singular values ``lambda_1 >= ... >= lambda_r > 0``.
    V : ndarray, shape (r, M), or None
        Right singular vectors, as rows (orthonormal rows).
    k : int
        Representation dimension, the paper's k (``1 <= k < d``, ``k <= M``); also :attr:`rank`.
    noise : float
        Label-noise standard deviation sigma.
    X : ndarray, shape (M, N, d) or None
        Fixed per-client dataset (``None``: population regime).
    y : ndarray, shape (M, N) or None
    """

    U: np.ndarray | None
    spectrum: np.ndarray | None
    V: np.ndarray | None
    k: int
    noise: float = 0.0
    X: np.ndarray | None = None
    y: np.ndarray | None = None

    def __post_init__(self):
        noise = check_positive(self.noise, "noise", strict=False)
        object.__setattr__(self, "noise", noise)
        if self.U is None and self.spectrum is None and self.V is None:
            if self.X is None:
                raise ValueError("an UnderparameterizedProblem needs a ground truth (U, spectrum, "
                                 "V) or a dataset (X, y); got neither")
            X = as_float_array(self.X, "X", ndim=3)
            M, _, d = X.shape
            k = check_int(self.k, "rank", minimum=1)
            if k >= d or k > M:
                raise ValueError(f"rank must be < d = {d} and <= n_clients = {M}, got {k}")
            object.__setattr__(self, "k", k)
            self._validate_dataset(M, d)
            return
        if self.U is None or self.spectrum is None or self.V is None:
            raise ValueError("U, spectrum and V must be given together (the ground truth) or all "
                             "be None (a problem from data)")
        U = as_float_array(self.U, "U", ndim=2)
        s = as_float_array(self.spectrum, "spectrum", ndim=1)
        V = as_float_array(self.V, "V", shape=(s.shape[0], None))
        if U.shape[1] != s.shape[0]:
            raise ValueError(f"U must have one column per singular value, got shape {U.shape} "
                             f"for {s.shape[0]} singular values")
        d, M = U.shape[0], V.shape[1]
        if s.shape[0] > min(d, M):
            raise ValueError(f"spectrum must have at most min(d, M) = {min(d, M)} entries, "
                             f"got {s.shape[0]}")
        if np.any(s <= 0) or np.any(np.diff(s) > 0):
            raise ValueError(f"spectrum must be positive and non-increasing, got {s}")
        k = check_int(self.k, "k", minimum=1)
        if k >= d:
            raise ValueError(f"k must be < d = {d} (a proper low-dimensional representation), got {k}")
        if k > M:
            raise ValueError(f"k must be <= n_clients = {M}, got {k}")
        if s.shape[0] < k:
            raise ValueError(f"spectrum must have at least k = {k} entries (rank(Phi) >= k, so "
                             f"that span(U_k) is defined), got {s.shape[0]}")
        lam_next = s[k] if k < s.shape[0] else 0.0
        if s[k - 1] - lam_next <= _GAP_RTOL * s[0]:
            raise ValueError(f"the spectrum must have a gap at k = {k} (lambda_k > lambda_(k+1), "
                             f"Delta > 0), got lambda_k = {s[k - 1]} and lambda_(k+1) = {lam_next}; "
                             f"Phi_k and span(U_k) are not unique otherwise")
        check_orthonormal(U, "U")
        check_orthonormal(V, "V", axis="rows")
        object.__setattr__(self, "U", U)
        object.__setattr__(self, "spectrum", s)
        object.__setattr__(self, "V", V)
        object.__setattr__(self, "k", k)
        self._validate_dataset(M, d)

    @classmethod
    def from_data(cls, X, y, *, rank: int) -> "UnderparameterizedProblem":
        """A problem from a user's own data, without ground truth.

        Parameters
        ----------
        X : array_like, shape (n_clients, N, d)
        y : array_like, shape (n_clients, N)
        rank : int
            The representation dimension to fit (the paper's k).
        """
        return cls(U=None, spectrum=None, V=None, k=rank, X=X, y=y)

    @property
    def has_truth(self) -> bool:
        """Whether ``Phi`` (and so a population) is known."""
        return self.U is not None

    def _require_truth(self, what: str) -> None:
        if self.U is None:
            raise ValueError(f"{what} needs the ground truth Phi; this problem was built from data "
                             f"(UnderparameterizedProblem.from_data) and has none")

    # ------------------------------------------------------------------ shapes
    @property
    def d(self) -> int:
        return self.U.shape[0] if self.U is not None else self.X.shape[2]

    @property
    def n_clients(self) -> int:
        return self.V.shape[1] if self.V is not None else self.X.shape[0]

    @property
    def rank(self) -> int:
        """The representation dimension, the paper's k (the package-wide meaning of ``rank``)."""
        return self.k

    @property
    def phi_rank(self) -> int:
        """``r = rank(Phi)``; under-parameterized iff ``k < r``."""
        self._require_truth("phi_rank")
        return self.spectrum.shape[0]

    @property
    def underparameterized(self) -> bool:
        return self.k < self.phi_rank

    # ------------------------------------------------------------------ ground truth
    @property
    def Phi(self) -> np.ndarray:
        """Ground truth ``Phi = U diag(lambda) V``, shape (d, M); column i is client i's model."""
        self._require_truth("Phi")
        return (self.U * self.spectrum) @ self.V

    @property
    def U_k(self) -> np.ndarray:
        """Optimal representation basis (top-k left singular vectors), shape (d, k)."""
        self._require_truth("U_k")
        return self.U[:, :self.k]

    @property
    def target(self) -> np.ndarray:
        """``Phi_k = U_k Lambda_k V_k^T`` (Eckart–Young, eq. (3)), shape (d, M)."""
        self._require_truth("target")
        k = self.k
        return (self.U[:, :k] * self.spectrum[:k]) @ self.V[:k]

    @property
    def theta(self) -> np.ndarray:
        """Client regression vectors, one row per client: ``Phi^T``, shape (M, d) (the
        multi-task layout, so methods written for :class:`MultitaskProblem` run here too)."""
        return self.Phi.T

    @property
    def truth_basis(self) -> np.ndarray | None:
        """The representation distances are measured to: ``U_k`` (``None`` without truth)."""
        return self.U_k if self.U is not None else None

    @property
    def gap(self) -> float:
        """``Delta = 2 (lambda_k - lambda_(k+1))`` (Sec. 5; ``lambda_(r+1) = 0``)."""
        s = self.spectrum
        nxt = s[self.k] if self.k < s.shape[0] else 0.0
        return 2.0 * float(s[self.k - 1] - nxt)

    @property
    def energy(self) -> float:
        """``E = ||Phi||_F^2 = sum_i lambda_i^2`` (Sec. 5)."""
        return float(np.sum(self.spectrum ** 2))

    @property
    def floor(self) -> float:
        """Misspecification error ``||Phi - Phi_k||_F^2 = sum_(j > k) lambda_j^2``."""
        return float(np.sum(self.spectrum[self.k:] ** 2))

    # ------------------------------------------------------------------ loss
    def population_loss(self, B, heads, *, excess: bool = False) -> float:
        """Population mean squared prediction error of the model ``x^T B w_i`` (FLUTE's metric):

        ``(1/M) sum_i E (y_i - x^T B w_i)^2 = (1/M) ||B W^T - Phi||_F^2 + noise^2`` for
        ``x ~ N(0, I_d)`` (no factor 1/2, unlike :meth:`MultitaskProblem.population_loss`: this is
        the convention of FLUTE's figures). ``excess=True`` drops ``noise^2``. Every method's
        ``Trace.loss`` on this problem is this value at its ``(B, heads)``.

        Parameters
        ----------
        B : array_like, shape (d, k')
        heads : array_like, shape (M, k')
            Row ``i`` is client ``i``'s head ``w_i`` (the transpose of FLUTE's ``W``).
        """
        self._require_truth("population_loss")
        B = as_float_array(B, "B", shape=(self.d, None))
        W = as_float_array(heads, "heads", shape=(self.n_clients, B.shape[1]))
        val = float(np.sum((B @ W.T - self.Phi) ** 2)) / self.n_clients
        return val if excess else val + self.noise ** 2

    def empirical_loss(self, B, heads) -> float:
        """Mean squared prediction error on the fixed dataset (the empirical counterpart of
        :meth:`population_loss`, same convention): ``(1/(M N)) sum_{i,j} (y_ij - x_ij^T B w_i)^2``."""
        X, y = self.require_dataset("empirical_loss")
        B = as_float_array(B, "B", shape=(self.d, None))
        W = as_float_array(heads, "heads", shape=(self.n_clients, B.shape[1]))
        resid = y - np.einsum("mnd,md->mn", X, W @ B.T)
        return float(np.mean(resid * resid))

    # ------------------------------------------------------------------ evaluation hook
    def fitted_heads(self, B, *, data: str) -> np.ndarray:
        """Least-squares heads (M, k') for ``B``: on the fixed dataset (``data="fixed"``) or the
        population heads ``argmin_w ||B w - phi_i||`` otherwise."""
        from ..exact.multitask import least_squares_heads      # exact sits above problems
        if data == "fixed":
            X, y = self.require_dataset("fitted_heads(data='fixed')")
            return least_squares_heads(X @ B, y)
        return np.linalg.lstsq(B, self.Phi, rcond=None)[0].T

    def evaluate(self, B, heads) -> dict:
        """The metrics every method records for ``(B, heads)`` (heads (M, k'), rows ``w_i``).

        With the truth: ``loss`` = :meth:`population_loss`, ``distance`` = principal-angle
        distance of ``col(B)`` to ``span(U_k)`` (1 if ``B`` lost rank), ``error_target`` =
        ``(1/M) sum_i ||B w_i - Phi_k e_i||`` (the metric of eqs. (7)-(8)) and ``error_truth`` =
        ``(1/M) sum_i ||B w_i - phi_i||`` (App. C's metric). From data: ``loss`` =
        :meth:`empirical_loss` and ``distance=None``.
        """
        if self.U is None:
            return {"loss": self.empirical_loss(B, heads), "distance": None}
        B = np.asarray(B, dtype=np.float64)
        Z = B @ np.asarray(heads, dtype=np.float64).T
        return {"loss": self.population_loss(B, heads),
                "distance": subspace_distance(self.U_k, B, rank_deficient="span"),
                "error_target": float(np.mean(np.linalg.norm(Z - self.target, axis=0))),
                "error_truth": float(np.mean(np.linalg.norm(Z - self.Phi, axis=0)))}

    # ------------------------------------------------------------------ data
    def sample(self, m: int, seed=None, *, clients=None) -> Samples:
        """Draw ``m`` fresh samples per client.

        Parameters
        ----------
        m : int
        seed : int or Generator
        clients : array_like of int, shape (c,), optional
            Which clients to sample for (default: all ``M``).

        Returns
        -------
        Samples
            ``X`` (c, m, d), features i.i.d. N(0, I_d); ``y`` (c, m),
            ``y_ij = phi_i^T x_ij + noise * xi_ij``.
        """
        self._require_truth("sample")
        m = check_int(m, "m", minimum=1)
        rng = as_generator(seed)
        Phi = self.Phi if clients is None else self.Phi[:, self.client_index(clients)]
        X = rng.standard_normal((Phi.shape[1], m, self.d))
        y = np.einsum("imd,di->im", X, Phi)
        if self.noise > 0:
            y = y + self.noise * rng.standard_normal(y.shape)
        return Samples(X, y)


def underparameterized(*, d: int | None = None, n_clients: int | None = None,
                       rank: int | None = None, spectrum=None,
                       samples_per_client: int | None = None, noise: float = 0.0,
                       seed=None, k: int | None = None) -> UnderparameterizedProblem:
    """Build a FLUTE linear instance ``Phi = U diag(spectrum) V`` (App. C.1).

    Parameters
    ----------
    d : int
        Feature dimension (>= 2).
    n_clients : int
        Number of clients M.
    rank : int
        Representation dimension, the paper's k: ``1 <= rank < d`` and ``rank <= M`` (``k`` is a
        deprecated alias).
    spectrum : array_like, shape (r,), optional
        Singular values, positive and non-increasing, ``r <= min(d, M)``. Default: App. C's
        ``2 min(d, M) / (i + 1)``. Pass ``r = rank`` values for the over-parameterized case
        (Remark 5.3); ``r < rank`` is rejected because ``span(U_k)`` is then undefined.
    samples_per_client : int, optional
        ``N``: draw a fixed dataset ``X`` (M, N, d), ``y`` (M, N). ``None``: population only.
    noise : float
        Label-noise standard deviation (App. C uses variance 0.3, i.e. ``noise = sqrt(0.3)``).
    seed : int or Generator
        Randomness of ``U``, ``V`` and the dataset.

    Sizes are keywords only.

    Returns
    -------
    UnderparameterizedProblem
    """
    k = renamed_size("underparameterized", rank, k, "rank", "k")
    if d is None or n_clients is None:
        raise TypeError("underparameterized() needs the keyword sizes d, n_clients and rank")
    # only what the drawing needs is checked here (the sizes of U and V); k, the spectrum's order
    # and gap and the noise are validated once, by UnderparameterizedProblem
    d = check_int(d, "d", minimum=2)
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    k = check_int(k, "rank", minimum=1)
    if k >= d:
        raise ValueError(f"rank must be < d = {d} (a proper low-dimensional representation), got {k}")
    if k > n_clients:
        raise ValueError(f"rank must be <= n_clients = {n_clients}, got {k}")
    if samples_per_client is not None:
        samples_per_client = check_int(samples_per_client, "samples_per_client", minimum=1)
    if spectrum is None:
        s = appendix_c_spectrum(d, n_clients)
    else:
        s = as_float_array(spectrum, "spectrum", ndim=1)
        if s.shape[0] == 0:
            raise ValueError("spectrum must contain at least one singular value")
    rng = as_generator(seed)
    r = s.shape[0]
    if r > min(d, n_clients):
        raise ValueError(f"spectrum must have at most min(d, n_clients) = {min(d, n_clients)} "
                         f"entries, got {r}")
    U = haar_orthonormal(d=d, rank=r, seed=rng)
    V = haar_orthonormal(d=n_clients, rank=r, seed=rng).T
    prob = UnderparameterizedProblem(U=U, spectrum=s, V=V, k=k, noise=noise)
    if samples_per_client is not None:
        X, y = prob.sample(samples_per_client, rng)
        prob = UnderparameterizedProblem(U=U, spectrum=s, V=V, k=k, noise=noise, X=X, y=y)
    return prob
