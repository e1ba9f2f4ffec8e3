r"""Whether a client's ``A`` factor still comes from the federation's common LoRA initialization.

Federated LoRA starts every client from the server's ``A_0`` (PEFT's default: the same ``A``,
``B = 0``). Training moves ``A`` by a displacement nearly orthogonal to ``A_0``, so the rows of
every client's ``A`` stay aligned with those of the *typical* ``A``, ``Ā`` (the elementwise median
over the clients). Per row ``i`` the cosine ``cos(A_k[i], Ā[i])`` has three reference values: 1
(trained from the common initialization), 0 (an unrelated initialization: about ``N(0, 1/in)``)
and -1 (the initialization reversed). A row below :data:`REVERSED_COSINE` = -1/2 (closer to
reversed than to unrelated) is *reversed*. A client with at least half of its (non-zero) rows
reversed in at least half of the modules tested for it did not train from the common
initialization (``by_reversed_init``, :func:`reversed_init_flags`): it sent a sign-flipped ``A``
(its update ``-ΔW_k`` on those rows), or factors re-signed on both sides (``(-B)(-A) = B A``: its
update unchanged, its factors not those training gives). Measured (`benchmarks/bench_init_reversal.py`,
docs/adapters_evidence.md): on 24 trained adapter sets of twelve families, 3-150 steps, the 3×
learning rates and steps included, every row's cosine was at least 0.22.

Why it is needed: where the benign clients' ``B`` are independent (a common row space, no common
direction) ``-ΔW_k`` has the distribution of ``ΔW_k``, and no statistic of the updates can see a
flipped client; its factors can, since ``A`` is pinned by the common initialization. A flip of
``B`` alone (the same ``-ΔW_k`` with ``A`` unchanged) leaves no trace there at all.

Per module, all-zero rows of ``A`` are dropped (they carry no update) and ``Ā`` is the median of the
clients holding the most common number of rows (at least 3 of them, at least 2 rows). The rows of
every client are matched one to one to the rows of ``Ā`` so that the sum of their absolute cosines
is largest (the assignment problem; the identity wherever each row is most aligned with its own
typical row), so a permutation of the rank components, a zero row or an extra rank changes
nothing; a client is tested where at least half of its rows relate to ``Ā`` (an absolute cosine of
at least 1/2). The module is tested only where the factors can carry that evidence:

* the typical client's factors are not both orthogonal: the module is left out where the rows of its
  ``A`` and the columns of its ``B`` both have a root-mean-square pairwise cosine below
  :data:`ORTHOGONAL_ROWS` ``/ sqrt(n)`` (n = in, out). Factors written by an SVD (a merged or
  truncated update, the outputs this package writes, a LoRA extracted from a fine-tuned model) are
  orthogonal on both sides — 0, and about ``0.005 / sqrt(n)`` once stored in bfloat16 (unit
  roundoff 2^-8 on each entry) — and their signs are a convention, not an initialization. A
  trained ``B`` is not (independent random columns give about ``1 / sqrt(out)``), whatever its
  ``A`` (PEFT's random rows, or an orthonormal initialization);
* at least half of them have a mean row cosine of at least :data:`SHARED_COSINE` (within 60°):
  the federation shares an initialization.

Shapes: ``A``, ``B`` lists over the K clients of ``(r_k, in)`` and ``(out, r_k)`` arrays;
:func:`init_cosines` returns an
:class:`InitCosines` of two (K,) arrays, NaN for clients not tested, or None where the module is
not tested at all; :func:`reversed_init_flags` reads a list of them over the modules.
"""
from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = ["REVERSED_COSINE", "SHARED_COSINE", "ORTHOGONAL_ROWS", "InitCosines", "init_cosines",
           "reversed_init_flags", "typical_init_cosines", "modules_tested", "modules_reversed"]

