import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.problems.underparameterized import (UnderparameterizedProblem, appendix_c_spectrum,
                                                    underparameterized)


def test_appendix_c_spectrum_values():
    # App. C.1: lambda_i = 2 min(d, M) / (i + 1); d = 10, M = 15 gives 10, 6.667, ..., 1.818
    s = appendix_c_spectrum(10, 15)
    assert s.shape == (10,)
    np.testing.assert_allclose(s, 20.0 / np.arange(2, 12))
    assert appendix_c_spectrum(40, 6).shape == (6,)          # min(d, M) = M when M < d
    np.testing.assert_allclose(np.sum(s ** 2), 223.21, atol=5e-3)   # the expected sum of squares of the App. C spectrum


def test_default_instance_structure():
    p = underparameterized(d=10, n_clients=15, rank=4, seed=0)
    assert p.Phi.shape == (10, 15) and p.U_k.shape == (10, 4)
    np.testing.assert_allclose(np.linalg.svd(p.Phi, compute_uv=False), p.spectrum, atol=1e-12)
    # Eckart-Young: the target is the rank-k SVD truncation and the floor its residual
    U, s, Vt = np.linalg.svd(p.Phi, full_matrices=False)
    np.testing.assert_allclose(p.target, (U[:, :4] * s[:4]) @ Vt[:4], atol=1e-12)
    assert np.isclose(np.sum((p.Phi - p.target) ** 2), p.floor, rtol=1e-12)
    assert np.isclose(p.gap, 2 * (10 / 2.5 - 10 / 3)), "Delta = 2 (lambda_4 - lambda_5)"
    assert np.isclose(p.energy, np.sum(p.Phi ** 2))
    assert p.underparameterized and p.phi_rank == 10 and p.rank == p.k == 4
    assert p.X is None and p.samples_per_client is None


def test_seed_reproducible_and_sample_shapes():
    a = underparameterized(d=6, n_clients=5, rank=2, samples_per_client=7, noise=0.5, seed=3)
    b = underparameterized(d=6, n_clients=5, rank=2, samples_per_client=7, noise=0.5, seed=3)
    np.testing.assert_array_equal(a.Phi, b.Phi)
    np.testing.assert_array_equal(a.X, b.X)
    assert a.X.shape == (5, 7, 6) and a.y.shape == (5, 7)
    X, y = a.sample(11, seed=1)
    X2, y2 = a.sample(11, seed=1)
    np.testing.assert_array_equal(y, y2)
    assert X.shape == (5, 11, 6)


def test_noiseless_labels_are_linear():
    p = underparameterized(d=6, n_clients=5, rank=2, seed=1)
    X, y = p.sample(9, seed=2)
    np.testing.assert_allclose(y, np.einsum("imd,di->im", X, p.Phi), atol=1e-12)


def test_noise_variance_is_noise_squared():
    # noise is a standard deviation: residual variance ~ noise^2 (Monte Carlo, 60k draws,
    # relative standard error sqrt(2/60000) = 0.6%, tolerance 4%)
    p = underparameterized(d=4, n_clients=3, rank=1, noise=0.7, seed=1)
    X, y = p.sample(20000, seed=5)
    r = y - np.einsum("imd,di->im", X, p.Phi)
    assert abs(r.var() / 0.49 - 1) < 0.04


@settings(max_examples=20, deadline=None)
@given(d=st.integers(3, 9), M=st.integers(2, 9), data=st.data())
def test_property_target_is_best_rank_k(d, M, data):
    k = data.draw(st.integers(1, min(d - 1, M)))
    p = underparameterized(d=d, n_clients=M, rank=k, seed=data.draw(st.integers(0, 1000)))
    assert np.linalg.matrix_rank(p.target, tol=1e-9) == k
    # U_k spans the column space of the target
    np.testing.assert_allclose(p.U_k @ (p.U_k.T @ p.target), p.target, atol=1e-10)


