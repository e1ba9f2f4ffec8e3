import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.problems.lora import (LoRAMatrixProblem, RankOneLoRAProblem, angle_distance, init_at_angle,
                                      lora_matrix_problem, random_unit, rank_one_lora, spread_exactly)


@settings(max_examples=30, deadline=None)
@given(d=st.integers(2, 12), n=st.integers(2, 9), gamma=st.floats(0.0, 5.0), seed=st.integers(0, 2 ** 16))
def test_heterogeneity_is_exactly_gamma_squared(d, n, gamma, seed):
    p = rank_one_lora(d=d, n_clients=n, gamma=gamma, seed=seed)
    spread = np.mean(np.sum((p.b_star - p.b_bar) ** 2, axis=1))
    # exact construction: only rounding error (relative 1e-12) remains
    assert spread == pytest.approx(gamma ** 2, rel=1e-12, abs=1e-14)
    assert np.linalg.norm(p.a_star) == pytest.approx(1.0, abs=1e-14)
    assert p.b_star.shape == (n, d)


def test_homogeneous_clients_share_b_and_b_norm_is_applied():
    p = rank_one_lora(d=6, n_clients=4, gamma=0.0, b_norm=2.5, seed=0)
    assert np.all(p.b_star == p.b_star[0])
    assert p.L_max == pytest.approx(2.5, rel=1e-14)


def test_matrix_problem_spread_and_orthonormal_down_projection():
    p = lora_matrix_problem(d=8, n_clients=5, rank=3, gamma=0.7, seed=1)
    # PEFT letters: A* (r, in) with orthonormal rows, B_i* (out, r), DeltaW_i = B_i* A* (out, in)
    assert p.A_star.shape == (3, 8) and p.B_star.shape == (5, 8, 3) and p.targets.shape == (5, 8, 8)
    np.testing.assert_allclose(p.A_star @ p.A_star.T, np.eye(3), atol=1e-13)
    np.testing.assert_allclose(p.targets[2], p.B_star[2] @ p.A_star, atol=1e-14)
    spread = np.mean(np.sum((p.B_star - p.B_star.mean(0)) ** 2, axis=(1, 2)))
    assert spread == pytest.approx(0.49, rel=1e-12)
    # A* orthonormal: the targets have the same spread
    T = p.targets
    assert np.mean(np.sum((T - T.mean(0)) ** 2, axis=(1, 2))) == pytest.approx(0.49, rel=1e-12)
    np.testing.assert_allclose(p.mean_target, T.mean(0), atol=1e-13)
    assert p.loss(p.A_star, p.B_star.mean(0)) == pytest.approx(0.49, rel=1e-12)
    q = lora_matrix_problem(d=8, n_clients=5, rank=3, d_out=4, gamma=0.7, seed=1)
    assert q.targets.shape == (5, 4, 8) and (q.d_in, q.d_out, q.rank) == (8, 4, 3)


def test_generators_take_sizes_as_keywords_only():
    with pytest.raises(TypeError):
        rank_one_lora(5, 3)
    with pytest.raises(TypeError):
        lora_matrix_problem(5, 3, 2)


def test_sampled_data_follow_the_model_and_are_reproducible():
    p = rank_one_lora(d=5, n_clients=3, gamma=0.5, samples_per_client=7, seed=3)
    q = rank_one_lora(d=5, n_clients=3, gamma=0.5, samples_per_client=7, seed=3)
    assert p.X.shape == (3, 7, 5) and p.Y.shape == (3, 7, 5)
    np.testing.assert_array_equal(p.X, q.X)
    expected = np.einsum("nmd,d,nk->nmk", p.X, p.a_star, p.b_star)
    np.testing.assert_allclose(p.Y, expected, atol=1e-13)
    r = p.sample(11, seed=4)
    assert r.X.shape == (3, 11, 5) and r.samples_per_client == 11
    np.testing.assert_array_equal(r.a_star, p.a_star)


