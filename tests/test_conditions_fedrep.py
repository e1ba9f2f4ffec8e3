import math

import numpy as np
import pytest

from verify.conditions import Condition
from verify.conditions.fedrep import evaluate, generate, guaranteed_rate, subset_sigmas


def _by_name(conds):
    return {c.name: c for c in conds}


def test_generate_and_evaluate_full_participation():
    inst = generate(0, d=30, k=2, n=50, m=10)
    assert set(inst) >= {"B_star", "heads", "B0", "m", "r", "eta"}
    conds = evaluate(inst)
    assert all(isinstance(c, Condition) for c in conds)
    c = _by_name(conds)
    s = np.linalg.svd(inst["heads"] / math.sqrt(50), compute_uv=False)
    assert c["sigma_min*"].value == pytest.approx(s[-1]) and c["sigma_max*"].value == pytest.approx(s[0])
    assert c["kappa"].value == pytest.approx(s[0] / s[-1])
    # Assumption 3: sigma_min^2 <= 1 <= sigma_max^2 <= k
    assert s[-1] ** 2 <= 1 + 1e-12 <= s[0] ** 2 + 2e-12 and s[0] ** 2 <= 2
    E0 = c["E0 = 1 - dist^2(B0, B*)"].value
    assert E0 == pytest.approx(1 - c["dist(B0, B*)"].value ** 2)
    assert c["step size eta"].holds is True           # default eta = 1/(4 sigma_max^2)
    rho = c["guaranteed per-round factor sqrt(1 - eta E0 sigma_min*^2/2)"].value
    assert rho == pytest.approx(math.sqrt(1 - inst["eta"] * E0 * s[-1] ** 2 / 2))
    assert c["max | ||w_i*|| - sqrt(k) |"].holds and c["B* orthonormal (max |B*^T B* - I|)"].holds


def test_step_bound_violation_is_reported():
    inst = generate(1, d=20, k=2, n=30, m=10, eta=1.0)
    assert _by_name(evaluate(inst))["step size eta"].holds is False


def test_subset_sigmas_brute_force_matches_loop():
    W = np.random.default_rng(0).standard_normal((7, 2))
    smin, smax, exact = subset_sigmas(W, 3)
    import itertools
    vals = [np.linalg.svd(W[list(I)] / math.sqrt(3), compute_uv=False) for I in itertools.combinations(range(7), 3)]
    assert exact and smin == pytest.approx(min(v[-1] for v in vals)) and smax == pytest.approx(max(v[0] for v in vals))
    # too many subsets: falls back to full-W values, flagged as not exact
    smin2, smax2, exact2 = subset_sigmas(np.random.default_rng(1).standard_normal((60, 2)), 30, max_subsets=10)
    assert not exact2 and smin2 <= smax2


def test_partial_participation_brute_force_and_bracket():
    small = evaluate(generate(0, d=10, k=2, n=10, m=10, r=0.5))
    assert _by_name(small)["sigma_min*"].holds is True
    big = evaluate(generate(0, d=10, k=2, n=100, m=10, r=0.5))
    c = _by_name(big)["sigma_min*"]
    assert c.holds is None and "full-W" in c.note


def test_assumption_failures_are_reported():
    inst = generate(0, d=10, k=2, n=20, m=10)
    inst["heads"] = inst["heads"] * 2.0                # violates ||w_i|| = sqrt(k)
    assert _by_name(evaluate(inst))["max | ||w_i*|| - sqrt(k) |"].holds is False
    inst = generate(0, d=10, k=3, n=20, m=10, r=0.1)   # 2 clients per round < k
    assert _by_name(evaluate(inst))["clients per round rn"].holds is False


def test_guaranteed_rate_formula():
    assert guaranteed_rate(0.25, 1.0, 1.0) == pytest.approx(math.sqrt(1 - 0.125))
    assert guaranteed_rate(10.0, 1.0, 1.0) == 0.0