def test_overparameterized_rank_k_spectrum():
    p = underparameterized(d=8, n_clients=6, rank=3, spectrum=[5.0, 3.0, 2.0], seed=0)
    assert not p.underparameterized and p.floor == 0.0
    np.testing.assert_allclose(p.target, p.Phi, atol=1e-12)
    assert np.isclose(p.gap, 4.0)     # lambda_(k+1) = 0


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(d=5, n_clients=4, rank=5), ValueError, "rank must be < d"),
    (dict(d=5, n_clients=2, rank=3), ValueError, "rank must be <= n_clients"),
    (dict(d=5, n_clients=4, rank=0), ValueError, "rank must be >= 1"),
    (dict(d=5, n_clients=4, rank=2.5), TypeError, "rank must be an integer"),
    (dict(d=1, n_clients=4, rank=1), ValueError, "d must be >= 2"),
    (dict(d=5, n_clients=4, rank=2, spectrum=[3.0, 2.0, 2.0]), ValueError, "gap at k"),
    (dict(d=5, n_clients=4, rank=2, spectrum=[3.0, 4.0]), ValueError, "non-increasing"),
    (dict(d=5, n_clients=4, rank=2, spectrum=[3.0, -1.0]), ValueError, "positive"),
    (dict(d=5, n_clients=4, rank=2, spectrum=[5, 4, 3, 2, 1]), ValueError, "at most min"),
    (dict(d=5, n_clients=4, rank=3, spectrum=[5, 4]), ValueError, "at least k"),
    (dict(d=5, n_clients=4, rank=2, spectrum=[]), ValueError, "at least one"),
    (dict(d=5, n_clients=4, rank=2, noise=-1.0), ValueError, "noise must be"),
    (dict(d=5, n_clients=4, rank=2, samples_per_client=0), ValueError, "samples_per_client must be"),
    (dict(d=5, n_clients=4, rank=2, seed="x"), TypeError, "seed must be"),
])
def test_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        underparameterized(**kwargs)


def test_dataclass_errors():
    p = underparameterized(d=5, n_clients=4, rank=2, seed=0)
    with pytest.raises(ValueError, match="U must have orthonormal columns"):
        UnderparameterizedProblem(U=2 * p.U, spectrum=p.spectrum, V=p.V, k=2)
    with pytest.raises(ValueError, match="V must have orthonormal rows"):
        UnderparameterizedProblem(U=p.U, spectrum=p.spectrum, V=2 * p.V, k=2)
    with pytest.raises(ValueError, match="U must have one column per singular value"):
        UnderparameterizedProblem(U=p.U[:, :2], spectrum=p.spectrum, V=p.V, k=1)
    with pytest.raises(ValueError, match="X and y must be given together"):
        UnderparameterizedProblem(U=p.U, spectrum=p.spectrum, V=p.V, k=2, X=np.zeros((4, 3, 5)))
    with pytest.raises(ValueError, match="X must have shape"):
        UnderparameterizedProblem(U=p.U, spectrum=p.spectrum, V=p.V, k=2,
                                  X=np.zeros((3, 3, 5)), y=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="m must be >= 1"):
        p.sample(0)


def test_population_loss_closed_form_matches_monte_carlo():
    p = underparameterized(d=5, n_clients=4, rank=2, noise=0.5, seed=3)
    rng = np.random.default_rng(0)
    B, H = rng.standard_normal((5, 2)), rng.standard_normal((4, 2))
    exact = p.population_loss(B, H)
    assert exact == pytest.approx(p.population_loss(B, H, excess=True) + 0.25, rel=1e-12)
    X, y = p.sample(20000, seed=1)
    mc = float(np.mean((y - np.einsum("imd,id->im", X, H @ B.T)) ** 2))
    # 80k squared residuals: relative sd of their mean ~ sqrt(2/8e4) ~ 0.005; 0.03 is > 5 sd
    assert mc == pytest.approx(exact, rel=0.03)
    assert p.population_loss(p.U_k, (p.spectrum[:2, None] * p.V[:2]).T) == pytest.approx(p.floor / 4 + 0.25)
    with pytest.raises(ValueError, match=r"heads must have shape \(4, 2\)"):
        p.population_loss(B, H.T)


def test_dataset_mixin_messages():
    p = underparameterized(d=5, n_clients=4, rank=2, seed=0)
    with pytest.raises(ValueError, match="needs a fixed dataset; this problem has no fixed dataset"):
        p.require_dataset("this step")
    q = underparameterized(d=5, n_clients=4, rank=2, samples_per_client=3, seed=0)
    X, y = q.require_dataset("this step")
    assert X.shape == (4, 3, 5) and y.shape == (4, 3) and q.samples_per_client == 3
    with pytest.raises(ValueError, match=r"y must have shape \(4, 3\)"):
        UnderparameterizedProblem(U=q.U, spectrum=q.spectrum, V=q.V, k=2, X=q.X, y=q.y[:, :2])
