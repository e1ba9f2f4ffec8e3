"""The raw-distance statistic (``client_rule="raw"``, and reported beside every rule): the pooled
modified z-score of each client's median distance ``||ΔW_j - ΔW_k||_F`` to the others, against
``c_K`` alone. Pinned against a computation from the dense updates; the two hand-built cases show
what it reads (size as much as direction) against the update rule."""
import json

import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.aggregate import CLIENT_RULES, client_decision
from lowrank_fl.adapters.decision import detection_sentence, raw_comparison
from lowrank_fl.adapters.detect import pooled_threshold, raw_evidence, raw_flags
from lowrank_fl.adapters.detect_updates import update_evidence
from lowrank_fl.cli import main


def _federation(seed, K=10, modules=4, d=120, shared=1.0, noise=0.5):
    """(modules, K, d) vectorised updates: one shared unit direction per module plus each
    client's own noise (expected norm ``noise``): benign clients of one task."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(modules):
        s = rng.standard_normal(d)
        out.append(shared * s / np.linalg.norm(s) + noise * rng.standard_normal((K, d)) / np.sqrt(d))
    return np.array(out)


def _reference(U):
    """The statistic from the dense updates, step by step, without the library's pooling: per
    module each client's median distance to the others, ``(s - median) / (1.4826 MAD)`` across the
    clients, the mean over the modules, and the same standardisation of that mean."""
    M, K, _ = U.shape
    s = np.array([[np.median([np.linalg.norm(U[m, k] - U[m, j]) for j in range(K) if j != k])
                   for k in range(K)] for m in range(M)])

    def z(x):
        med = np.median(x)
        return (x - med) / (1.4826 * np.median(np.abs(x - med)))

    return z(np.mean([z(s[m]) for m in range(M)], axis=0))


def _grams(U):
    return np.einsum("mkd,mjd->mkj", U, U)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_match_the_dense_reference_and_flag_above_c_K_alone(seed):
    U = _federation(seed)
    U[:, 4] *= 3.0                                       # one client far out: a flag at the boundary's far side
    ev = raw_evidence(_grams(U))
    np.testing.assert_allclose(ev.scores, _reference(U), rtol=1e-9, atol=1e-9)
    assert ev.cutoff == pooled_threshold(10) and ev.min_ratio == 0.0
    np.testing.assert_array_equal(ev.flagged, ev.scores > ev.cutoff)
    assert list(np.flatnonzero(ev.flagged)) == [4]


def test_a_scaled_benign_client_is_flagged_by_the_raw_statistic_not_by_the_update_rule():
    """A benign client that trained harder: the same task, 3x the update. The raw statistic reads its
    distance and flags it; the update rule reads direction apart from size (3x is below its 5x floor,
    and it agrees with the others) and keeps it."""
    for seed in range(3):
        U = _federation(seed)
        U[:, 2] *= 3.0
        G = _grams(U)
        assert list(np.flatnonzero(raw_flags(G))) == [2]
        ev = update_evidence(G)
        assert ev.size_ratios[2] == pytest.approx(3.0, rel=0.15) and not ev.flagged.any()


def _lora_clients(seed, K=8, modules=4, out=24, inp=20, r=3, contaminated=7):
    """LoRA factors from a common init: the benign clients' ``A_k = A + 0.05 E_k`` (one shared row
    space) with their own ``B_k`` (updates as different as their own tasks), the contaminated one
    another ``A`` (another task's row space), every update of about the same size."""
    rng = np.random.default_rng(seed)
    f = {f"c{k}": {} for k in range(K)}
    for m in range(modules):
        A = np.linalg.qr(rng.standard_normal((inp, r)))[0].T
        for k in range(K):
            Ak = (np.linalg.qr(rng.standard_normal((inp, r)))[0].T if k == contaminated
                  else A + 0.05 * rng.standard_normal((r, inp)))
            f[f"c{k}"][f"m{m}"] = (Ak, rng.standard_normal((out, r)), 1.0)
    return f


def test_a_common_init_contamination_of_typical_size_is_missed_by_the_raw_statistic():
    """A client learning another task from the same init, its update of the typical size, among
    benign clients whose own column sides differ as much: its raw distances are no larger than the
    benign pairs', so the raw statistic keeps it; the update rule flags it by its share outside the
    shared row space."""
    for seed in range(4):
        det = aggregate_factors(_lora_clients(seed), ModuleOptions(output_dtype="float64")).summary["detection"]
        assert det["flagged"] == ["c7"] and det["updates"]["by_outside"] == ["c7"]
        assert det["raw_flagged"] == [] and det["raw_scores"]["c7"] < det["raw_threshold"]
        assert 0.8 < det["updates"]["size_ratios"]["c7"] < 1.25


def test_a_clean_federation_flags_nobody():
    for seed in range(5):
        ev = raw_evidence(_grams(_federation(seed)))
        assert not ev.flagged.any() and ev.scores.max() < ev.cutoff


def _factors(U):
    """LoRA factors whose products are the vectorised updates: A = the update as (10, d / 10), B = I."""
    M, K, d = U.shape
    return {f"c{k}": {f"m{m}": (U[m, k].reshape(10, d // 10), np.eye(10), 1.0) for m in range(M)}
            for k in range(K)}


def test_the_summary_reports_it_beside_the_rule_and_applies_it_as_an_option():
    U = _federation(0)
    U[:, 2] *= 3.0
    f = _factors(U)
    default = aggregate_factors(f, ModuleOptions(output_dtype="float64"))
    det = default.summary["detection"]
    names = [f"c{k}" for k in range(10)]
    np.testing.assert_allclose([det["raw_scores"][n] for n in names], _reference(U), rtol=1e-8, atol=1e-8)
    assert det["raw_threshold"] == pooled_threshold(10)
    assert det["rule"] == "updates" and det["flagged"] == [] and det["raw_flagged"] == ["c2"]
    text = raw_comparison(det)
    assert text.startswith("beside it, the raw-distance statistic would flag c2 (score ")
    assert f", each > {pooled_threshold(10):.2f}" in text and "trained harder or less" in text
    assert "; the updates rule flagged none of them;" in text
    assert client_decision(default.aggregation.results, "raw").tolist() == [n != "c2" for n in names]

    raw = aggregate_factors(f, ModuleOptions(output_dtype="float64"), client_rule="raw")
    rdet = raw.summary["detection"]
    assert rdet["rule"] == "raw" and rdet["flagged"] == ["c2"] and rdet["scores"] == rdet["raw_scores"]
    assert rdet["threshold"] == rdet["raw_threshold"] and raw_comparison(rdet) == ""
    sentence = detection_sentence(rdet)
    assert sentence.startswith("flagged c2 by the raw-distance statistic over all modules (score ")
    assert "left out of what the others receive" in sentence
    # what the others receive: c2 is outside the collaborative set
    assert raw.summary["refinement"]["clients"]["c2"]["weight"] == 0
    assert all(raw.summary["refinement"]["clients"][n]["weight"] > 0 for n in names if n != "c2")


def test_nobody_flagged_and_too_few_clients():
    det = aggregate_factors(_factors(_federation(1)), ModuleOptions(output_dtype="float64"),
                            client_rule="raw").summary["detection"]
    name = max(det["raw_scores"], key=det["raw_scores"].get)
    assert detection_sentence(det) == (
        f"no client stands out under the raw-distance statistic: largest score "
        f"{det['raw_scores'][name]:.2f} ({name}) against the cutoff {det['raw_threshold']:.2f}.")
    two = aggregate_factors(_factors(_federation(1, K=2)), ModuleOptions(output_dtype="float64"),
                            client_rule="raw").summary["detection"]
    assert two["raw_scores"] is None and two["flagged"] == [] and raw_comparison(two) == ""
    assert two["scores"] == {"c0": None, "c1": None} and two["threshold"] is None and two["raw_tie"] is None
    assert "fewer than 3 clients" in detection_sentence(two)


def test_tied_scores_are_reported_and_warned():
    """Four identical clients of six: the fallback scale bounds every score below c_6, so even a
    10x client is not flagged; summary, sentence and a warning say so."""
    U = _federation(0, K=6)
    U[:, 1:4] = U[:, :1]
    U[:, 5] *= 10.0
    with pytest.warns(RuntimeWarning, match="raw-distance scores of more than half of the 6 clients tie"):
        det = aggregate_factors(_factors(U), ModuleOptions(output_dtype="float64"),
                                client_rule="raw").summary["detection"]
    assert det["raw_tie"] is True and det["flagged"] == [] and det["raw_scores"]["c5"] < det["raw_threshold"]
    assert detection_sentence(det).endswith("; the scores of most clients tie, so every client that differs gets "
                                            "the same score however little it differs, and nobody is flagged.")
    ev = raw_evidence(_grams(U))
    assert ev.tie and ev.scores.max() < ev.cutoff
    # the reduced path's Grams tie the identical clients exactly, as the dense ones do: the distance
    # between identical updates is the Gram's rounding (about 1e-8 of the norms), read as 0, not a scale
    np.testing.assert_allclose([det["raw_scores"][f"c{k}"] for k in range(6)], ev.scores, atol=1e-9)
    upd = aggregate_factors(_factors(U), ModuleOptions(output_dtype="float64")).summary["detection"]
    assert upd["flagged"] == ["c5"] and max(upd["updates"]["direction_scores"].values()) < 5


def test_a_tie_flags_nobody_even_where_its_bounded_score_exceeds_c_K():
    """Nine identical clients of ten and one 0.1 % larger: the MeanAD fallback gives it K / 1.2533 = 7.98
    above c_10 = 5.91, as it would give a 10x client; a tie decides nothing."""
    for factor in (1.001, 10.0):
        U = np.repeat(_federation(0, K=1), 10, axis=1)
        U[:, 9] *= factor
        ev = raw_evidence(_grams(U))
        assert ev.tie and ev.scores[9] == pytest.approx(10 / 1.2533, rel=1e-3) and ev.scores[9] > ev.cutoff
        assert not ev.flagged.any()


def test_rounding_level_distances_are_zero_and_small_real_ones_are_kept():
    """Identical updates through the Gram: ||a||² + ||b||² - 2<a, b> leaves rounding, read as 0; two
    updates 3e-6 apart (relative) keep their distance (1e-13 of the squared norms is 3e-7 of the norms)."""
    from lowrank_fl.adapters.updates import DISTANCE_ROUNDING, direction_distances, raw_distances

    rng = np.random.default_rng(1)
    a = rng.standard_normal(1000) * 1e3
    for eps, zero in ((0.0, True), (3e-6, False), (1e-7, True)):
        b = a + eps * np.linalg.norm(a) * rng.standard_normal(1000) / np.sqrt(1000)
        G = np.array([[a @ a, a @ b], [a @ b, b @ b]])
        d, exact = raw_distances(G)[0], np.linalg.norm(a - b)
        assert (d == 0) if zero else d == pytest.approx(exact, rel=1e-3)
    assert DISTANCE_ROUNDING == 1e-13
    u = np.array([[1.0, np.cos(1e-5)], [np.cos(1e-5), 1.0]])     # an angle of 1e-5: kept
    assert direction_distances(u)[0] == pytest.approx(1e-5, rel=1e-3)


def test_the_comparison_names_where_the_rule_and_the_statistic_differ():
    det = {"rule": "updates", "flagged": ["b", "c"], "raw_threshold": 5.0, "raw_tie": False,
           "raw_scores": {"a": 7.0, "b": 9.0, "c": 1.0}, "raw_flagged": ["a", "b"]}
    assert raw_comparison(det) == (
        "beside it, the raw-distance statistic would flag a, b (scores a 7.00, b 9.00, each > 5.00); of these "
        "the updates rule did not flag a; it would not flag c, whom the updates rule flagged; it counts size "
        "as much as direction, so a benign client that trained harder or less (a larger or smaller update) "
        "stands out too.")
    det.update(raw_flagged=[], raw_scores={"a": 1.0, "b": 4.999, "c": 2.0})
    assert raw_comparison(det) == ("beside it, the raw-distance statistic flags nobody (largest score 4.999, b, "
                                   "against 5.00); it would not flag b, c, whom the updates rule flagged.")


def test_bad_grams_name_the_argument():
    with pytest.raises(ValueError, match="grams"):
        raw_evidence(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="grams must hold at least one module of at least 2 clients"):
        raw_evidence(np.zeros((0, 5, 5)))
    with pytest.raises(ValueError, match="grams must hold at least one module of at least 2 clients"):
        raw_evidence(np.ones((2, 1, 1)))
    with pytest.raises(ValueError, match="grams"):
        raw_evidence(np.full((1, 3, 3), np.nan))
    assert "raw" in CLIENT_RULES


def test_the_cli_option_and_the_comparison_line(tmp_path, capsys):
    from lowrank_fl.adapters.synthetic import write_synthetic_adapters

    src = write_synthetic_adapters(tmp_path / "in", n_clients=6, n_layers=1, modules=("q_proj", "v_proj"),
                                   shape=(24, 20), rank=3, contaminated=1, dtype="float32", seed=0)
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "o")]) == 0
    lines = capsys.readouterr().out.splitlines()
    det = json.loads((tmp_path / "o" / "summary.json").read_text())["detection"]
    assert raw_comparison(det) in lines
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "o2"), "--client-rule", "raw"]) == 0
    out = capsys.readouterr().out
    det2 = json.loads((tmp_path / "o2" / "summary.json").read_text())["detection"]
    assert det2["rule"] == "raw" and det2["raw_scores"] == det["raw_scores"]
    assert detection_sentence(det2) in out.splitlines() and "beside it" not in out


