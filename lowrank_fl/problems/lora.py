"""LoRA toy problems of RoLoRA (Chen et al., "Robust federated finetuning of LLMs via alternating
optimization of LoRA").

Rank-one toy (paper §5.1 eqs. (5)–(7), homogeneous; App. A.5 eqs. (245)–(246), heterogeneous).
Client ``i`` has the local model ``f_i(X) = X a b^T`` and data

    Y_i = X_i a* b_i*^T  (+ noise * E_i, an extension: the paper is noiseless),

with ``X_i`` an (m, d) matrix of i.i.d. N(0, 1) entries, ``a*`` a unit vector (the shared
*down-projection*) and ``b_i*`` the client's *up-projection*. The toy keeps the paper's names
``a``, ``b``. In PEFT's letters (``DeltaW = B A``, A r × in, B out × r, column-vector
convention ``h = W x``) with r = 1: ``a`` is the **A side** (``A = a^T``, 1 × in: it reads the
input) and ``b`` the **B side** (``B = b``, out × 1: it writes the output), so the update is
``DeltaW = b a^T`` (out × in); the paper writes its transpose ``a b^T`` because it multiplies
rows, ``x W`` (RoLoRA §3.1). Stacked arrays put the client axis first: ``b_star`` is (N, d),
``X`` is (N, m, d), ``Y`` is (N, m, d).

Heterogeneity (Def. A.13): ``gamma^2 = (1/N) sum_i ||b_i* - bbar*||^2``. The generator makes this
hold *exactly* (up to rounding) by centring and rescaling the client deviations, not in
expectation. ``gamma = 0`` is the homogeneous model of §5.1 (all ``b_i* = b*``).

Matrix (rank-r) problem for the general algorithms (paper §3–4, eqs. (1)–(4)), in PEFT's letters:
targets ``DeltaW_i = B_i* A*`` (out × in) with a shared down-projection ``A*`` (r, in) (orthonormal
rows) and client up-projections ``B_i*`` (out, r); the population loss is
``(1/N) sum_i ||DeltaW_i - B A||_F^2``. (The paper writes ``A B`` with A (d × r), B (r × d): the
transpose of the same objects, RoLoRA §3.1.)
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..validation import as_float_array, as_generator, check_int, check_positive, check_in_interval
from ..linalg import subspace_distance
from .multitask import haar_orthonormal

__all__ = ["RankOneLoRAProblem", "rank_one_lora", "LoRAMatrixProblem", "lora_matrix_problem",
           "init_at_angle", "random_unit", "angle_distance", "spread_exactly"]


def random_unit(d: int, seed=None) -> np.ndarray:
    """A vector drawn uniformly from the unit sphere S^{d-1}, shape (d,)."""
    d = check_int(d, "d", minimum=1)
    g = as_generator(seed).standard_normal(d)
    return g / np.linalg.norm(g)


def angle_distance(a, a_star) -> float:
    """Angle distance ``|sin theta(a, a*)| = ||(I - a a^T) a*||`` of Definition 5.2, eq. (8).

    The subspace distance between ``span(a)`` and ``span(a*)``
    (``lowrank_fl.linalg.subspace_distance(..., rank_deficient="span")``, the toolkit-wide rule for
    scoring iterates): any scaling of ``a`` is measured, from the residual (not from
    ``sqrt(1 - cos^2)``, which loses accuracy near 0). A zero ``a`` spans nothing, so ``a*`` is
    entirely outside its span: distance 1 (an iterate that collapsed is as far as possible, as
    for a rank-deficient B). Non-finite ``a`` gives ``nan``.

    Parameters
    ----------
    a, a_star : array_like, shape (d,)
        ``a_star`` non-zero (unit in the paper).

    Returns
    -------
    float in [0, 1] or nan
    """
    a = np.asarray(a, dtype=np.float64)
    a_star = np.asarray(a_star, dtype=np.float64)
    if a.ndim != 1 or a_star.ndim != 1 or a.shape != a_star.shape:
        raise ValueError(f"a and a_star must be vectors of the same length, got shapes {a.shape} and "
                         f"{a_star.shape}")
    return subspace_distance(a_star[:, None], a[:, None], rank_deficient="span")


def init_at_angle(a_star, delta0: float, seed=None) -> np.ndarray:
    """Unit ``a0 = sqrt(1 - delta0^2) a* + delta0 u`` with ``u`` a random unit vector ⊥ ``a*``.

    Then ``|sin theta(a0, a*)| = delta0`` exactly (the controlled initialisation of an angle-distance experiment).

    Parameters
    ----------
    a_star : array_like, shape (d,), unit, d >= 2
    delta0 : float in [0, 1]
    """
    a_star = as_float_array(a_star, "a_star", ndim=1)
    if a_star.size < 2:
        raise ValueError(f"a_star must have at least 2 entries to rotate away from, got {a_star.size}")
    delta0 = check_in_interval(delta0, "delta0", 0.0, 1.0)
    g = as_generator(seed).standard_normal(a_star.size)
    g -= a_star * (a_star @ g) / (a_star @ a_star)
    u = g / np.linalg.norm(g)
    a0 = np.sqrt(1.0 - delta0 ** 2) * a_star / np.linalg.norm(a_star) + delta0 * u
    return a0 / np.linalg.norm(a0)


def spread_exactly(center, Z, gamma: float) -> np.ndarray:
    """Rows ``center + gamma (Z_i - Zbar) / rms`` with ``(1/N) sum ||row_i - center||^2 = gamma^2``.

    Parameters
    ----------
    center : ndarray, shape (...)
    Z : ndarray, shape (N, ...)
        Raw deviations (N >= 2 when ``gamma > 0``).
    gamma : float >= 0

    Returns
    -------
    ndarray, shape (N, ...)
    """
    center = as_float_array(center, "center")
    Z = as_float_array(Z, "Z")
    if Z.shape[1:] != center.shape:
        raise ValueError(f"Z must have shape (N, *{center.shape}) to match center, got {Z.shape}")
    gamma = check_positive(gamma, "gamma", strict=False)
    if gamma == 0.0:
        return np.broadcast_to(center, Z.shape).copy()
    D = Z - Z.mean(axis=0)
    rms = np.sqrt(np.mean(np.sum(D.reshape(len(D), -1) ** 2, axis=1)))
    if not rms > 0:
        raise ValueError("Z must have at least two distinct rows when gamma > 0 (its deviations are "
                         f"rescaled to spread gamma={gamma}), got rows that are all equal")
    return center + gamma * D / rms


def _split(a_star, a):
    """``a* = alpha a + w`` with ``w ⊥ a``; returns ``(||a||^2, alpha, w)``.

    ``||a* c^T - a b^T||_F^2 = ||a||^2 ||alpha c - b||^2 + ||w||^2 ||c||^2`` (the two rank-one terms
    have orthogonal column spaces). Unlike the expanded inner-product form, this has no
    cancellation, so losses and model errors stay accurate down to machine precision.
    """
    aa = float(a @ a)
    alpha = float(a_star @ a) / aa if aa > 0 else 0.0
    return aa, alpha, a_star - alpha * a


#: Tolerance of the problems' consistency checks: unit a*, orthonormal A* and the declared gamma
#: against the spread of the up-projections. Generators meet them to ~1e-15; 1e-8 (relative)
#: accepts any hand-built instance that is right up to rounding and rejects real contradictions.
_TOL = 1e-8


def _spread(B) -> float:
    """``sqrt((1/N) sum_i ||B_i - Bbar||_F^2)`` for B (N, ...)."""
    D = B - B.mean(axis=0)
    return float(np.sqrt(np.mean(np.sum(D.reshape(len(D), -1) ** 2, axis=1))))


def _check_gamma(gamma, B, name) -> float:
    gamma = check_positive(gamma, "gamma", strict=False)
    spread = _spread(B)
    if abs(spread - gamma) > _TOL * max(1.0, gamma):
        raise ValueError(f"gamma must equal the spread sqrt((1/N) sum ||{name}_i - mean||^2) of {name} "
                         f"(Def. A.13), got gamma={gamma} but the spread is {spread:.12g}")
    return gamma


@dataclass(frozen=True)
class RankOneLoRAProblem:
    """A rank-one federated LoRA instance (RoLoRA §5.1 / App. A.5) with ground truth.

    Attributes
    ----------
    a_star : ndarray, shape (d,)
        Unit down-projection shared by all clients.
    b_star : ndarray, shape (N, d)
        Client up-projections ``b_i*`` (rows); all equal when ``gamma = 0``.
    gamma : float
        Heterogeneity, ``(1/N) sum ||b_i* - bbar*||^2 = gamma^2`` exactly (Def. A.13).
    noise : float
        Label-noise standard deviation (0 in the paper).
    X : ndarray, shape (N, m, d) or None
        Per-client design (``None``: population mode, loss = population loss).
    Y : ndarray, shape (N, m, d) or None
        ``Y_i = X_i a* b_i*^T + noise E_i``.
    """

    a_star: np.ndarray
    b_star: np.ndarray
    gamma: float
    noise: float = 0.0
    X: np.ndarray | None = None
    Y: np.ndarray | None = None

    def __post_init__(self):
        a_star = as_float_array(self.a_star, "a_star", ndim=1)
        if a_star.size < 2:
            raise ValueError(f"a_star must have at least 2 entries, got {a_star.size}")
        if abs(np.linalg.norm(a_star) - 1.0) > _TOL:
            raise ValueError(f"a_star must be a unit vector, got norm {np.linalg.norm(a_star):.12g}")
        d = a_star.size
        b_star = as_float_array(self.b_star, "b_star", shape=(None, d))
        gamma = _check_gamma(self.gamma, b_star, "b_star")
        noise = check_positive(self.noise, "noise", strict=False)
        if (self.X is None) != (self.Y is None):
            raise ValueError("X and Y must be given together (or neither, for the population problem)")
        X = Y = None
        if self.X is not None:
            X = as_float_array(self.X, "X", shape=(b_star.shape[0], None, d))
            Y = as_float_array(self.Y, "Y", shape=X.shape)
        for name, value in (("a_star", a_star), ("b_star", b_star), ("gamma", gamma), ("noise", noise),
                            ("X", X), ("Y", Y)):
            object.__setattr__(self, name, value)

    @property
    def d(self) -> int:
        return self.a_star.shape[0]

    @property
    def n_clients(self) -> int:
        return self.b_star.shape[0]

    @property
    def samples_per_client(self) -> int | None:
        return None if self.X is None else self.X.shape[1]

    @property
    def y(self) -> np.ndarray | None:
        """Alias of ``Y`` (the outputs are d-dimensional rows, stacked (N, m, d))."""
        return self.Y

    @property
    def population(self) -> bool:
        """True when there is no sampled data (the analysis of App. A.5)."""
        return self.X is None

    @property
    def b_bar(self) -> np.ndarray:
        """``bbar* = (1/N) sum_i b_i*``, shape (d,)."""
        return self.b_star.mean(axis=0)

    @property
    def L_max(self) -> float:
        """The tightest admissible ``L_max = ||bbar*||`` (Assumption 5.1 / A.12)."""
        return float(np.linalg.norm(self.b_bar))

    def sample(self, m: int, seed=None) -> "RankOneLoRAProblem":
        """The same ground truth with fresh data: ``m`` samples per client.

        Returns a new problem with ``X`` (N, m, d) i.i.d. N(0, 1) and ``Y`` (N, m, d).
        """
        m = check_int(m, "m", minimum=1)
        rng = as_generator(seed)
        X = rng.standard_normal((self.n_clients, m, self.d))
        Xa = X @ self.a_star                                  # (N, m)
        Y = Xa[:, :, None] * self.b_star[:, None, :]          # X_i a* b_i*^T
        if self.noise > 0:
            Y = Y + self.noise * rng.standard_normal(Y.shape)
        return replace(self, X=X, Y=Y)

    def population_loss(self, a, b) -> float:
        """Global population loss ``(1/N) sum_i ||a* b_i*^T - a b^T||_F^2`` (eq. (246)).

        Equals ``E_X[(1/m)||X(a* b_i*^T - a b^T)||^2]`` averaged over clients, plus ``d noise^2``
        with label noise. Computed without forming d×d matrices and without cancellation
        (see :func:`_split`), so it is accurate near the optimum.

        Parameters
        ----------
        a, b : array_like, shape (d,)
        """
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        aa, alpha, w = _split(self.a_star, a)
        D = alpha * self.b_star - b                                    # (N, d)
        per_client = aa * np.einsum("nd,nd->n", D, D) + (w @ w) * np.einsum("nd,nd->n", self.b_star, self.b_star)
        return float(np.mean(per_client) + self.d * self.noise ** 2)

    def empirical_loss(self, a, b) -> float:
        """Global training loss ``(1/(Nm)) sum_i ||Y_i - X_i a b^T||_F^2`` (eq. (7)).

        Raises ``ValueError`` in population mode (no data).
        """
        if self.X is None:
            raise ValueError("empirical_loss needs sampled data; call sample(m, seed) first")
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        R = self.Y - (self.X @ a)[:, :, None] * b[None, None, :]
        return float(np.sum(R * R) / (self.n_clients * self.X.shape[1]))

    def angle(self, a) -> float:
        """``|sin theta(a, a*)|`` (eq. (8))."""
        return angle_distance(a, self.a_star)

    def model_error(self, a, b) -> float:
        """Relative model error ``||a b^T - a* bbar*^T||_F / ||a* bbar*^T||_F`` (Thm 5.4 / A.14)."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        bs = self.b_bar
        aa, alpha, w = _split(self.a_star, a)
        D = alpha * bs - b
        return float(np.sqrt(aa * (D @ D) + (w @ w) * (bs @ bs)) / np.linalg.norm(bs))


