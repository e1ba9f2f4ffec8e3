"""Copying tasks of CLAIR §8.1 and S5 (after Song, Xu & Zhong's copying benchmark).

Vocabulary: 52 letter tokens ``a..z, A..Z`` with ids ``0..51`` (letter ``a`` of the power law is
id ``a - 1``) and the padding token ``&`` with id :data:`PAD` = 52; sequences have length
``T = 64``. A segment ``u = (u_1..u_L)`` (``L < T/2``) drawn i.i.d. from the power law
``P(X = a; t) = a^{-t} / Σ_{l=1}^{52} l^{-t}`` (§8.2) appears twice:

* ``"fuzzy"`` (S5): ``x = (*, u, *, u, *)``; the three background lengths come from two distinct
  cut points drawn among the ``T - 2L`` non-copy positions, and the background tokens ``*`` are
  drawn from the same power law (the paper says "random tokens"; :func:`sample` takes
  ``background="uniform"`` for the uniform reading);
* ``"clean"`` (S5): two adjacent copies ``(&.., u, u, &..)`` at a random offset, padding elsewhere.

Mismatched tasks for the contaminated client (the paper only says "a copying task mismatched to
those of the benign clients"; :data:`CONTAMINATIONS`): ``"reverse"`` (the second occurrence is
``u`` reversed: a different copying rule, the default of :mod:`lowrank_fl.nn.sec8`), ``"shift"``
(the second occurrence is ``u`` shifted by one letter, ``u_i + 1 mod 52``) and ``"clean"``
(clean instead of fuzzy copying); ``"rotate"``, a near miss (the second occurrence is ``u`` rotated
by one position, ``(u_2, .., u_L, u_1)``: every letter is copied, one position early).

The metric (§8.2): ``Err_mask`` over positions ``M_i = {m_i+3, ..., m_i+L_i-1}`` of the second
copy (``m_i`` its first position), i.e. the first copy and the first three tokens of the second
are excluded; :func:`masked_error` computes it from predictions. Song et al.'s code masks the
*inputs* ``m_i+4 .. m_i+L_i-1`` and scores the prediction made there, i.e. the targets
``m_i+5 .. m_i+L_i`` (``metric="song"``: the first target after the copy is counted, which no
copying rule determines, and ``m_i+3``, ``m_i+4`` are not).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..validation import as_generator, check_int

__all__ = ["VOCAB", "PAD", "T", "LETTERS", "CONTAMINATIONS", "BACKGROUNDS", "CopyBatch", "power_law", "sample",
           "sample_mixture", "masked_error", "mask", "copy_positions", "LOSSES", "loss_positions", "METRICS"]

#: conventions of the masked metric: §8.2's ``M_i`` ("paper") or Song et al.'s code ("song")
METRICS = ("paper", "song")

#: which next-token targets a training loss uses: every position (S5's "autoregressive"), or only
#: the second copy's positions ``m+1 .. m+L-1`` (those the first copy determines)
LOSSES = ("all", "copy")

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
PAD = 52
VOCAB = 53
T = 64
CONTAMINATIONS = ("reverse", "shift", "upper", "clean", "rotate")
#: background tokens of fuzzy copying: the segment's power law, or uniform over the 52 letters
BACKGROUNDS = ("power-law", "uniform")
_KINDS = ("fuzzy", "clean", "reverse", "shift", "upper", "rotate")


class CopyBatch(NamedTuple):
    """Sequences with the position of their second copy.

    tokens : int64 (n, T); second_start : int64 (n,), ``m_i`` (0-based); length : int64 (n,), ``L_i``.
    """

    tokens: np.ndarray
    second_start: np.ndarray
    length: np.ndarray


def power_law(t: float) -> np.ndarray:
    """``P(X = a; t) ∝ a^{-t}``, ``a = 1..52`` (§8.2), as probabilities over ids 0..51."""
    p = np.arange(1, 53, dtype=np.float64) ** (-float(t))
    return p / p.sum()


def sample(n: int, *, length: int, exponent: float = 1.1, kind: str = "fuzzy",
           background: str = "power-law", seq_len: int = T, alphabet=None, label_noise: float = 0.0,
           seed=None) -> CopyBatch:
    """``n`` copying sequences with segment length ``length`` (``L``), power-law exponent ``t``.

    ``kind``: ``"fuzzy"`` (default) or ``"clean"`` (S5), or the mismatched rules ``"reverse"`` /
    ``"shift"`` / ``"upper"`` / ``"rotate"`` (fuzzy layout, second occurrence reversed / shifted by
    one letter / in upper case / rotated by one position).
    ``alphabet``: letter ids (0..51) the segments are drawn from (the power law restricted to them,
    in the given order of ranks); None: all 52. The background keeps every letter.
    ``label_noise``: each token of the second occurrence is replaced, with this probability, by a
    uniform letter (noisy training labels; the returned sequences are the noisy ones).
    """
    n = check_int(n, "n", minimum=1)
    L = check_int(length, "length", minimum=4)
    if not 2 * L < seq_len:
        raise ValueError(f"length must satisfy L < T/2 = {seq_len / 2}, got L={L}")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if background not in BACKGROUNDS:
        raise ValueError(f"background must be one of {BACKGROUNDS}, got {background!r}")
    if not (isinstance(label_noise, (int, float)) and 0.0 <= label_noise <= 1.0):
        raise ValueError(f"label_noise must be a probability in [0, 1], got {label_noise!r}")
    rng = as_generator(seed)
    p = power_law(exponent)
    if alphabet is None:
        seg = rng.choice(52, size=(n, L), p=p)
    else:
        letters = np.asarray(alphabet, dtype=np.int64).reshape(-1)
        if letters.size < 2 or letters.min() < 0 or letters.max() > 51 or np.unique(letters).size != letters.size:
            raise ValueError(f"alphabet must be at least 2 distinct letter ids in 0..51, got {alphabet!r}")
        sub = power_law(exponent)[: letters.size]
        seg = letters[rng.choice(letters.size, size=(n, L), p=sub / sub.sum())]
    n_bg = seq_len - 2 * L
    rows = np.arange(n)[:, None]
    if kind == "clean":
        tokens = np.full((n, seq_len), PAD, dtype=np.int64)
        first = rng.integers(0, n_bg + 1, size=n)
        second = first + L
    else:
        bg_p = p if background == "power-law" else None
        tokens = rng.choice(52, size=(n, seq_len), p=bg_p).astype(np.int64)
        # two distinct cut points among the n_bg + 1 boundaries of the background (S5)
        cuts = np.sort(rng.random((n, n_bg + 1)).argsort(axis=1)[:, :2], axis=1)
        first = cuts[:, 0]
        second = cuts[:, 1] + L
    second_seg = seg
    if kind == "reverse":
        second_seg = seg[:, ::-1]
    elif kind == "shift":
        second_seg = (seg + 1) % 52
    elif kind == "upper":
        second_seg = np.where(seg < 26, seg + 26, seg)
    elif kind == "rotate":
        second_seg = np.roll(seg, -1, axis=1)
    if label_noise > 0:
        flip = rng.random(second_seg.shape) < label_noise
        second_seg = np.where(flip, rng.integers(0, 52, size=second_seg.shape), second_seg)
    offs = np.arange(L)[None, :]
    tokens[rows, first[:, None] + offs] = seg
    tokens[rows, second[:, None] + offs] = second_seg
    return CopyBatch(tokens, second.astype(np.int64), np.full(n, L, dtype=np.int64))


def sample_mixture(n: int, *, lengths, exponent: float = 1.1, kind: str = "fuzzy",
                   background: str = "power-law", seed=None) -> CopyBatch:
    """A balanced mixture of copying tasks over ``lengths`` (pretraining, S5: fuzzy, L in 5..15).

    Each sequence's length is drawn uniformly from ``lengths``; ``kind`` and ``background`` as in
    :func:`sample` (``exponent=0`` gives uniform letters).
    """
    rng = as_generator(seed)
    lengths = np.asarray(list(lengths), dtype=np.int64)
    pick = rng.integers(0, lengths.size, size=n)
    out_t = np.empty((n, T), dtype=np.int64)
    out_m = np.empty(n, dtype=np.int64)
    out_l = np.empty(n, dtype=np.int64)
    for i, L in enumerate(lengths):      # a handful of lengths, not a loop over samples
        idx = np.flatnonzero(pick == i)
        if idx.size:
            b = sample(idx.size, length=int(L), exponent=exponent, kind=kind, background=background,
                       seed=rng)
            out_t[idx], out_m[idx], out_l[idx] = b
    return CopyBatch(out_t, out_m, out_l)


def mask(batch: CopyBatch, *, metric: str = "paper") -> np.ndarray:
    """Bool (n, T) over target positions: ``t`` in ``M_i = {m_i+3, ..., m_i+L_i-1}`` (§8.2,
    ``metric="paper"``) or in ``{m_i+5, ..., m_i+L_i}`` (Song et al.'s code, ``metric="song"``;
    a target at ``T`` does not exist and is not counted)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    pos = np.arange(batch.tokens.shape[1])[None, :]
    m = batch.second_start[:, None]
    lo, hi = (3, -1) if metric == "paper" else (5, 0)
    return (pos >= m + lo) & (pos <= m + batch.length[:, None] + hi)


