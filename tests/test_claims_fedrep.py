"""FedRep claims at smoke scale, and deliberately broken variants that must make them fail."""
import numpy as np
import pytest

import verify.claims.fedrep  # noqa: F401 - registers the claims
from _broken_variants import fedsgd_quarter_clients, mom_first_batch, repeated_samples
from lowrank_fl.algorithms.fedrep import fedrep
from verify.claim import OMITTED, REGISTRY, Context, Evidence

IDS = [
    "fedrep.sec2_1.population_optima", "fedrep.thm1.linear_rate", "fedrep.thm1.rate_dependence",
    "fedrep.thm1.sample_complexity", "fedrep.lemma1.exact_identities", "fedrep.lemma4.F_scaling",
    "fedrep.fig3.exact_head_value", "fedrep.fig1.collaboration", "fedrep.fig4.new_client",
    "fedrep.thm2.mom_exponent", "fedrep.claim1.no_rip", "fedrep.thm1.participation",
    "fedrep.ext.noise_floor", "fedrep.ext.split_batch", "fedrep.ext.head_steps",
    "fedrep.sec6.exact_references", "fedrep.lemma5.concentration", "fedrep.fig3.random_init",
]


def run(cid, **opts):
    return REGISTRY[cid].run(Context(scale="smoke"), **opts)


@pytest.mark.parametrize("cid", IDS)
def test_claim_runs_at_smoke_and_is_well_formed(cid, tmp_path):
    c = REGISTRY[cid]
    assert c.paper == "fedrep"
    ev = c.run(Context(scale="smoke", out_dir=tmp_path))
    assert isinstance(ev, Evidence) and ev.summary
    assert ev.verdict in ("holds", "inconclusive", "erratum confirmed")
    assert ev.seeds, "seeds must be recorded"
    d = ev.to_dict()
    assert d["verdict"] == ev.verdict
    if ev.figure is not None:
        assert (tmp_path / ev.figure).is_file()


def test_erratum_claim_is_marked():
    assert REGISTRY["fedrep.thm2.mom_exponent"].erratum
    assert run("fedrep.thm2.mom_exponent").verdict == "erratum confirmed"


def test_omitted_claims_have_reasons():
    for oid in ("fedrep.table1.real_data", "fedrep.thm1.probability", "fedrep.thm1.fixed_dataset"):
        assert OMITTED[oid].reason


# ------------------------------------------------------------------ broken variants
def _fedrep_first_k_clients(problem, rounds, step_size, **kw):
    """Broken: the server only ever uses k clients, whatever n is."""
    from lowrank_fl.problems.multitask import MultitaskProblem
    sub = MultitaskProblem(B_star=problem.B_star, heads=problem.heads[:problem.k], noise=problem.noise)
    if kw.get("clients_per_round") is not None:
        kw["clients_per_round"] = min(kw["clients_per_round"], sub.n_clients)
    return fedrep(sub, rounds, step_size, **kw)


def _fedrep_first_k_clients_data(problem, rounds, step_size, **kw):
    """Broken (fixed-dataset version): only the first k clients and their samples are used."""
    from lowrank_fl.problems.multitask import MultitaskProblem
    k = problem.k
    sub = MultitaskProblem(B_star=problem.B_star, heads=problem.heads[:k], noise=problem.noise,
                           X=problem.X[:k], y=problem.y[:k])
    if kw.get("clients_per_round") is not None:
        kw["clients_per_round"] = min(kw["clients_per_round"], sub.n_clients)
    return fedrep(sub, rounds, step_size, **kw)


def _fedrep_tripled_step(problem, rounds, step_size, **kw):
    """Broken: every client's gradient is 3x too large (converges at the theorem's step only)."""
    return fedrep(problem, rounds, 3 * step_size, **kw)


def _fedrep_full_participation(problem, rounds, step_size, *, clients_per_round=None, **kw):
    """Broken: ignores the requested number of clients per round (always all of them)."""
    return fedrep(problem, rounds, step_size, **kw)


