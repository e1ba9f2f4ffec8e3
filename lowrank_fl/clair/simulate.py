"""Synthetic CLAIR instances with ground truth.

Two generators, both returning a frozen :class:`ClairInstance`:

* :func:`simulate` — the paper's §7 simulation (multi-response linear model, local OLS estimates,
  40% contaminated clients), reproducing Tables 1–2.
* :func:`generate` — a general generator for the model (3)–(4): orthonormal-row shared factor
  ``A``, benign misalignment ``delta``, per-client Gaussian estimation error of chosen size
  (``noise=0`` is the noiseless setting of Theorem 1) and a chosen number of contaminated clients.

Model (paper eq. (3)): ``W^(k) = W0 + B^(k) A^(k)`` (q x p), with ``A^(k) = A`` for benign clients
when ``delta = 0``. Contaminated clients replace the low-rank adaptation ``B^(k) A^(k)`` by an
unstructured perturbation. Pairs ``(j, k)``, ``j < k``, are in the lexicographic order of eq. (6)
(``np.triu_indices(K, 1)``); stacked contrast matrices are ``(G*q, p)``.
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, NamedTuple

import numpy as np

from ..validation import (as_float_array, as_generator, check_choice, check_in_interval,
                           check_int, check_positive)
from ..linalg import block_norms, orth, row_projector
from .contrasts import contaminated_pairs, pairs

__all__ = ["ClairInstance", "Canonical", "simulate", "generate", "ar1_covariance", "check_contaminated_count",
           "SEC7_VARIANTS"]

#: Readings of the §7 contamination entries: the text says ``Unif[-1, 1]``, the FedAvg column of
#: Table 1 implies unit variance.
SEC7_VARIANTS = ("unit-variance", "uniform")


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float64)
    a.setflags(write=False)
    return a


def _stack_pairs(M: np.ndarray, j: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``[M_j - M_k]`` over pairs, stacked as a (G*q, p) matrix (eq. (6) layout)."""
    G, q, p = len(j), M.shape[1], M.shape[2]
    return (M[j] - M[k]).reshape(G * q, p)


class Canonical(NamedTuple):
    """Canonical components (18) of an instance, each (G*q, p)."""

    L_A: np.ndarray
    S_A_perp: np.ndarray


