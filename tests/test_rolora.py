import warnings

import numpy as np
import pytest

from lowrank_fl.algorithms.lora_aggregation import (LoRAFactors, cross_covariance, eckart_young_tail,
                                                    fedavg_factors, federated_lora_matrix, flexlora_aggregate,
                                                    interference, mean_product, rolora_matrix)
from lowrank_fl.algorithms.common import MAX_LOCAL_STEPS
from lowrank_fl.algorithms.rolora import (fedavg_lora, ffa_lora, grad_a_clients, grad_b_clients,
                                          resolve_step_size, rolora)
from lowrank_fl.exact.rolora import (angle_loss, ffa_matrix_optimum, ffa_population_loss,
                                     rolora_population_recursion)
from lowrank_fl.problems.lora import init_at_angle, lora_matrix_problem, rank_one_lora
from lowrank_fl.results import ConvergenceWarning


@pytest.fixture
def pop():
    return rank_one_lora(d=12, n_clients=6, gamma=0.5, seed=0)


@pytest.fixture
def data():
    return rank_one_lora(d=8, n_clients=4, gamma=0.3, samples_per_client=30, noise=0.1, seed=1)


# ------------------------------------------------------------------------------------------ RoLoRA
def test_population_trajectory_equals_exact_recursion_and_angle_loss(pop):
    a0 = init_at_angle(pop.a_star, 0.9, seed=2)
    s = pop.L_max ** 2
    tr = rolora(pop, 30, 0.25 / s, init=a0)
    # exact recursion (Lemma A.16 equality form); residual-norm angle is accurate to ~1e-16
    np.testing.assert_allclose(tr.distance, rolora_population_recursion(0.9, s, 0.25 / s, 30), atol=1e-12)
    expected = [angle_loss(0.5, pop.L_max, dl) for dl in tr.distance]
    np.testing.assert_allclose(tr.loss, expected, rtol=1e-10)
    assert tr.status == "completed" and tr.a.shape == (12,) and tr.b.shape == (12,)
    assert tr.extra["iterate_loss"][0] == pytest.approx(0.25 + pop.L_max ** 2)   # b^0 = 0


def test_one_step_recovery_with_tuned_step(pop):
    a0 = init_at_angle(pop.a_star, 0.6, seed=3)
    eta = 1.0 / (2 * (1 - 0.36) * pop.L_max ** 2)    # one-step recovery: eta = 1/(2 c_0^2 ||bbar*||^2) kills the component ⊥ a*
    tr = rolora(pop, 1, eta, init=a0)
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
    tr = rolora(data, 1, 0.05, init=a0)
    a1, b1 = _rolora_reference_iteration(data, a0, 0.05)
    np.testing.assert_allclose(tr.a, a1, atol=1e-12)
    np.testing.assert_allclose(tr.extra["b_iterate"], b1, atol=1e-12)


def test_fedavg_batched_round_equals_per_client_loop(data):
    a0 = init_at_angle(data.a_star, 0.5, seed=5)
    b0 = np.linspace(-1, 1, 8)
    K, eta, m = 3, 0.02, data.X.shape[1]
    tr = fedavg_lora(data, 1, eta, local_steps=K, init=(a0, b0))
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
    t1 = rolora(data, 5, "corrected", data="fresh", seed=7)
    t2 = rolora(data, 5, "corrected", data="fresh", seed=7)
    t3 = rolora(data, 5, "corrected", data="fixed", seed=7)
    np.testing.assert_array_equal(t1.distance, t2.distance)
    assert not np.allclose(t1.distance[1:], t3.distance[1:])
    assert t1.distance[0] == t3.distance[0]
    assert np.all(t1.bytes_up == 8 * 2 * data.n_clients * data.d)


def test_string_step_sizes(pop, data):
    assert resolve_step_size("paper", data) == pytest.approx(1 / data.L_max ** 2)
    assert resolve_step_size("corrected", data) == pytest.approx(0.5 / data.L_max ** 2)
    assert resolve_step_size("paper", pop) == pytest.approx(0.5 / pop.L_max ** 2)   # Thm A.14's bound
    assert resolve_step_size("paper", pop, L_max=2.0) == pytest.approx(0.125)


