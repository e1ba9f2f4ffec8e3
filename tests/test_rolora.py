import numpy as np
import pytest

from lowrank_fl.algorithms.lora_aggregation import (cross_covariance, eckart_young_tail, federated_lora_matrix,
                                                    flexlora_aggregate, interference, mean_product, rolora_matrix)
from lowrank_fl.algorithms.rolora import (MAX_LOCAL_STEPS, fedavg_lora, ffa_lora, grad_a_clients, grad_b_clients,
                                          resolve_step_size, rolora)
from lowrank_fl.exact.rolora import (angle_loss, ffa_matrix_optimum, ffa_population_loss,
                                     rolora_population_recursion)
from lowrank_fl.problems.lora import init_at_angle, lora_matrix_problem, rank_one_lora


@pytest.fixture
def pop():
    return rank_one_lora(12, 6, gamma=0.5, seed=0)


@pytest.fixture
def data():
    return rank_one_lora(8, 4, gamma=0.3, samples_per_client=30, noise=0.1, seed=1)


# ------------------------------------------------------------------------------------------ RoLoRA
def test_population_trajectory_equals_exact_recursion_and_angle_loss(pop):
    a0 = init_at_angle(pop.a_star, 0.9, seed=2)
    s = pop.L_max ** 2
    tr = rolora(pop, 30, 0.25 / s, a0=a0)
    # exact recursion (Lemma A.16 equality form); residual-norm angle is accurate to ~1e-16
    np.testing.assert_allclose(tr.distance, rolora_population_recursion(0.9, s, 0.25 / s, 30), atol=1e-12)
    expected = [angle_loss(0.5, pop.L_max, dl) for dl in tr.distance]
    np.testing.assert_allclose(tr.loss, expected, rtol=1e-10)
    assert tr.status == "completed" and tr.a.shape == (12,) and tr.b.shape == (12,)
    assert tr.extra["iterate_loss"][0] == pytest.approx(0.25 + pop.L_max ** 2)   # b^0 = 0


def test_one_step_recovery_with_tuned_step(pop):
    a0 = init_at_angle(pop.a_star, 0.6, seed=3)
    eta = 1.0 / (2 * (1 - 0.36) * pop.L_max ** 2)    # notes §6.8: kills the component ⊥ a*
    tr = rolora(pop, 1, eta, a0=a0)
    assert tr.distance[1] <= 1e-14


def _rolora_reference_iteration(p, a, eta):
    """Algorithm 2, one iteration, client by client (Python loop)."""
    b_tilde = []
    for i in range(p.n_clients):
        Xa = p.X[i] @ a
        b_tilde.append(p.Y[i].T @ Xa / (Xa @ Xa))
    b_bar = np.mean(b_tilde, axis=0)
    grads = [2 / p.X.shape[1] * p.X[i].T @ (p.X[i] @ np.outer(a, b_bar) - p.Y[i]) @ b_bar
             for i in range(p.n_clients)]
    a_plus = a - eta * np.mean(grads, axis=0)
    return a_plus / np.linalg.norm(a_plus), b_bar


def test_batched_round_equals_per_client_loop(data):
    a0 = init_at_angle(data.a_star, 0.5, seed=4)
    tr = rolora(data, 1, 0.05, a0=a0)
    a1, b1 = _rolora_reference_iteration(data, a0, 0.05)
    np.testing.assert_allclose(tr.a, a1, atol=1e-12)
    np.testing.assert_allclose(tr.extra["b_iterate"], b1, atol=1e-12)