@dataclass(frozen=True, eq=False)
class ClairInstance:
    """A CLAIR instance: local estimates plus the ground truth that produced them.

    Attributes
    ----------
    W_hat : ndarray, shape (K, q, p)
        Local (preliminary) estimates ``What^(k)`` — the only input CLAIR sees.
    W : ndarray, shape (K, q, p)
        True client parameters ``W^(k)``.
    W0 : ndarray, shape (q, p)
        Common base.
    A : ndarray, shape (r, p)
        Shared row factor. Orthonormal rows for :func:`generate`; entrywise ``Unif[-1, 1]`` (not
        orthonormal) for :func:`simulate` — use :attr:`projector`, never ``A.T @ A``.
    B : ndarray, shape (K, q, r)
        Left factors: benign clients have ``W^(k) = W0 + B^(k) A^(k)``. Rows of contaminated
        clients are zero (their adaptation is unstructured, see :attr:`Delta`).
    A_clients : ndarray, shape (K, r, p)
        Client row factors ``A^(k)`` (``= A`` when ``delta = 0``; contaminated clients: ``A``,
        unused).
    benign : ndarray of bool, shape (K,)
        True collaborative set ``C``.
    rank : int
        ``r``.
    design : str
        ``"sec7"`` (from :func:`simulate`) or ``"general"`` (from :func:`generate`).
    params : mapping
        Generator parameters and replicate-level draws (e.g. the §7 signal ``c``).
    """

    W_hat: np.ndarray
    W: np.ndarray
    W0: np.ndarray
    A: np.ndarray
    B: np.ndarray
    A_clients: np.ndarray
    benign: np.ndarray
    rank: int
    design: str = "general"
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("W_hat", "W", "W0", "A", "B", "A_clients"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))
        benign = np.array(self.benign, dtype=bool)
        benign.setflags(write=False)
        object.__setattr__(self, "benign", benign)
        self._check_shapes()

    def _check_shapes(self):
        if self.W_hat.ndim != 3:
            raise ValueError(f"W_hat must have shape (K, q, p), got {self.W_hat.shape}")
        K, q, p = self.W_hat.shape
        r = check_int(self.rank, "rank", minimum=1)
        want = {"W": (K, q, p), "W0": (q, p), "A": (r, p), "B": (K, q, r),
                "A_clients": (K, r, p), "benign": (K,)}
        for name, shape in want.items():
            got = getattr(self, name).shape
            if got != shape:
                raise ValueError(f"ClairInstance: {name} must have shape {shape} (from W_hat "
                                 f"{(K, q, p)} and rank={r}), got {got}")

    # -- sizes --------------------------------------------------------------------------------
    @property
    def K(self) -> int:
        return self.W_hat.shape[0]

    @property
    def q(self) -> int:
        return self.W_hat.shape[1]

    @property
    def p(self) -> int:
        return self.W_hat.shape[2]

    @property
    def G(self) -> int:
        """Number of pairs ``K(K-1)/2``."""
        return self.K * (self.K - 1) // 2

    @property
    def eta(self) -> float:
        """Collaborative proportion ``|C|/K``."""
        return float(self.benign.mean())

    @cached_property
    def pairs(self) -> np.ndarray:
        """(G, 2) int array of 0-based pairs ``(j, k)``, ``j < k``, lexicographic (eq. (6))."""
        return pairs(self.K)

    # -- truth ---------------------------------------------------------------------------------
    @cached_property
    def projector(self) -> np.ndarray:
        """True ``P_A = A^T (A A^T)^{-1} A`` (p, p), computed stably."""
        return _readonly(row_projector(self.A, name="A"))

    @cached_property
    def Delta(self) -> np.ndarray:
        """Client adaptations ``W^(k) - W0`` (K, q, p)."""
        return _readonly(self.W - self.W0)

    @cached_property
    def errors(self) -> np.ndarray:
        """Estimation errors ``Xi_k = What^(k) - W^(k)`` (K, q, p)."""
        return _readonly(self.W_hat - self.W)

    @cached_property
    def contaminated_pairs(self) -> np.ndarray:
        """The index set ``I`` as a (G,) bool mask: pairs with at least one contaminated client."""
        return contaminated_pairs(self.benign)

    @property
    def I(self) -> np.ndarray:  # noqa: E743 - the paper's name
        """Alias of :attr:`contaminated_pairs` (the paper's ``I``)."""
        return self.contaminated_pairs

    @property
    def s(self) -> int:
        """``s = |I|``."""
        return int(self.contaminated_pairs.sum())

    @cached_property
    def delta(self) -> float:
        """Realised benign misalignment ``max_{k in C} ||A^(k) - A||_F`` (eq. (4), before any
        extra rotation; an upper bound on the rotation-minimised value). ``A`` is taken with
        orthonormal rows when the design's ``A`` is not orthonormal (then ``delta = 0``)."""
        if not np.any(self.benign):
            return 0.0
        diff = self.A_clients[self.benign] - self.A
        return float(np.max(np.sqrt(np.einsum("kij,kij->k", diff, diff))))

    # -- contrasts and canonical components (§3.1, §3.2; stacked (G*q, p)) ----------------------
    @cached_property
    def D(self) -> np.ndarray:
        """Population contrasts ``D^(j,k) = W^(j) - W^(k)`` stacked (G*q, p), eq. (10)."""
        j, k = self.pairs.T
        return _readonly(_stack_pairs(self.W, j, k))

    @cached_property
    def D_hat(self) -> np.ndarray:
        """Observed contrasts ``What^(j) - What^(k)`` stacked (G*q, p), eqs. (5)–(6)."""
        j, k = self.pairs.T
        return _readonly(_stack_pairs(self.W_hat, j, k))

    @cached_property
    def L0(self) -> np.ndarray:
        """``L0^(j,k) = (B^(j) - B^(k)) A`` on benign pairs, 0 on ``I`` (eq. (11)), (G*q, p)."""
        j, k = self.pairs.T
        blocks = np.einsum("gqr,rp->gqp", self.B[j] - self.B[k], self.A)
        blocks[self.contaminated_pairs] = 0.0
        return _readonly(blocks.reshape(self.G * self.q, self.p))

    @cached_property
    def S0(self) -> np.ndarray:
        """``S0^(j,k) = B^(j)A^(j) - B^(k)A^(k)`` (= ``Delta_j - Delta_k``) on ``I``, 0 on benign
        pairs (eq. (11)), (G*q, p)."""
        j, k = self.pairs.T
        blocks = self.Delta[j] - self.Delta[k]
        blocks[~self.contaminated_pairs] = 0.0
        return _readonly(blocks.reshape(self.G * self.q, self.p))

    @cached_property
    def D0(self) -> np.ndarray:
        """Noiseless contrasts ``D0 = L0 + S0`` (eq. (15); equals :attr:`D` when ``delta = 0``)."""
        return _readonly(self.L0 + self.S0)

    @cached_property
    def E0(self) -> np.ndarray:
        """Misalignment error (11): ``E0^(j,k) = B^(j)(A^(j) - A) - B^(k)(A^(k) - A)`` on benign
        pairs, 0 on ``I``; ``D = L0 + S0 + E0``. (G*q, p)."""
        j, k = self.pairs.T
        BdA = self.B @ (self.A_clients - self.A)                  # (K, q, p)
        blocks = BdA[j] - BdA[k]
        blocks[self.contaminated_pairs] = 0.0
        return _readonly(blocks.reshape(self.G * self.q, self.p))

    def canonical(self) -> "Canonical":
        """Canonical components (18): ``L_A = D0 P_A`` and ``S_{A_perp} = D0 (I - P_A)``, each
        (G*q, p). Invariant under shifts between ``L0`` and ``S0``."""
        LA = self.D0 @ self.projector
        return Canonical(LA, self.D0 - LA)

    @cached_property
    def beta_min(self) -> float:
        """Mixed-pair signal ``min_{j in C, k in C^c} ||S_{A_perp}^{(j,k)}||_F`` (§5.4);
        ``inf`` if there is no mixed pair."""
        _, S_perp = self.canonical()
        norms = block_norms(S_perp.reshape(self.G, self.q, self.p))
        j, k = self.pairs.T
        mixed = self.benign[j] != self.benign[k]
        return float(norms[mixed].min()) if np.any(mixed) else float("inf")