@pytest.mark.parametrize("cid, opts", [
    ("fedrep.lemma1.exact_identities", {"round_options": {"head_steps": 1}}),
    ("fedrep.lemma4.F_scaling", {"design": repeated_samples}),                          # dependent samples
    ("fedrep.fig3.exact_head_value", {"fedrep_options": {"head_steps": 1}}),
    ("fedrep.thm2.mom_exponent", {"estimator": mom_first_batch}),                  # ignores data
    ("fedrep.claim1.no_rip", {"design_scale": 1 / np.sqrt(50)}),                        # cov I/d design
    ("fedrep.thm1.participation", {"algorithm": _fedrep_full_participation}),
    ("fedrep.ext.split_batch", {"options": {"head_steps": 1, "head_step_size": 0.01}}),
    ("fedrep.ext.head_steps", {"head_step_size": 3.0}),                                # diverging head GD
])
def test_broken_variant_fails(cid, opts):
    assert run(cid, **opts).verdict == "fails"


# Each variant breaks one checked quantity; the matching flag of `measured` must say so.
FLAGS = [
    # FedSGD trained on a quarter of the clients: its error no longer equals (1/2n) sum ||w_i - wbar||^2
    ("fedrep.sec2_1.population_optima", {"shared_model": fedsgd_quarter_clients},
     {"fedsgd_formula_ok": False, "fedrep_zero_ok": True}),
    ("fedrep.sec2_1.population_optima", {"fedrep_options": {"step_size": 1e-4}}, {"fedrep_zero_ok": False}),
    ("fedrep.thm1.linear_rate", {"options": {"head_steps": 1, "head_step_size": 0.01}},   # starved head
     {"rate_ok": False}),
    ("fedrep.thm1.linear_rate", {"algorithm": _fedrep_tripled_step}, {"rate_ok": True, "eta1_converges": False}),
    ("fedrep.thm1.rate_dependence", {"options": {"head_steps": 1}}, {"bound_ok": False}),
    ("fedrep.thm1.sample_complexity", {"algorithm": _fedrep_first_k_clients}, {"saturation": False}),  # no pooling
    # starved head: the floor is optimization error, not proportional to sigma
    ("fedrep.ext.noise_floor", {"options": {"head_steps": 1, "head_step_size": 0.01}}, {"slope_ok": False}),
    ("fedrep.fig1.collaboration", {"algorithm": _fedrep_first_k_clients_data}, {"beats_local_ok": False}),
    ("fedrep.fig4.new_client", {"head_ridge": 10.0}, {"prediction_ok": False}),          # shrunk heads
    ("fedrep.lemma5.concentration", {"design": repeated_samples}, {"lemma5_m_ok": False, "lemma2_m_ok": False}),
    ("fedrep.fig3.random_init", {"fedrep_options": {"head_steps": 1, "head_step_size": 0.01}},
     {"fraction_ok": False}),
]


@pytest.mark.parametrize("cid, opts, flags", FLAGS, ids=[f"{f[0]}-{'-'.join(f[2])}" for f in FLAGS])
def test_broken_variant_trips_its_flag(cid, opts, flags):
    ev = run(cid, **opts)
    assert ev.verdict == "fails", ev.summary
    for key, value in flags.items():
        assert ev.measured[key] is value, (key, ev.measured[key], ev.summary)


@pytest.mark.parametrize("opts, failed", [
    ({"nuclear_mu": 1.0}, "nuclear"),                                  # a biased reference is caught
    ({"fedrep_options": {"step_size": 1e-4}}, "fedrep_vs_altmin"),      # FedRep not at the ERM
])
def test_exact_references_name_the_failing_check(opts, failed):
    ev = run("fedrep.sec6.exact_references", **opts)
    assert ev.verdict == "fails" and failed in ev.measured["failed_checks"]


def test_no_global_backend_switch(monkeypatch):
    # claims must not call matplotlib.use (the report code owns the backend)
    import matplotlib
    calls = []
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: calls.append(a))
    run("fedrep.thm1.rate_dependence")
    assert calls == []