def test_fedavg_batched_round_equals_per_client_loop(data):
    a0 = init_at_angle(data.a_star, 0.5, seed=5)
    b0 = np.linspace(-1, 1, 8)
    K, eta, m = 3, 0.02, data.X.shape[1]
    tr = fedavg_lora(data, 1, eta, local_steps=K, a0=a0, b0=b0)
    A, B = [], []
    for i in range(data.n_clients):
        a, b = a0.copy(), b0.copy()
        for _ in range(K):
            R = data.Y[i] - np.outer(data.X[i] @ a, b)
            ga = -2 / m * data.X[i].T @ R @ b
            gb = -2 / m * R.T @ (data.X[i] @ a)
            a, b = a - eta * ga, b - eta * gb
        A.append(a), B.append(b)
    np.testing.assert_allclose(tr.a, np.mean(A, 0), atol=1e-12)
    np.testing.assert_allclose(tr.b, np.mean(B, 0), atol=1e-12)
    inter = np.linalg.norm(np.mean([np.outer(x, y) for x, y in zip(A, B)], 0) - np.outer(tr.a, tr.b))
    assert tr.extra["interference"][1] == pytest.approx(inter, rel=1e-10)


@pytest.mark.parametrize("which", ["data", "pop"])
def test_gradients_match_finite_differences(which, data, pop):
    p = data if which == "data" else pop
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal(p.d), rng.standard_normal(p.d)

    def losses(a, b):
        if p.population:
            return np.array([np.sum((np.outer(p.a_star, bi) - np.outer(a, b)) ** 2) for bi in p.b_star])
        return np.array([np.sum((p.Y[i] - np.outer(p.X[i] @ a, b)) ** 2) / p.X.shape[1] for i in range(p.n_clients)])

    ga = grad_a_clients(p, a, b, p.X, p.Y)
    gb = grad_b_clients(p, a, b, p.X, p.Y)
    h = 1e-6
    E = np.eye(p.d)
    fd_a = np.stack([(losses(a + h * e, b) - losses(a - h * e, b)) / (2 * h) for e in E], axis=1)
    fd_b = np.stack([(losses(a, b + h * e) - losses(a, b - h * e)) / (2 * h) for e in E], axis=1)
    # central differences: truncation O(h^2) (losses are quartic, ~1e-11) plus rounding ~1e-16/h ~ 1e-10
    np.testing.assert_allclose(ga, fd_a, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gb, fd_b, rtol=1e-6, atol=1e-6)


def test_same_seed_same_numbers_and_fresh_mode(data):
    t1 = rolora(data, 5, "corrected", sample_mode="fresh", seed=7)
    t2 = rolora(data, 5, "corrected", sample_mode="fresh", seed=7)
    t3 = rolora(data, 5, "corrected", sample_mode="reuse", seed=7)
    np.testing.assert_array_equal(t1.distance, t2.distance)
    assert not np.allclose(t1.distance[1:], t3.distance[1:])
    assert t1.distance[0] == t3.distance[0]
    assert np.all(t1.bytes_up == 8 * 2 * data.n_clients * data.d)


def test_string_step_sizes(pop, data):
    assert resolve_step_size("paper", data) == pytest.approx(1 / data.L_max ** 2)
    assert resolve_step_size("corrected", data) == pytest.approx(0.5 / data.L_max ** 2)
    assert resolve_step_size("paper", pop) == pytest.approx(0.5 / pop.L_max ** 2)   # Thm A.14's bound
    assert resolve_step_size("paper", pop, L_max=2.0) == pytest.approx(0.125)


def test_rolora_divergence_is_reported():
    # Algorithm 2 with normalisation is scale-stable; an overflowing a-step (huge data, huge step)
    # makes a^+ infinite and the normalised a NaN at round 1, which must stop the run.
    from dataclasses import replace
    p = rank_one_lora(6, 3, samples_per_client=10, seed=8)
    big = replace(p, X=p.X * 1e80, Y=p.Y * 1e80)
    tr = rolora(big, 20, 1e150, seed=9)
    assert tr.status == "diverged" and tr.diverged_at == 1
    assert np.all(np.isnan(tr.distance[1:])) and np.isfinite(tr.distance[0])
    # the returned model is the last finite iterate (here the initialization, round 0)
    ref = rolora(big, 0, 1e150, seed=9)
    assert np.array_equal(tr.a, ref.a) and np.array_equal(tr.b, ref.b)