def rank_one_lora(*, d: int, n_clients: int, gamma: float = 0.0, samples_per_client: int | None = None,
                  noise: float = 0.0, b_norm: float | None = None, seed=None) -> RankOneLoRAProblem:
    """Draw a rank-one federated LoRA instance (RoLoRA §5.1 eqs. (5)–(7); App. A.5 eqs. (245)–(246)).

    ``a*`` is uniform on S^{d-1}; ``bbar* ~ N(0, I_d)`` (rescaled to ``||bbar*|| = b_norm`` when
    given); ``b_i* = bbar* + gamma (z_i - zbar)/rms`` with ``z_i ~ N(0, I_d)``, so the
    heterogeneity ``(1/N) sum ||b_i* - bbar*||^2`` equals ``gamma^2`` exactly and the mean of the
    ``b_i*`` is exactly ``bbar*``.

    Parameters
    ----------
    d : int >= 2
        Ambient dimension (in = out = d).
    n_clients : int >= 1 (>= 2 when ``gamma > 0``)
        The paper's N.
    gamma : float >= 0
    samples_per_client : int or None
        ``m``; ``None`` gives the population problem (no data, App. A.5).
    noise : float >= 0
        Label-noise standard deviation ([NOT IN PAPER] extension; 0 = the paper).
    b_norm : float > 0 or None
    seed : int or Generator

    Returns
    -------
    RankOneLoRAProblem
    """
    d = check_int(d, "d", minimum=2)
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    gamma = check_positive(gamma, "gamma", strict=False)
    noise = check_positive(noise, "noise", strict=False)
    if gamma > 0 and n_clients < 2:
        raise ValueError(f"gamma > 0 needs n_clients >= 2 (heterogeneity across clients), got {n_clients}")
    if samples_per_client is not None:
        samples_per_client = check_int(samples_per_client, "samples_per_client", minimum=1)
    if b_norm is not None:
        b_norm = check_positive(b_norm, "b_norm")
    rng = as_generator(seed)
    a_star = random_unit(d, rng)
    b_bar = rng.standard_normal(d)
    if b_norm is not None:
        b_bar *= b_norm / np.linalg.norm(b_bar)
    b_star = spread_exactly(b_bar, rng.standard_normal((n_clients, d)), gamma)
    prob = RankOneLoRAProblem(a_star=a_star, b_star=b_star, gamma=gamma, noise=noise)
    return prob if samples_per_client is None else prob.sample(samples_per_client, rng)