def test_an_untrained_client_is_named_as_such_not_as_opposed():
    """A client whose update is zero in every module (PEFT's initial state) among clients sharing a
    direction: flagged (it carries none of it), and the sentence says its update is zero, not that it
    opposes the shared direction; ``live_modules`` counts the modules where some update is not zero."""
    from lowrank_fl.adapters.decision import detection_sentence
    U = _federation(3, shared=1.0, noise=0.3)
    U[:, 5] = 0.0
    det = aggregate_factors(_factors(U), ModuleOptions(output_dtype="float64")).summary["detection"]
    u = det["updates"]
    assert u["live_modules"] == 4 and u["zero_modules"]["c5"] == 4 and u["zero_modules"]["c0"] == 0
    assert "c5" in det["flagged"]
    s = detection_sentence(det)
    clause = s[s.index("c5 ("):]
    assert clause.startswith("c5 (its update is zero in every module (an untrained adapter")
    assert "opposed" not in clause.split(");")[0]


@pytest.mark.parametrize("idle", [6, 5, 3])
def test_where_most_clients_are_untrained_the_update_rule_abstains(idle):
    """Six of ten clients untrained (zero updates everywhere): the typical update is zero and every
    trained client is far from it whatever it learned, so the update rule abstains (undecided:
    nobody flagged, every client keeps its own adapter) and says why, naming how many sent nothing.
    With five of ten (not a strict majority) the rule points at the five others and the guard leaves it
    undecided, saying so; with three the rule decides: the client at 8x is flagged by size."""
    from lowrank_fl.adapters.aggregate import client_decision
    from lowrank_fl.adapters.decision import detection_sentence
    from lowrank_fl.adapters.refinement_sentence import refinement_sentence
    U = _federation(4, shared=1.0, noise=0.3)
    U[:, :idle] = 0.0
    U[:, 9] *= 8.0
    f = _factors(U)
    res = aggregate_factors(f, ModuleOptions(output_dtype="float64"))
    det = res.summary["detection"]
    assert det["untrained"] == [f"c{k}" for k in range(idle)]
    s = detection_sentence(det)
    if idle == 6:
        assert det["undecided"] and det["flagged"] == [] and "c9" in det["updates"]["by_size"]
        assert s.startswith("no client flagged: 6 of the 10 clients sent no update (untrained: c0, c1, c2, c3 "
                            "and 2 more), so the typical update is zero"), s
        # the set the outputs apply is the same undecided one (not the zero clients as a "majority")
        assert all(not any(mod["benign_applied"]) for mod in res.summary["modules"].values())
        assert client_decision(res.aggregation.results, "updates").tolist() == [False] * 10
        for n in f:                                      # every output is the client's own update
            for m, (A, B, sc) in f[n].items():
                A2, B2, s2 = res.outputs[n][m]
                assert np.allclose(s2 * B2 @ A2, sc * B @ A, atol=1e-12)
        assert refinement_sentence(res.summary["refinement"]) == (
            "refinement: every client keeps its own adapter: the collaborative set is empty (the detection "
            "could not decide, the sentence above says why).")
        assert "pooled rule" not in s                    # no lead pointing at the trained clients either
    elif idle == 5:
        assert det["undecided"] and det["flagged"] == [] and "sent no update" not in s
        assert s.startswith("no client flagged: the update rule's evidence points at "), s
    else:
        assert not det["undecided"] and "c9" in det["flagged"] and "sent no update" not in s
        assert "training diverged looks alike" in s[s.index("c9 ("):]