def test_fedavg_divergence_is_reported(pop):
    tr = fedavg_lora(pop, 50, 5.0, local_steps=2, seed=10)
    assert tr.status == "diverged" and 1 <= tr.diverged_at <= 50
    assert np.all(np.isfinite(tr.a)) and np.all(np.isfinite(tr.b))
    ref = fedavg_lora(pop, tr.diverged_at - 1, 5.0, local_steps=2, seed=10)
    assert ref.status == "completed"
    assert np.array_equal(tr.a, ref.a) and np.array_equal(tr.b, ref.b)


def test_ffa_gd_divergence_keeps_last_finite_b(pop):
    tr = ffa_lora(pop, 60, delta0=0.3, local="gd", local_steps=3, step_size=50.0, seed=0)
    assert tr.status == "diverged" and np.all(np.isfinite(tr.b))
    ref = ffa_lora(pop, tr.diverged_at - 1, delta0=0.3, local="gd", local_steps=3, step_size=50.0, seed=0)
    assert np.array_equal(tr.b, ref.b)


# ------------------------------------------------------------------------------------------ FFA / FedAvg
def test_ffa_argmin_and_gd_reach_the_floor(pop):
    a0 = init_at_angle(pop.a_star, 0.7, seed=11)
    floor = ffa_population_loss(0.5, pop.L_max, 0.7)
    tr = ffa_lora(pop, 4, a0=a0)
    np.testing.assert_allclose(tr.loss[1:], floor, rtol=1e-12)
    np.testing.assert_allclose(tr.distance, 0.7, atol=1e-12)
    gd = ffa_lora(pop, 3, a0=a0, local="gd", local_steps=100, step_size=0.25)
    # contraction of each GD step on b is |1 - 2*0.25| = 0.5; 100 steps: exact to rounding
    assert gd.loss[-1] == pytest.approx(floor, rel=1e-12)
    fin = ffa_lora(rank_one_lora(5, 3, samples_per_client=20, seed=12), 2, delta0=0.4, seed=0)
    assert fin.extra["empirical_loss"][1] == pytest.approx(fin.extra["empirical_loss"][2], rel=1e-14)


def test_fedavg_one_local_step_is_centralized_gd(pop):
    a0 = init_at_angle(pop.a_star, 0.5, seed=13)
    tr = fedavg_lora(pop, 10, 0.05, local_steps=1, a0=a0)
    a, b = a0.copy(), np.zeros(pop.d)
    for _ in range(10):
        ga = 2 * (a * (b @ b) - pop.a_star * (pop.b_bar @ b))
        gb = 2 * (b * (a @ a) - pop.b_bar * (pop.a_star @ a))
        a, b = a - 0.05 * ga, b - 0.05 * gb
    np.testing.assert_allclose(np.outer(tr.a, tr.b), np.outer(a, b), atol=1e-12)
    norm = fedavg_lora(pop, 3, 0.05, a0=a0, normalize=True)
    assert np.linalg.norm(norm.a) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ matrix form
def test_interference_identity_and_equal_factor_exactness():
    rng = np.random.default_rng(14)
    A = rng.standard_normal((5, 7, 2))
    B = rng.standard_normal((5, 2, 7))
    scale = np.linalg.norm(mean_product(A, B))
    assert np.linalg.norm(interference(A, B) - cross_covariance(A, B)) <= 1e-12 * scale
    A_eq = np.broadcast_to(A[0], A.shape)
    assert np.linalg.norm(interference(A_eq, B)) <= 1e-12 * np.linalg.norm(mean_product(A_eq, B))
    B_eq = np.broadcast_to(B[0], B.shape)
    assert np.linalg.norm(interference(A, B_eq)) <= 1e-12 * np.linalg.norm(mean_product(A, B_eq))
    As, Bs = flexlora_aggregate(A, B)
    tail = eckart_young_tail(mean_product(A, B), 2)
    assert np.linalg.norm(mean_product(A, B) - As @ Bs) == pytest.approx(tail, rel=1e-10)


