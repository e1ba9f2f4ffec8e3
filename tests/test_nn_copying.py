"""Copying tasks of CLAIR §8/S5: layout, power law, mask and metric (numpy only; the package needs torch)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
from lowrank_fl.nn import copying  # noqa: E402


@pytest.mark.parametrize("kind", ["fuzzy", "clean", "reverse", "shift", "upper"])
def test_second_copy_relates_to_the_first(kind):
    b = copying.sample(200, length=12, kind=kind, seed=0)
    assert b.tokens.shape == (200, copying.T)
    for x, m, L in zip(b.tokens, b.second_start, b.length):
        second = x[m:m + L]
        firsts = [x[s:s + L] for s in range(0, m - L + 1)]
        want = {"fuzzy": lambda f: f, "clean": lambda f: f, "reverse": lambda f: f[::-1],
                "shift": lambda f: (f + 1) % 52,
                "upper": lambda f: np.array([copying.LETTERS.index(copying.LETTERS[a].upper()) for a in f])}[kind]
        assert any(np.array_equal(want(f), second) for f in firsts)
    if kind == "clean":
        assert np.all((b.tokens == copying.PAD).sum(1) == copying.T - 24)
    else:
        assert not np.any(b.tokens == copying.PAD)


def test_fuzzy_layout_uses_distinct_cut_points():
    b = copying.sample(2000, length=16, seed=1)
    assert b.second_start.min() >= 17          # first copy + at least one background token between (distinct cuts)
    assert b.second_start.max() <= copying.T - 16


def test_power_law_frequencies():
    p = copying.power_law(1.1)
    assert p.shape == (52,) and np.isclose(p.sum(), 1) and np.all(np.diff(p) < 0)
    assert np.isclose(p[0] / p[1], 2 ** 1.1)
    b = copying.sample(4000, length=10, exponent=1.1, seed=2)
    freq = np.bincount(b.tokens.ravel(), minlength=53)[:52] / b.tokens.size
    assert np.abs(freq - p).max() < 0.01


def test_mask_and_metric():
    b = copying.sample(50, length=10, seed=3)
    M = copying.mask(b)
    assert np.all(M.sum(1) == 7)               # positions m+3 .. m+L-1
    assert copying.masked_error(b.tokens, b) == 0.0
    wrong = b.tokens.copy()
    i = np.flatnonzero(M[0])[0]
    wrong[0, i] = (wrong[0, i] + 1) % 52
    assert np.isclose(copying.masked_error(wrong, b), 1 / M.sum())
    wrong[~M] = -5                             # positions outside M never count
    assert np.isclose(copying.masked_error(wrong, b), 1 / M.sum())


def test_mixture_and_validation():
    b = copying.sample_mixture(300, lengths=range(5, 16), seed=4)
    assert set(np.unique(b.length)) <= set(range(5, 16)) and len(np.unique(b.length)) > 5
    with pytest.raises(ValueError, match="L < T/2"):
        copying.sample(3, length=32, seed=0)
    with pytest.raises(ValueError, match="kind"):
        copying.sample(3, length=8, kind="nope", seed=0)
    a1 = copying.sample(5, length=8, seed=7).tokens
    assert np.array_equal(a1, copying.sample(5, length=8, seed=7).tokens)


def test_copy_positions_and_loss_choice():
    b = copying.sample(40, length=9, seed=5)
    P = copying.copy_positions(b)
    assert np.all(P.sum(1) == 8) and np.all(P[np.arange(40), b.second_start + 1])
    assert not P[np.arange(40), b.second_start].any()          # the copy's first token is unpredictable
    assert np.all(copying.mask(b) <= P)                        # the metric's positions are trained
    assert copying.loss_positions(b, "all") is None and np.array_equal(copying.loss_positions(b, "copy"), P)
    with pytest.raises(ValueError, match="loss"):
        copying.loss_positions(b, "some")


def test_song_metric_is_the_paper_mask_shifted_by_one():
    b = copying.sample(60, length=10, seed=8)
    paper, song = copying.mask(b), copying.mask(b, metric="song")
    rows = np.arange(60)
    # Song et al.'s code masks inputs m+4 .. m+L-1 and scores the next token: targets m+5 .. m+L
    want = np.zeros_like(song)
    for i, (m, L) in enumerate(zip(b.second_start, b.length)):
        want[i, m + 5:min(m + L + 1, copying.T)] = True
    assert np.array_equal(song, want)
    assert np.all(paper.sum(1) == 7)
    ends_inside = b.second_start + 10 < copying.T
    assert np.all(song.sum(1)[ends_inside] == 6)
    assert np.all(song[rows[ends_inside], (b.second_start + 10)[ends_inside]])   # the token after the copy
    # predictions right on M_i but wrong just after the copy: perfect by §8.2, not by Song's metric
    pred = b.tokens.copy()
    after = b.second_start + 10
    pred[rows[ends_inside], after[ends_inside]] = -1
    assert copying.masked_error(pred, b) == 0.0
    assert np.isclose(copying.masked_error(pred, b, metric="song"),
                      ends_inside.sum() / song.sum())
    with pytest.raises(ValueError, match="metric"):
        copying.mask(b, metric="llm")
