"""Closed forms of lowrank_fl.exact.fedavg_ft against simulated FedAvg / D-GD iterates."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.algorithms.fedavg import dgd, fedavg, fedavg_round
from lowrank_fl.exact.fedavg_ft import (complement_closed_form, dgd_invariant_lower_bound,
                                        global_gradient, global_objective, gradient_norm,
                                        head_only_expected_error, head_only_least_squares,
                                        head_statistics, one_round_closed_form, oracle_representation,
                                        population_optimum, proposition1_bounds, theorem2_constants)
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.fedavg_ft import paper_instance, proposition1_instance
from verify.stats import within_mc_error

# Identities of notes C1 are exact algebra; residuals are rounding of O(10) flops on O(1) entries,
# so 1e-12 relative to ||B_t|| (the note's normalization) is the stated pass threshold.
TOL = 1e-12


@pytest.fixture(scope="module")
def state():
    inst = paper_instance(d=15, rank=3, n_clients=10, step_size=0.4, seed=2)
    tr = fedavg(inst.problem, 30, 0.4, local_steps=3, init=inst.init)
    return inst, tr.B, tr.extra["w"]


@pytest.mark.parametrize("clients", [None, [1, 4, 7]])
def test_one_round_closed_form(state, clients):
    inst, B, w = state
    p = inst.problem
    idx = np.arange(10) if clients is None else np.array(clients)
    Bn, wn, path = fedavg_round(B, w, 0.4, local_steps=3, targets=p.theta[idx], return_path=True)
    prior, signal = one_round_closed_form(path["w"][:, :3], p.heads[idx], 0.4)
    assert np.max(np.abs(B @ prior + p.B_star @ signal - Bn)) / np.linalg.norm(B, 2) <= TOL


def test_eq57(state):
    inst, B, w = state
    p = inst.problem
    Bn, _, path = fedavg_round(B, w, 0.4, local_steps=3, targets=p.theta, return_path=True)
    lhs = Bn - p.B_star @ (p.B_star.T @ Bn)
    rhs = complement_closed_form(B, p.B_star, path["w"][:, :3], 0.4)
    assert np.max(np.abs(lhs - rhs)) / np.linalg.norm(B, 2) <= TOL


def test_local_head_and_delta_recursions(state):
    inst, B, w = state
    p = inst.problem
    a = 0.4
    _, _, path = fedavg_round(B, w, a, local_steps=3, targets=p.theta, return_path=True)
    Bp, Wp = path["B"], path["w"]
    for s in range(3):
        Bs, ws = Bp[:, s], Wp[:, s]
        Delta = np.eye(3) - a * np.einsum("mdk,mdl->mkl", Bs, Bs)
        # C1(c): w_{s+1} = Delta_s w_s + alpha B_s^T B* w_i*
        pred = np.einsum("mkl,ml->mk", Delta, ws) + a * np.einsum("mdk,md->mk", Bs, p.theta)
        assert np.max(np.abs(pred - Wp[:, s + 1])) <= TOL
        # C1(d): Delta_{s+1} = Delta + a^2 B^T G + a^2 G^T B - a^3 G^T G with G = e w^T
        e = np.einsum("mdk,mk->md", Bs, ws) - p.theta
        G = np.einsum("md,mk->mdk", e, ws)
        BtG = np.einsum("mdk,mdl->mkl", Bs, G)
        pred = Delta + a**2 * BtG + a**2 * np.swapaxes(BtG, 1, 2) - a**3 * np.einsum("mdk,mdl->mkl", G, G)
        nxt = np.eye(3) - a * np.einsum("mdk,mdl->mkl", Bp[:, s + 1], Bp[:, s + 1])
        assert np.max(np.abs(pred - nxt)) <= TOL


def test_eq28_global_with_corrected_sign(state):
    inst, B, w = state
    a = 0.4
    Bn, _, _ = fedavg_round(B, w, a, local_steps=3, targets=inst.problem.theta)
    G = (B - Bn) / a            # Table 1 prints (B_{t+1} - B_t)/alpha: a sign typo (notes 3.9)
    D, Dn = np.eye(3) - a * B.T @ B, np.eye(3) - a * Bn.T @ Bn
    assert np.max(np.abs(D + a**2 * B.T @ G + a**2 * G.T @ B - a**3 * G.T @ G - Dn)) <= TOL
    Gp = -G
    assert np.max(np.abs(D + a**2 * B.T @ Gp + a**2 * Gp.T @ B - a**3 * Gp.T @ Gp - Dn)) > 1e-6


@settings(max_examples=30, deadline=None)
@given(d=st.integers(3, 8), k=st.integers(1, 2), M=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_objective_closed_form_and_optimum(d, k, M, seed):
    rng = np.random.default_rng(seed)
    Bs = np.linalg.qr(rng.standard_normal((d, k)))[0]
    W = rng.standard_normal((M, k))
    B, w = rng.standard_normal((d, k)), rng.standard_normal(k)
    direct = global_objective(B, w, Bs, W)
    assert np.isclose(direct, global_objective(B, w, Bs, W, closed_form=True), rtol=1e-12, atol=1e-12)
    target, gamma2 = population_optimum(Bs, W)
    assert np.isclose(gamma2, head_statistics(W).gamma2, rtol=1e-12, atol=1e-14)
    # a minimizer: B = [target/||target|| , ...], w = ||target|| e_1
    if np.linalg.norm(target) > 1e-8:
        Bm = B.copy()
        Bm[:, 0] = target / np.linalg.norm(target)
        wm = np.zeros(k)
        wm[0] = np.linalg.norm(target)
        assert np.isclose(global_objective(Bm, wm, Bs, W), gamma2, rtol=1e-10, atol=1e-12)
        assert gradient_norm(Bm, wm, Bs, W) <= 1e-10 * (1 + np.linalg.norm(target))
    assert direct >= gamma2 - 1e-10


def test_global_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    Bs = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    W = rng.standard_normal((5, 2))
    B, w = rng.standard_normal((6, 2)), rng.standard_normal(2)
    gB, gw = global_gradient(B, w, Bs, W)
    h = 1e-6   # central differences: error O(h^2) ~ 1e-12 on O(1) values, tolerance 1e-7
    f = lambda B, w: 0.5 * global_objective(B, w, Bs, W)
    E = np.zeros_like(B); E[3, 1] = h
    assert np.isclose((f(B + E, w) - f(B - E, w)) / (2 * h), gB[3, 1], atol=1e-7)
    e = np.zeros(2); e[0] = h
    assert np.isclose((f(B, w + e) - f(B, w - e)) / (2 * h), gw[0], atol=1e-7)


def test_head_statistics_by_hand():
    W = np.array([[3.0, 0.0], [0.0, 3.0], [-3.0, 0.0], [0.0, -3.0]])
    s = head_statistics(W)
    assert np.allclose(s.mean, 0) and np.isclose(s.L_max, 3.0) and np.isclose(s.mu, np.sqrt(4.5))
    assert np.isclose(s.gamma2, 9.0) and np.isclose(s.kappa_max, 3 / np.sqrt(4.5))
    assert np.isclose(s.second_moment_min, 4.5)
    # H^4 = mean_i ||w_i w_i^T - 4.5 I||^2 = 4.5^2
    assert np.isclose(s.H, np.sqrt(4.5))
    same = head_statistics(np.ones((4, 2)))
    assert same.mu == 0 and same.kappa_max == np.inf


def test_dgd_invariant_lower_bound_holds_along_run():
    inst = paper_instance(d=20, rank=3, n_clients=10, step_size=0.4, seed=5)
    p = inst.problem
    lb = dgd_invariant_lower_bound(inst.B0, p.B_star, p.heads)
    tr = dgd(p, 300, 0.4, init=inst.init)
    assert 0 < lb < 1 and np.min(tr.distance) >= lb - 1e-10
    # FedAvg (tau = 2) is not confined to S and goes below it
    assert fedavg(p, 300, 0.4, local_steps=2, init=inst.init).distance[-1] < lb - 0.1


def test_invariant_bound_on_prop1_instance_is_delta0():
    inst = proposition1_instance(d=12, rank=3, n_clients=6, delta0=0.3, seed=0)
    assert np.isclose(dgd_invariant_lower_bound(inst.B0, inst.problem.B_star, inst.problem.heads),
                      0.3, atol=1e-12)


def test_proposition1_bounds():
    b = proposition1_bounds(0.5)
    assert np.isclose(b["dgd_lower_bound"], 0.35) and np.isclose(b["reflection_distance"], np.sqrt(3) / 2)
    with pytest.raises(ValueError, match=r"delta0 must lie in \(0.0, 0.5\]"):
        proposition1_bounds(0.6)


def test_theorem2_constants_formulae():
    W = np.array([[3.0, 0.0], [0.0, 3.0], [-3.0, 0.0], [0.0, -3.0]])
    c = theorem2_constants(W, 0.5, 2, epsilon=1e-3)
    L, kap, mu = 3.0, 3 / np.sqrt(4.5), np.sqrt(4.5)
    a = 0.5 / (4800 * np.sqrt(2) * L * kap**2)
    assert np.isclose(c.step_size_bound, a) and np.isclose(c.step_size, a) and np.isclose(c.E0, 0.75)
    assert np.isclose(c.contraction, 0.04 * a**2 * 2 * mu**2 * 0.75)
    assert np.isclose(c.round_bound, 25 / (a**2 * 2 * mu**2 * 0.75) * np.log(1e3))
    assert np.isclose(c.init_w_bound, a**2.5 * 2 * L**3) and c.participation_bound == 4
    c2 = theorem2_constants(W, 0.5, 2, step_size=0.1)
    assert c2.step_size == 0.1 and c2.contraction > c.contraction


@pytest.mark.parametrize("kw, match", [
    (dict(heads=np.ones((4, 2))), "heads must be diverse"),
    (dict(delta0=1.0), r"delta0 must lie in \[0.0, 1.0\)"),
    (dict(local_steps=0), "local_steps must be >= 1"),
    (dict(epsilon=1.0), "epsilon must lie in"),
    (dict(E0=0.0), "E0 must lie in"),
    (dict(step_size=-1.0), "step_size must be finite and > 0"),
])
def test_theorem2_errors(kw, match):
    args = dict(heads=np.array([[3.0, 0.0], [0.0, 3.0], [-3.0, 0.0], [0.0, -3.0]]), delta0=0.5, local_steps=2)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        theorem2_constants(args.pop("heads"), args.pop("delta0"), args.pop("local_steps"), **args)


def test_head_only_ls_expected_error_monte_carlo():
    rng = np.random.default_rng(0)
    d, k, n, sigma = 8, 2, 12, 0.3
    Bs = np.linalg.qr(rng.standard_normal((d, k)))[0]
    Q = np.linalg.qr(Bs + 0.3 * rng.standard_normal((d, k)))[0]   # a misspecified representation
    beta = Bs @ np.array([1.0, -0.5])
    errs = []
    for _ in range(3000):
        X = rng.standard_normal((n, d))
        y = X @ beta + sigma * rng.standard_normal(n)
        errs.append(np.sum((head_only_least_squares(X, y, Q)[2] - beta) ** 2))
    # Monte Carlo mean within 4 standard errors of the closed form (false alarm < 1e-4)
    ok, mean, se = within_mc_error(errs, head_only_expected_error(Q, beta, sigma, n), n_se=4)
    assert ok, (mean, se)


def test_head_only_errors():
    with pytest.raises(ValueError, match="n must be >= 4"):
        head_only_expected_error(np.eye(5)[:, :2], np.ones(5), 0.1, 3)
    with pytest.raises(ValueError, match=r"B must have shape \(4, \?\)"):
        head_only_least_squares(np.ones((6, 4)), np.ones(6), np.ones((5, 2)))


def test_oracle_representation():
    rng = np.random.default_rng(1)
    Bs = np.linalg.qr(rng.standard_normal((10, 3)))[0]
    assert subspace_distance(Bs, oracle_representation(Bs, rng.standard_normal((6, 3)))) < 1e-12
    with pytest.raises(ValueError, match="heads must span R"):
        oracle_representation(Bs, np.ones((6, 3)))


def test_input_errors():
    rng = np.random.default_rng(1)
    Bs = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    with pytest.raises(ValueError, match=r"heads must have shape \(n_clients, 2\)"):
        population_optimum(Bs, np.ones((4, 3)))
    with pytest.raises(ValueError, match="B_star must have k < d"):
        population_optimum(np.eye(2), np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"w must have shape \(2\)"):
        global_objective(Bs, np.ones(3), Bs, np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"local_w must have shape \(m, tau, 2\)"):
        complement_closed_form(Bs, Bs, np.ones((3, 2, 3)), 0.1)
    with pytest.raises(ValueError, match=r"client_heads must have shape \(3, 2\)"):
        one_round_closed_form(np.ones((3, 2, 2)), np.ones((4, 2)), 0.1)