def test_rolora_divergence_is_reported_and_warns():
    # Algorithm 2 with normalisation is scale-stable; an overflowing a-step (huge data, huge step)
    # makes a^+ infinite and the normalised a NaN at round 1, which must stop the run.
    from dataclasses import replace
    p = rank_one_lora(d=6, n_clients=3, samples_per_client=10, seed=8)
    big = replace(p, X=p.X * 1e80, Y=p.Y * 1e80)
    with pytest.warns(ConvergenceWarning, match="rolora diverged at round 1"):
        tr = rolora(big, 20, 1e150, seed=9)
    assert tr.status == "diverged" and tr.diverged_at == 1
    assert np.all(np.isnan(tr.distance[1:])) and np.isfinite(tr.distance[0])
    # the returned model is the last finite iterate (here the initialization, round 0)
    ref = rolora(big, 0, 1e150, seed=9)
    assert np.array_equal(tr.a, ref.a) and np.array_equal(tr.b, ref.b)


def test_fedavg_divergence_is_reported_and_warns(pop):
    with pytest.warns(ConvergenceWarning, match="fedavg_lora diverged"):
        tr = fedavg_lora(pop, 50, 5.0, local_steps=2, seed=10)
    assert tr.status == "diverged" and 1 <= tr.diverged_at <= 50
    assert np.all(np.isfinite(tr.a)) and np.all(np.isfinite(tr.b))
    ref = fedavg_lora(pop, tr.diverged_at - 1, 5.0, local_steps=2, seed=10)
    assert ref.status == "completed"
    assert np.array_equal(tr.a, ref.a) and np.array_equal(tr.b, ref.b)


def test_ffa_gd_divergence_keeps_last_finite_b(pop):
    with pytest.warns(ConvergenceWarning, match="ffa_lora diverged"):
        tr = ffa_lora(pop, 60, 50.0, init=0.3, local="gd", local_steps=3, seed=0)
    assert tr.status == "diverged" and np.all(np.isfinite(tr.b))
    ref = ffa_lora(pop, tr.diverged_at - 1, 50.0, init=0.3, local="gd", local_steps=3, seed=0)
    assert np.array_equal(tr.b, ref.b)


# ------------------------------------------------------------------------------------------ FFA / FedAvg
def test_ffa_argmin_and_gd_reach_the_floor(pop):
    a0 = init_at_angle(pop.a_star, 0.7, seed=11)
    floor = ffa_population_loss(0.5, pop.L_max, 0.7)
    tr = ffa_lora(pop, 4, init=a0)
    np.testing.assert_allclose(tr.loss[1:], floor, rtol=1e-12)
    np.testing.assert_allclose(tr.distance, 0.7, atol=1e-12)
    gd = ffa_lora(pop, 3, 0.25, init=a0, local="gd", local_steps=100)
    # contraction of each GD step on b is |1 - 2*0.25| = 0.5; 100 steps: exact to rounding
    assert gd.loss[-1] == pytest.approx(floor, rel=1e-12)
    fin = ffa_lora(rank_one_lora(d=5, n_clients=3, samples_per_client=20, seed=12), 2, init=0.4, seed=0)
    assert fin.extra["empirical_loss"][1] == pytest.approx(fin.extra["empirical_loss"][2], rel=1e-14)


def test_fedavg_one_local_step_is_centralized_gd(pop):
    a0 = init_at_angle(pop.a_star, 0.5, seed=13)
    tr = fedavg_lora(pop, 10, 0.05, local_steps=1, init=a0)
    a, b = a0.copy(), np.zeros(pop.d)
    for _ in range(10):
        ga = 2 * (a * (b @ b) - pop.a_star * (pop.b_bar @ b))
        gb = 2 * (b * (a @ a) - pop.b_bar * (pop.a_star @ a))
        a, b = a - 0.05 * ga, b - 0.05 * gb
    np.testing.assert_allclose(np.outer(tr.a, tr.b), np.outer(a, b), atol=1e-12)
    norm = fedavg_lora(pop, 3, 0.05, init=a0, normalize=True)
    assert np.linalg.norm(norm.a) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ matrix form
