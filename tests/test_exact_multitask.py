
import numpy as np
import pytest

from lowrank_fl.exact.multitask import (altmin, fedavg_population_error, fit_heads,
                                        lemma1_decomposition, local_least_squares,
                                        method_of_moments, moment_matrix, ols_then_svd,
                                        projected_gd_init,
                                        pooled_least_squares, population_moment_matrix,
                                        population_optimum)
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.multitask import multitask_linear
from lowrank_fl.results import ConvergenceWarning


def test_moment_matrix_matches_loop_and_population_limit():
    p = multitask_linear(d=6, rank=2, n_clients=4, noise=0.2, seed=0)
    X, y = p.sample(3, seed=1)
    ref = sum(y[i, j] ** 2 * np.outer(X[i, j], X[i, j]) for i in range(4) for j in range(3)) / 12
    assert np.allclose(moment_matrix(X, y), ref, atol=1e-13)
    # E[y^2 x x^T] = (||theta||^2 + s^2) I + 2 theta theta^T: Monte Carlo with 4 * 50000 samples;
    # entries have sd ~ sqrt(var/N) ~ 0.03 here, so 0.15 is a > 4 sd band.
    X, y = p.sample(50000, seed=2)
    assert np.max(np.abs(moment_matrix(X, y) - population_moment_matrix(p.theta, 0.2))) < 0.15


def test_population_moments_top_eigenspace_is_B_star():
    p = multitask_linear(d=10, rank=3, n_clients=20, seed=1)
    M = population_moment_matrix(p.theta)
    vals, vecs = np.linalg.eigh(M)
    assert subspace_distance(p.B_star, vecs[:, -3:]) < 1e-12
    gap = vals[-3] - vals[-4]
    assert gap == pytest.approx(2 * np.linalg.eigvalsh(p.heads.T @ p.heads / 20)[0], rel=1e-10)


def test_method_of_moments_improves_with_samples():
    p = multitask_linear(d=20, rank=2, n_clients=100, seed=2)
    d_small = subspace_distance(p.B_star, method_of_moments(*p.sample(5, seed=3), 2))
    d_big = subspace_distance(p.B_star, method_of_moments(*p.sample(500, seed=3), 2))
    # dist ~ 3.2 sqrt(d/(nm)) (the Davis-Kahan rate of Theorem 2): ~0.6 vs ~0.06
    assert d_big < 0.3 * d_small and d_big < 0.15


def test_projected_gd_init_recovers_subspace_and_is_deterministic():
    p = multitask_linear(d=20, rank=2, n_clients=100, samples_per_client=10, seed=0)
    B = projected_gd_init(p.X, p.y, 2, step_size=0.5, seed=1)
    assert B.shape == (20, 2) and np.allclose(B.T @ B, np.eye(2), atol=1e-12)
    # 10 SVP steps from a random start: dist ~0.08 here (a random subspace has dist ~1)
    assert subspace_distance(p.B_star, B) < 0.3
    assert np.array_equal(B, projected_gd_init(p.X, p.y, 2, step_size=0.5, seed=1))
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        projected_gd_init(p.X, p.y, 2, step_size=0.0)


def test_fit_heads_closed_form_and_population_version():
    p = multitask_linear(d=8, rank=2, n_clients=5, seed=3)
    X, y = p.sample(20, seed=4)
    B = np.linalg.qr(np.random.default_rng(0).standard_normal((8, 2)))[0]
    W = fit_heads(B, X, y)
    for i in range(5):
        assert np.allclose(W[i], np.linalg.lstsq(X[i] @ B, y[i], rcond=None)[0], atol=1e-12)
    Wr = fit_heads(B, X, y, ridge=0.5)
    A = X[0] @ B
    assert np.allclose(Wr[0], np.linalg.solve(A.T @ A + 0.5 * np.eye(2), A.T @ y[0]), atol=1e-12)
    # noiseless with B = B*: heads recovered exactly
    assert np.allclose(fit_heads(p.B_star, X, y), p.heads, atol=1e-10)


def test_local_least_squares_and_min_norm_fallback():
    p = multitask_linear(d=5, rank=2, n_clients=4, samples_per_client=9, seed=0)
    assert np.allclose(local_least_squares(p.X, p.y), p.theta, atol=1e-10)
    q = multitask_linear(d=5, rank=2, n_clients=4, samples_per_client=3, seed=0)   # m < d: singular, min-norm solution
    T = local_least_squares(q.X, q.y)
    for i in range(4):
        assert np.allclose(T[i], np.linalg.pinv(q.X[i]) @ q.y[i], atol=1e-10)


def test_ols_then_svd_and_population_optimum_recover_subspace():
    p = multitask_linear(d=6, rank=2, n_clients=10, samples_per_client=8, seed=1)
    assert subspace_distance(p.B_star, ols_then_svd(p.X, p.y, 2)) < 1e-10
    assert subspace_distance(p.B_star, population_optimum(p.theta, 2)) < 1e-12


