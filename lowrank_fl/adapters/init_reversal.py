r"""Whether a client's ``A`` factor is its common LoRA initialization reversed: a sign-flipped factor.

Federated LoRA starts every client from the server's ``A_0`` (PEFT's default: the same ``A``,
``B = 0``), and training moves ``A`` only a little and nearly orthogonally to ``A_0``: the clients'
``A`` form a tight cloud around the *typical* ``A``, ``Ā`` (the elementwise median over the
clients). A client that sends ``-A_k`` (its update ``-ΔW_k``; or ``(-B_k)(-A_k)``, the same
product, re-signed factors no training gives) sits at the mirror image of that cloud. In a module
it is *reversed* where

* every (non-zero) row of ``A_k`` points away from its own row of ``Ā``: ``cos(A_k[i], Ā[i]) <``
  :data:`REVERSED_COSINE` = -1/2 (1 for the shared init, about 0 for an unrelated one, -1 for the
  init reversed: closer to reversed than to unrelated), and
* ``-A_k`` lies among the honest drifts, ``A_k`` does not: ``||A_k + Ā|| <=`` :data:`MIRROR_RADIUS`
  × the typical ``||A_j - Ā||`` (median over the clients) ``< ||A_k - Ā||``.

The second condition is what keeps honest factors in another gauge out: an adapter re-factored by
an SVD (``A' = R A``, ``B' = B R^{-1}``: the same product) has rows that may point anywhere, but
lands within two typical drifts of ``-Ā`` only by a coincidence of every row's direction and
length. A client reversed in at least half of the modules tested for it, and in more of them than
a random sign per rank component would reverse by chance (binomial tail at ``2^-r`` at most
:data:`SIGN_CHANCE`), is flagged (``by_reversed_init``, :func:`reversed_init_flags`): a tool that
re-signs each rank component of an honest adapter (the same product) reverses every row of a
module with probability ``2^-r`` and is not flagged; a naive flip reverses every module (at rank 4,
three modules suffice; at rank 2, five). Measured (`benchmarks/bench_init_reversal.py`,
docs/adapters_evidence.md): 24 trained sets of twelve families, nobody flagged, each set's
first client with its ``A`` negated flagged.

Why it is needed: where the benign clients' ``B`` are independent (a common row space, no common
direction) ``-ΔW_k`` has the distribution of ``ΔW_k``, and no statistic of the updates can see a
flipped client; its factors can, in the gauge the common initialization fixes. A flip of ``B``
alone (the same ``-ΔW_k``) leaves no trace there at all, and neither does a flip hidden by a change
of gauge (a permutation of the rank components, a rotation, an extra rank): the test reads the
naive flip only, and errs toward not flagging.

A module is tested only where

* at least 3 clients share the most common shape of ``A``, with rank ``r >= 2`` and at least
  :data:`MIN_WIDTH` input features (the others are not tested there), every entry finite: with
  fewer features two random rows of ``Ā`` can point opposite ways (their cosine is about
  ``N(0, 1/in)``), and an honest client with its rank components permuted would read as reversed;
* the typical ``||A_j - Ā||`` is at most :data:`SHARED_DRIFT` × ``||Ā||`` (the clients still share
  their initialization; long training on few examples moves ``A`` by 0.4-0.8 of it);
* the typical client's factors are not orthogonal on both sides: where the rows of its ``A`` and
  the columns of its ``B`` both have a root-mean-square pairwise cosine below
  :data:`ORTHOGONAL_ROWS` ``/ sqrt(n)`` (n = in, out), the factors were written by an SVD (a merged
  or truncated update, this package's outputs, a LoRA extracted from a fine-tuned model; bfloat16
  rounding leaves about ``0.005 / sqrt(n)``) and their signs are a convention. A trained ``B`` is
  not orthogonal (independent random columns give about ``1 / sqrt(out)``), whatever its ``A``.

Shapes: ``A``, ``B`` lists over the K clients of ``(r_k, in)`` and ``(out, r_k)`` arrays;
:func:`init_cosines` returns an :class:`InitCosines` (three (K,) arrays, NaN for clients not
tested, and the rank), or None where the module is not tested at all; :func:`reversed_init_flags` reads a list
of them over the modules.
"""
from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np
from scipy.stats import binom

__all__ = ["REVERSED_COSINE", "SHARED_DRIFT", "MIRROR_RADIUS", "SIGN_CHANCE", "MIN_WIDTH", "ORTHOGONAL_ROWS",
           "InitCosines", "init_cosines", "reversed_init_flags", "typical_init_cosines", "modules_tested",
           "modules_reversed"]

#: a row is reversed below this cosine with the typical row (midway between unrelated, 0, and reversed, -1)
REVERSED_COSINE = -0.5
#: a module shares an initialization where the typical client's ||A_k - Ā|| is at most this fraction of ||Ā||
SHARED_DRIFT = 0.5
#: -A_k must lie within this many typical drifts of Ā (the honest cloud, mirrored)
MIRROR_RADIUS = 2.0
#: a flag needs fewer than this chance of as many reversed modules under a random sign per rank component
SIGN_CHANCE = 1e-3
#: modules with fewer input features are not tested (random rows' cosines, about N(0, 1/in), reach -1/2)
MIN_WIDTH = 32
#: rows whose rms pairwise cosine is below this over sqrt(n) are orthogonal (an SVD's, even in bfloat16)
ORTHOGONAL_ROWS = 0.1