def test_rolora_matrix_aggregation_is_exact_every_round():
    p = lora_matrix_problem(8, 5, 2, gamma=0.8, seed=15)
    tr = rolora_matrix(p, 12, 0.05, local_steps=4, seed=16)
    assert np.max(tr.extra["relative_aggregation_error"]) <= 1e-12
    fed = federated_lora_matrix(p, 12, 0.05, method="fedavg", local_steps=4, seed=16)
    assert np.max(fed.extra["relative_aggregation_error"]) > 1e-6
    # RoLoRA sends one factor per round: half of FedAvg's uplink
    assert np.sum(tr.bytes_up) * 2 == pytest.approx(np.sum(fed.bytes_up))


def test_flexlora_server_is_truncated_svd_of_exact_aggregate():
    # per-client loop reference: GD on both factors, server = best rank-r approximation of
    # mean_i A_i B_i (Eckart-Young); the recorded aggregation error is then the SVD tail
    p = lora_matrix_problem(8, 5, 2, gamma=0.8, seed=15)
    rng = np.random.default_rng(3)
    A0, B0 = rng.standard_normal((8, 2)) / np.sqrt(8), 0.1 * rng.standard_normal((2, 8))
    rounds, eta, K = 3, 0.05, 4
    flex = federated_lora_matrix(p, rounds, eta, method="flexlora", local_steps=K, A0=A0, B0=B0)
    A, B = A0.copy(), B0.copy()
    for t in range(1, rounds + 1):
        prods = []
        for i in range(p.n_clients):
            Ai, Bi = A.copy(), B.copy()
            for _ in range(K):
                R = p.targets[i] - Ai @ Bi
                Ai, Bi = Ai + 2 * eta * R @ Bi.T, Bi + 2 * eta * Ai.T @ R
            prods.append(Ai @ Bi)
        exact = np.mean(prods, axis=0)
        U, sv, Vt = np.linalg.svd(exact)
        A, B = U[:, :2] * np.sqrt(sv[:2]), np.sqrt(sv[:2])[:, None] * Vt[:2]
        # aggregation error = Eckart-Young tail; both O(1) norms of the same SVD: 1e-10 relative
        assert flex.extra["aggregation_error"][t] == pytest.approx(np.sqrt(np.sum(sv[2:] ** 2)), rel=1e-10)
    # the balanced factors are unique up to the signs of singular-vector pairs: compare products
    np.testing.assert_allclose(flex.a @ flex.b, A @ B, atol=1e-12)
    assert flex.loss[-1] == pytest.approx(p.loss(A, B), rel=1e-10)


def test_matrix_rank_deficient_A_is_at_distance_one():
    p = lora_matrix_problem(6, 3, 2, seed=19)
    tr = federated_lora_matrix(p, 0, 0.1, A0=np.ones((6, 2)))
    assert tr.distance[0] == 1.0 and tr.status == "completed"


def test_matrix_divergence_keeps_last_finite_factors():
    p = lora_matrix_problem(6, 3, 2, seed=19)
    tr = federated_lora_matrix(p, 40, 10.0, method="fedavg", B0=np.ones((2, 6)), seed=20)
    ref = federated_lora_matrix(p, tr.diverged_at - 1, 10.0, method="fedavg", B0=np.ones((2, 6)), seed=20)
    assert np.all(np.isfinite(tr.a)) and np.array_equal(tr.a, ref.a) and np.array_equal(tr.b, ref.b)



def test_ffa_matrix_converges_to_frozen_optimum():
    p = lora_matrix_problem(6, 4, 2, gamma=0.5, seed=17)
    A0 = np.random.default_rng(18).standard_normal((6, 2)) / np.sqrt(6)
    tr = federated_lora_matrix(p, 400, 0.2, method="ffa", A0=A0)
    _, best = ffa_matrix_optimum(p.targets, A0)
    # GD on a strongly convex quadratic in B; 400 rounds at this step converge to ~1e-12
    assert tr.loss[-1] == pytest.approx(best, rel=1e-8)
    np.testing.assert_array_equal(tr.a, A0)


