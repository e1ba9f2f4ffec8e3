import cvxpy as cp
import numpy as np
import pytest

from lowrank_fl.exact.rolora import (angle_loss, c_tilde, expected_gradient_a, ffa_expected_loss,
                                     ffa_lstsq_loss, ffa_matrix_optimum, ffa_population_loss, global_b_solve,
                                     iterations_bound, local_b_solve, population_b, rate_bound_heterogeneous,
                                     rate_bound_homogeneous, reduced_rank_regression, rolora_population_recursion,
                                     step_size_bound, zero_model_loss)
from lowrank_fl.problems.lora import init_at_angle, lora_matrix_problem, rank_one_lora


def test_local_and_global_b_match_numpy_lstsq():
    p = rank_one_lora(d=5, n_clients=3, gamma=0.4, samples_per_client=9, noise=0.2, seed=0)
    a = np.random.default_rng(1).standard_normal(5)
    B = local_b_solve(p.X, p.Y, a)
    for i in range(3):  # reference: lstsq of vec(Y_i) on the design kron(X_i a, I)
        design = np.kron((p.X[i] @ a)[:, None], np.eye(5))
        ref, *_ = np.linalg.lstsq(design, p.Y[i].reshape(-1), rcond=None)
        np.testing.assert_allclose(B[i], ref, rtol=1e-10, atol=1e-12)
    design = np.vstack([np.kron((p.X[i] @ a)[:, None], np.eye(5)) for i in range(3)])
    ref, *_ = np.linalg.lstsq(design, p.Y.reshape(-1), rcond=None)
    np.testing.assert_allclose(global_b_solve(p.X, p.Y, a), ref, rtol=1e-10, atol=1e-12)


def test_population_b_and_ffa_floor_match_lstsq_and_cvxpy():
    p = rank_one_lora(d=4, n_clients=5, gamma=0.6, seed=2)
    a0 = init_at_angle(p.a_star, 0.7, seed=3)
    b_ls, loss_ls = ffa_lstsq_loss(p.a_star, p.b_star, a0)
    # FFA's b (average of local population argmins) is the global LS solution (eq. (276))
    np.testing.assert_allclose(population_b(p.b_star, p.a_star, a0).mean(0), b_ls, atol=1e-12)
    floor = ffa_population_loss(0.6, p.L_max, 0.7)
    assert loss_ls == pytest.approx(floor, rel=1e-10)
    assert p.population_loss(a0, b_ls) == pytest.approx(floor, rel=1e-12)
    # CVXPY (Clarabel, interior point, ~1e-8 accuracy) on the same convex problem
    b = cp.Variable(4)
    obj = sum(cp.sum_squares(np.outer(p.a_star, bi) - a0[:, None] @ cp.reshape(b, (1, 4), order="C"))
              for bi in p.b_star) / 5
    prob = cp.Problem(cp.Minimize(obj))
    prob.solve(solver=cp.CLARABEL)
    assert prob.status == "optimal"
    assert prob.value == pytest.approx(floor, rel=1e-6)


def test_loss_expressions():
    p = rank_one_lora(d=6, n_clients=4, gamma=0.5, seed=4)
    a = init_at_angle(p.a_star, 0.4, seed=5)
    b = p.b_bar * (p.a_star @ a)
    assert p.population_loss(a, b) == pytest.approx(angle_loss(0.5, p.L_max, 0.4), rel=1e-12)
    assert p.population_loss(a, np.zeros(6)) == pytest.approx(zero_model_loss(0.5, p.L_max), rel=1e-12)
    assert angle_loss(0.5, p.L_max, 0.0) == pytest.approx(0.25)


def test_c_tilde_and_ffa_expected_loss():
    # (N(4-m)-2)/(N^2 m(m-2)) at N=3, m=6: (3*(-2)-2)/(9*6*4) = -8/216
    assert c_tilde(3, 6) == pytest.approx(-8 / 216, rel=1e-14)
    assert ffa_expected_loss(0.6, 2.0, 3, 6) == pytest.approx((1 - 8 / 216) * 4 * 0.36, rel=1e-14)
    with pytest.raises(ValueError, match="m must be >= 3"):
        c_tilde(3, 2)


