"""FedRep claims at smoke scale, and deliberately broken variants that must make them fail."""
import numpy as np
import pytest

import verify.claims.fedrep as cf
from lowrank_fl.algorithms.fedrep import fedrep
from verify.claim import OMITTED, REGISTRY, Context, Evidence

IDS = [
    "fedrep.sec2_1.population_optima", "fedrep.thm1.linear_rate", "fedrep.thm1.rate_dependence",
    "fedrep.thm1.sample_complexity", "fedrep.lemma1.exact_identities", "fedrep.lemma4.F_scaling",
    "fedrep.fig3.exact_head_value", "fedrep.fig1.collaboration", "fedrep.fig4.new_client",
    "fedrep.thm2.mom_exponent", "fedrep.claim1.no_rip", "fedrep.thm1.participation",
    "fedrep.ext.noise_floor", "fedrep.ext.split_batch", "fedrep.ext.head_steps",
    "fedrep.sec6.exact_references",
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
    for oid in ("fedrep.table1.real_data", "fedrep.thm1.probability"):
        assert OMITTED[oid].reason


# ------------------------------------------------------------------ broken variants
def _fedrep_first_k_clients(problem, rounds, step_size, **kw):
    """Broken: the server only ever uses k clients, whatever n is."""
    from lowrank_fl.problems.multitask import MultitaskProblem
    sub = MultitaskProblem(B_star=problem.B_star, heads=problem.heads[:problem.k], noise=problem.noise)
    return fedrep(sub, rounds, step_size, **kw)


def _fedrep_full_participation(problem, rounds, step_size, *, participation=1.0, **kw):
    """Broken: ignores the requested participation rate."""
    return fedrep(problem, rounds, step_size, participation=1.0, **kw)


@pytest.mark.parametrize("cid, opts", [
    ("fedrep.sec2_1.population_optima", {"fedrep_options": {"step_size": 1e-4}}),     # wrong step
    ("fedrep.thm1.linear_rate", {"options": {"head_steps": 1, "head_step_size": 0.01}}),  # starved head
    ("fedrep.thm1.rate_dependence", {"options": {"head_steps": 1}}),
    ("fedrep.thm1.sample_complexity", {"algorithm": _fedrep_first_k_clients}),         # no pooling
    ("fedrep.lemma1.exact_identities", {"round_options": {"head_steps": 1}}),
    ("fedrep.lemma4.F_scaling", {"design": "repeated"}),                               # dependent samples
    ("fedrep.fig3.exact_head_value", {"fedrep_options": {"head_steps": 1}}),
    ("fedrep.fig1.collaboration", {"fedrep_options": {"step_size": 1e-4}}),
    ("fedrep.fig4.new_client", {"fedrep_options": {"step_size": 1e-4}}),
    ("fedrep.thm2.mom_exponent", {"estimator": cf._mom_first_batch}),                  # ignores data
    ("fedrep.claim1.no_rip", {"design_scale": 1 / np.sqrt(50)}),                        # cov I/d design
    ("fedrep.thm1.participation", {"algorithm": _fedrep_full_participation}),
    ("fedrep.ext.split_batch", {"options": {"head_steps": 1, "head_step_size": 0.01}}),
    ("fedrep.ext.head_steps", {"head_step_size": 3.0}),                                # diverging head GD
    ("fedrep.sec6.exact_references", {"fedrep_options": {"step_size": 1e-4}}),
])
def test_broken_variant_fails(cid, opts):
    assert run(cid, **opts).verdict == "fails"