def _factors(seed, K=5, r=2, d_in=7, d_out=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((K, r, d_in)), rng.standard_normal((K, d_out, r))   # PEFT: A (K,r,in), B (K,out,r)


@pytest.mark.parametrize("K, r, d_in, d_out", [(5, 2, 7, 4), (3, 3, 5, 9), (1, 1, 2, 6), (6, 4, 11, 8)])
def test_mean_product_is_mean_of_B_k_A_k_in_peft_letters(K, r, d_in, d_out):
    A, B = _factors(K, K, r, d_in, d_out)
    M = mean_product(A, B)
    assert M.shape == (d_out, d_in)
    np.testing.assert_allclose(M, np.mean([B[k] @ A[k] for k in range(K)], axis=0), rtol=1e-13, atol=1e-13)
    w = np.arange(1.0, K + 1)                       # relative weights, normalised to sum 1
    np.testing.assert_allclose(mean_product(A, B, weights=w),
                               sum(w[k] * B[k] @ A[k] for k in range(K)) / w.sum(), rtol=1e-13, atol=1e-13)
    f = fedavg_factors(A, B, weights=w)
    assert isinstance(f, LoRAFactors) and f.A.shape == (r, d_in) and f.B.shape == (d_out, r)
    np.testing.assert_allclose(f.A, np.average(A, axis=0, weights=w), atol=1e-14)
    np.testing.assert_allclose(f.B, np.average(B, axis=0, weights=w), atol=1e-14)
    scale = np.linalg.norm(M) + 1.0
    assert np.linalg.norm(interference(A, B, weights=w) - cross_covariance(A, B, weights=w)) <= 1e-12 * scale


@pytest.mark.parametrize("rank", [None, 1, 3])
def test_flexlora_equals_truncated_svd_of_the_mean(rank):
    A, B = _factors(3, K=4, r=3, d_in=9, d_out=6)
    w = np.array([1.0, 2.0, 0.5, 3.0])
    f = flexlora_aggregate(A, B, rank=rank, weights=w)
    k = 3 if rank is None else rank
    M = sum(w[i] * B[i] @ A[i] for i in range(4)) / w.sum()
    U, s, Vt = np.linalg.svd(M)
    assert f.A.shape == (k, 9) and f.B.shape == (6, k)
    np.testing.assert_allclose(f.B @ f.A, (U[:, :k] * s[:k]) @ Vt[:k], atol=1e-12)
    # balanced split: B = U sqrt(S), A = sqrt(S) V^T, so both factors carry sqrt(s) as singular values
    np.testing.assert_allclose(np.linalg.svd(f.A, compute_uv=False), np.sqrt(s[:k]), rtol=1e-12)
    np.testing.assert_allclose(np.linalg.svd(f.B, compute_uv=False), np.sqrt(s[:k]), rtol=1e-12)
    assert np.linalg.norm(M - f.B @ f.A) == pytest.approx(eckart_young_tail(M, k), rel=1e-10, abs=1e-13)


def test_interference_identity_and_equal_factor_exactness():
    A, B = _factors(14)
    scale = np.linalg.norm(mean_product(A, B))
    assert np.linalg.norm(interference(A, B) - cross_covariance(A, B)) <= 1e-12 * scale
    A_eq = np.broadcast_to(A[0], A.shape)
    assert np.linalg.norm(interference(A_eq, B)) <= 1e-12 * np.linalg.norm(mean_product(A_eq, B))
    B_eq = np.broadcast_to(B[0], B.shape)
    assert np.linalg.norm(interference(A, B_eq)) <= 1e-12 * np.linalg.norm(mean_product(A, B_eq))
    As, Bs = flexlora_aggregate(A, B)
    tail = eckart_young_tail(mean_product(A, B), 2)
    assert np.linalg.norm(mean_product(A, B) - Bs @ As) == pytest.approx(tail, rel=1e-10)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: mean_product(np.ones((2, 3, 4)), np.ones((2, 5, 2))), ValueError, r"B must have shape \(2, out, 3\)"),
    (lambda: mean_product(np.ones((2, 3, 4)), np.ones((3, 5, 3))), ValueError, r"B must have shape \(2, out, 3\)"),
    (lambda: mean_product(np.ones((3, 4)), np.ones((2, 5, 3))), ValueError, "A must have 3 dimensions"),
    (lambda: mean_product(np.ones((2, 3, 4)), np.ones((2, 5, 3)), weights=[1.0]), ValueError, r"weights must have shape \(2\)"),
    (lambda: mean_product(np.ones((2, 3, 4)), np.ones((2, 5, 3)), weights=[1.0, -1.0]), ValueError, "weights must be >= 0"),
    (lambda: fedavg_factors(np.ones((2, 3, 4)), np.ones((2, 5, 3)), weights=[0.0, 0.0]), ValueError, "positive sum"),
    (lambda: flexlora_aggregate(np.ones((2, 3, 4)), np.ones((2, 5, 3)), rank=5), ValueError, "rank must be <= 4"),
    (lambda: interference(np.full((2, 3, 4), np.nan), np.ones((2, 5, 3))), ValueError, "A must be finite"),
])
def test_aggregation_input_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_rolora_matrix_aggregation_is_exact_every_round():
    p = lora_matrix_problem(d=8, n_clients=5, rank=2, gamma=0.8, seed=15)
    tr = rolora_matrix(p, 12, 0.05, local_steps=4, seed=16)
    assert np.max(tr.extra["relative_aggregation_error"]) <= 1e-12
    fed = federated_lora_matrix(p, 12, 0.05, method="fedavg", local_steps=4, seed=16)
    assert np.max(fed.extra["relative_aggregation_error"]) > 1e-6
    # RoLoRA sends one factor per round: half of FedAvg's uplink
    assert np.sum(tr.bytes_up) * 2 == pytest.approx(np.sum(fed.bytes_up))
    assert tr.a.shape == (2, 8) and tr.b.shape == (8, 2)
    assert tr.config == {"data": "population", "batch_size": None, "clients_per_round": 5, "local_steps": 4,
                         "init": "random", "step_size": 0.05, "method": "rolora"}