def test_expected_gradient_formula_at_truth_is_zero():
    a = np.array([1.0, 0.0, 0.0])
    b = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(expected_gradient_a(a, b, a, b), 0.0, atol=1e-15)


def test_recursion_one_step_recovery_and_limits():
    s, d0 = 2.0, 0.6
    c2 = 1 - d0 ** 2
    # eta = 1/(2 c0^2 s) kills the component of a^+ orthogonal to a* (one-step population recovery)
    assert rolora_population_recursion(d0, s, 1 / (2 * c2 * s), 1)[1] == pytest.approx(0.0, abs=1e-15)
    traj = rolora_population_recursion(d0, s, 1 / (4 * s), 60)
    ratio = traj[-1] / traj[-2]
    assert ratio == pytest.approx(0.5, rel=1e-6)           # -> |1 - 2 eta s| = 1/2


def test_step_bounds_rates_and_iteration_counts():
    assert step_size_bound(2.0) == pytest.approx(0.25)
    assert step_size_bound(2.0, variant="corrected") == pytest.approx(0.125)
    assert step_size_bound(2.0, setting="heterogeneous", variant="paper") == pytest.approx(0.125)
    assert rate_bound_homogeneous(0.25, 0.5, 1.0) == pytest.approx(np.sqrt(1 - 0.25 * 0.75))
    assert np.isnan(rate_bound_homogeneous(10.0, 0.0, 1.0))
    assert rate_bound_heterogeneous(0.25, 0.5, 1.0) == pytest.approx(1 - 0.5 * 0.75)
    assert iterations_bound(0.5, 0.5, 1e-3) == pytest.approx(2 / (0.5 * 0.75) * np.log(500))
    assert iterations_bound(0.5, 0.5, 1e-3, setting="heterogeneous") == pytest.approx(1 / (0.5 * 0.75) * np.log(500))
    with pytest.raises(ValueError, match="setting must be one of"):
        step_size_bound(1.0, setting="other")
    with pytest.raises(ValueError, match="variant must be one of"):
        step_size_bound(1.0, variant="x")
    with pytest.raises(ValueError, match="L_max must be finite and > 0"):
        step_size_bound(0.0)
    with pytest.raises(ValueError, match="c must lie in"):
        iterations_bound(1.5, 0.5, 1e-3)
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        rolora_population_recursion(0.5, 1.0, 0.0, 3)


