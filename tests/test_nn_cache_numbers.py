"""nn/ (copy placement, "clair-auto" options) and verify/cache.py (``clear`` on foreign
directories): boundary cases with exact expectations."""
from itertools import combinations

import numpy as np
import pytest

from verify.cache import MARKER, clear_cache, mark_cache_dir, store_entry


# --------------------------------------------------------------------------------------------
# cache: clear never deletes a directory that is not a task cache
def test_clear_refuses_a_foreign_directory_with_files_only_in_subfolders(tmp_path):
    docs = tmp_path / "docs"
    (docs / "chapter1").mkdir(parents=True)
    (docs / "chapter1" / "thesis.tex").write_text("precious")
    (docs / "data" / "raw").mkdir(parents=True)
    (docs / "data" / "raw" / "table.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="does not look like a lowrank_fl task cache"):
        clear_cache(docs)
    with pytest.raises(ValueError, match="does not look like"):
        clear_cache(docs, ["chapter1"])
    assert (docs / "chapter1" / "thesis.tex").read_text() == "precious"
    assert (docs / "data" / "raw" / "table.csv").exists()
    # files named like entries are entries only if their content is one
    fake = tmp_path / "fake"
    (fake / "a" / "b").mkdir(parents=True)
    (fake / "a" / "b" / ("1" * 32 + ".npz")).write_bytes(b"my own archive")
    with pytest.raises(ValueError, match="does not look like"):
        clear_cache(fake)
    assert (fake / "a" / "b" / ("1" * 32 + ".npz")).read_bytes() == b"my own archive"


def test_clear_removes_cache_entries_and_counts_them(tmp_path):
    cache = tmp_path / "cache"
    for label, n in (("clair.a", 3), ("fedrep.b", 2)):
        task = cache / label / "task"
        task.mkdir(parents=True)
        for i in range(n):
            store_entry(task / f"{i:032x}.npz", [i], {"label": label})
        (task / "tmpab_12.tmp").write_bytes(b"")
        (task / ".lock").write_bytes(b"")
    # an unmarked directory holding only cache-kind files (in subfolders) is a cache
    assert clear_cache(cache, ["fedrep.b"]) == 2
    assert not (cache / "fedrep.b").exists() and (cache / "clair.a").exists()
    mark_cache_dir(cache)
    (cache / "notes.txt").write_text("kept")          # a marked cache: only entries go
    assert clear_cache(cache) == 3
    assert sorted(p.name for p in cache.iterdir()) == sorted([MARKER, "notes.txt"])
    assert clear_cache(tmp_path / "missing") == 0


# --------------------------------------------------------------------------------------------
# nn.copying: the two cut points are drawn among the n_bg + 1 boundaries, uniformly
torch = pytest.importorskip("torch")
from lowrank_fl.nn import copying  # noqa: E402


@pytest.mark.parametrize("L", [30, 28])
def test_fuzzy_cut_points_cover_every_pair_of_the_n_bg_plus_1_boundaries(L):
    T = copying.T
    n_bg = T - 2 * L
    b = copying.sample(6000, length=L, seed=3)
    second = b.second_start
    # first copy start = cut 0; second copy start = cut 1 + L (the layout of S5)
    starts = np.array([np.flatnonzero([np.array_equal(x[s:s + L], x[m:m + L])
                                       for s in range(0, m - L)])[0] for x, m in
                       zip(b.tokens[:300], b.second_start[:300])])
    assert np.all(starts + L < b.second_start[:300])                # at least one token between
    cuts1 = second - L
    pairs = {(int(a), int(c)) for a, c in zip(starts, cuts1[:300])}
    assert pairs <= set(combinations(range(n_bg + 1), 2))
    # the second copy may end at the last position (cut 1 = n_bg) and begin right after the
    # first background token (cut 1 = 1)
    assert cuts1.max() == n_bg and b.second_start.max() + L == T
    assert cuts1.min() == 1
    # cut 1 = c has probability c / C(n_bg + 1, 2) (c choices of cut 0 below it)
    counts = np.bincount(cuts1, minlength=n_bg + 1)
    expect = 6000 * np.arange(n_bg + 1) / (n_bg * (n_bg + 1) / 2)
    assert counts[0] == 0
    sd = np.sqrt(expect[1:] * (1 - expect[1:] / 6000))
    assert np.all(np.abs(counts[1:] - expect[1:]) <= 5 * sd)


# --------------------------------------------------------------------------------------------
# nn.aggregate: "clair-auto" runs the adapters aggregator with the given alpha and rank
def _one_contaminated(seed=0, K=6, r=2, q=20, p=16):
    from lowrank_fl.adapters.io import ModuleFactors

    rng = np.random.default_rng(seed)
    A0 = np.linalg.qr(rng.standard_normal((p, r)))[0].T
    A = [A0 + 0.01 * rng.standard_normal((r, p)) if k < K - 1 else rng.standard_normal((r, p))
         for k in range(K)]
    B = [rng.standard_normal((q, r)) for _ in range(K)]
    return ModuleFactors(name="m", A=A, B=B, scaling=np.ones(K))


def test_clair_auto_keeps_alpha():
    from lowrank_fl.adapters import ModuleOptions, aggregate_module
    from lowrank_fl.nn.aggregate import aggregate

    f = _one_contaminated()
    W = np.stack([f.delta(k) for k in range(6)])
    truth = np.array([True] * 5 + [False])
    ref = {a: aggregate_module(f, ModuleOptions(rank=2, alpha=a, output_dtype="float64"))
           for a in (0.5, 0.9)}
    assert ref[0.5].benign != ref[0.9].benign               # alpha matters on this module
    for a in (0.5, 0.9):
        agg = aggregate({"m": W}, ["m"], truth, lam_L=1.0, lam_S=1.0, tau=0.0, alpha=a, rank=2,
                        methods=("clair-auto",), factors={"m": f})
        assert list(agg.benign_auto["m"]) == ref[a].benign
        for k in range(6):
            B, A, _ = ref[a].outputs(k)
            np.testing.assert_allclose(agg.deltas["clair-auto"]["m"][k], B @ A, rtol=0,
                                       atol=1e-12 * np.abs(W).max())