#: a row is reversed below this cosine with the typical row (midway between unrelated, 0, and reversed, -1)
REVERSED_COSINE = -0.5
#: a client shares the initialization at this mean row cosine or above (within 60°)
SHARED_COSINE = 0.5
#: rows whose rms pairwise cosine is below this over sqrt(n) are orthogonal (an SVD's, even in bfloat16)
ORTHOGONAL_ROWS = 0.1


class InitCosines(NamedTuple):
    """One module's evidence: per client (K,) its mean row cosine with ``Ā`` (``mean``), the share of its
    non-zero rows below :data:`REVERSED_COSINE` (``reversed_share``) and its lowest row cosine
    (``lowest``); NaN where not tested."""
    mean: np.ndarray
    reversed_share: np.ndarray
    lowest: np.ndarray


def _orthogonal_rows(M) -> bool:
    """Whether ``M``'s non-zero rows (r, n) look like an SVD's: rms pairwise cosine below
    ORTHOGONAL_ROWS / sqrt(n)."""
    M = M[np.linalg.norm(M, axis=1) > 0]
    if len(M) < 2:
        return False
    U = M / np.linalg.norm(M, axis=1, keepdims=True)
    C = U @ U.T
    r = len(C)
    rms = np.sqrt(max(float(np.sum(C * C) - np.sum(np.diag(C) ** 2)), 0.0) / (r * (r - 1)))   # >= 0 to rounding
    return bool(rms < ORTHOGONAL_ROWS / np.sqrt(M.shape[1]))


