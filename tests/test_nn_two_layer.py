"""RoLoRA §5.2 two-layer network on scikit-learn's digits: split, methods, determinism."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from lowrank_fl.nn.two_layer import digits_federation, train  # noqa: E402


@pytest.fixture(scope="module")
def fed10():
    return digits_federation(10, seed=0)


def test_label_skew_split(fed10):
    assert fed10.X.shape[0] == 10 and fed10.X.shape[2] == 64
    for k in range(10):
        assert set(np.unique(fed10.y[k])) == {k}
    fed5 = digits_federation(5, seed=0)
    for k in range(5):
        assert set(np.unique(fed5.y[k])) == {2 * k, 2 * k + 1}
    assert set(np.unique(fed5.y_test)) == set(range(10))
    assert fed10.X.max() <= 1.0 and fed10.X_test.shape[0] + 10 * fed10.X.shape[1] <= 1797
    with pytest.raises(ValueError, match="n_clients"):
        digits_federation(3, seed=0)


def test_relu_convention_at_zero(fed10):
    # B = 0 makes the hidden layer exactly 0: with ReLU'(0) = 0 nothing ever trains
    stuck = train(fed10, "fedavg", 3, 0.5, rank=4, relu_grad_at_zero=0.0, seed=1)
    assert np.all(stuck.B == 0) and np.all(stuck.accuracy == stuck.accuracy[0])
    moving = train(fed10, "fedavg", 3, 0.5, rank=4, seed=1)
    assert np.abs(moving.B).max() > 0 and moving.accuracy.max() > moving.accuracy[0]


def test_methods_update_the_right_factors(fed10):
    A0 = train(fed10, "ffa", 1, 1e-12, rank=4, seed=2).A          # ~ the initialization
    ffa = train(fed10, "ffa", 4, 0.3, rank=4, seed=2)
    np.testing.assert_array_equal(ffa.A, A0)                       # FFA-LoRA: A frozen
    one = train(fed10, "rolora", 1, 0.3, rank=4, seed=2)           # round 1 trains B only
    np.testing.assert_array_equal(one.A, A0)
    two = train(fed10, "rolora", 2, 0.3, rank=4, seed=2)           # round 2 trains A only
    assert not np.array_equal(two.A, A0)
    np.testing.assert_array_equal(two.B, one.B)
    fa = train(fed10, "fedavg", 1, 0.3, rank=4, seed=2)
    assert not np.array_equal(fa.A, A0) and np.abs(fa.B).max() > 0


def test_deterministic(fed10):
    a = train(fed10, "rolora", 3, 0.3, rank=4, seed=5)
    b = train(fed10, "rolora", 3, 0.3, rank=4, seed=5)
    assert np.array_equal(a.accuracy, b.accuracy) and np.array_equal(a.A, b.A)
    with pytest.raises(ValueError, match="method"):
        train(fed10, "flexlora", 1, 0.1, seed=0)