def test_pooled_least_squares_and_fedavg_error():
    p = multitask_linear(d=6, rank=2, n_clients=10, samples_per_client=4000, seed=5)
    # pooled OLS -> B* mean(w*) as m grows (noiseless: error ~ heterogeneity / sqrt(nm) ~ 0.03)
    th = pooled_least_squares(p.X, p.y)
    assert np.linalg.norm(th - p.B_star @ p.heads.mean(axis=0)) < 0.1
    W = p.heads
    err = fedavg_population_error(W)
    best = p.B_star @ W.mean(axis=0)
    assert err == pytest.approx(0.5 * np.mean(np.sum((best - p.theta) ** 2, axis=1)), rel=1e-12)


def test_altmin_reaches_exact_fit_noiseless_and_is_monotone():
    # m = 10: MoM start at dist ~0.75; AltMin reaches the exact fit (at m = 6 it can stall).
    p = multitask_linear(d=10, rank=2, n_clients=40, samples_per_client=10, seed=2)
    res = altmin(p.X, p.y, 2, max_iter=300, tol=1e-14)
    obj = res.history["objective"]
    assert np.all(np.diff(obj) <= 1e-12 * obj[:-1] + 1e-18)     # exact block minimization never increases
    assert res.status == "optimal"
    assert subspace_distance(p.B_star, res.B) < 1e-6
    assert np.allclose(res.B.T @ res.B, np.eye(2), atol=1e-12)


def test_altmin_max_iter_warns():
    p = multitask_linear(d=10, rank=2, n_clients=40, samples_per_client=6, noise=0.1, seed=2)
    with pytest.warns(ConvergenceWarning, match="altmin stopped at max_iter=2"):
        res = altmin(p.X, p.y, 2, max_iter=2)
    assert res.status == "max_iter" and res.iterations == 2


def test_lemma1_shapes():
    p = multitask_linear(d=7, rank=2, n_clients=3, seed=0)
    X, _ = p.sample(5, seed=1)
    q = lemma1_decomposition(p.B_star, p.B_star, p.heads, X)
    assert q["G"].shape == (3, 2, 2) and q["D"].shape == (2, 2)
    # at B = B*, H = 0 and F = 0 (Lemma 3 bound is proportional to dist = 0)
    assert np.max(np.abs(q["F"])) < 1e-12 and np.max(np.abs(q["H"])) < 1e-12


@pytest.mark.parametrize("call, err, match", [
    (lambda X, y: moment_matrix(X[0], y), ValueError, "X must have 3 dimensions"),
    (lambda X, y: moment_matrix(X, y[:, :1]), ValueError, r"y must have shape \(4, 5\)"),
    (lambda X, y: method_of_moments(X, y, 6), ValueError, "k must be <= 5"),
    (lambda X, y: fit_heads(np.ones((5, 2)), X, y), ValueError, r"B must have shape \(6, \?\)"),
    (lambda X, y: fit_heads(np.ones((6, 2)), X, y, ridge=-1.0), ValueError, "ridge must be finite and >= 0"),
    (lambda X, y: altmin(X, y, 2, B0=np.ones((6, 3))), ValueError, r"B0 must have shape \(6, 2\)"),
    (lambda X, y: altmin(X, y, 2, tol=0.0), ValueError, "tol must be finite and > 0"),
    (lambda X, y: population_optimum(np.ones((3, 4)), 5), ValueError, "k must be <= 3"),
    (lambda X, y: population_moment_matrix(np.ones(3)), ValueError, "theta must have 2 dimensions"),
])
def test_bad_input(call, err, match):
    p = multitask_linear(d=6, rank=2, n_clients=4, seed=0)
    X, y = p.sample(5, seed=0)
    with pytest.raises(err, match=match):
        call(X, y)


def test_shared_head_and_representation_solvers():
    from lowrank_fl.exact.multitask import gram_heads, least_squares_heads, representation_step

    p = multitask_linear(d=7, rank=2, n_clients=5, samples_per_client=9, noise=0.3, seed=3)
    B = np.linalg.qr(np.random.default_rng(1).standard_normal((7, 2)))[0]
    gram = np.einsum("nmd,nme->nde", p.X, p.X)
    xty = np.einsum("nmd,nm->nd", p.X, p.y)
    ref = np.stack([np.linalg.lstsq(p.X[i] @ B, p.y[i], rcond=None)[0] for i in range(5)])
    # three routes to the same normal equations, O(1) entries: agreement to 1e-10
    np.testing.assert_allclose(least_squares_heads(p.X @ B, p.y), ref, atol=1e-10)
    np.testing.assert_allclose(gram_heads(B, gram, xty), ref, atol=1e-10)
    # representation step: the gradient of sum_i ||X_i B w_i - y_i||^2 in B vanishes there
    Bn = representation_step(ref, gram, xty)
    grad = sum(np.outer(p.X[i].T @ (p.X[i] @ Bn @ ref[i] - p.y[i]), ref[i]) for i in range(5))
    assert np.max(np.abs(grad)) < 1e-10