def _median0(S) -> np.ndarray:
    """``np.median(S, axis=0)`` (the mean of the two middle values for an even count), by one sort: about
    half of its time on (K, r, in) stacks."""
    T = np.sort(S, axis=0)
    n = len(T)
    return T[n // 2] if n % 2 else 0.5 * (T[n // 2 - 1] + T[n // 2])


def _matched_cosines(P, norms, R) -> np.ndarray:
    """(K, rmax) cosines of every client's rows ``P`` (K, rmax, in; row norms ``norms``, 0 where a row is
    padding or zero) with the unit typical rows ``R`` (r, in), each row matched one to one to a typical
    row so that the sum of absolute cosines is largest (a permutation of the rank components, a zero
    row dropped or an extra rank change nothing); NaN where a row is unmatched or absent."""
    K, rmax = norms.shape
    rows = norms > 0
    C = (P @ R.T) / np.where(rows, norms, 1.0)[..., None]                             # (K, rmax, r)
    cos = np.full((K, rmax), np.nan)
    # where every row's largest |cosine| is its own typical row, that matching is the best one (the sum of
    # the row maxima bounds any matching's); the assignment problem is solved only for the other clients
    m = min(rmax, R.shape[0])
    own = (np.all(~rows[:, :m] | (np.abs(C[:, :m]).argmax(axis=2) == np.arange(m)), axis=1)
           & ~rows[:, m:].any(axis=1))
    cos[:, :m] = np.where(own[:, None] & rows[:, :m], np.diagonal(C[:, :m, :m], axis1=1, axis2=2), np.nan)
    for k in np.flatnonzero(~own):
        held = np.flatnonzero(rows[k])
        t, s = linear_sum_assignment(-np.abs(C[k, held]))
        cos[k, held[t]] = C[k, held[t], s]
    return cos


def init_cosines(A, B) -> InitCosines | None:
    """The module's evidence (module docstring) from the clients' ``A`` (r_k, in) and ``B`` (out, r_k):
    per client its mean row cosine with the typical ``A``, its share of reversed rows and its lowest
    row cosine; None where the module is not tested."""
    A = [np.asarray(a, float) for a in A]
    if len({a.shape for a in A}) == 1:                   # one rank (the usual case): batched, no copies
        P = np.stack(A)
        norms = np.sqrt(np.einsum("kri,kri->kr", P, P))
        live = [int(v) for v in (norms > 0).sum(axis=1)]
    else:                                                # ragged ranks: each client's non-zero rows, padded
        rmax, width = max(a.shape[0] for a in A), Counter(a.shape[1] for a in A).most_common(1)[0][0]
        P = np.zeros((len(A), rmax, width))
        for k, a in enumerate(A):
            if a.shape[1] == width:
                a = a[np.einsum("ri,ri->r", a, a) > 0]
                P[k, :len(a)] = a
        norms = np.sqrt(np.einsum("kri,kri->kr", P, P))
        live = [int(v) for v in (norms > 0).sum(axis=1)]
    # the typical A: the median of the clients holding the most common number of non-zero rows, in place
    rank, n = Counter(live).most_common(1)[0]
    if n < 3 or rank < 2:
        return None
    group = np.array(live) == rank
    S = P if group.all() else P[group]
    if len({a.shape for a in A}) == 1 and not np.all(norms[group] > 0):      # zero rows inside: compact them
        S = np.stack([s[nm > 0] for s, nm in zip(S, norms[group])])
    else:
        S = S[:, :rank]
    ref = _median0(S)
    rn = np.linalg.norm(ref, axis=1)
    if not np.all(rn > 0):
        return None
    cos = _matched_cosines(P, norms, ref / rn[:, None])
    rows = np.isfinite(cos)
    n_rows = rows.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        related = np.sum(rows & (np.abs(cos) >= SHARED_COSINE), axis=1)
        mean = np.where(rows, cos, 0.0).sum(axis=1) / n_rows
        share = np.sum(rows & (cos < REVERSED_COSINE), axis=1) / n_rows
    tested = (n_rows > 0) & (2 * related >= n_rows)    # rows that relate to the typical A at all, either way
    if 2 * int(np.sum(tested[group] & (mean[group] >= SHARED_COSINE))) < n:
        return None
    # factors orthogonal on both sides (an SVD's) carry signs by convention: judged on the typical client
    idx = np.flatnonzero(group)
    k = int(idx[np.argsort(mean[idx], kind="stable")[len(idx) // 2]])
    if _orthogonal_rows(P[k][norms[k] > 0]) and _orthogonal_rows(np.asarray(B[k], float).T):
        return None
    lowest = np.where(rows, cos, np.inf).min(axis=1)
    return InitCosines(*(np.where(tested, v, np.nan) for v in (mean, share, lowest)))


def _tested(cosines, K: int) -> np.ndarray:
    """(modules, K) reversed shares of the tested modules (NaN: not tested for that client), or (0, K)."""
    return np.array([c.reversed_share for c in cosines if c is not None], float).reshape(-1, K)


def modules_reversed(cosines, K: int) -> np.ndarray:
    """Int (K,): per client the number of tested modules where at least half of its rows are reversed."""
    return (np.nan_to_num(_tested(cosines, K), nan=0.0) >= 0.5).sum(axis=0)


def reversed_init_flags(cosines, K: int) -> np.ndarray:
    """Bool (K,): clients with at least half of their rows reversed in at least half of the modules
    tested for them (``cosines``: a list over modules of :func:`init_cosines`' results or None); all
    False where no module was tested."""
    n = modules_tested(cosines, K)
    return (n > 0) & (2 * modules_reversed(cosines, K) >= n)


def modules_tested(cosines, K: int) -> np.ndarray:
    """Int (K,): the number of modules tested for each client."""
    return np.isfinite(_tested(cosines, K)).sum(axis=0)


def typical_init_cosines(cosines, K: int) -> np.ndarray:
    """Per client (K,) the median over its tested modules of its mean row cosine with ``Ā`` (NaN
    where no module was tested for it): what ``summary.json`` reports as ``init_cosines``."""
    mean = np.array([c.mean for c in cosines if c is not None], float).reshape(-1, K)
    out = np.full(K, np.nan)
    some = np.isfinite(mean).any(axis=0)
    if some.any():                                      # nanmedian warns on all-NaN columns: left out
        out[some] = np.nanmedian(mean[:, some], axis=0)
    return out