def test_matrix_problem_with_out_different_from_in():
    p = lora_matrix_problem(d=7, n_clients=4, rank=2, d_out=3, gamma=0.5, seed=1)
    assert p.targets.shape == (4, 3, 7) and p.A_star.shape == (2, 7) and p.B_star.shape == (4, 3, 2)
    for method in ("rolora", "fedavg", "flexlora"):
        tr = federated_lora_matrix(p, 300, 0.1, method=method, local_steps=2, seed=0)
        assert tr.a.shape == (2, 7) and tr.b.shape == (3, 2)
        assert tr.loss[-1] == pytest.approx(p.loss(tr.a, tr.b), rel=1e-12)
    # RoLoRA reaches the rank-r optimum of the mean target (the targets share A*): loss -> gamma^2
    tr = rolora_matrix(p, 400, 0.1, local_steps=2, seed=0)
    assert tr.loss[-1] == pytest.approx(0.25, rel=1e-6)


def test_matrix_participation_averages_over_a_subset_without_replacement():
    p = lora_matrix_problem(d=6, n_clients=6, rank=2, gamma=0.5, seed=2)
    A0 = np.random.default_rng(0).standard_normal((2, 6)) / np.sqrt(6)
    tr = federated_lora_matrix(p, 1, 0.05, method="ffa", init=A0, clients_per_round=3, seed=5)
    full = federated_lora_matrix(p, 1, 0.05, method="ffa", init=A0, seed=5)
    # reference: the same three clients (same generator stream), one GD step on B from 0, averaged
    from lowrank_fl.algorithms.common import choose_clients
    from lowrank_fl.validation import as_generator
    S = choose_clients(as_generator(5, stream="federated_lora_matrix"), 6, 3)
    assert len(set(S.tolist())) == 3
    B_ref = np.mean([2 * 0.05 * p.targets[i] @ A0.T for i in S], axis=0)
    np.testing.assert_allclose(tr.b, B_ref, atol=1e-14)
    assert not np.allclose(tr.b, full.b)
    assert tr.bytes_up[0] * 2 == pytest.approx(full.bytes_up[0]) and tr.config["clients_per_round"] == 3


def test_flexlora_server_is_truncated_svd_of_exact_aggregate():
    # per-client loop reference: GD on both factors, server = best rank-r approximation of
    # mean_i B_i A_i (Eckart-Young); the recorded aggregation error is then the SVD tail
    p = lora_matrix_problem(d=8, n_clients=5, rank=2, gamma=0.8, seed=15)
    rng = np.random.default_rng(3)
    A0, B0 = rng.standard_normal((2, 8)) / np.sqrt(8), 0.1 * rng.standard_normal((8, 2))
    rounds, eta, K = 3, 0.05, 4
    flex = federated_lora_matrix(p, rounds, eta, method="flexlora", local_steps=K, init=(A0, B0))
    A, B = A0.copy(), B0.copy()
    for t in range(1, rounds + 1):
        prods = []
        for i in range(p.n_clients):
            Ai, Bi = A.copy(), B.copy()
            for _ in range(K):
                R = p.targets[i] - Bi @ Ai
                Ai, Bi = Ai + 2 * eta * Bi.T @ R, Bi + 2 * eta * R @ Ai.T
            prods.append(Bi @ Ai)
        exact = np.mean(prods, axis=0)
        U, sv, Vt = np.linalg.svd(exact)
        B, A = U[:, :2] * np.sqrt(sv[:2]), np.sqrt(sv[:2])[:, None] * Vt[:2]
        # aggregation error = Eckart-Young tail; both O(1) norms of the same SVD: 1e-10 relative
        assert flex.extra["aggregation_error"][t] == pytest.approx(np.sqrt(np.sum(sv[2:] ** 2)), rel=1e-10)
    # the balanced factors are unique up to the signs of singular-vector pairs: compare products
    np.testing.assert_allclose(flex.b @ flex.a, B @ A, atol=1e-12)
    assert flex.loss[-1] == pytest.approx(p.loss(A, B), rel=1e-10)


