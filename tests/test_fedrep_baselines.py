import numpy as np
import pytest

from lowrank_fl.algorithms.fedrep_baselines import fedsgd, local_only
from lowrank_fl.exact.multitask import fedavg_population_error, fit_heads, pooled_least_squares
from lowrank_fl.problems.multitask import multitask_linear


def test_local_only_is_per_client_ridge():
    p = multitask_linear(d=6, rank=2, n_clients=5, samples_per_client=8, noise=0.1, seed=0)
    T = local_only(p)
    for i in range(5):
        Xi, yi = p.X[i], p.y[i]
        assert np.allclose(T[i], np.linalg.solve(Xi.T @ Xi + 1e-5 * np.eye(6), Xi.T @ yi), atol=1e-12)
    with pytest.raises(ValueError, match="local_only needs a fixed dataset"):
        local_only(multitask_linear(d=6, rank=2, n_clients=5, seed=0))


def test_fedsgd_population_reaches_problem4_optimum():
    # Sec. 2.1: the shared model converges to B* mean(w*), with error 1/(2n) sum ||w_i* - wbar||^2.
    p = multitask_linear(d=10, rank=3, n_clients=20, seed=1)
    tr = fedsgd(p, 3000, 0.5, seed=0)          # no dataset: data="population" by default
    model = tr.B @ tr.extra["w"]
    assert np.linalg.norm(model - p.B_star @ p.heads.mean(axis=0)) < 1e-8
    assert tr.loss[-1] == pytest.approx(fedavg_population_error(p.heads), rel=1e-8)
    assert tr.distance[-1] > 0.5           # only one direction of col(B*) is identified


def test_fedsgd_fixed_data_reaches_pooled_least_squares():
    p = multitask_linear(d=8, rank=2, n_clients=30, samples_per_client=10, noise=0.01, seed=2)
    tr = fedsgd(p, 4000, 0.5, seed=0)
    assert np.linalg.norm(tr.B @ tr.extra["w"] - pooled_least_squares(p.X, p.y)) < 1e-6
    assert np.allclose(tr.heads, fit_heads(tr.B, p.X, p.y, ridge=1e-5))
    assert tr.bytes_up.shape == (4000,) and tr.bytes_up[0] == 8 * 30 * (8 * 2 + 2)


def test_fedsgd_diverges_with_huge_step():
    p = multitask_linear(d=8, rank=2, n_clients=30, samples_per_client=10, seed=2)
    tr = fedsgd(p, 200, 50.0, seed=0)
    assert tr.status == "diverged" and tr.diverged_at is not None and tr.heads is None
    # the returned model is the last finite one, and loss[t-1] is its loss
    assert np.all(np.isfinite(tr.B)) and np.all(np.isfinite(tr.extra["w"]))
    t = tr.diverged_at - 1
    assert tr.loss[t] == pytest.approx(p.population_loss(tr.B, np.tile(tr.extra["w"], (30, 1))), rel=1e-12)


def test_sum_aggregation_is_participants_times_mean():
    # the notebook sums client gradients: identical to the mean with a step c times larger
    p = multitask_linear(d=8, rank=2, n_clients=30, samples_per_client=10, seed=2)
    s = fedsgd(p, 5, 0.01, clients_per_round=15, aggregation="sum", seed=3)
    m = fedsgd(p, 5, 0.01 * 15, clients_per_round=15, seed=3)
    np.testing.assert_allclose(s.B, m.B, atol=1e-12)
    np.testing.assert_allclose(s.extra["w"], m.extra["w"], atol=1e-12)


def test_fedsgd_loss_convention():
    # loss = population_loss(B, w for every client); personalized heads' loss in extra
    p = multitask_linear(d=8, rank=2, n_clients=30, samples_per_client=10, noise=0.2, seed=2)
    tr = fedsgd(p, 10, 0.1, seed=0)
    assert tr.loss[-1] == pytest.approx(p.population_loss(tr.B, np.tile(tr.extra["w"], (30, 1))), rel=1e-12)
    assert tr.extra["personalized_loss"] == pytest.approx(p.population_loss(tr.B, tr.heads), rel=1e-12)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(step_size=0.0), ValueError, "step_size must be finite and > 0"),
    (dict(clients_per_round=31), ValueError, "clients_per_round must be <= 30"),
    (dict(head_ridge=-1.0), ValueError, "head_ridge must be finite and >= 0"),
    (dict(batch_size=0, data="fresh"), ValueError, "batch_size must be >= 1"),
    (dict(batch_size=5), ValueError, "batch_size is only used with data='fresh'"),
    (dict(data="empirical"), ValueError, "data must be one of"),
    (dict(aggregation="median"), ValueError, "aggregation must be one of"),
    (dict(rounds=-1), ValueError, "rounds must be >= 0"),
])
def test_fedsgd_bad_input(kwargs, err, match):
    p = multitask_linear(d=8, rank=2, n_clients=30, samples_per_client=10, seed=2)
    args = dict(step_size=0.1, rounds=3)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        fedsgd(p, args.pop("rounds"), args.pop("step_size"), **args)


def test_fedsgd_needs_data_and_problem():
    with pytest.raises(ValueError, match="data='fixed' needs a problem with a dataset"):
        fedsgd(multitask_linear(d=8, rank=2, n_clients=3, seed=0), 3, 0.1, data="fixed")
    with pytest.raises(TypeError, match="problem must be a MultitaskProblem"):
        fedsgd(None, 3, 0.1)
