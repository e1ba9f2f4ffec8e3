"""The joint evidence (direction and size together) reads "agrees less" only against a material
shared direction: a benign client that trained harder, in a federation whose updates share little,
is larger and agrees less for one reason (it fitted more of its own noise). Where a direction is
shared it still holds for such clients, so it is reported and flags only with ``joint_flag=True``."""
import numpy as np
import pytest

from lowrank_fl.adapters.detect import pooled_scores
from lowrank_fl.adapters.detect_updates import SHARED_FLOOR, joint_cutoff, update_evidence
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
    assert not ev.by_joint.any() and not ev.flagged.any()


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_where_a_material_direction_is_shared_the_joint_evidence_holds_and_flags_only_on_request(seed):
    """The same two clients against a shared direction of typical agreement above the floor: the
    joint evidence cannot tell them from clients learning another task there and holds for them; it
    is reported, and flags them only with ``joint_flag=True`` (as it did by default before seeds 6500)."""
    U = _updates(seed, shared=0.4)
    G = np.einsum("mkd,mjd->mkj", U, U)
    ev = update_evidence(G)
    old, typical = _reference(U)
    assert typical >= SHARED_FLOOR and ev.typical_agreement == pytest.approx(typical, rel=1e-9)
    assert list(np.flatnonzero(ev.joint_evidence)) == list(np.flatnonzero(old)) == list(HARD)
    assert not ev.by_joint.any() and not ev.joint_flag
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
    assert "; direction and size together hold for c7 (reported, not a flag: under uneven training" in text


def test_the_nothing_detected_sentence_says_the_joint_evidence_is_reported_not_a_flag():
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
    assert (f"direction and size together {jv:.2f} ({jn}, the smaller of its two scores) / reported, not a flag "
            f"(with joint_flag=True: both above {u['joint_cutoff']:.2f}, the size 1.2x the typical") in text
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