def test_matrix_rank_deficient_A_is_at_distance_one():
    p = lora_matrix_problem(d=6, n_clients=3, rank=2, seed=19)
    tr = federated_lora_matrix(p, 0, 0.1, init=np.ones((2, 6)))
    assert tr.distance[0] == 1.0 and tr.status == "completed"


def test_matrix_divergence_warns_and_keeps_last_finite_factors():
    p = lora_matrix_problem(d=6, n_clients=3, rank=2, seed=19)
    with pytest.warns(ConvergenceWarning, match="fedavg diverged"):
        tr = federated_lora_matrix(p, 40, 10.0, method="fedavg", init=(None, np.ones((6, 2))), seed=20)
    assert tr.status == "diverged" and 1 <= tr.diverged_at <= 40
    ref = federated_lora_matrix(p, tr.diverged_at - 1, 10.0, method="fedavg", init=(None, np.ones((6, 2))), seed=20)
    assert np.all(np.isfinite(tr.a)) and np.array_equal(tr.a, ref.a) and np.array_equal(tr.b, ref.b)


def test_ffa_matrix_converges_to_frozen_optimum():
    p = lora_matrix_problem(d=6, n_clients=4, rank=2, gamma=0.5, seed=17)
    A0 = np.random.default_rng(18).standard_normal((2, 6)) / np.sqrt(6)
    tr = federated_lora_matrix(p, 400, 0.2, method="ffa", init=A0)
    _, best = ffa_matrix_optimum(p.targets, A0)
    # GD on a strongly convex quadratic in B; 400 rounds at this step converge to ~1e-12
    assert tr.loss[-1] == pytest.approx(best, rel=1e-8)
    np.testing.assert_array_equal(tr.a, A0)


def test_matrix_degenerate_inits_are_refused_or_warned():
    p = lora_matrix_problem(d=5, n_clients=3, rank=2, seed=0)
    for method in ("rolora", "fedavg", "flexlora", "ffa"):
        with pytest.raises(ValueError, match="init: A0 and B0 are both zero"):
            federated_lora_matrix(p, 3, 0.1, method=method, init=np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"init \(A0\) is zero with method='ffa'"):
        federated_lora_matrix(p, 3, 0.1, method="ffa", init=(np.zeros((2, 5)), np.ones((5, 2))))
    with pytest.warns(UserWarning, match=r"init \(A0\) has rank 1 < 2 with method='ffa'"):
        federated_lora_matrix(p, 3, 0.1, method="ffa", init=np.ones((2, 5)))
    # a zero A0 with a non-zero B0 moves under the other methods (A's gradient is -2 B^T R)
    tr = federated_lora_matrix(p, 2, 0.1, method="fedavg", init=(np.zeros((2, 5)), np.ones((5, 2))))
    assert np.any(tr.a != 0)


def test_matrix_deprecated_aliases_warn_and_match_init():
    p = lora_matrix_problem(d=5, n_clients=3, rank=2, seed=0)
    A0, B0 = np.ones((2, 5)) + np.eye(2, 5), np.zeros((5, 2))
    with pytest.warns(DeprecationWarning) as rec:
        old = federated_lora_matrix(p, 3, 0.1, A0=A0, B0=B0)
    assert sorted(str(w.message).split(":")[1].split("=")[0].strip() for w in rec) == ["A0", "B0"]
    assert all("use init=" in str(w.message) and w.filename == __file__ for w in rec)
    new = federated_lora_matrix(p, 3, 0.1, init=(A0, B0))
    np.testing.assert_array_equal(old.a, new.a)
    with pytest.raises(ValueError, match="give init= or the deprecated"), pytest.warns(DeprecationWarning):
        federated_lora_matrix(p, 3, 0.1, A0=A0, init=(A0, B0))
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['sample_mode'\]"):
        federated_lora_matrix(p, 3, 0.1, sample_mode="reuse")


