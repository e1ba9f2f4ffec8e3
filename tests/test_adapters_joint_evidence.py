"""The joint evidence (direction and size together) reads "agrees less" only against a material
shared direction: a benign client that trained harder, in a federation whose updates share little,
is larger and agrees less for one reason (it fitted more of its own noise). Where a direction is
shared it still holds for such clients, so it is reported wherever it holds and flags only a client that
carries at most a quarter of the typical agreement (``JOINT_AGREEMENT``; ``joint_flag=True``: 1/ρ)."""
import numpy as np
import pytest

from lowrank_fl.adapters.detect import pooled_scores
from lowrank_fl.adapters.detect_updates import JOINT_AGREEMENT, SHARED_FLOOR, joint_cutoff, update_evidence
from lowrank_fl.clair import pairs

HARD = (3, 7)


def _updates(seed, shared, K=20, modules=8, d=400, hard_noise=2.5):
    """(modules, K, d) vectorised updates: each ``shared`` times one unit direction per module plus
    the client's own noise of unit expected norm; the ``HARD`` clients fitted ``hard_noise`` times
    as much noise (a benign client that trained harder where little is shared)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(modules):
        s = rng.standard_normal(d)
        s /= np.linalg.norm(s)
        scale = np.where(np.isin(np.arange(K), HARD), hard_noise, 1.0)[:, None]
        out.append(shared * s + scale * rng.standard_normal((K, d)) / np.sqrt(d))
    return np.array(out)


def _reference(U):
    """The joint condition from the dense updates, independently of the library's Gram path:
    direction and size scores (the pooled statistic on unit-vector distances; the modified z of
    the mean log norm), agreement ratio, size ratio, and the typical agreement."""
    M, K, _ = U.shape
    P = pairs(K)
    unit = U / np.linalg.norm(U, axis=2, keepdims=True)
    d = np.linalg.norm(unit[:, P[:, 0]] - unit[:, P[:, 1]], axis=2)
    Md, _ = pooled_scores(d, K)
    ell = np.log(np.linalg.norm(U, axis=2)).mean(axis=0)
    mad = 1.4826 * np.median(np.abs(ell - np.median(ell)))
    Ms = (ell - np.median(ell)) / mad
    C = np.einsum("mkd,mjd->mkj", unit, unit)
    per = np.array([[np.median(np.delete(C[m, k], k)) for k in range(K)] for m in range(M)])
    agree = per.mean(axis=0)
    typical = float(np.median(agree))
    cj = joint_cutoff(K)
    old = (np.minimum(Md, Ms) > cj) & (agree / typical <= 1 / 1.2) & (np.exp(ell - np.median(ell)) >= 1.2)
    return old, typical


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_a_harder_trainer_where_little_is_shared_is_not_flagged_by_the_joint_evidence(seed):
    U = _updates(seed, shared=0.25)
    G = np.einsum("mkd,mjd->mkj", U, U)
    ev = update_evidence(G)
    old, typical = _reference(U)
    # what the joint evidence alone flagged before the gate: exactly the two harder trainers
    assert list(np.flatnonzero(old)) == list(HARD)
    assert 0 < typical < SHARED_FLOOR
    assert ev.typical_agreement == pytest.approx(typical, rel=1e-9)
    assert not ev.joint_evidence.any() and not ev.flagged.any()
    assert not update_evidence(G, joint_flag=True).by_joint.any()      # the floor holds whatever the bound


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_where_a_material_direction_is_shared_the_joint_evidence_holds_and_flags_only_on_request(seed):
    """The same two clients against a shared direction of typical agreement above the floor: the
    joint evidence cannot tell them from clients learning another task there and holds for them; it
    is reported, and flags them only with ``joint_flag=True`` (as it did by default before seeds 6500):
    they keep more than a quarter of the typical agreement."""
    U = _updates(seed, shared=0.4)
    G = np.einsum("mkd,mjd->mkj", U, U)
    ev = update_evidence(G)
    old, typical = _reference(U)
    assert typical >= SHARED_FLOOR and ev.typical_agreement == pytest.approx(typical, rel=1e-9)
    assert list(np.flatnonzero(ev.joint_evidence)) == list(np.flatnonzero(old)) == list(HARD)
    assert not ev.by_joint.any() and not ev.joint_flag and ev.joint_agreement == JOINT_AGREEMENT
    on = update_evidence(G, joint_flag=True)
    assert list(np.flatnonzero(on.by_joint)) == list(HARD) and set(HARD) <= set(np.flatnonzero(on.flagged))
    with pytest.raises(TypeError, match="joint_flag"):
        update_evidence(G, joint_flag="yes")


def test_the_sentence_states_the_shared_direction_and_names_the_joint_evidence_unflagged():
    from lowrank_fl.adapters import ModuleOptions, aggregate_factors
    from lowrank_fl.adapters.decision import detection_sentence

    U = _updates(0, shared=0.4, K=10, modules=4, d=12 * 10)
    # as LoRA factors: A = the update reshaped (rank 10 x in 12), B = I (out 10 x rank 10)
    f = {f"c{k}": {f"m{m}": (U[m, k].reshape(10, 12), np.eye(10), 1.0) for m in range(4)} for k in range(10)}
    det = aggregate_factors(f, ModuleOptions(output_dtype="float64")).summary["detection"]
    u = det["updates"]
    assert set(u["joint_evidence"]) == {"c3", "c7"} and u["by_joint"] == []
    # c3 moved 2.3x as far agreeing 0.3 as much: the farther flag's price (README); c7 is named, unflagged
    assert det["flagged"] == ["c3"] and u["by_farther"] == ["c3"]
    text = detection_sentence(det)
    assert f"the typical agreement {u['typical_agreement']:.3f} >= 0.1" in text
    r, z = u["agreement_ratios"]["c7"], u["size_ratios"]["c7"]
    assert (f"; direction and size together hold (both scores above 3.50, agreement at most 0.833) for c7 "
            f"(agreement {r:.2f}x, size {z:.2f}x): not flagged, a flag needs the agreement at most 0.25 of the "
            "typical") in text


def test_the_nothing_detected_sentence_says_the_joint_test_is_off_without_a_shared_direction():
    from lowrank_fl.adapters import ModuleOptions, aggregate_factors
    from lowrank_fl.adapters.decision import detection_sentence

    U = _updates(0, shared=0.25)             # the first test's federation: K = 20, 8 modules, 20 x 20
    f = {f"c{k}": {f"m{m}": (U[m, k].reshape(20, 20), np.eye(20), 1.0) for m in range(8)} for k in range(20)}
    det = aggregate_factors(f, ModuleOptions(output_dtype="float64")).summary["detection"]
    u = det["updates"]
    assert det["flagged"] == [] and u["typical_agreement"] < 0.1
    jn, jv = max(((n, min(v, u["size_scores"][n])) for n, v in u["direction_scores"].items()), key=lambda kv: kv[1])
    assert jv > u["joint_cutoff"]          # above the cutoff, and the sentence says why that flags nobody
    text = detection_sentence(det)
    assert (f"direction and size together {jv:.2f} ({jn}, the smaller of its two scores) / off here, as the next "
            f"test: no material shared direction; when on, both above {u['joint_cutoff']:.2f}, the size 1.2x the "
            f"typical and the agreement at most 0.25 of the typical") in text
    # the last test names its values too: the least agreement, the largest update among those agreeing at
    # most half as much as the typical client (the farther flag's bound, 1/2 < 1/ρ)
    r = u["agreement_ratios"]
    an = min(r, key=r.get)
    fn = max((n for n in r if r[n] <= 0.5), key=lambda n: u["size_ratios"][n])
    assert (f"or 2x as far while agreeing at most 0.5 as much: least agreement "
            f"{r[an] * u['typical_agreement']:.3g} ({an}), "
            f"largest update agreeing that little {u['size_ratios'][fn]:.2f}x ({fn}) / a material") in text
    p = u["shared_direction_p"]
    weak = f"significant, p = {p:.3g}, but below the floor" if p < 0.05 else f"none significant, p = {p:.3g}"
    assert (f"a material shared direction (typical agreement {u['typical_agreement']:.3f} against the floor 0.1, "
            f"off: no material shared direction ({weak}))") in text and len(text) < 1500


def _elsewhere(seed, agree, K=20, modules=8, d=400, scale=1.8):
    """(modules, K, d) updates sharing one unit direction per module (0.6 of a unit update, the rest
    noise); client K - 1 learns another task: ``agree`` of the shared direction, the rest a direction of
    its own, ``scale`` times the size (the trial's case: farther than 1.2x, not yet 2x)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(modules):
        s, o = np.linalg.qr(rng.standard_normal((d, 2)))[0].T
        U = 0.6 * s + 0.8 * rng.standard_normal((K, d)) / np.sqrt(d)
        U[-1] = scale * (agree * s + np.sqrt(1 - agree ** 2) * (0.6 * o + 0.8 * rng.standard_normal(d) / np.sqrt(d)))
        out.append(U)
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_client_elsewhere_at_most_twice_the_size_is_flagged_where_it_carries_little_of_the_shared_direction(seed):
    """A client learning another task, 1.8x the size, carrying 5 % of the shared direction (agreement about
    0.06 of the typical: above 0, so neither the direction nor the opposed flag; below 2x, so not the
    farther flag): the joint evidence flags it (agreement at most 1/4, checked against the dense
    computation of _reference). Carrying 30 % (agreement 0.45-0.52 of the typical, as the benign
    clients that trained harder kept on seeds 6500-6501), the evidence holds but flags nobody; scaled
    up, it is never less flagged."""
    U = _elsewhere(seed, agree=0.05)
    G = np.einsum("mkd,mjd->mkj", U, U)
    ev = update_evidence(G)
    old, typical = _reference(U)
    assert typical >= SHARED_FLOOR and old[-1] and ev.joint_evidence[-1]
    assert 0 < ev.agreement_ratios[-1] <= JOINT_AGREEMENT and ev.size_ratios[-1] < 2
    assert not (ev.by_direction[-1] or ev.by_opposed[-1] or ev.by_farther[-1])
    assert list(np.flatnonzero(ev.flagged)) == [19] and ev.by_joint[-1]
    W = _elsewhere(seed, agree=0.3)
    half = update_evidence(np.einsum("mkd,mjd->mkj", W, W))
    assert _reference(W)[0][-1] and half.joint_evidence[-1] and 0.4 < half.agreement_ratios[-1] < 0.6
    assert not half.flagged.any()
    for c in (1.05, 2.0, 10.0, 1e3):      # 1.05: still under twice the size, flagged by the joint flag itself
        V = U.copy()
        V[:, -1] *= c
        big = update_evidence(np.einsum("mkd,mjd->mkj", V, V))
        assert big.flagged[-1] and big.by_joint[-1] and (c > 1.1 or big.size_ratios[-1] < 2)