# ----------------------------------------------------------------------------------------------
def _take_alias(new_value, old_value, new: str, old: str, func: str):
    """Resolve a deprecated size alias (``K``, ``n``, ``r``): warn and use it."""
    if old_value is None:
        return new_value
    warnings.warn(f"{func}({old}=...) is deprecated; use {new}=...", DeprecationWarning,
                  stacklevel=3)
    if new_value is not None:
        raise TypeError(f"{func}: pass {new} only ({old} is its deprecated alias), not both")
    return old_value


def _require(value, name: str, func: str):
    if value is None:
        raise TypeError(f"{func}() missing required keyword argument: {name!r}")
    return value


def check_contaminated_count(contaminated, n_clients: int) -> int:
    """``contaminated`` is a COUNT of clients, ``0 <= contaminated <= n_clients - 2``.

    A non-integer (e.g. the fraction 0.4) is refused with the count it probably meant: a fraction
    read as a count would build a different instance without complaint.
    """
    if isinstance(contaminated, numbers.Real) and not isinstance(contaminated, numbers.Integral) \
            and not isinstance(contaminated, bool):
        if float(contaminated).is_integer():
            contaminated = int(contaminated)
        else:
            raise TypeError(
                f"contaminated is a count of clients, got {contaminated!r}; for a fraction f "
                f"pass round(f * n_clients) (here {round(float(contaminated) * n_clients)})")
    contaminated = check_int(contaminated, "contaminated", minimum=0)
    if contaminated > n_clients - 2:
        raise ValueError(f"contaminated must be <= n_clients - 2 = {n_clients - 2} (CLAIR needs "
                         f"two benign clients), got {contaminated}")
    return contaminated


def _check_dims(p, q, r):
    p = check_int(p, "p", minimum=2)
    q = check_int(q, "q", minimum=2)
    r = check_int(r, "rank", minimum=1)
    if r >= min(p, q):
        raise ValueError(f"rank must satisfy 1 <= rank < min(p, q) = {min(p, q)}, got {r}")
    return p, q, r


def _pick_contaminated(rng, K: int, m: int) -> np.ndarray:
    benign = np.ones(K, dtype=bool)
    benign[rng.choice(K, size=m, replace=False)] = False
    return benign


def ar1_covariance(q: int, rho: float) -> np.ndarray:
    """AR(1) covariance ``Sigma_ij = rho^|i-j|`` (unit diagonal), shape (q, q)."""
    idx = np.arange(q)
    return rho ** np.abs(idx[:, None] - idx[None, :])