def test_matrix_divergence_is_reported():
    p = lora_matrix_problem(6, 3, 2, seed=19)
    tr = federated_lora_matrix(p, 40, 10.0, method="fedavg", B0=np.ones((2, 6)), seed=20)
    assert tr.status == "diverged" and 1 <= tr.diverged_at <= 40


# ------------------------------------------------------------------------------------------ errors
def test_errors(pop, data):
    with pytest.raises(TypeError, match="problem must be a RankOneLoRAProblem"):
        rolora("x", 3, 0.1)
    with pytest.raises(ValueError, match="rounds must be >= 0"):
        rolora(pop, -1, 0.1)
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        rolora(pop, 3, 0.0)
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        fedavg_lora(pop, 3, -1.0)
    with pytest.raises(ValueError, match="step_size must be one of"):
        rolora(pop, 3, "big")
    with pytest.raises(TypeError, match="step_size must be a positive number"):
        rolora(pop, 3, None)
    with pytest.raises(ValueError, match=r"a0 must have shape \(12\)"):
        rolora(pop, 3, 0.1, a0=np.ones(5))
    with pytest.raises(ValueError, match="a0 must be non-zero"):
        rolora(pop, 3, 0.1, a0=np.zeros(12))
    with pytest.raises(ValueError, match="at most one of a0 and delta0"):
        rolora(pop, 3, 0.1, a0=np.ones(12), delta0=0.5)
    with pytest.raises(ValueError, match="sample_mode must be one of"):
        rolora(data, 3, 0.1, sample_mode="bootstrap")
    with pytest.raises(ValueError, match="sample_mode='fresh' needs"):
        rolora(pop, 3, 0.1, sample_mode="fresh")
    with pytest.raises(ValueError, match="local_steps must be >= 1"):
        fedavg_lora(pop, 3, 0.1, local_steps=0)
    with pytest.raises(ValueError, match=f"local_steps must be <= {MAX_LOCAL_STEPS}"):
        fedavg_lora(pop, 3, 0.1, local_steps=MAX_LOCAL_STEPS + 1)
    with pytest.raises(ValueError, match="local must be one of"):
        ffa_lora(pop, 3, local="adam")
    with pytest.raises(ValueError, match="step_size is required for local='gd'"):
        ffa_lora(pop, 3, local="gd")
    with pytest.raises(ValueError, match="step_size applies to local='gd' only"):
        ffa_lora(pop, 3, step_size=0.1)
    with pytest.raises(ValueError, match="local_steps applies to local='gd' only"):
        ffa_lora(pop, 3, local_steps=5)
    with pytest.raises(TypeError, match="normalize must be a bool"):
        rolora(pop, 3, 0.1, normalize="no")
    with pytest.raises(TypeError, match="normalize must be a bool"):
        fedavg_lora(pop, 3, 0.1, normalize=1)
    with pytest.raises(ValueError, match=r"b0 must have shape \(12\)"):
        fedavg_lora(pop, 3, 0.1, b0=np.ones(3))
    p = lora_matrix_problem(5, 3, 2, seed=0)
    with pytest.raises(TypeError, match="problem must be a LoRAMatrixProblem"):
        federated_lora_matrix(pop, 3, 0.1)
    with pytest.raises(ValueError, match="method must be one of"):
        federated_lora_matrix(p, 3, 0.1, method="sgd")
    with pytest.raises(ValueError, match=r"A0 must have shape \(5, 2\)"):
        federated_lora_matrix(p, 3, 0.1, A0=np.ones((5, 3)))
    with pytest.raises(ValueError, match="local_steps must be <= 100000"):
        federated_lora_matrix(p, 3, 0.1, local_steps=10 ** 6)
    with pytest.raises(ValueError, match=r"B must have shape \(2, 3, q\)"):
        mean_product(np.ones((2, 4, 3)), np.ones((2, 2, 4)))
