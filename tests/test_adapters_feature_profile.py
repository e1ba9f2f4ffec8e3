"""The feature profile (lowrank_fl.adapters.feature_profile), reported beside the update rule and a
flag only on request: the row and column norms against the formed updates, the score against a
loop-by-loop reference, and the flag on hand-built federations (a scaled benign client, a
common-init contamination on other features, a clean federation, a client whose A drifted)."""
import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.decision import detection_sentence
from lowrank_fl.adapters.detect_updates import update_evidence
from lowrank_fl.adapters.feature_profile import (FEATURE_RATIO, RATIO_FLOOR, feature_cutoff, feature_norms,
                                                 feature_scores, live_features, side_scores)
from lowrank_fl.adapters.updates import update_gram

OPTS = ModuleOptions(output_dtype="float64")


def test_feature_norms_are_the_row_and_column_norms_of_the_formed_updates():
    rng = np.random.default_rng(0)
    ranks, q, p = (2, 5, 3, 0), 7, 6
    A = [rng.standard_normal((r, p)) for r in ranks]
    B = [rng.standard_normal((q, r)) for r in ranks]
    s = np.array([0.5, 2.0, 1.0, 1.0])
    rows, cols = feature_norms(A, B, s)
    for k in range(len(ranks)):
        W = s[k] * B[k] @ A[k]                                        # the rank-0 client: all zeros
        np.testing.assert_allclose(rows[k], np.linalg.norm(W, axis=1), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cols[k], np.linalg.norm(W, axis=0), rtol=1e-12, atol=1e-14)
    assert rows.shape == (4, q) and cols.shape == (4, p) and not rows[3].any()
    with pytest.raises(ValueError, match="one entry per client"):
        feature_norms(A, B[:3], s)


