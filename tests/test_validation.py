"""Shared input checks and seeding."""
import numpy as np
import pytest

from lowrank_fl.validation import (as_float_array, as_generator, check_in_interval, check_int,
                                    check_positive)
from lowrank_fl.algorithms import fedrep
from lowrank_fl.problems import multitask_linear


def test_named_streams_are_deterministic_and_independent():
    a = as_generator(3, stream="fedrep").standard_normal(4)
    assert np.array_equal(a, as_generator(3, stream="fedrep").standard_normal(4))
    assert not np.allclose(a, as_generator(3).standard_normal(4))
    assert not np.allclose(a, as_generator(3, stream="fedavg").standard_normal(4))
    g = np.random.default_rng(1)
    assert as_generator(g, stream="x") is g  # a Generator is shared as is


def test_same_int_seed_for_problem_and_algorithm_does_not_replay_the_truth():
    # Before named streams, seed=0 for both made the random init equal to B* (distance 0).
    prob = multitask_linear(d=20, rank=2, n_clients=30, seed=0)
    tr = fedrep(prob, 1, 0.1, init="random", seed=0)
    assert tr.distance[0] > 0.5


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="W must have 3 dimensions"):
        as_float_array(np.ones((2, 2)), "W", ndim=3)
    with pytest.raises(ValueError, match=r"W must have shape \(\?, 2\)"):
        as_float_array(np.ones((2, 3)), "W", shape=(None, 2))
    with pytest.raises(TypeError, match="rounds must be an integer"):
        check_int(2.5, "rounds")
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        check_positive(0.0, "step_size")
    with pytest.raises(ValueError, match=r"alpha must lie in \[0.5, 1.0\)"):
        check_in_interval(1.0, "alpha", 0.5, 1.0, closed="left")
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        as_generator(-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        as_generator("0")


def test_complex_input_is_refused():
    # casting to float64 would silently drop the imaginary part
    with pytest.raises(TypeError, match=r"W must be a real numeric array, got complex values"):
        as_float_array(np.array([1 + 2j, 3]), "W")
    with pytest.raises(TypeError, match="x must be a real numeric array"):
        as_float_array([1.0, 2j], "x")
    np.testing.assert_array_equal(as_float_array(np.array([1, 2]), "x"), [1.0, 2.0])


def test_algorithms_name_the_problem_type_they_need():
    from lowrank_fl.validation import check_instance
    from lowrank_fl.algorithms import fedavg, flute, rolora
    from lowrank_fl.problems import MultitaskProblem
    with pytest.raises(TypeError, match=r"problem must be a MultitaskProblem \(lowrank_fl.problems.multitask\), got str"):
        check_instance("x", "problem", MultitaskProblem)
    prob = multitask_linear(d=10, rank=2, n_clients=5, seed=0)
    with pytest.raises(TypeError, match="problem must be an UnderparameterizedProblem"):
        flute(prob, 1, 0.1)
    with pytest.raises(TypeError, match="problem must be a RankOneLoRAProblem"):
        rolora(prob, 1, 0.1)
    with pytest.raises(TypeError, match="problem must be a MultitaskProblem"):
        fedavg("not a problem", 1, 0.1, local_steps=1)


def test_a_ragged_list_names_the_element_that_differs():
    from lowrank_fl import clair
    from lowrank_fl.problems.multitask import MultitaskProblem

    W = np.ones((5, 6))
    with pytest.raises(ValueError, match=r"W_hat: its elements must all have one shape, got \(5, 6\) for "
                                         r"W_hat\[0\] and \(5, 4\) for W_hat\[2\]"):
        clair.fit([W, W, W[:, :4]], 0.1, 0.1, rank=1)
    with pytest.raises(ValueError, match=r"X: .* \(4, 3\) for X\[0\] and \(4, 2\) for X\[1\]"):
        MultitaskProblem.from_data([np.ones((4, 3)), np.ones((4, 2))], [np.ones(4), np.ones(4)], rank=1)
    np.testing.assert_array_equal(as_float_array([[1, 2], (3, 4)], "x"), [[1.0, 2.0], [3.0, 4.0]])