@dataclass(frozen=True)
class LoRAMatrixProblem:
    """Rank-r federated LoRA targets in PEFT's letters: ``DeltaW_i = B_i* A*``.

    Attributes
    ----------
    A_star : ndarray, shape (r, d_in)
        Shared down-projection (PEFT ``lora_A``), orthonormal rows.
    B_star : ndarray, shape (N, d_out, r)
        Client up-projections (PEFT ``lora_B``).
    gamma : float
        ``(1/N) sum_i ||B_i* - Bbar*||_F^2 = gamma^2`` exactly; since ``A*`` has orthonormal rows
        this is also the spread of the targets ``DeltaW_i``.
    """

    A_star: np.ndarray
    B_star: np.ndarray
    gamma: float

    def __post_init__(self):
        A_star = as_float_array(self.A_star, "A_star", ndim=2)
        r, d_in = A_star.shape
        if r > d_in:
            raise ValueError(f"A_star must have at most as many rows (rank) as columns (d_in), got "
                             f"shape {A_star.shape}")
        dev = float(np.max(np.abs(A_star @ A_star.T - np.eye(r))))
        if dev > _TOL:
            raise ValueError(f"A_star must have orthonormal rows, got max |A A^T - I| = {dev:.3g}")
        B_star = as_float_array(self.B_star, "B_star", shape=(None, None, r))
        gamma = _check_gamma(self.gamma, B_star, "B_star")
        for name, value in (("A_star", A_star), ("B_star", B_star), ("gamma", gamma)):
            object.__setattr__(self, name, value)

    @property
    def d_in(self) -> int:
        return self.A_star.shape[1]

    @property
    def d_out(self) -> int:
        return self.B_star.shape[1]

    @property
    def d(self) -> int:
        """The input dimension ``d_in`` (the generator's ``d``)."""
        return self.d_in

    @property
    def rank(self) -> int:
        return self.A_star.shape[0]

    @property
    def n_clients(self) -> int:
        return self.B_star.shape[0]

    @property
    def targets(self) -> np.ndarray:
        """``DeltaW_i = B_i* A*``, shape (N, d_out, d_in)."""
        return self.B_star @ self.A_star

    @property
    def mean_target(self) -> np.ndarray:
        """``(1/N) sum_i DeltaW_i``, shape (d_out, d_in) — the exact aggregate of eq. (1)."""
        return self.B_star.mean(axis=0) @ self.A_star

    def loss(self, A, B) -> float:
        """Population loss ``(1/N) sum_i ||DeltaW_i - B A||_F^2``.

        Parameters
        ----------
        A : array_like, shape (r', d_in);  B : array_like, shape (d_out, r')
            Any inner rank r'. Non-finite entries give ``nan``/``inf`` (iterates are scored, not
            rejected: the caller's TraceRecorder reports the divergence).
        """
        A = np.asarray(A, dtype=np.float64)
        B = np.asarray(B, dtype=np.float64)
        if A.ndim != 2 or B.ndim != 2 or A.shape[1] != self.d_in or B.shape != (self.d_out, A.shape[0]):
            raise ValueError(f"A must have shape (r, {self.d_in}) and B shape ({self.d_out}, r), got "
                             f"{A.shape} and {B.shape}")
        R = self.targets - B @ A
        return float(np.sum(R * R) / self.n_clients)