def test_matrix_data_regime_is_population_only():
    p = lora_matrix_problem(d=5, n_clients=3, rank=2, seed=0)
    assert federated_lora_matrix(p, 1, 0.1, data="population").config["data"] == "population"
    with pytest.raises(ValueError, match="data='fixed' needs a problem with a dataset"):
        federated_lora_matrix(p, 1, 0.1, data="fixed")
    with pytest.raises(ValueError, match="data='fresh' needs a problem that can draw samples"):
        federated_lora_matrix(p, 1, 0.1, data="fresh")
    with pytest.raises(ValueError, match="batch_size is only used with data='fresh'"):
        federated_lora_matrix(p, 1, 0.1, batch_size=4)


# ------------------------------------------------------------------------------------------ vocabulary
def test_signatures_share_the_vocabulary():
    import inspect
    shared = ["data", "batch_size", "clients_per_round", "local_steps", "init"]
    for fn in (rolora, ffa_lora, fedavg_lora, federated_lora_matrix, rolora_matrix):
        params = inspect.signature(fn).parameters
        names = list(params)
        assert names[:3] == ["problem", "rounds", "step_size"], fn.__name__
        assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in shared), fn.__name__
        assert names.index("seed") == len(names) - 2 and names[-1] == "deprecated", fn.__name__
        assert params["local_steps"].default == 1 and params["data"].default is None


