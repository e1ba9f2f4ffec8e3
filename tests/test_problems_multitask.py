import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.problems.multitask import MultitaskProblem, haar_orthonormal, multitask_linear


def test_shapes_and_orthonormal_truth():
    p = multitask_linear(d=12, rank=3, n_clients=7, samples_per_client=5, noise=0.1, seed=0)
    assert p.B_star.shape == (12, 3) and p.heads.shape == (7, 3)
    assert np.allclose(p.B_star.T @ p.B_star, np.eye(3), atol=1e-12)
    assert p.theta.shape == (7, 12)
    assert np.allclose(p.theta, p.heads @ p.B_star.T)
    assert p.X.shape == (7, 5, 12) and p.y.shape == (7, 5)
    assert (p.d, p.k, p.n_clients, p.samples_per_client, p.noise) == (12, 3, 7, 5, 0.1)


def test_population_regime_has_no_data():
    p = multitask_linear(d=6, rank=2, n_clients=4, seed=1)
    assert p.X is None and p.y is None and p.samples_per_client is None
    with pytest.raises(ValueError, match="no fixed dataset"):
        p.empirical_loss(p.B_star, p.heads)


@given(st.integers(1, 4), st.integers(1, 20), st.integers(0, 2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_normalized_heads_have_norm_sqrt_k(k, n, seed):
    p = multitask_linear(d=k + 3, rank=k, n_clients=n, seed=seed)
    assert np.allclose(np.linalg.norm(p.heads, axis=1), np.sqrt(k), atol=1e-12)


def test_heads_options():
    g = multitask_linear(d=8, rank=2, n_clients=500, heads="gaussian", seed=3)
    # Gaussian rows: E||w||^2 = k; mean over 500 rows has sd sqrt(2k/500) ~ 0.09, so 0.4 is > 4 sd.
    assert abs(np.mean(np.sum(g.heads ** 2, axis=1)) - 2) < 0.4
    q = multitask_linear(d=8, rank=2, n_clients=50, heads="qr", seed=3)
    assert np.allclose(q.heads.T @ q.heads, 2 * np.eye(2), atol=1e-12)
    W = np.arange(10.0).reshape(5, 2)
    u = multitask_linear(d=8, rank=2, n_clients=5, heads=W, seed=3)
    assert np.array_equal(u.heads, W)


def test_same_seed_same_numbers():
    a = multitask_linear(d=9, rank=2, n_clients=4, samples_per_client=3, noise=0.2, seed=11)
    b = multitask_linear(d=9, rank=2, n_clients=4, samples_per_client=3, noise=0.2, seed=11)
    c = multitask_linear(d=9, rank=2, n_clients=4, samples_per_client=3, noise=0.2, seed=12)
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y) and np.array_equal(a.B_star, b.B_star)
    assert not np.array_equal(a.X, c.X)


def test_noiseless_labels_are_exact_and_noise_has_right_std():
    p = multitask_linear(d=10, rank=2, n_clients=3, seed=0)
    X, y = p.sample(4, seed=1)
    assert np.allclose(y, np.einsum("nmd,nd->nm", X, p.theta), atol=1e-13)
    q = multitask_linear(d=10, rank=2, n_clients=20, noise=0.5, seed=0)
    X, y = q.sample(2000, seed=2)
    resid = y - np.einsum("nmd,nd->nm", X, q.theta)
    # 40000 draws: the sample sd has relative error ~ 1/sqrt(2*40000) ~ 0.0035; 0.02 is > 5 sd.
    assert abs(resid.std() / 0.5 - 1) < 0.02


def test_sample_subset_of_clients():
    p = multitask_linear(d=10, rank=2, n_clients=6, seed=0)
    X, y = p.sample(3, seed=1, clients=np.array([4, 1]))
    assert X.shape == (2, 3, 10)
    assert np.allclose(y, np.einsum("cmd,cd->cm", X, p.theta[[4, 1]]))
    with pytest.raises(ValueError, match="clients must lie in"):
        p.sample(3, seed=1, clients=np.array([6]))
    with pytest.raises(ValueError, match="clients must be a 1-D integer array"):
        p.sample(3, seed=1, clients=np.array([0.5]))


def test_population_loss_closed_form_matches_monte_carlo():
    p = multitask_linear(d=8, rank=2, n_clients=5, noise=0.3, seed=4)
    rng = np.random.default_rng(0)
    B = rng.standard_normal((8, 2))
    W = rng.standard_normal((5, 2))
    exact = p.population_loss(B, W)
    assert exact == pytest.approx(p.population_loss(B, W, excess=True) + 0.5 * 0.09)
    X, y = p.sample(20000, seed=5)
    mc = p.empirical_loss(B, W, X, y)
    # 1e5 squared residuals; relative sd of their mean ~ sqrt(2/1e5) * (a few) < 0.01; 0.03 is safe.
    assert mc == pytest.approx(exact, rel=0.03)
    assert p.population_loss(p.B_star, p.heads, excess=True) == pytest.approx(0.0, abs=1e-25)


def test_empirical_loss_uses_fixed_dataset():
    p = multitask_linear(d=8, rank=2, n_clients=5, samples_per_client=6, seed=4)
    assert p.empirical_loss(p.B_star, p.heads) == pytest.approx(0.0, abs=1e-25)
    B = np.zeros((8, 2))
    assert p.empirical_loss(B, p.heads) == pytest.approx(0.5 * np.mean(p.y ** 2))


def test_haar_is_orthonormal_and_deterministic():
    Q = haar_orthonormal(d=7, rank=3, seed=2)
    assert np.allclose(Q.T @ Q, np.eye(3), atol=1e-12)
    assert np.array_equal(Q, haar_orthonormal(d=7, rank=3, seed=2))


def test_user_B_star_accepted_when_orthonormal_rejected_otherwise():
    B = haar_orthonormal(d=6, rank=2, seed=0)
    p = multitask_linear(d=6, rank=2, n_clients=3, B_star=B, seed=1)
    assert np.array_equal(p.B_star, B)
    with pytest.raises(ValueError, match="B_star must have orthonormal columns"):
        multitask_linear(d=6, rank=2, n_clients=3, B_star=2 * B, seed=1)
    with pytest.raises(ValueError, match=r"B_star must have shape \(6, 2\)"):
        multitask_linear(d=6, rank=2, n_clients=3, B_star=B[:5], seed=1)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(d=5, rank=5, n_clients=3), ValueError, "rank must be smaller than d"),
    (dict(d=5, rank=7, n_clients=3), ValueError, "rank must be smaller than d"),
    (dict(d=5, rank=0, n_clients=3), ValueError, "rank must be >= 1"),
    (dict(d=5, rank=2, n_clients=0), ValueError, "n_clients must be >= 1"),
    (dict(d=5, rank=2.0, n_clients=3), TypeError, "rank must be an integer"),
    (dict(d=5, rank=2, n_clients=3, samples_per_client=0), ValueError, "samples_per_client must be >= 1"),
    (dict(d=5, rank=2, n_clients=3, noise=-1.0), ValueError, "noise must be finite and >= 0"),
    (dict(d=5, rank=2, n_clients=3, heads="unit"), ValueError, "heads must be one of"),
    (dict(d=5, rank=2, n_clients=3, heads=np.ones((4, 2))), ValueError, r"heads must have shape \(3, 2\)"),
    (dict(d=5, rank=2, n_clients=1, heads="qr"), ValueError, "heads='qr' needs n_clients >= rank"),
])
def test_bad_input(kwargs, err, match):
    with pytest.raises(err, match=match):
        multitask_linear(seed=0, **kwargs)


def test_direct_construction_is_validated():
    B = haar_orthonormal(d=6, rank=2, seed=0)
    with pytest.raises(ValueError, match="B_star must have k < d"):
        MultitaskProblem(B_star=np.eye(3), heads=np.ones((2, 3)))
    with pytest.raises(ValueError, match="X and y must be given together"):
        MultitaskProblem(B_star=B, heads=np.ones((2, 2)), X=np.zeros((2, 3, 6)))
    with pytest.raises(ValueError, match=r"X must have shape \(2, \?, 6\)"):
        MultitaskProblem(B_star=B, heads=np.ones((2, 2)), X=np.zeros((2, 3, 5)), y=np.zeros((2, 3)))
    p = MultitaskProblem(B_star=B, heads=np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"W must have shape \(2, 2\)"):
        p.population_loss(B, np.ones((3, 2)))
    with pytest.raises(ValueError, match="m must be >= 1"):
        p.sample(0)