def lora_matrix_problem(*, d: int, n_clients: int, rank: int, d_out: int | None = None,
                        gamma: float = 1.0, b_scale: float = 1.0, seed=None) -> LoRAMatrixProblem:
    """Draw rank-r LoRA targets ``DeltaW_i = B_i* A*`` (PEFT letters; RoLoRA §3–4).

    ``A*`` (r, d) has Haar-orthonormal rows; ``Bbar*`` (d_out, r) has i.i.d. N(0, b_scale^2)
    entries and ``B_i* = Bbar* + gamma (Z_i - Zbar)/rms`` so that the spread is exactly ``gamma^2``.

    Parameters
    ----------
    d : int >= 1
        Input dimension ``d_in``.
    n_clients : int >= 1 (>= 2 when ``gamma > 0``)
    rank : int in [1, d]
        The LoRA rank (the paper's r).
    d_out : int >= 1, optional
        Output dimension; default ``d`` (the paper's square ``W0``).
    gamma : float >= 0
    b_scale : float > 0
    seed : int or Generator
    """
    d = check_int(d, "d", minimum=1)
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    rank = check_int(rank, "rank", minimum=1, maximum=d)
    d_out = d if d_out is None else check_int(d_out, "d_out", minimum=1)
    gamma = check_positive(gamma, "gamma", strict=False)
    b_scale = check_positive(b_scale, "b_scale")
    if gamma > 0 and n_clients < 2:
        raise ValueError(f"gamma > 0 needs n_clients >= 2 (heterogeneity across clients), got {n_clients}")
    rng = as_generator(seed)
    # draws in the order (and shapes) of the paper's letters, then transposed: the instance for a
    # given seed is the transpose of the paper-letter one
    A_star = haar_orthonormal(d=d, rank=rank, seed=rng).T
    B_bar = b_scale * rng.standard_normal((rank, d_out)).T
    Z = np.swapaxes(rng.standard_normal((n_clients, rank, d_out)), 1, 2)
    B_star = spread_exactly(B_bar, Z, gamma)
    return LoRAMatrixProblem(A_star=A_star, B_star=B_star, gamma=gamma)