def simulate(*, n_clients: int | None = None, samples_per_client: int | None = None,
             rank: int | None = None, p: int, q: int, contaminated: int | None = None,
             variant: str = "unit-variance", c: float | None = None, benign_scale: float = 0.8,
             contamination_factor: float = 1.0, correlation: float = 0.25, seed=None,
             K: int | None = None, n: int | None = None, r: int | None = None) -> ClairInstance:
    """The §7 simulation of the paper (multi-response linear model, local OLS).

    * ``X^(k)`` (p, n) iid N(0, 1); ``W0`` (q, p) and ``A`` (r, p) entrywise ``Unif[-1, 1]``
      (``A`` is *not* orthonormal: the instance's :attr:`~ClairInstance.projector` is
      ``A^T (A A^T)^{-1} A``).
    * Benign clients: ``W^(k) = W0 + 0.8 B^(k) A`` with ``B^(k)`` (q, r) entrywise
      ``Unif[-1, 1]``; the stored factor is ``B = 0.8 B^(k)`` so that ``W = W0 + B A``.
    * ``contaminated`` clients (chosen at random; default 40 %) are contaminated:
      ``W^(k) = W0 + contamination_factor * c / sqrt(q (p - r)) * Z^(k)``, with one replicate-level
      ``c`` drawn uniformly from {3, 4, 5, 6} and ``Z^(k)`` entries per ``variant``:

      - ``"unit-variance"`` (default): ``Unif[-sqrt 3, sqrt 3]`` (mean 0, variance 1) — the
        reading the paper's FedAvg column of Table 1 implies;
      - ``"uniform"``: ``Unif[-1, 1]`` (variance 1/3), the paper's text.

      The 0.8 factor of the benign adaptation is **not** applied to the perturbation by default
      (``contamination_factor=1``; Table 1's FedAvg column fits without it); pass
      ``contamination_factor=0.8`` for the other reading.
    * ``Y^(k) = W^(k) X^(k) + E^(k)``, the columns of ``E^(k)`` iid ``N(0, Sigma)`` with AR(1)
      ``Sigma_ij = 0.25^|i-j|`` (unit diagonal, ``tr Sigma = q``).
    * Local OLS: ``What^(k) = Y^(k) X^(k)T (X^(k) X^(k)T)^{-1}``, batched over clients. Its expected
      squared error is ``q p / (n - p - 1)`` (``params["expected_local_error"]``).

    Parameters
    ----------
    n_clients : int
        The paper's ``K``, >= 2.
    samples_per_client : int
        The paper's ``n``; must exceed ``p + 1`` (OLS and a finite expected error).
    rank : int
        The paper's ``r``, ``1 <= rank < min(p, q)``; default 2 (§7).
    p, q : int
        Input and output dimensions (``W`` is q x p).
    contaminated : int or None
        Number of contaminated clients, ``0 <= contaminated <= n_clients - 2``; None gives the
        paper's 40 %: ``round(0.4 * n_clients)``. A fraction is refused (it is a count).
    variant : {"unit-variance", "uniform"}
    seed : int or Generator
    c : float, optional
        Fix the contamination signal instead of drawing it from {3, 4, 5, 6}.
    benign_scale : float
        The 0.8 of the benign adaptation.
    contamination_factor : float
        Extra factor on the perturbation (see above).
    correlation : float in (-1, 1)
        AR(1) correlation of the noise across responses.
    K, n, r : int
        Deprecated aliases of ``n_clients``, ``samples_per_client``, ``rank``.

    Returns
    -------
    ClairInstance
        ``design="sec7"``; ``params`` holds ``n``, ``c``, ``variant``, ``noise_covariance`` (q, q)
        and ``expected_local_error``.
    """
    K = _require(_take_alias(n_clients, K, "n_clients", "K", "simulate"), "n_clients", "simulate")
    n = _require(_take_alias(samples_per_client, n, "samples_per_client", "n", "simulate"),
                 "samples_per_client", "simulate")
    r = _take_alias(rank, r, "rank", "r", "simulate")
    p, q, r = _check_dims(p, q, 2 if r is None else r)
    K = check_int(K, "n_clients", minimum=2)
    n = check_int(n, "samples_per_client", minimum=p + 2)
    m = int(round(0.4 * K)) if contaminated is None else check_contaminated_count(contaminated, K)
    if m > K - 2:
        raise ValueError(f"the default 40 % contamination gives {m} contaminated clients out of "
                         f"n_clients={K}; at most n_clients - 2 = {K - 2} are allowed (pass "
                         "contaminated=...)")
    variant = check_choice(variant, "variant", SEC7_VARIANTS)
    benign_scale = check_positive(benign_scale, "benign_scale", strict=False)
    contamination_factor = check_positive(contamination_factor, "contamination_factor",
                                          strict=False)
    correlation = check_in_interval(correlation, "correlation", -1.0, 1.0, closed="neither")
    rng = as_generator(seed)
    if c is None:
        c = float(rng.choice([3, 4, 5, 6]))
    else:
        c = check_positive(c, "c", strict=False)
    if m > 0 and c * contamination_factor == 0:
        warnings.warn(f"c={c:g} and contamination_factor={contamination_factor:g}: the {m} contaminated "
                      "client(s) get no perturbation (W^(k) = W0 exactly), so nothing can tell them "
                      "from the others", UserWarning, stacklevel=2)

    W0 = rng.uniform(-1.0, 1.0, size=(q, p))
    A = rng.uniform(-1.0, 1.0, size=(r, p))
    B = benign_scale * rng.uniform(-1.0, 1.0, size=(K, q, r))
    benign = _pick_contaminated(rng, K, m)
    half_width = np.sqrt(3.0) if variant == "unit-variance" else 1.0
    Z = rng.uniform(-half_width, half_width, size=(K, q, p))
    B[~benign] = 0.0
    Delta = np.einsum("kqr,rp->kqp", B, A)
    Delta[~benign] = contamination_factor * c / np.sqrt(q * (p - r)) * Z[~benign]
    W = W0 + Delta

    Sigma = ar1_covariance(q, correlation)
    chol = np.linalg.cholesky(Sigma)
    X = rng.standard_normal(size=(K, p, n))
    E = chol @ rng.standard_normal(size=(K, q, n))
    Y = W @ X + E
    # OLS, batched: What^T = (X X^T)^{-1} X Y^T, solved rather than inverted.
    XXt = X @ np.swapaxes(X, 1, 2)
    XYt = X @ np.swapaxes(Y, 1, 2)
    W_hat = np.swapaxes(np.linalg.solve(XXt, XYt), 1, 2)

    params = dict(p=p, q=q, K=K, n=n, r=r, contaminated=m, n_contaminated=m,
                  variant=variant, c=c, benign_scale=benign_scale,
                  contamination_factor=contamination_factor, correlation=correlation,
                  noise_covariance=Sigma, expected_local_error=q * p / (n - p - 1))
    A_clients = np.broadcast_to(A, (K, r, p))
    return ClairInstance(W_hat=W_hat, W=W, W0=W0, A=A, B=B, A_clients=A_clients, benign=benign,
                         rank=r, design="sec7", params=params)