@pytest.mark.parametrize("fn, old, new", [
    (rolora, dict(sample_mode="reuse"), dict(data="fixed")),
    (rolora, dict(sample_mode="fresh"), dict(data="fresh")),
    (rolora, dict(delta0=0.4), dict(init=0.4)),
    (ffa_lora, dict(delta0=0.4, sample_mode="fresh"), dict(init=0.4, data="fresh")),
    (fedavg_lora, dict(delta0=0.4, b0=np.linspace(0, 1, 8)), dict(init=(0.4, np.linspace(0, 1, 8)))),
])
def test_rank_one_deprecated_aliases_warn_and_match(fn, old, new, data):
    args = (data, 3) if fn is ffa_lora else (data, 3, 0.05)
    with pytest.warns(DeprecationWarning, match="is deprecated, use"):
        tr_old = fn(*args, seed=4, **old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        tr_new = fn(*args, seed=4, **new)
    np.testing.assert_array_equal(tr_old.distance, tr_new.distance)
    np.testing.assert_array_equal(tr_old.b, tr_new.b)


def test_rank_one_a0_alias_and_conflicts(pop):
    a0 = init_at_angle(pop.a_star, 0.5, seed=0)
    with pytest.warns(DeprecationWarning, match="rolora: a0= is deprecated") as rec:
        old = rolora(pop, 3, 0.1, a0=a0)
    assert rec[0].filename == __file__                   # points at the caller
    np.testing.assert_array_equal(old.a, rolora(pop, 3, 0.1, init=a0).a)
    with pytest.raises(ValueError, match="give init= or the deprecated"), pytest.warns(DeprecationWarning):
        rolora(pop, 3, 0.1, a0=a0, init=0.3)
    with pytest.raises(ValueError, match="give data= or the deprecated sample_mode="), \
            pytest.warns(DeprecationWarning):
        rolora(pop, 3, 0.1, sample_mode="reuse", data="fixed")
    with pytest.raises(TypeError, match=r"rolora\(\) got unexpected keyword argument\(s\) \['A0'\]"):
        rolora(pop, 3, 0.1, A0=a0)


def test_data_regimes_of_the_rank_one_methods(pop, data):
    # default: the dataset when there is one, the population otherwise
    assert rolora(data, 1, 0.05).config["data"] == "fixed"
    assert rolora(pop, 1, 0.05).config["data"] == "population"
    # population gradients on a problem with samples ignore them (and equal the pure-population run)
    on_data = rolora(data, 4, 0.05, data="population", init=0.5, seed=1)
    stripped = rank_one_lora(d=8, n_clients=4, gamma=0.3, noise=0.1, seed=1)
    np.testing.assert_allclose(on_data.distance, rolora(stripped, 4, 0.05, init=0.5, seed=1).distance, atol=1e-15)
    assert on_data.config["step_size"] == 0.05
    # the theorem's step follows the regime: Thm A.14 (population) vs Thm 5.4 (samples)
    assert rolora(data, 0, "paper", data="population").extra["step_size"] == pytest.approx(0.5 / data.L_max ** 2)
    assert rolora(data, 0, "paper").extra["step_size"] == pytest.approx(1 / data.L_max ** 2)
    # fresh samples on a population problem: batch_size per client per step, reproducible
    f1 = rolora(pop, 3, 0.05, data="fresh", batch_size=30, seed=2)
    f2 = rolora(pop, 3, 0.05, data="fresh", batch_size=30, seed=2)
    np.testing.assert_array_equal(f1.distance, f2.distance)
    assert f1.config["batch_size"] == 30 and "empirical_loss" not in f1.extra
    assert rolora(data, 1, 0.05, data="fresh").config["batch_size"] == 30   # problem's m by default
    with pytest.raises(ValueError, match="data='fresh' on a problem without samples needs batch_size"):
        rolora(pop, 1, 0.05, data="fresh")
    with pytest.raises(ValueError, match="data='fixed' needs a problem with a dataset"):
        fedavg_lora(pop, 1, 0.05, data="fixed")
    with pytest.raises(ValueError, match="batch_size is only used with data='fresh'"):
        ffa_lora(data, 1, batch_size=5)
    with pytest.raises(ValueError, match="data must be one of"):
        rolora(data, 1, 0.05, data="reuse")


def test_rank_one_participation(pop):
    from lowrank_fl.algorithms.common import choose_clients
    from lowrank_fl.validation import as_generator
    a0 = init_at_angle(pop.a_star, 0.6, seed=0)
    tr = ffa_lora(pop, 1, init=a0, clients_per_round=2, seed=7)
    # FFA argmin on a subset: the mean of the participants' population b-steps (eq. (275))
    S = choose_clients(as_generator(7, stream="lora"), pop.n_clients, 2)
    np.testing.assert_allclose(tr.b, pop.b_star[S].mean(axis=0) * (pop.a_star @ a0), atol=1e-14)
    assert tr.config["clients_per_round"] == 2 and tr.bytes_up[0] == 8 * 2 * pop.d
    # RoLoRA with one client per round still contracts the angle in population (the a-step uses the
    # same client's b, and a* is shared)
    ro = rolora(pop, 30, "corrected", clients_per_round=1, init=0.6, seed=3)
    assert ro.status == "completed" and ro.distance[-1] < 1e-3 < 0.6
    fa = fedavg_lora(pop, 3, 0.05, clients_per_round=3, seed=3)
    assert fa.bytes_up[0] == 8 * 2 * 3 * pop.d
    with pytest.raises(ValueError, match="clients_per_round must be <= 6"):
        rolora(pop, 1, 0.05, clients_per_round=7)
    with pytest.raises(ValueError, match="clients_per_round must be >= 1"):
        fedavg_lora(pop, 1, 0.05, clients_per_round=0)


def test_rolora_local_steps(pop):
    # local_steps=1 is Algorithm 2; more local steps on a at fixed bbar, then averaged: reference loop
    a0 = init_at_angle(pop.a_star, 0.7, seed=1)
    eta, K = 0.02, 3
    tr = rolora(pop, 1, eta, local_steps=K, init=a0)
    a = a0
    b_bar = (pop.b_star * (pop.a_star @ a)).mean(axis=0)
    A_i = []
    for i in range(pop.n_clients):
        x = a.copy()
        for _ in range(K):
            x = x - eta * 2 * (x * (b_bar @ b_bar) - pop.a_star * (pop.b_star[i] @ b_bar))
        A_i.append(x)
    a_plus = np.mean(A_i, axis=0)
    np.testing.assert_allclose(tr.a, a_plus / np.linalg.norm(a_plus), atol=1e-14)
    assert tr.config["local_steps"] == K


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("call, exc, match", [
    (lambda p, q: rolora("x", 3, 0.1), TypeError, "problem must be a RankOneLoRAProblem"),
    (lambda p, q: rolora(p, -1, 0.1), ValueError, "rounds must be >= 0"),
    (lambda p, q: rolora(p, 3, 0.0), ValueError, "step_size must be finite and > 0"),
    (lambda p, q: rolora(p, 3, float("nan")), ValueError, "step_size must be finite and > 0"),
    (lambda p, q: fedavg_lora(p, 3, -1.0), ValueError, "step_size must be finite and > 0"),
    (lambda p, q: rolora(p, 3, "big"), ValueError, "step_size must be one of"),
    (lambda p, q: rolora(p, 3, None), TypeError, "step_size must be a positive number"),
    (lambda p, q: rolora(p, 3, 0.1, init=np.ones(5)), ValueError, r"init \(a0\) must have shape \(12\)"),
    (lambda p, q: rolora(p, 3, 0.1, init=np.zeros(12)), ValueError, r"init \(a0\) must be non-zero: a zero a"),
    (lambda p, q: fedavg_lora(p, 3, 0.1, init=(np.zeros(12), np.ones(12))), ValueError, r"init \(a0\) must be non-zero"),
    (lambda p, q: rolora(p, 3, 0.1, init=1.5), ValueError, "delta0 must lie in"),
    (lambda p, q: rolora(p, 3, 0.1, init="paper"), ValueError, "init must be one of"),
    (lambda p, q: rolora(p, 3, 0.1, init=(0.5, np.ones(12))), ValueError, "rolora computes b by its exact b-step"),
    (lambda p, q: rolora(q, 3, 0.1, data="bootstrap"), ValueError, "data must be one of"),
    (lambda p, q: fedavg_lora(p, 3, 0.1, local_steps=0), ValueError, "local_steps must be >= 1"),
    (lambda p, q: fedavg_lora(p, 3, 0.1, local_steps=MAX_LOCAL_STEPS + 1), ValueError,
     f"local_steps must be <= {MAX_LOCAL_STEPS}"),
    (lambda p, q: rolora(p, 3, 0.1, local_steps=2.5), TypeError, "local_steps must be an integer"),
    (lambda p, q: ffa_lora(p, 3, local="adam"), ValueError, "local must be one of"),
    (lambda p, q: ffa_lora(p, 3, local="gd"), ValueError, "step_size is required for local='gd'"),
    (lambda p, q: ffa_lora(p, 3, 0.1), ValueError, "step_size applies to local='gd' only"),
    (lambda p, q: ffa_lora(p, 3, local_steps=5), ValueError, "local_steps applies to local='gd' only"),
    (lambda p, q: rolora(p, 3, 0.1, normalize="no"), TypeError, "normalize must be a bool"),
    (lambda p, q: fedavg_lora(p, 3, 0.1, normalize=1), TypeError, "normalize must be a bool"),
    (lambda p, q: fedavg_lora(p, 3, 0.1, init=(0.5, np.ones(3))), ValueError, r"init \(b0\) must have shape \(12\)"),
    (lambda p, q: rolora(p, 3, 0.1, clients_per_round=2.0), TypeError, "clients_per_round must be an integer"),
    (lambda p, q: rolora(p, 3, 0.1, seed=-1), ValueError, "seed must be a non-negative integer"),
])
def test_rank_one_errors_name_the_argument(pop, data, call, exc, match):
    with pytest.raises(exc, match=match):
        call(pop, data)


def test_deprecated_a0_and_delta0_together_is_an_error(pop):
    with pytest.raises(ValueError, match="at most one of a0 and delta0"), pytest.warns(DeprecationWarning):
        rolora(pop, 3, 0.1, a0=np.ones(12), delta0=0.5)
    with pytest.raises(ValueError, match="sample_mode must be one of"):
        rolora(pop, 3, 0.1, sample_mode="bootstrap")


def test_matrix_errors():
    p = lora_matrix_problem(d=5, n_clients=3, rank=2, seed=0)
    pop = rank_one_lora(d=5, n_clients=3, seed=0)
    with pytest.raises(TypeError, match="problem must be a LoRAMatrixProblem"):
        federated_lora_matrix(pop, 3, 0.1)
    with pytest.raises(ValueError, match="method must be one of"):
        federated_lora_matrix(p, 3, 0.1, method="sgd")
    with pytest.raises(ValueError, match=r"init \(A0\) must have shape \(2, 5\)"):
        federated_lora_matrix(p, 3, 0.1, init=np.ones((5, 2)))
    with pytest.raises(ValueError, match=r"init \(B0\) must have shape \(5, 2\)"):
        federated_lora_matrix(p, 3, 0.1, init=(None, np.ones((2, 5))))
    with pytest.raises(ValueError, match="init must be one of"):
        federated_lora_matrix(p, 3, 0.1, init="kaiming")
    with pytest.raises(ValueError, match="local_steps must be <= 100000"):
        federated_lora_matrix(p, 3, 0.1, local_steps=10 ** 6)
    with pytest.raises(ValueError, match="clients_per_round must be <= 3"):
        federated_lora_matrix(p, 3, 0.1, clients_per_round=4)
