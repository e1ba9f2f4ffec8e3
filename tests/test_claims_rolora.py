import numpy as np
import pytest

import verify.claims.rolora  # noqa: F401  (registers the rolora claims)
import verify.claims.rolora._rates as R
from lowrank_fl.algorithms.lora_aggregation import fedavg_factors
from lowrank_fl.algorithms.rolora import fedavg_lora, ffa_lora, rolora
from lowrank_fl.exact.rolora import local_b_solve
from lowrank_fl.problems.lora import random_unit
from verify.claim import REGISTRY, VERDICTS, Context, Evidence
from verify.conditions import Condition
from verify.conditions.rolora import evaluate, generate

IDS = sorted(k for k in REGISTRY if k.startswith("rolora.") and not k.startswith("rolora.sec5_2."))
EXPECTED = {"rolora.lemma5_3.step_size_bound": "erratum confirmed"}


def run(cid, **opts):
    return REGISTRY[cid].run(Context(scale="smoke"), **opts)


def test_registry_has_the_claims_and_the_omission():
    assert len(IDS) == 14
    assert REGISTRY["rolora.lemma5_3.step_size_bound"].erratum


@pytest.mark.parametrize("cid", IDS)
def test_claim_smoke(cid):
    ev = run(cid)
    assert isinstance(ev, Evidence) and ev.verdict in VERDICTS
    assert ev.verdict == EXPECTED.get(cid, "holds"), ev.summary
    assert ev.summary and ev.seeds and ev.measured
    ev.to_dict()                                      # JSON-able


# ------------------------------------------------------------------------------ broken variants
def _biased_cross_cov(A, B):
    n = A.shape[0]
    return np.einsum("kor,kri->oi", B - B.mean(0), A - A.mean(0)) / (n - 1)


def _ffa_that_moves_a(prob, rounds, step_size=None, *, init, seed=None, local="argmin", local_steps=1):
    return rolora(prob, rounds, "corrected", init=init, seed=seed)


def _one_client_estimator(X, Y, a0):
    return local_b_solve(X[:, 0], Y[:, 0], a0)


def _double_step(prob, rounds, eta, **kw):
    return rolora(prob, rounds, 2 * eta, **kw)


def _quadruple_step(prob, rounds, eta, **kw):
    return rolora(prob, rounds, 4 * eta, **kw)


def _b_step_over_m(X, Y, a):
    Xa = X @ a
    return np.einsum("nmd,nm->nd", Y, Xa) / X.shape[1]


def _half_gradient(prob, a, b, X, Y):
    return 0.5 * R._grad_full(prob, a, b, X, Y)


def _frozen(prob, rounds, step, *, init, seed=None):
    return ffa_lora(prob, rounds, init=init, seed=seed)


def _normalized_fedavg(prob, rounds, eta, **kw):
    return fedavg_lora(prob, rounds, eta, normalize=True, **kw)


def _not_equivariant(prob, rounds, eta, *, init, **kw):
    e1 = np.zeros(prob.d)
    e1[0] = 0.3
    return rolora(prob, rounds, eta, init=init + e1, **kw)


def _biased_init(prob, rng):
    g = prob.a_star + random_unit(prob.d, rng)
    return g / np.linalg.norm(g)


BROKEN = [
    ("rolora.eq1_2.interference_identity", {"cross_cov": _biased_cross_cov}),
    ("rolora.eq3_4.aggregation_exact", {"method": "fedavg"}),
    ("rolora.sec3_2.eckart_young", {"server": fedavg_factors}),
    ("rolora.propA17.ffa_floor", {"algorithm": _ffa_that_moves_a}),
    ("rolora.prop5_5.ffa_expected_loss", {"estimator": _one_client_estimator}),
    ("rolora.thmA14.population_rate", {"algorithm": _double_step}),
    ("rolora.thm5_4.finite_sample_rate", {"algorithm": _quadruple_step}),
    ("rolora.lemma5_3.step_size_bound", {"step_variant": "corrected"}),
    ("rolora.lemmaA9.b_step_concentration", {"b_step": _b_step_over_m}),
    ("rolora.eq49.expected_gradient", {"gradient": _half_gradient}),
    ("rolora.prop5_5.rolora_beats_ffa", {"algorithm": _frozen}),
    ("rolora.sec3_2.fedavg_lora_toy", {"algorithm": _normalized_fedavg}),
    ("rolora.sec5.invariance", {"algorithm": _not_equivariant}),
    ("rolora.sec3_7.random_init_ffa", {"init": _biased_init}),
]