def test_population_loss_matches_direct_frobenius_and_is_accurate_near_optimum():
    p = rank_one_lora(d=6, n_clients=4, gamma=0.3, seed=5)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(6), rng.standard_normal(6)
    direct = np.mean([np.sum((np.outer(p.a_star, bi) - np.outer(a, b)) ** 2) for bi in p.b_star])
    assert p.population_loss(a, b) == pytest.approx(direct, rel=1e-12)
    # at the optimum the stable form gives gamma^2 to full precision and model error ~ 1e-16
    assert p.population_loss(p.a_star, p.b_bar) == pytest.approx(0.09, rel=1e-13)
    assert p.model_error(-p.a_star, -p.b_bar) <= 1e-15
    direct_me = np.linalg.norm(np.outer(a, b) - np.outer(p.a_star, p.b_bar)) / np.linalg.norm(p.b_bar)
    assert p.model_error(a, b) == pytest.approx(direct_me, rel=1e-12)


def test_empirical_loss_tends_to_population_loss():
    p = rank_one_lora(d=4, n_clients=2, gamma=0.4, samples_per_client=40000, noise=0.1, seed=6)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(4), rng.standard_normal(4)
    # CLT: relative fluctuation of a mean of 80000 chi-square-like terms is ~ 1/sqrt(80000) ~ 0.004;
    # 0.03 is > 5 standard errors
    assert p.empirical_loss(a, b) == pytest.approx(p.population_loss(a, b), rel=0.03)


def test_angle_distance_and_controlled_init():
    a_star = random_unit(7, 0)
    for delta0 in (0.0, 0.3, 0.99, 1.0):
        a0 = init_at_angle(a_star, delta0, seed=2)
        assert np.linalg.norm(a0) == pytest.approx(1.0, abs=1e-14)
        assert angle_distance(a0, a_star) == pytest.approx(delta0, abs=1e-12)
        assert angle_distance(-3.0 * a0, a_star) == pytest.approx(delta0, abs=1e-12)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"d": 1, "n_clients": 2}, ValueError, "d must be >= 2"),
    ({"d": 3, "n_clients": 0}, ValueError, "n_clients must be >= 1"),
    ({"d": 3, "n_clients": 2, "gamma": -0.1}, ValueError, "gamma must be finite and >= 0"),
    ({"d": 3, "n_clients": 1, "gamma": 0.5}, ValueError, "gamma > 0 needs n_clients >= 2"),
    ({"d": 3, "n_clients": 2, "samples_per_client": 0}, ValueError, "samples_per_client must be >= 1"),
    ({"d": 3, "n_clients": 2, "b_norm": 0.0}, ValueError, "b_norm must be finite and > 0"),
    ({"d": 3, "n_clients": 2, "noise": -1.0}, ValueError, "noise must be finite and >= 0"),
    ({"d": 3.5, "n_clients": 2}, TypeError, "d must be an integer"),
])
def test_rank_one_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        rank_one_lora(**kwargs)


def test_other_errors():
    with pytest.raises(ValueError, match="empirical_loss needs sampled data"):
        rank_one_lora(d=3, n_clients=2, seed=0).empirical_loss(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="rank must be <= 4"):
        lora_matrix_problem(d=4, n_clients=2, rank=5)
    with pytest.raises(ValueError, match="d_out must be >= 1"):
        lora_matrix_problem(d=4, n_clients=2, rank=2, d_out=0)
    with pytest.raises(ValueError, match="gamma > 0 needs n_clients >= 2"):
        lora_matrix_problem(d=4, n_clients=1, rank=2, gamma=1.0)
    with pytest.raises(ValueError, match="delta0 must lie in"):
        init_at_angle(random_unit(3, 0), 1.5)
    with pytest.raises(ValueError, match="a_star must have at least 2 entries"):
        init_at_angle(np.ones(1), 0.5)
    with pytest.raises(ValueError, match="m must be >= 1"):
        rank_one_lora(d=3, n_clients=2, seed=0).sample(0)