def _reference_side(per_module):
    """S_k written out with loops: logs over all live features (a zero at 1e-12 of the lower median
    over the clients of each one's largest feature norm), centred per client, minus the median
    client per feature, one MAD scale over everything."""
    feats = []
    for v in per_module:
        top = v.max()
        largest = sorted(max(v[k]) for k in range(v.shape[0]))
        ref = largest[(v.shape[0] - 1) // 2] or top
        for f in range(v.shape[1]):
            col = np.maximum(v[:, f], 1e-12 * ref)
            if np.mean(v[:, f] <= 1e-12 * ref) < 0.5:
                feats.append(np.log(col / top))
    L = np.array(feats)                                               # (features, K)
    K = L.shape[1]
    p = np.array([[L[f, k] - np.mean(L[:, k]) for k in range(K)] for f in range(L.shape[0])])
    r = np.array([[p[f, k] - np.median(p[f]) for k in range(K)] for f in range(L.shape[0])])
    s = 1.482602218505602 * np.median(np.abs(r).ravel())
    return np.array([np.mean((r[:, k] / s) ** 2) for k in range(K)])


def test_the_score_matches_a_loop_reference_and_ignores_features_most_clients_left_at_zero():
    rng = np.random.default_rng(1)
    rows = [np.exp(rng.standard_normal((6, 5))), np.exp(rng.standard_normal((6, 3)))]
    rows[0][:, 2] = 0.0                                               # a feature nobody trained: left out
    rows[0][:4, 4] = 0.0                                              # most clients at zero: left out
    rows[1][5, 1] = 0.0                                               # one client's zero: at the floor
    cols = [np.exp(rng.standard_normal((6, 4))), np.exp(rng.standard_normal((6, 4)))]
    np.testing.assert_allclose(side_scores(rows), _reference_side(rows), rtol=1e-12)
    S, ratio, _, col_ratio = feature_scores(rows, cols)
    ref, ref_col = _reference_side(rows), _reference_side(cols)
    np.testing.assert_allclose(S, ref, rtol=1e-12)
    np.testing.assert_allclose(ratio, ref / np.median(ref), rtol=1e-12)
    np.testing.assert_allclose(col_ratio, ref_col / np.median(ref_col), rtol=1e-12)
    assert live_features(rows) == 5 + 3 - 2                            # two features left out
    # the floor makes the client with a zero feature stand out on the row side
    assert np.argmax(side_scores(rows)) == 5
    with pytest.raises(ValueError, match="same modules"):
        feature_scores(rows, cols[:1])


def _federation(seed, K=8, M=3, q=24, p=16, r=4, other=(), scale=None):
    """Clients from one LoRA init (A near a shared A0): the benign ones learn a task on output rows
    0-11, the clients in ``other`` one on rows 12-23 (same size); ``scale`` multiplies updates."""
    rng = np.random.default_rng(seed)
    out = {f"c{k}": {} for k in range(K)}
    for m in range(M):
        A0 = rng.standard_normal((r, p)) / np.sqrt(p)
        task, elsewhere = np.zeros((q, r)), np.zeros((q, r))
        task[:12] = rng.standard_normal((12, r))
        elsewhere[12:] = rng.standard_normal((12, r))
        for k in range(K):
            B = (elsewhere if k in other else task) + 0.3 * rng.standard_normal((q, r))
            A = A0 + 0.05 * rng.standard_normal((r, p))
            out[f"c{k}"][f"layer{m}.q_proj"] = (A, (scale or {}).get(k, 1.0) * B, 1.0)
    return out


def _evidence(f, **kw):
    """The update rule's evidence with the feature profile flagging (``feature_flag=True``)."""
    names = sorted(f)
    G, rows, cols = [], [], []
    for m in f[names[0]]:
        A = [f[n][m][0] for n in names]
        B = [f[n][m][2] * f[n][m][1] for n in names]
        G.append(update_gram(np.stack(B), np.stack(A)))
        r, c = feature_norms(A, B, np.ones(len(names)))
        rows.append(r)
        cols.append(c)
    return names, np.array(G), (rows, cols), update_evidence(np.array(G), features=(rows, cols), **kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_client_learning_on_other_features_is_flagged_on_request_and_a_harder_trainer_is_not(seed):
    names, _, _, clean = _evidence(_federation(seed), feature_flag=True)
    assert not clean.by_features.any() and clean.feature_ratios.max() < FEATURE_RATIO
    # a benign client that trained 3x (or 1000x) harder: the profile is scale-free, nothing changes
    for f in (3.0, 1e3):
        _, _, _, ev = _evidence(_federation(seed, scale={3: f}), feature_flag=True)
        assert not ev.by_features.any()
        np.testing.assert_allclose(ev.feature_ratios, clean.feature_ratios, rtol=1e-9)
    _, _, _, ev = _evidence(_federation(seed, other=(7,)), feature_flag=True)
    assert list(np.flatnonzero(ev.by_features)) == [7] and ev.flagged[7]
    assert ev.feature_ratios[7] >= 2.5 * FEATURE_RATIO                  # 8.7-10.3 on these seeds
    # the default reports it and does not flag by it
    _, _, _, off = _evidence(_federation(seed, other=(7,)))
    assert not off.by_features.any() and off.feature_ratios[7] == ev.feature_ratios[7]
    u = aggregate_factors(_federation(seed, other=(7,)), OPTS).summary["detection"]["updates"]
    assert u["feature_ratios"]["c7"] == pytest.approx(ev.feature_ratios[7], rel=1e-12)
    assert "by_features" not in u


def test_the_summary_values_are_the_statistic_on_the_factors_and_the_limit_sentence_names_the_largest():
    f = _federation(4)
    names = sorted(f)
    det = aggregate_factors(f, OPTS).summary["detection"]
    u = det["updates"]
    rows, cols = [], []
    for m in f["c0"]:
        r, c = feature_norms([f[n][m][0] for n in names], [f[n][m][1] for n in names], np.ones(len(names)))
        rows.append(r)
        cols.append(c)
    S, ratio, d, col_ratio = feature_scores(rows, cols)
    assert [u["feature_distances"][n] for n in names] == pytest.approx(d, rel=1e-12)
    assert [u["feature_ratios"][n] for n in names] == pytest.approx(ratio, rel=1e-12)
    assert [u["feature_scores"][n] for n in names] == pytest.approx(S, rel=1e-12)
    assert [u["column_ratios"][n] for n in names] == pytest.approx(col_ratio, rel=1e-12)
    assert det["flagged"] == [] and u["feature_profile_off"] is None
    assert "output features" not in detection_sentence(det)                   # reported, not a test


def test_without_feature_norms_the_rule_is_the_seven_tests_and_bad_feature_lists_are_refused():
    names, G, feats, full = _evidence(_federation(0, other=(7,)), feature_flag=True)
    rows, cols = feats
    bare = update_evidence(G)
    assert bare.feature_ratios is None and not bare.by_features.any()
    assert full.by_features[7] and full.flagged[7]
    assert (full.flagged & ~full.by_features == bare.flagged & ~full.by_features).all()
    with pytest.raises(ValueError, match="features must list the 3 modules"):
        update_evidence(G, features=(rows[:2], cols[:2]))
    with pytest.raises(ValueError, match=r"features must hold \(K, features\) = \(8, features\)"):
        update_evidence(G, features=([r[:6] for r in rows], [c[:6] for c in cols]))
    with pytest.raises(ValueError, match=r"feature norms of module 1 must be \(K, features\) = \(8, "):
        update_evidence(G, features=([rows[0], rows[1][:7], rows[2]], cols))     # K differs in one module
    with pytest.raises(ValueError, match="negative values"):
        update_evidence(G, features=([-rows[0], rows[1], rows[2]], cols))
    with pytest.raises(ValueError, match="features must be a pair"):
        update_evidence(G, features=rows)
    with pytest.raises(TypeError, match="feature_flag must be True or False"):
        update_evidence(G, features=(rows, cols), feature_flag="no")
    # infinite cutoff: the rule flags nobody, the feature profile included
    assert not update_evidence(G, cutoff=np.inf, features=(rows, cols), feature_flag=True).flagged.any()


def _null_max_ratio(K, n_rows, draws, seed):
    """The largest ratio of K exchangeable clients (i.i.d. normal log norms), one federation at a time."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        rows = [np.exp(rng.standard_normal((K, n_rows)))]
        out.append(feature_scores(rows, [np.ones((K, 2))])[1].max())
    return np.array(out)


def test_the_cutoff_is_2_or_the_null_quantile_where_features_are_few():
    # an independent simulation (other seed, the public score on each federation) brackets the floor
    q = feature_cutoff(10, 16)
    sim = _null_max_ratio(10, 16, draws=1500, seed=7)
    assert 2.5 < q < 4.0 and np.mean(sim >= q) == pytest.approx(0.01, abs=0.008)
    assert feature_cutoff(10, 300) == FEATURE_RATIO == 2.0              # many features: 2 binds
    assert np.quantile(_null_max_ratio(10, 128, draws=300, seed=8), 0.99) < 1.8
    assert feature_cutoff(2, 16) == np.inf and feature_cutoff(5, 1) == np.inf



def test_the_feature_profile_is_off_where_the_clients_ranks_differ(tmp_path):
    """A rank-2 update spreads over the input features unlike rank-3 ones by construction: with
    mixed ranks the profile is off (and says so); with equal ranks the same federation reads it."""
    from lowrank_fl.adapters import load_adapters
    from lowrank_fl.adapters.feature_profile import off_reason, results_features
    from lowrank_fl.adapters.synthetic import write_synthetic_adapters

    def summary(ranks, where, contaminated=1):
        src = write_synthetic_adapters(tmp_path / where, n_clients=6, n_layers=2, modules=("q_proj", "v_proj"),
                                       shape=(24, 20), rank=3, ranks=ranks, contaminated=contaminated,
                                       dtype="float32", seed=3)
        res = aggregate_factors(load_adapters(src), OPTS)
        return res, res.summary["detection"]

    res, det = summary([3, 3, 2, 3, 3, 3], "mixed")
    u = det["updates"]
    results = res.aggregation.results
    assert off_reason(results) == "the clients' LoRA ranks differ" and results_features(results) is None
    assert u["feature_ratios"] is None and u["column_ratios"] is None and "client_02" not in det["flagged"]
    assert u["feature_profile_off"] == "the clients' LoRA ranks differ"
    res, det = summary([3] * 6, "equal")
    assert off_reason(res.aggregation.results) is None
    assert set(det["updates"]["feature_ratios"]) == {f"client_{k:02d}" for k in range(6)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_client_whose_lora_a_drifted_from_the_common_init_is_not_flagged(seed):
    """What a larger learning rate does to a benign update besides its size: its A moves away from
    the server's init, which changes how the update spreads over the *input* features (the column
    side, 4.8-6.2 times the typical here) and hardly over the output features the task moves. The
    flag reads the row side; the column side is reported."""
    f = _federation(seed)
    rng = np.random.default_rng(100 + seed)
    f["c3"] = {m: (A + 0.6 * rng.standard_normal(A.shape) / np.sqrt(A.shape[1]), B, s)
               for m, (A, B, s) in f["c3"].items()}
    _, _, _, ev = _evidence(f, feature_flag=True)
    assert ev.column_ratios[3] == ev.column_ratios.max() > 4.0
    assert ev.feature_ratios[3] < FEATURE_RATIO and not ev.by_features.any() and not ev.flagged.any()


def test_among_identical_clients_a_scaled_one_has_ratio_0_and_a_reshaped_one_a_finite_large_one():
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((2, 9)), rng.standard_normal((7, 2))
    rows, cols = feature_norms([A] * 6, [B] * 6, np.array([1, 1, 3, 1, 1, 1.0]))   # client 2 ×3
    S, ratio, d, col = feature_scores([rows], [cols])
    # every residual is rounding (< 1e-12) against the scale's floor 1e-6: scores and ratios far below 1
    assert np.all(np.abs(d) < 1e-12) and np.all(ratio < 1e-6) and np.all(col < 1e-6)
    bumped = rows.copy()
    bumped[4, 0] *= 1.1                                                   # one row of one client, ×1.1
    S, ratio, d, _ = feature_scores([bumped], [cols])
    # its residual log 1.1 · (1 − 1/7) on the bumped row, −log 1.1 / 7 on the others: against s = 1e-6
    r = np.full(7, -np.log(1.1) / 7)
    r[0] += np.log(1.1)
    assert d[4] == pytest.approx(np.sqrt(np.mean(r ** 2)), rel=1e-9)
    assert np.isfinite(ratio[4]) and ratio[4] == pytest.approx(np.mean((r / 1e-6) ** 2) / RATIO_FLOOR, rel=1e-6)


def test_feature_norms_refuse_factors_that_do_not_fit():
    A, B = np.ones((2, 5)), np.ones((4, 2))
    with pytest.raises(ValueError, match=r"client 1: A must be \(r, in\) = \(r, 5\)"):
        feature_norms([A, np.ones((2, 6))], [B, B], np.ones(2))
    with pytest.raises(ValueError, match=r"client 1: .* with the same r"):
        feature_norms([A, A], [B, np.ones((4, 3))], np.ones(2))
    with pytest.raises(ValueError, match=r"A\[1\]"):
        feature_norms([A, np.full((2, 5), np.nan)], [B, B], np.ones(2))
    with pytest.raises(TypeError, match="n_rows must be an integer"):
        feature_cutoff(5, float("nan"))
    with pytest.raises(ValueError, match="n_rows must be >= 0"):
        feature_cutoff(5, -3)