def copy_positions(batch: CopyBatch) -> np.ndarray:
    """Bool (n, T): position ``t`` in ``{m_i+1, ..., m_i+L_i-1}``, the second copy without its first
    token (the targets the first copy determines)."""
    pos = np.arange(batch.tokens.shape[1])[None, :]
    m = batch.second_start[:, None]
    return (pos >= m + 1) & (pos <= m + batch.length[:, None] - 1)


def loss_positions(batch: CopyBatch, loss: str) -> np.ndarray | None:
    """The target mask of a training loss (:data:`LOSSES`): None for ``"all"``, else
    :func:`copy_positions`."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return None if loss == "all" else copy_positions(batch)


def masked_error(predictions, batch: CopyBatch, *, metric: str = "paper") -> float:
    """``Err_mask`` of §8.2 from next-token predictions.

    predictions : int (n, T); ``predictions[i, t]`` is ``x̂_{i,t} = argmax_a p̂_t(a | x_{i,<t})``
    (column 0 is never used).
    """
    pred = np.asarray(predictions)
    if pred.shape != batch.tokens.shape:
        raise ValueError(f"predictions must have shape {batch.tokens.shape}, got {pred.shape}")
    M = mask(batch, metric=metric)
    return float(np.sum((pred != batch.tokens) & M) / np.sum(M))