def test_every_claim_has_a_broken_variant():
    assert sorted(cid for cid, _ in BROKEN) == IDS


@pytest.mark.parametrize("cid, opts", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_variant_fails(cid, opts):
    assert run(cid, **opts).verdict == "fails"


# ---------------------------------------------- Theorem A.14: one broken variant per sub-criterion
def _manual_rolora(prob, rounds, eta, *, init, seed=None, sign=1.0, per_client_b=False):
    """Population Algorithm 2 written out (a reference for the variants below): b-step (249), a-step
    on the averaged b (251), normalisation. ``sign=-1`` ascends; ``per_client_b`` evaluates each
    client's gradient at its own b~_i instead of bbar (heterogeneity leaks into the a-step)."""
    from types import SimpleNamespace

    from lowrank_fl.problems.lora import angle_distance
    a = init / np.linalg.norm(init)
    dist, loss = [], []
    for t in range(rounds + 1):
        b_cl = prob.b_star * (prob.a_star @ a)                    # (N, d), ||a|| = 1
        b_bar = b_cl.mean(axis=0)
        dist.append(angle_distance(a, prob.a_star))
        loss.append(prob.population_loss(a, b_bar))
        if t == rounds:
            break
        B = b_cl if per_client_b else np.broadcast_to(b_bar, b_cl.shape)
        g = 2 * (a * np.mean(np.sum(B * B, axis=1)) - prob.a_star * np.mean(np.sum(prob.b_star * B, axis=1)))
        a = a - sign * eta * g
        a = a / np.linalg.norm(a)
    return SimpleNamespace(distance=np.array(dist), loss=np.array(loss), status="completed")


def _tenth_step(prob, rounds, eta, **kw):
    return rolora(prob, rounds, eta / 10, **kw)


def _slightly_larger_step(prob, rounds, eta, **kw):
    return rolora(prob, rounds, 1.01 * eta, **kw)


def _iterate_loss(prob, rounds, eta, **kw):
    from dataclasses import replace
    tr = rolora(prob, rounds, eta, **kw)
    return replace(tr, loss=tr.extra["iterate_loss"])      # scores (a^t, b^t) instead of (a^t, b^{t+1})


def _ascent(prob, rounds, eta, **kw):
    return _manual_rolora(prob, rounds, eta, sign=-1.0, **kw)


def _per_client_b(prob, rounds, eta, **kw):
    return _manual_rolora(prob, rounds, eta, per_client_b=True, **kw)


def test_manual_reference_is_rolora():
    from lowrank_fl.problems.lora import init_at_angle, rank_one_lora
    prob = rank_one_lora(d=8, n_clients=4, gamma=0.6, seed=0)
    a0 = init_at_angle(prob.a_star, 0.8, seed=1)
    ref, man = rolora(prob, 10, 0.3 / prob.L_max ** 2, init=a0), _manual_rolora(prob, 10, 0.3 / prob.L_max ** 2, init=a0)
    # same arithmetic up to the order of a few O(1) sums
    np.testing.assert_allclose(man.distance, ref.distance, atol=1e-13)
    np.testing.assert_allclose(man.loss, ref.loss, rtol=1e-12)


@pytest.mark.parametrize("algorithm, flags", [
    (_ascent, ("monotone",)),
    (_tenth_step, ("bound", "T_bound")),
    (_slightly_larger_step, ("recursion",)),
    (_iterate_loss, ("loss_identity",)),
    (_per_client_b, ("gamma_free",)),
])
def test_population_rate_each_criterion_can_fail(algorithm, flags):
    ev = run("rolora.thmA14.population_rate", algorithm=algorithm)
    assert ev.verdict == "fails"
    for flag in flags:
        assert ev.measured["checks"][flag] is False, (flag, ev.summary)


# ------------------------------------------------------------------------------ conditions
def test_conditions_generate_and_evaluate():
    inst = generate(seed=1, d=10, n_clients=4, gamma=0.5, delta0=0.6, samples_per_client=30)
    assert inst["a_star"].shape == (10,) and inst["b_star"].shape == (4, 10)
    conds = evaluate(inst)
    assert all(isinstance(c, Condition) for c in conds)
    by = {c.name: c for c in conds}
    assert by["delta_0"].value == pytest.approx(0.6, abs=1e-12) and by["delta_0"].holds is True
    assert by["gamma"].value == pytest.approx(0.5, rel=1e-12)
    L = np.linalg.norm(inst["b_star"].mean(0))
    assert by["step bound (paper) 1/L_max^2"].value == pytest.approx(1 / L ** 2)
    assert by["step bound (corrected) 1/(2 L_max^2)"].holds is True       # default step is the corrected bound
    floor = by["FFA population loss gamma^2 + ||bbar*||^2 delta0^2"].value
    assert floor == pytest.approx(0.25 + L ** 2 * 0.36, rel=1e-12)
    assert by["homogeneous (all b_i* equal)"].holds is False


def test_conditions_flag_the_paper_step_as_outside_the_corrected_bound():
    inst = generate(seed=2, d=8, n_clients=3, delta0=0.5)
    inst["step_size"] = 1.0 / np.linalg.norm(inst["b_star"].mean(0)) ** 2
    by = {c.name: c for c in evaluate(inst)}
    assert by["step bound (paper) 1/L_max^2"].holds is True
    assert by["step bound (corrected) 1/(2 L_max^2)"].holds is False
    assert by["homogeneous (all b_i* equal)"].holds is True


def test_conditions_errors():
    with pytest.raises(TypeError, match="instance must be a mapping"):
        evaluate([1, 2])
    with pytest.raises(ValueError, match="instance is missing"):
        evaluate({"a_star": np.ones(3)})
    inst = generate(seed=0, d=5, n_clients=2)
    with pytest.raises(ValueError, match=r"b_star must have shape \(N, 5\)"):
        evaluate({**inst, "b_star": np.ones((2, 4))})


def _quadruple_step_at_large_m(prob, rounds, eta, **kw):
    """Broken where the theorem should hold best: a 4x step when m > d, the paper's step otherwise."""
    return rolora(prob, rounds, 4 * eta if prob.samples_per_client > prob.d else eta, **kw)


def test_finite_sample_m_sweep_is_judged():
    ok = run("rolora.thm5_4.finite_sample_rate")
    assert ok.measured["m_sweep"]["failures_concentrate_at_small_m"] is True
    bad = run("rolora.thm5_4.finite_sample_rate", algorithm=_quadruple_step_at_large_m)
    assert bad.verdict == "fails"
    assert bad.measured["m_sweep"]["failures_concentrate_at_small_m"] is False


def test_step_size_erratum_judges_the_finite_sample_stall():
    ev = run("rolora.lemma5_3.step_size_bound")
    assert ev.measured["finite_sample_stall"] is True
    bad = run("rolora.lemma5_3.step_size_bound", step_variant="corrected")
    assert bad.verdict == "fails" and bad.measured["finite_sample_stall"] is False


@pytest.mark.parametrize("kw, match", [
    (dict(step_size=-0.1), "step_size must be finite and > 0"),
    (dict(step_size=float("nan")), "step_size must be finite and > 0"),
    (dict(eps=0.0), "eps must be finite and > 0"),
])
def test_conditions_validate_scalars(kw, match):
    with pytest.raises(ValueError, match=match):
        generate(seed=0, d=5, n_clients=2, **kw)
    inst = generate(seed=0, d=5, n_clients=2)
    if "step_size" in kw and not np.isnan(kw["step_size"]):
        with pytest.raises(ValueError, match=match):
            evaluate({**inst, **kw})
    if "eps" in kw:
        with pytest.raises(ValueError, match=match):
            evaluate({**inst, **kw})