def test_angle_distance_zero_and_nonfinite():
    a_star = random_unit(5, 0)
    # a zero a spans nothing: a* lies entirely outside its span (distance 1, the
    # subspace_distance(..., rank_deficient="span") rule for iterates that lost rank)
    assert angle_distance(np.zeros(5), a_star) == 1.0
    assert np.isnan(angle_distance(np.full(5, np.nan), a_star))
    with pytest.raises(ValueError, match="a and a_star must be vectors of the same length"):
        angle_distance(np.ones(4), a_star)


def _rank_one(**kw):
    base = rank_one_lora(d=4, n_clients=3, gamma=0.5, seed=0)
    args = dict(a_star=base.a_star, b_star=base.b_star, gamma=0.5)
    args.update(kw)
    return RankOneLoRAProblem(**args)


@pytest.mark.parametrize("kw, match", [
    (dict(a_star=2 * np.eye(4)[0]), "a_star must be a unit vector, got norm 2"),
    (dict(a_star=np.eye(3)[0]), r"b_star must have shape \(\?, 3\)"),
    (dict(a_star=np.ones(1)), "a_star must have at least 2 entries"),
    (dict(gamma=0.9), r"gamma must equal the spread .* got gamma=0.9 but the spread is 0.5"),
    (dict(gamma=-0.5), "gamma must be finite and >= 0"),
    (dict(noise=-1.0), "noise must be finite and >= 0"),
    (dict(X=np.zeros((3, 2, 4))), "X and Y must be given together"),
    (dict(X=np.zeros((3, 2, 4)), Y=np.zeros((3, 2, 5))), r"Y must have shape \(3, 2, 4\)"),
    (dict(X=np.zeros((2, 2, 4)), Y=np.zeros((2, 2, 4))), r"X must have shape \(3, \?, 4\)"),
])
def test_rank_one_problem_validation(kw, match):
    assert _rank_one().gamma == 0.5          # the base instance itself is valid
    with pytest.raises(ValueError, match=match):
        _rank_one(**kw)


@pytest.mark.parametrize("kw, match", [
    (dict(A_star=np.ones((2, 5))), "A_star must have orthonormal rows"),
    (dict(A_star=np.ones((6, 5))), "A_star must have at most as many rows"),
    (dict(A_star=np.eye(3, 6)), r"B_star must have shape \(\?, \?, 3\)"),
    (dict(gamma=2.0), "gamma must equal the spread"),
])
def test_matrix_problem_validation(kw, match):
    base = lora_matrix_problem(d=5, n_clients=3, rank=2, gamma=0.7, seed=1)
    args = dict(A_star=base.A_star, B_star=base.B_star, gamma=base.gamma)
    LoRAMatrixProblem(**args)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        LoRAMatrixProblem(**args)
    with pytest.raises(ValueError, match=r"A must have shape \(r, 5\) and B shape \(5, r\)"):
        base.loss(np.ones((2, 5)), np.ones((5, 3)))


def test_spread_exactly_errors_and_haar_draw():
    with pytest.raises(ValueError, match="Z must have at least two distinct rows when gamma > 0"):
        spread_exactly(np.zeros(3), np.ones((4, 3)), 0.5)
    with pytest.raises(ValueError, match=r"Z must have shape \(N, \*\(3,\)\)"):
        spread_exactly(np.zeros(3), np.ones((4, 2)), 0.5)
    # A* is the shared Haar draw of the multitask module (same generator, same numbers)
    from lowrank_fl.problems.multitask import haar_orthonormal
    np.testing.assert_array_equal(lora_matrix_problem(d=6, n_clients=3, rank=2, seed=4).A_star,
                                  haar_orthonormal(d=6, rank=2, seed=np.random.default_rng(4)).T)
