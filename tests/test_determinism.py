"""Real claims give bit-identical evidence on the sequential and loky backends, and shared runs
(clair.sec7.table2 reusing clair.sec7.table1's seeds) hit the same cache entries.

loky caps BLAS threads in its workers (``threadpoolctl``), while the sequential backend runs in
the test process with the default thread count: identical evidence shows that the numerical code
(FedRep iterations, CLAIR's FISTA, RoLoRA's alternating steps) does not depend on the BLAS thread
count or on the order in which the tasks finish.
"""
from __future__ import annotations

import json
import warnings

import pytest

import verify.claims.clair  # noqa: F401 - registers the claims
import verify.claims.fedrep  # noqa: F401
import verify.claims.rolora  # noqa: F401
from verify.claim import REGISTRY, Context
from verify.sweep import Sweep

# fast smoke-scale claims that run several tasks each (a single task would run in-process)
REAL_CLAIMS = ("fedrep.thm1.participation", "clair.lemma3.eps_sup", "rolora.thm5_4.finite_sample_rate")


def _fingerprint(evidence) -> str:
    """Every number of the evidence; json keeps floats' shortest round-trip repr (bitwise)."""
    d = evidence.to_dict()
    return json.dumps({k: d[k] for k in ("verdict", "summary", "measured", "predicted", "table", "seeds")},
                      sort_keys=True)


def _run(claim_id, sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return REGISTRY[claim_id].run(Context(scale="smoke", sweep=sweep))


@pytest.fixture(scope="module")
def loky_sweep():
    return Sweep("loky", n_jobs=2)


@pytest.mark.parametrize("claim_id", REAL_CLAIMS)
def test_sequential_and_loky_give_bitwise_identical_evidence(claim_id, loky_sweep):
    sequential = Sweep("sequential")
    ref = _run(claim_id, sequential)
    assert sequential.executed >= 4  # enough tasks for loky to spread them over both workers
    executed = loky_sweep.executed
    other = _run(claim_id, loky_sweep)
    assert loky_sweep.executed - executed == sequential.executed
    assert _fingerprint(other) == _fingerprint(ref)
    assert _fingerprint(_run(claim_id, Sweep("sequential"))) == _fingerprint(ref)  # rerun


def test_table2_reuses_table1_runs_through_the_cache(tmp_path):
    sweep = Sweep(cache_dir=tmp_path)
    t1 = _run("clair.sec7.table1", sweep)
    ran = sweep.executed
    assert ran >= 2 and sweep.reused == 0
    t2 = _run("clair.sec7.table2", sweep)
    # pilot and main runs all served from cache (Table 1 also runs its lambda-sensitivity band)
    assert sweep.executed == ran and 2 <= sweep.reused < ran
    assert set(t2.seeds) < set(t1.seeds)
    # without the cache table2 recomputes exactly the same numbers
    assert _fingerprint(_run("clair.sec7.table2", Sweep())) == _fingerprint(t2)