def _misaligned(rng, A: np.ndarray, delta: float, count: int) -> np.ndarray:
    """``count`` row factors with orthonormal rows and ``||A^(k) - A||_F = delta`` exactly.

    In a random orthonormal basis ``R A`` of ``row(A)``, the first ``m = min(r, p - r)`` rows are
    rotated by the same angle ``theta`` towards random orthonormal directions ``N`` of
    ``row(A)^perp``: row ``i`` becomes ``cos(theta) (RA)_i + sin(theta) N_i``. Rows stay
    orthonormal and ``||A^(k) - A||_F^2 = 2 m (1 - cos theta) = 4 m sin^2(theta / 2)``, so
    ``theta = 2 arcsin(delta / (2 sqrt(m)))`` (half-angle forms avoid cancellation for tiny
    ``delta``).
    """
    r, p = A.shape
    mm = min(r, p - r)
    out = np.broadcast_to(A, (count, r, p)).copy()
    if delta == 0.0 or count == 0:
        return out
    half = np.arcsin(delta / (2.0 * np.sqrt(mm)))
    cos_m1 = -2.0 * np.sin(half) ** 2                                   # cos(theta) - 1
    sin_t = np.sin(2.0 * half)
    P_perp = np.eye(p) - A.T @ A
    R = orth(rng.standard_normal(size=(count, r, r)), name="R")          # random rotations
    N = orth(P_perp @ rng.standard_normal(size=(count, p, mm)), name="N")  # (count, p, mm)
    RA = np.swapaxes(R, 1, 2) @ A                                        # rows: basis of row(A)
    step = np.zeros_like(RA)
    step[:, :mm] = cos_m1 * RA[:, :mm] + sin_t * np.swapaxes(N, 1, 2)
    return out + R @ step                                                # A + R (RA' - RA)