def test_identical_clients_tie_on_both_statistics_and_nobody_is_flagged():
    """All module-averaged scores equal (identical updates): a tie for the pooled and the raw statistic
    alike (the documented case), every score 0, nobody flagged."""
    from lowrank_fl.adapters.detect import pooled_evidence, scores_tie
    U = np.repeat(_federation(0)[:, :1], 6, axis=1)              # six identical clients
    ev = raw_evidence(_grams(U))
    assert ev.tie and not ev.flagged.any() and np.all(ev.scores == 0)
    norms = np.zeros((4, 15))                                    # every pair's contrast norm 0
    assert scores_tie(norms, 6) and not pooled_evidence(norms, 6).flagged.any()


def test_shared_direction_p_is_0_for_a_spread_at_rounding_without_scipy_warning():
    """Per-module typical agreements equal up to rounding: Student's t is undefined there (scipy warns of
    catastrophic cancellation); the p-value is that of no spread, 0 for a positive agreement."""
    import warnings
    from lowrank_fl.adapters.detect_updates import _shared_direction_p
    per = np.full((6, 5), 0.8) + 3e-16 * np.arange(6)[:, None]      # std 6e-16: scipy warns here
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _shared_direction_p(per) == 0.0
        assert _shared_direction_p(-per) == 1.0
        assert 0.0 < _shared_direction_p(np.full((6, 5), 0.1) + 0.05 * np.arange(6)[:, None] - 0.2) < 1.0
