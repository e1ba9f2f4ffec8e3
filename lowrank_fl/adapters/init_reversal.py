r"""Whether a client's ``A`` factor still comes from the federation's common LoRA initialization.

Federated LoRA starts every client from the server's ``A_0`` (PEFT's default: the same ``A``,
``B = 0``). Training moves ``A`` by a displacement nearly orthogonal to ``A_0``, so every client's
rows stay aligned with those of the *typical* ``A``, ``Ā`` (the elementwise median over the
clients). Per row ``i`` the cosine ``cos(A_k[i], Ā[i])`` has three reference values: 1 (trained
from the common initialization), 0 (an unrelated initialization: about ``N(0, 1/in)``) and -1 (the
initialization reversed). A client whose ``A`` is reversed in **every row** (each cosine below
:data:`REVERSED_COSINE` = -1/2, closer to reversed than to unrelated) in **at least half of its
tested modules** did not train from the common initialization: it sent a sign-flipped factor
(``A → -A``: its update ``-ΔW_k``; or both factors, the same product). The update rule flags it
(``by_reversed_init``, :func:`reversed_init_flags`). Measured on trained adapter sets of the
benchmark's families (common initialization, 3-150 steps at 1e-3-3e-3, the 3× learning rates and
steps included): every client's ``<A_k, Ā> / ||Ā||²`` lies in 0.75-1.33, far from reversal.

Why it is needed: where the benign clients' ``B`` are independent (a common row space, no common
direction) ``-ΔW_k`` has the distribution of ``ΔW_k``, and no statistic of the updates can see a
flipped client; its factors can, since ``A`` is pinned by the common initialization. A flip of
``B`` alone (the same ``-ΔW_k`` with ``A`` unchanged) leaves no trace there at all.

A module is tested only where the factors can carry that evidence:

* every client has the same rank ``r >= 2`` and ``K >= 3`` (the median needs a majority; at rank
  1 a sign is all a factor has, and an SVD chooses it freely);
* the typical client's rows are not orthogonal (the largest off-diagonal of its row-normalised
  ``A A^T`` above :data:`ORTHOGONAL_ROWS`): factors written by an SVD (a merged or truncated
  update, the outputs this package writes, a LoRA extracted from a fine-tuned model) have
  orthogonal rows and signs that are a convention, not an initialization; trained PEFT factors
  do not;
* at least half of the clients have every row within 60° of ``Ā`` (cosines at least 1/2): the
  federation shares an initialization.

Shapes: ``A`` a list over the K clients of ``(r, in)`` arrays; :func:`init_cosines` returns
``(K, r)`` or None (module not tested); :func:`reversed_init_flags` reads a list over modules.
"""
from __future__ import annotations

import numpy as np

__all__ = ["REVERSED_COSINE", "SHARED_COSINE", "ORTHOGONAL_ROWS", "init_cosines", "reversed_init_flags",
           "typical_init_cosines"]

#: a row is reversed below this cosine with the typical row (midway between unrelated, 0, and reversed, -1)
REVERSED_COSINE = -0.5
#: a row shares the initialization at this cosine or above (within 60°)
SHARED_COSINE = 0.5
#: rows whose normalised Gram has no off-diagonal above this are orthogonal (factors from an SVD)
ORTHOGONAL_ROWS = 1e-6


def _row_cosines(S, ref) -> np.ndarray:
    """(K, r) cosines of each client's rows ``S[k, i]`` with ``ref[i]`` (NaN where a row is zero)."""
    num = np.einsum("kri,ri->kr", S, ref)
    den = np.linalg.norm(S, axis=2) * np.linalg.norm(ref, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _orthogonal_rows(A) -> bool:
    n = np.linalg.norm(A, axis=1)
    if not np.all(n > 0):
        return False
    C = (A / n[:, None]) @ (A / n[:, None]).T
    return float(np.abs(C - np.diag(np.diag(C))).max()) <= ORTHOGONAL_ROWS


def init_cosines(A) -> np.ndarray | None:
    """Per client and row, ``cos(A_k[i], Ā[i])`` (K, r) with ``Ā`` the elementwise median of the
    clients' ``A``; None where the module cannot be tested (module docstring: ranks differ or are 1,
    fewer than 3 clients, rows from an SVD, or no shared initialization)."""
    ranks = {np.shape(a) for a in A}
    if len(A) < 3 or len(ranks) != 1 or np.shape(A[0])[0] < 2:
        return None
    S = np.stack([np.asarray(a, float) for a in A])                     # (K, r, in)
    ref = np.median(S, axis=0)
    cos = _row_cosines(S, ref)
    dist = np.linalg.norm(S - ref, axis=(1, 2))
    typical = int(np.argmin(np.abs(dist - np.median(dist))))           # the client at the median distance
    if _orthogonal_rows(S[typical]):
        return None
    shared = np.all(cos >= SHARED_COSINE, axis=1)                      # NaN rows compare False
    return cos if 2 * int(shared.sum()) >= len(A) else None


def reversed_init_flags(cosines, K: int) -> np.ndarray:
    """Bool (K,): clients whose ``A`` is reversed (every row below :data:`REVERSED_COSINE`) in at least
    half of the modules tested for them (``cosines``: a list over modules of :func:`init_cosines`'s
    (K, r) arrays or None); all False where no module was tested."""
    tested = [c for c in cosines if c is not None]
    if not tested:
        return np.zeros(K, bool)
    C = np.array([np.all(np.isfinite(c), axis=1) for c in tested])     # (modules, K): row cosines defined
    R = np.array([np.all(c < REVERSED_COSINE, axis=1) for c in tested]) & C
    n = C.sum(axis=0)
    return (n > 0) & (2 * R.sum(axis=0) >= n)


def typical_init_cosines(cosines, K: int) -> np.ndarray:
    """Per client (K,) the median over its tested modules of its mean row cosine with ``Ā`` (NaN
    where no module was tested for it): what ``summary.json`` reports as ``init_cosines``."""
    tested = np.array([c.mean(axis=1) for c in cosines if c is not None]).reshape(-1, K)   # NaN rows stay NaN
    out = np.full(K, np.nan)
    for k in np.flatnonzero(np.isfinite(tested).any(axis=0)):       # per client: its own modules (K values)
        out[k] = np.median(tested[np.isfinite(tested[:, k]), k])
    return out