@pytest.mark.parametrize("call, match", [
    (lambda: local_b_solve(np.zeros((2, 3, 4)), np.zeros((2, 3, 5)), np.ones(4)), r"Y must have shape \(2, 3, 4\)"),
    (lambda: local_b_solve(np.ones((2, 3, 4)), np.ones((2, 3, 4)), np.ones(3)), r"a must have shape \(4\)"),
    (lambda: local_b_solve(np.ones((2, 3)), np.ones((2, 3)), np.ones(3)), "X must have 3 dimensions"),
    (lambda: local_b_solve(np.r_[np.ones((1, 3, 4)), np.zeros((1, 3, 4))], np.ones((2, 3, 4)), np.ones(4)),
     r"X_i a must be non-zero for every client .* clients \[1\]"),
    (lambda: global_b_solve(np.zeros((2, 3, 4)), np.ones((2, 3, 4)), np.ones(4)), "X a must be non-zero"),
    (lambda: population_b(np.ones((2, 3)), np.ones(3), np.zeros(3)), "a must be non-zero"),
    (lambda: population_b(np.ones((2, 3)), np.ones(4), np.ones(3)), r"a_star must have shape \(3\)"),
    (lambda: expected_gradient_a(np.ones(3), np.ones(2), np.ones(3), np.ones(3)), r"b_bar must have shape \(3\)"),
    (lambda: rate_bound_homogeneous(-0.1, 0.5, 1.0), "step_size must be finite and > 0"),
    (lambda: rate_bound_homogeneous(0.1, 1.5, 1.0), "delta0 must lie in"),
    (lambda: rate_bound_heterogeneous(0.1, 0.5, -1.0), "b_bar_norm must be finite and >= 0"),
    # unvalidated scalars used to pass NaN through or accept negative constants
    (lambda: angle_loss(float("nan"), 1.0, 0.5), "gamma must be finite and >= 0"),
    (lambda: angle_loss(0.5, -1.0, 0.5), "b_bar_norm must be finite and >= 0"),
    (lambda: angle_loss(0.5, 1.0, 1.5), "delta must lie in"),
    (lambda: angle_loss(0.5, 1.0, float("nan")), "delta must lie in"),
    (lambda: zero_model_loss(-0.5, 1.0), "gamma must be finite and >= 0"),
    (lambda: zero_model_loss(0.5, float("inf")), "b_bar_norm must be finite and >= 0"),
    (lambda: ffa_population_loss(0.5, -2.0, 0.3), "b_bar_norm must be finite and >= 0"),
    (lambda: ffa_population_loss(0.5, 2.0, float("nan")), "delta0 must lie in"),
    (lambda: rolora_population_recursion(float("nan"), 1.0, 0.1, 3), "delta0 must lie in"),
    (lambda: rolora_population_recursion(0.5, -1.0, 0.1, 3), "s must be finite and > 0"),
    (lambda: step_size_bound(float("nan")), "L_max must be finite and > 0"),
    (lambda: iterations_bound(0.5, 0.5, -1e-3), "eps must be finite and > 0"),
    (lambda: ffa_expected_loss(0.5, -1.0, 3, 6), "b_norm must be finite and >= 0"),
    (lambda: ffa_lstsq_loss(np.ones(3), np.full((2, 3), np.nan), np.ones(3)), "b_star must be finite"),
])
def test_reference_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_reduced_rank_regression():
    rng = np.random.default_rng(7)
    p = rank_one_lora(d=5, n_clients=3, samples_per_client=20, seed=8)
    # noiseless rank-one data: the rank-1 optimum is the truth
    W = reduced_rank_regression(p.X, p.Y, 1)
    np.testing.assert_allclose(W, np.outer(p.a_star, p.b_bar), atol=1e-10)
    # orthonormal design (S = I): RRR is the truncated SVD of the OLS solution
    Q, _ = np.linalg.qr(rng.standard_normal((12, 4)))
    X = Q.reshape(2, 6, 4)
    Y = rng.standard_normal((2, 6, 3))
    W_ols = Q.T @ Y.reshape(12, 3)
    U, s, Vt = np.linalg.svd(W_ols)
    np.testing.assert_allclose(reduced_rank_regression(X, Y, 2), (U[:, :2] * s[:2]) @ Vt[:2], atol=1e-12)
    with pytest.raises(ValueError, match="Y must have shape"):
        reduced_rank_regression(X, Y[:, :5], 1)
    with pytest.raises(ValueError, match="positive definite"):
        reduced_rank_regression(np.zeros((1, 2, 3)), np.zeros((1, 2, 3)), 1)


def test_ffa_matrix_optimum_closed_form_loss():
    p = lora_matrix_problem(d=6, n_clients=4, rank=2, d_out=5, gamma=0.5, seed=9)
    A0 = np.random.default_rng(10).standard_normal((2, 6))          # PEFT: A (r, in)
    res = ffa_matrix_optimum(p.targets, A0)
    B, loss = res
    assert res.B.shape == (5, 2) and res.loss == loss
    M = p.targets
    Mbar = M.mean(0)
    P = A0.T @ np.linalg.solve(A0 @ A0.T, A0)                       # projector onto the row space of A
    expected = np.mean(np.sum((M - Mbar) ** 2, axis=(1, 2))) + np.sum((Mbar @ (np.eye(6) - P)) ** 2)
    assert loss == pytest.approx(expected, rel=1e-12)
    assert p.loss(A0, B) == pytest.approx(loss, rel=1e-12)
    with pytest.raises(ValueError, match="A must have 6 columns"):
        ffa_matrix_optimum(p.targets, A0[:, :3])