def generate(*, n_clients: int | None = None, rank: int | None = None, p: int, q: int,
             contaminated: int = 1, delta: float = 0.0, noise=0.0,
             contamination_scale: float = 1.0, seed=None, K: int | None = None,
             r: int | None = None) -> ClairInstance:
    """General CLAIR instance for model (3)–(4).

    * ``A`` (r, p): orthonormal rows (QR of a Gaussian matrix); ``W0`` (q, p) and ``B^(k)``
      (q, r) iid N(0, 1).
    * Benign ``k``: ``W^(k) = W0 + B^(k) A^(k)`` with ``A^(k) = A`` when ``delta = 0``, otherwise
      an orthonormal-row factor at Frobenius distance exactly ``delta`` from ``A`` (so eq. (4)
      holds with ``max_{k in C} min_O ||O^T A^(k) - A||_F <= delta``).
    * ``contaminated`` clients (chosen at random): ``W^(k) = W0 + contamination_scale * Z^(k)``
      with ``Z^(k)`` iid N(0, 1) (q, p) — an unstructured, generically full-rank perturbation
      (the contamination S0 of (11) is then generically full rank on every contaminated pair).
    * Estimation error: ``What^(k) = W^(k) + Xi_k``, ``Xi_k`` iid ``N(0, tau_k^2)`` entries;
      ``noise=0`` gives the noiseless setting (``What = W``).

    Parameters
    ----------
    n_clients : int
        The paper's ``K``, >= 2.
    rank : int
        The paper's ``r``, ``1 <= rank < min(p, q)``.
    p, q : int
        ``W`` is (q, p).
    contaminated : int
        Number of contaminated clients, ``0 <= contaminated <= n_clients - 2``.
    delta : float
        Benign misalignment, ``0 <= delta <= sqrt(2 min(r, p - r))`` (rotation angle <= pi/2).
    noise : float or array_like, shape (K,)
        Per-client noise level ``tau_k >= 0`` (scalar: the same for all).
    contamination_scale : float
        Entry standard deviation of the contamination (> 0).
    seed : int or Generator
    K, r : int
        Deprecated aliases of ``n_clients``, ``rank``.

    Returns
    -------
    ClairInstance
        ``design="general"``; ``params`` holds the arguments and ``noise`` as a (K,) array.
    """
    K = _require(_take_alias(n_clients, K, "n_clients", "K", "generate"), "n_clients", "generate")
    r = _require(_take_alias(rank, r, "rank", "r", "generate"), "rank", "generate")
    K = check_int(K, "n_clients", minimum=2)
    p, q, r = _check_dims(p, q, r)
    contaminated = check_contaminated_count(contaminated, K)
    delta = check_positive(delta, "delta", strict=False)
    dmax = np.sqrt(2 * min(r, p - r))
    if delta > dmax:
        raise ValueError(f"delta must be <= sqrt(2 min(r, p - r)) = {dmax:.4g}, got {delta}")
    tau = as_float_array(noise, "noise", ndim=(0, 1))
    if tau.ndim == 1 and tau.shape != (K,):
        raise ValueError(f"noise must be a scalar or have shape ({K},), got shape {tau.shape}")
    if np.any(tau < 0):
        raise ValueError(f"noise must be >= 0, got min {tau.min()}")
    tau = np.broadcast_to(tau, (K,)).astype(np.float64)
    contamination_scale = check_positive(contamination_scale, "contamination_scale")
    rng = as_generator(seed)

    A = orth(rng.standard_normal(size=(p, r))).T
    W0 = rng.standard_normal(size=(q, p))
    B = rng.standard_normal(size=(K, q, r))
    benign = _pick_contaminated(rng, K, contaminated)
    A_clients = np.broadcast_to(A, (K, r, p)).copy()
    A_clients[benign] = _misaligned(rng, A, delta, int(benign.sum()))
    Z = rng.standard_normal(size=(K, q, p))
    B[~benign] = 0.0
    Delta = B @ A_clients
    Delta[~benign] = contamination_scale * Z[~benign]
    W = W0 + Delta
    W_hat = W + tau[:, None, None] * rng.standard_normal(size=(K, q, p))
    params = dict(K=K, p=p, q=q, r=r, contaminated=contaminated, delta=delta, noise=tau,
                  contamination_scale=contamination_scale)
    return ClairInstance(W_hat=W_hat, W=W, W0=W0, A=A, B=B, A_clients=A_clients, benign=benign,
                         rank=r, design="general", params=params)