class InitCosines(NamedTuple):
    """One module's evidence: per client (K,) its mean row cosine with its rows of ``Ā`` (``mean``),
    1.0 where it is reversed here and 0.0 where not (``is_reversed``), and its lowest row cosine
    (``lowest``); NaN where not tested."""
    mean: np.ndarray
    is_reversed: np.ndarray
    lowest: np.ndarray
    #: the rank of the clients tested (2^-rank: the chance that a random sign per rank component reverses all)
    rank: int = 2


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


def init_cosines(A, B) -> InitCosines | None:
    """The module's evidence (module docstring) from the clients' ``A`` (r_k, in) and ``B`` (out, r_k):
    per client its mean row cosine with the typical ``A``, whether it is reversed here (1.0) or not
    (0.0), and its lowest row cosine; None where the module is not tested."""
    A = [np.asarray(a, float) for a in A]
    shape, n = Counter(a.shape for a in A).most_common(1)[0]
    if n < 3 or shape[0] < 2 or shape[1] < MIN_WIDTH or not all(np.isfinite(a).all() for a in A):
        return None
    group = np.array([a.shape == shape for a in A])
    P = np.stack([a for a, g in zip(A, group) if g])                    # (n, r, in), one copy
    ref = _median0(P)
    rn = np.linalg.norm(ref, axis=1)
    if not np.all(rn > 0):
        return None
    norms = np.sqrt(np.einsum("kri,kri->kr", P, P))
    rows = norms > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(rows, np.einsum("kri,ri->kr", P, ref) / (np.where(rows, norms, 1.0) * rn), np.nan)
    drift = np.linalg.norm(P - ref, axis=(1, 2))                        # ||A_k - Ā||
    mirror = np.linalg.norm(P + ref, axis=(1, 2))                       # ||A_k + Ā||: -A_k's drift
    typical = float(np.median(drift))
    if typical > SHARED_DRIFT * float(np.linalg.norm(ref)):            # the clients no longer share an init
        return None
    # factors orthogonal on both sides (an SVD's) carry signs by convention: judged on the typical client
    k = int(np.argsort(drift, kind="stable")[len(drift) // 2])
    if _orthogonal_rows(P[k][rows[k]]) and _orthogonal_rows(np.asarray(B[int(np.flatnonzero(group)[k])], float).T):
        return None
    live = rows.sum(axis=1)
    mean = np.where(live > 0, np.nansum(cos, axis=1) / np.maximum(live, 1), np.nan)
    # reversed: every row points away from its typical row, and -A_k lies among the honest drifts (within
    # MIRROR_RADIUS typical drifts of Ā) while A_k itself does not
    every = (live >= 2) & np.all(~rows | (cos < REVERSED_COSINE), axis=1)
    rev = every & (mirror <= MIRROR_RADIUS * typical) & (drift > mirror)
    out = InitCosines(*(np.full(len(A), np.nan) for _ in range(3)), rank=shape[0])
    out.mean[group] = mean
    out.is_reversed[group] = np.where(live > 0, rev.astype(float), np.nan)
    out.lowest[group] = np.where(live > 0, np.nanmin(np.where(rows, cos, np.inf), axis=1), np.nan)
    return out


def _tested(cosines, K: int) -> np.ndarray:
    """(modules, K) 1.0 / 0.0 reversed or not, per tested module (NaN: not tested for that client)."""
    return np.array([c.is_reversed for c in cosines if c is not None], float).reshape(-1, K)


def modules_reversed(cosines, K: int) -> np.ndarray:
    """Int (K,): per client the number of tested modules where it is reversed."""
    return (np.nan_to_num(_tested(cosines, K), nan=0.0) >= 0.5).sum(axis=0)


def reversed_init_flags(cosines, K: int) -> np.ndarray:
    """Bool (K,): clients reversed in at least half of the modules tested for them, and in more than a
    random sign per rank component would reverse by chance (the binomial tail at ``2^-r``, ``r`` the
    smallest rank tested for the client, at most :data:`SIGN_CHANCE`: an honest client whose tool
    re-signs each rank component, the same product, is not flagged). ``cosines``: a list over modules
    of :func:`init_cosines`' results or None; all False where no module was tested."""
    share = _tested(cosines, K)                                                 # (modules, K), built once
    tested = np.isfinite(share)
    n, c = tested.sum(axis=0), (np.nan_to_num(share, nan=0.0) >= 0.5).sum(axis=0)
    ranks = np.array([cc.rank for cc in cosines if cc is not None], float)
    r = np.where(tested, ranks[:, None], np.inf).min(axis=0) if len(ranks) else np.full(K, np.inf)
    chance = binom.sf(c - 1, n, np.exp2(-np.where(np.isfinite(r), r, 1.0)))
    return (n > 0) & (2 * c >= n) & (chance <= SIGN_CHANCE)


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
