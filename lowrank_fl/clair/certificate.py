"""Dual certificate of Proposition S1, Lemma S3, Block-IC and the Theorem 1 window (25).

Pure functions of arrays (never a (Gq x Gq) object), used by the verifier's conditions module:

* :func:`block_incoherence` — Block-IC constant ``mu`` of Assumption 2 for a rank-r ``L0``.
* :func:`theorem1_window` — the ratio window (25) for ``lam_S / lam_L`` (or ``None`` if empty).
* :func:`lemma_s3_residual` — residual of ``lam_L P_I U'V'^T = lam_S P_I(H P_V')`` (Lemma S3).
* :func:`build_certificate` — ``Q`` of Prop. S1 with ``Z = (I - P_I P_U' P_I)^{-1} R`` (S1.4)
  applied by Woodbury on the ``I`` rows only (never a Gq x Gq identity), ``â``, ``b̂``, ``ρ'``
  and the residuals of its defining identities (S1.3).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import as_float_array, check_in_interval, check_int, check_positive
from ..linalg import block_norms
from .contrasts import check_block_rows

__all__ = [
    "Certificate",
    "block_incoherence",
    "block_leverages",
    "theorem1_x",
    "theorem1_window",
    "lemma_s3_residual",
    "rho_prime",
    "build_certificate",
]


def _check_blocks(X, q, name):
    X = as_float_array(X, name, ndim=2)
    q, G = check_block_rows(X, q, name)
    return X, q, G


def _check_mask(I_mask, G):
    m = np.asarray(I_mask)
    if m.dtype != bool or m.shape != (G,):
        raise ValueError(f"I_mask must be a boolean array of shape ({G},) (contaminated pairs), "
                         f"got dtype {m.dtype} and shape {m.shape}")
    return m


def _left_basis(L, r):
    U, s, Vt = np.linalg.svd(L, full_matrices=False)
    if s[r - 1] <= 1e-12 * max(s[0], np.finfo(float).tiny):
        raise ValueError(f"L must have rank >= r={r}; its singular values are {s[:r + 1]}")
    return U[:, :r], s, Vt[:r].T


def block_leverages(L0, q: int, r: int) -> np.ndarray:
    """Block leverages ``||P_g P_U||_F^2 = ||U^(g)||_F^2`` (G,) of the top-r left singular
    vectors ``U`` of ``L0`` (Gq, p). They sum to ``r``."""
    L0, q, G = _check_blocks(L0, q, "L0")
    r = check_int(r, "r", minimum=1, maximum=min(L0.shape))
    U, _, _ = _left_basis(L0, r)
    return block_norms(U.reshape(G, q, r)) ** 2


def block_incoherence(L0, q: int, r: int) -> float:
    """Smallest ``mu`` with ``max_g ||P_g P_U||_F^2 <= mu r / G`` (Block-IC, Assumption 2).

    For the model-induced ``L0`` (zero on the s contaminated blocks) ``mu >= G/(G - s)``
    (so Theorems 1-2's window needs r s/(G - s) < 1/16: very few contaminated clients).
    """
    lev = block_leverages(L0, q, r)
    return float(lev.max() * lev.size / r)


def theorem1_x(mu: float, r: int, s: int, G: int) -> float:
    """``x = sqrt(mu r s / G)``, the quantity Theorem 1 needs below ``ab/(1+a)^2``."""
    mu = check_positive(mu, "mu")
    r = check_int(r, "r", minimum=1)
    G = check_int(G, "G", minimum=1)
    s = check_int(s, "s", minimum=0, maximum=G)
    return float(np.sqrt(mu * r * s / G))


def theorem1_window(mu: float, r: int, s: int, G: int, a: float, b: float):
    """Window (25) for ``lam_S / lam_L`` in Theorem 1 (and (27) in Theorem 2).

    ``( sqrt(mu r/G) / (b - (1+a) x),  a / ((1+a) sqrt(s)) )`` with ``x = sqrt(mu r s/G)``.

    Parameters
    ----------
    mu : float
        Block-IC constant (:func:`block_incoherence`).
    r, s, G : int
        Rank, number of contaminated pairs ``|I|``, number of pairs.
    a, b : float in (0, 1)

    Returns
    -------
    (low, high) or None
        ``None`` when the window is empty, i.e. ``x >= ab/(1+a)^2`` (the two conditions are
        equivalent). ``high = inf`` when ``s = 0``.
    """
    a = check_in_interval(a, "a", 0.0, 1.0, closed="neither")
    b = check_in_interval(b, "b", 0.0, 1.0, closed="neither")
    x = theorem1_x(mu, r, s, G)
    if x >= a * b / (1 + a) ** 2:
        return None
    low = float(np.sqrt(mu * r / G) / (b - (1 + a) * x))
    high = float(a / ((1 + a) * np.sqrt(s))) if s > 0 else float("inf")
    return (low, high) if low < high else None


def _sign_blocks(L, S, q, I_mask, zero_tol, U, V, lam_L, lam_S):
    """``H`` of S1.1/Lemma S3: ``S_g / ||S_g||_F`` on the live blocks of I, 0 off I.

    A block is live when ``||S_g||_F > zero_tol * max_g ||(L + S)_g||_F`` (relative to the data
    ``D0 = L + S``, so the decision does not depend on units). On blocks of I where ``S_g``
    vanishes any ``||H_g||_F <= 1`` is allowed; the choice ``(lam_L/lam_S) U'_g V'^T`` is the
    smallest one satisfying Lemma S3 there (returned mask ``zero``: the caller checks
    ``||H_g|| <= 1``).
    """
    Sb = S.reshape(-1, q, S.shape[1])
    n = block_norms(Sb)
    ref = float(block_norms((L + S).reshape(Sb.shape)).max())
    live = I_mask & (n > zero_tol * ref)
    zero = I_mask & ~live
    H = np.zeros_like(Sb)
    H[live] = Sb[live] / n[live, None, None]
    if np.any(zero):
        Ub = U.reshape(-1, q, U.shape[1])
        H[zero] = (lam_L / lam_S) * (Ub[zero] @ V.T)
    return H.reshape(S.shape), zero


def lemma_s3_residual(L, S, I_mask, q: int, r: int, lam_L: float, lam_S: float, *,
                      zero_tol: float = 1e-9) -> float:
    """Relative residual of Lemma S3, ``lam_L P_I U'V'^T = lam_S P_I(H P_V')``.

    Parameters
    ----------
    L, S : array_like, shape (G*q, p)
        An oracle optimizer ``(L', S')`` of (23).
    I_mask : ndarray of bool, shape (G,)
    q, r : int
    lam_L, lam_S : float
    zero_tol : float, > 0
        Blocks with ``||S_g||_F <= zero_tol * max_g ||(L + S)_g||_F`` count as zero.

    Returns
    -------
    float
        ``||lhs - rhs||_F / max(||lhs||_F, ||rhs||_F, tiny)``.
    """
    L, S, I_mask, q, G, r, lam_L, lam_S, zero_tol = _check_oracle_point(
        L, S, I_mask, q, r, lam_L, lam_S, zero_tol)
    U, _, V = _left_basis(L, r)
    H, _ = _sign_blocks(L, S, q, I_mask, zero_tol, U, V, lam_L, lam_S)
    return _s3_residual(U, V, H, np.repeat(I_mask, q), lam_L, lam_S)


def _check_oracle_point(L, S, I_mask, q, r, lam_L, lam_S, zero_tol):
    L, q, G = _check_blocks(L, q, "L")
    S = as_float_array(S, "S", shape=L.shape)
    I_mask = _check_mask(I_mask, G)
    r = check_int(r, "r", minimum=1, maximum=min(L.shape))
    return (L, S, I_mask, q, G, r, check_positive(lam_L, "lam_L"),
            check_positive(lam_S, "lam_S"), check_positive(zero_tol, "zero_tol"))


def _s3_residual(U, V, H, rows, lam_L, lam_S) -> float:
    if not np.any(rows):
        return 0.0
    lhs = lam_L * (U[rows] @ V.T)
    rhs = lam_S * ((H[rows] @ V) @ V.T)
    scale = max(float(np.linalg.norm(lhs)), float(np.linalg.norm(rhs)), np.finfo(float).tiny)
    return float(np.linalg.norm(lhs - rhs)) / scale


def rho_prime(U, I_mask, q: int) -> float:
    """``rho' = ||P_I P_U' P_I||_op = ||U_I^T U_I||_op`` for an orthonormal ``U`` (Gq, r)
    (Lemmas S7/S8); ``U_I`` are the rows of ``U`` in the contaminated blocks."""
    U, q, G = _check_blocks(U, q, "U")
    I_mask = _check_mask(I_mask, G)
    UI = U[np.repeat(I_mask, q)]
    return float(np.linalg.norm(UI.T @ UI, 2)) if UI.size else 0.0


@dataclass(frozen=True)
class Certificate:
    """The Prop. S1 certificate for an oracle optimizer ``(L', S')``.

    Attributes
    ----------
    Q : ndarray, shape (G*q, p)
    a_hat : float
        ``||P_{T⊥}(Q)||_op / lam_L`` (condition 2 of (S1.3) holds with any ``a > a_hat``).
    b_hat : float
        ``max_{g in I^c} ||Q_g||_F / lam_S`` (condition 4 with any ``b > b_hat``).
    rho_prime : float
        ``||U_I^T U_I||_op`` (< 1 by Lemma S8).
    tangent_residual : float
        ``||P_T(Q) - lam_L U'V'^T||_F / (lam_L sqrt(r))`` (condition 1; ~ rounding by
        construction).
    support_residual : float
        ``||P_I(Q) - lam_S P_I(H)||_F / ||lam_S P_I(H)||_F`` (condition 3; equals the Lemma S3
        residual, i.e. the solver accuracy of ``(L', S')``).
    lemma_s3_residual : float
    sign_ok : bool
        ``||H_g||_F <= 1`` on blocks of ``I`` where ``S'_g = 0`` (``H_g`` chosen as
        ``(lam_L/lam_S) U'_g V'^T``, the only choice with no ``P_V'⊥`` part meeting Lemma S3).
    """

    Q: np.ndarray
    a_hat: float
    b_hat: float
    rho_prime: float
    tangent_residual: float
    support_residual: float
    lemma_s3_residual: float
    sign_ok: bool

    def valid(self, a: float = 1.0, b: float = 1.0, *, rtol: float = 1e-6) -> bool:
        """Conditions (S1.3) with constants ``a``, ``b``: ``a_hat < a``, ``b_hat < b`` and the
        identities within ``rtol``."""
        return bool(self.a_hat < a and self.b_hat < b and self.sign_ok
                    and self.tangent_residual <= rtol and self.support_residual <= rtol)


def build_certificate(L, S, I_mask, q: int, r: int, lam_L: float, lam_S: float, *,
                      zero_tol: float = 1e-9) -> Certificate:
    """Construct the dual certificate of Proposition S1 (proof in S1; Woodbury form on the I-blocks).

    ``Q = lam_L U'V'^T + P_{U'⊥} Z`` with ``R = lam_S P_I(H P_{V'⊥})`` and
    ``Z = (I - P_I P_U' P_I)^{-1} R`` (S1.4): on the ``I`` rows
    ``Z_I = R_I + U_I (I_r - U_I^T U_I)^{-1} U_I^T R_I`` (Woodbury), ``Z = 0`` elsewhere.

    Parameters
    ----------
    L, S : array_like, shape (G*q, p)
        An oracle optimizer of (23) (e.g. from :func:`~lowrank_fl.clair.oracle.solve_oracle_smooth`).
    I_mask : ndarray of bool, shape (G,)
    q, r : int
    lam_L, lam_S : float, > 0
    zero_tol : float, > 0
        Relative threshold for zero blocks of ``S`` (see :func:`lemma_s3_residual`).

    Returns
    -------
    Certificate

    Raises
    ------
    ValueError
        Bad input, or ``rho' = ||U_I^T U_I||_op >= 1`` (then ``I - P_I P_U' P_I`` is singular and
        (S1.4) is undefined; Lemma S8 needs ``rho' < 1``).
    """
    L, S, I_mask, q, G, r, lam_L, lam_S, zero_tol = _check_oracle_point(
        L, S, I_mask, q, r, lam_L, lam_S, zero_tol)
    U, _, V = _left_basis(L, r)
    p = L.shape[1]
    H, zero_I = _sign_blocks(L, S, q, I_mask, zero_tol, U, V, lam_L, lam_S)
    rows = np.repeat(I_mask, q)
    UI = U[rows]                                        # (s q, r)
    HI = H[rows]
    RI = lam_S * (HI - (HI @ V) @ V.T)                  # lam_S P_I(H P_{V'⊥})
    M = UI.T @ UI                                       # (r, r); rho' = ||M||
    rho = float(np.linalg.norm(M, 2)) if UI.size else 0.0
    if rho >= 1 - 1e-12:
        raise ValueError(f"rho' = ||U_I^T U_I||_op = {rho:.12g} must be < 1 for the certificate "
                         "(S1.4): the contaminated rows span the whole column space of L")
    Z = np.zeros_like(L)
    if UI.size:
        Z[rows] = RI + UI @ np.linalg.solve(np.eye(r) - M, UI.T @ RI)
    UV = U @ V.T
    Q = lam_L * UV + (Z - U @ (U.T @ Z))
    # residuals of (S1.3)
    UtQ = U.T @ Q
    PT = U @ UtQ + (Q @ V) @ V.T - U @ ((UtQ @ V) @ V.T)
    tangent = float(np.linalg.norm(PT - lam_L * UV)) / (lam_L * np.sqrt(r))
    Tperp = Q - PT
    a_hat = float(np.linalg.norm(Tperp, 2)) / lam_L
    qn = block_norms(Q.reshape(G, q, p))
    b_hat = float(qn[~I_mask].max()) / lam_S if np.any(~I_mask) else 0.0
    target = lam_S * HI
    tnorm = float(np.linalg.norm(target))
    support = float(np.linalg.norm(Q[rows] - target)) / tnorm if tnorm > 0 else \
        float(np.linalg.norm(Q[rows]))
    hn = block_norms(H.reshape(G, q, p))
    sign_ok = bool(np.all(hn[zero_I] <= 1 + 1e-8))
    s3 = _s3_residual(U, V, H, rows, lam_L, lam_S)
    return Certificate(Q=Q, a_hat=a_hat, b_hat=b_hat, rho_prime=rho, tangent_residual=tangent,
                       support_residual=support, lemma_s3_residual=s3, sign_ok=sign_ok)
