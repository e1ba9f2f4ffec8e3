import numpy as np
import pytest

from lowrank_fl.algorithms.flute import flute, flute_init
from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.algorithms.flute_baselines import fedrep_flute_baseline
from lowrank_fl.exact import flute as ex
from lowrank_fl.exact.multitask import fit_heads, method_of_moments
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.underparameterized import underparameterized


@pytest.fixture(scope="module")
def pop():
    return underparameterized(d=8, n_clients=10, rank=2, seed=1)


@pytest.fixture(scope="module")
def data():
    return underparameterized(d=6, n_clients=5, rank=2, samples_per_client=9, noise=0.4, seed=2)


def test_population_converges_to_truncated_svd(pop):
    # C1: from a tiny data-independent init, BW -> Phi_k, balanced, col(B) -> span(U_k).
    # Rate 1 - eta Delta / 2 = 0.9 per round (Delta = 2(8/1.5 - 8/2) ~ 2.67 at eta = 0.075)
    tr = flute(pop, 600, 0.075, seed=0, record_every=50)
    assert tr.status == "completed" and tr.diverged_at is None
    W = tr.heads                                   # (M, k): client axis first (the paper's W^T)
    assert W.shape == (10, 2) and "W" not in tr.extra
    assert np.linalg.norm(tr.B @ W.T - pop.target) / np.linalg.norm(pop.target) < 1e-8
    assert np.linalg.norm(tr.B.T @ tr.B - W.T @ W) < 1e-8
    assert tr.distance[-1] < 1e-8 and tr.extra["error_target"][-1] < 1e-8
    assert np.isnan(tr.distance[1]) and np.isfinite(tr.distance[50])   # record_every


@pytest.mark.parametrize("g1, g2, normalization", [
    (0.125, 0.125, "appendix"), (0.3, 0.125, "appendix"), (0.125, 0.125, "main"),
    (0.25, 0.125, "main")])
def test_population_limit_equals_closed_form(pop, g1, g2, normalization):
    # population minimizer of eq. (4): BW -> a/(a + 2g2 - g1) Phi_k (0.8 Phi_k for g1 = g2 = 1/8, appendix)
    tr = flute(pop, 1500, 0.05, gamma1=g1, gamma2=g2, normalization=normalization, seed=0,
               record_every=100)
    Z = ex.regularized_minimizer(pop.Phi, 2, gamma1=g1, gamma2=g2, normalization=normalization)
    assert np.linalg.norm(tr.B @ tr.heads.T - Z) < 1e-8


def test_divergence_beyond_boundary_is_reported(pop):
    tr = flute(pop, 400, 0.03, gamma1=0.8, seed=0)        # 0.8 >= 2 g2 + 1/2 = 0.75
    assert tr.status == "diverged" and isinstance(tr.diverged_at, int)
    assert 0 < tr.diverged_at <= 400
    assert np.all(np.isnan(tr.loss[tr.diverged_at:]))
    assert np.all(np.isfinite(tr.loss[:tr.diverged_at]))
    ok = flute(pop, 400, 0.03, gamma1=0.3, seed=0)        # above the paper's 2 g2, below 0.75
    assert ok.status == "completed"


def _loop_round(B, W, X, y, eta, eta_r, g1, g2, two):
    # per-client reference of eqs. (5)-(6): sum over clients, regularizer at the old iterate
    gB = np.zeros_like(B)
    gW = np.zeros_like(W)
    N = X.shape[1]
    for i in range(X.shape[0]):
        r = X[i] @ B @ W[:, i] - y[i]
        gB += two * np.outer(X[i].T @ r, W[:, i]) / N
        gW[:, i] = two * B.T @ X[i].T @ r / N
    Bn = B - eta * gB + 2 * g1 * eta_r * B @ W @ W.T - 4 * g2 * eta_r * B @ B.T @ B
    Wn = W - eta * gW + 2 * g1 * eta_r * B.T @ B @ W - 4 * g2 * eta_r * W @ W.T @ W
    return Bn, Wn


@pytest.mark.parametrize("normalization, two", [("appendix", 1.0), ("main", 2.0)])
def test_batched_round_equals_per_client_loop(data, normalization, two):
    B0, W0 = flute_init(d=6, rank=2, n_clients=5, init_scale=0.5, seed=3)
    tr = flute(data, 1, 0.02, gamma1=0.3, gamma2=0.1, step_size_reg=0.04, init=(B0, W0),
               normalization=normalization, data="fixed")
    assert W0.shape == (5, 2)                       # heads, client axis first
    Bn, Wn = _loop_round(B0, W0.T, data.X, data.y, 0.02, 0.04, 0.3, 0.1, two)   # paper's (k, M)
    np.testing.assert_allclose(tr.B, Bn, atol=1e-12)
    np.testing.assert_allclose(tr.heads, Wn.T, atol=1e-12)


def test_mean_aggregation_scales_data_gradient(data):
    B0, W0 = flute_init(d=6, rank=2, n_clients=5, init_scale=0.5, seed=3)
    s = flute(data, 1, 0.02, init=(B0, W0), data="fixed", gamma1=0, gamma2=0)
    m = flute(data, 1, 0.02, init=(B0, W0), data="fixed", gamma1=0, gamma2=0,
              aggregation="mean")
    np.testing.assert_allclose(m.B - B0, (s.B - B0) / 5, atol=1e-12)


def test_fixed_dataset_converges_to_empirical_erm(data):
    # Remark 4.1 on the empirical eq. (4): with g1 = 2 g2 and a reused dataset FLUTE converges to
    # the empirical rank-k ERM
    tr = flute(data, 3000, 0.05, data="fixed", seed=0, record_every=500)
    erm = ex.altmin_erm(data.X, data.y, 2, seed=0)
    assert np.linalg.norm(tr.B @ tr.heads.T - erm.Z) < 1e-6
    # FedRep(RI) reaches the same ERM (on this tiny instance the moment init of FedRep lands in
    # a spurious stationary point, objective 6.12 vs 3.75: the ERM is non-convex)
    base = fedrep(data, 1500, 0.1, init="random", seed=0)
    assert np.linalg.norm(base.B @ base.heads.T - erm.Z) < 1e-6


def test_fresh_samples_reproducible_and_schedule(data):
    a = flute(data, 5, 0.02, data="fresh", seed=4)
    b = flute(data, 5, 0.02, data="fresh", seed=4)
    c = flute(data, 5, 0.02, data="fresh", seed=5)
    np.testing.assert_array_equal(a.B, b.B)
    assert not np.allclose(a.B, c.B)
    assert a.extra["data_mode"] == "fresh"
    # the per-round schedule is used: a constant schedule equals the scalar, another one differs
    g = flute(data, 3, 0.02, data="fresh", batch_size=[5, 10, 20], seed=4)
    h = flute(data, 3, 0.02, data="fresh", batch_size=[9, 9, 9], seed=4)
    np.testing.assert_array_equal(h.B, flute(data, 3, 0.02, data="fresh", batch_size=9, seed=4).B)
    assert g.extra["data_mode"] == "fresh" and not np.allclose(g.B, h.B)
    f = flute(data, 3, 0.02, data="fixed")
    assert f.extra["data_mode"] == "fixed"


def test_default_data_mode_matches_the_fedrep_baseline(data, pop):
    # default: the problem's fixed dataset if it has one (as fedrep), population gradients
    # otherwise; fresh draws only on request; the trace's config says which
    assert flute(data, 1, 0.02, seed=0).extra["data_mode"] == "fixed"
    assert fedrep(data, 1, 0.02, seed=0).config["data"] == "fixed"
    tr = flute(data, 1, 0.02, data="fresh", batch_size=4, seed=0)
    assert tr.extra["data_mode"] == tr.config["data"] == "fresh" and tr.config["batch_size"] == 4
    assert flute(pop, 1, 0.02, seed=0).config["data"] == "population"


def test_bytes_and_theta_record(pop):
    tr = flute(pop, 4, 0.03, record_theta=True, seed=0)
    d, M, k = 8, 10, 2
    np.testing.assert_array_equal(tr.bytes_up, 8 * M * (d * k + k) * np.ones(4))
    np.testing.assert_array_equal(tr.bytes_down, tr.bytes_up)
    q = ex.region_quantities(ex.theta_embedding(tr.B, tr.heads, pop.Phi), k)
    assert np.isclose(tr.extra["sigma1"][-1], q["sigma1"], rtol=1e-10)
    assert np.isclose(tr.extra["sigma1_res"][-1], q["sigma1_res"], rtol=1e-10)
    assert np.isclose(tr.extra["sigmak_k"][-1], q["sigmak_k"], rtol=1e-10)


def test_default_init_scale_and_loss(pop):
    tr = flute(pop, 1, 1e-9, seed=0, gamma1=0, gamma2=0)
    B0, W0 = flute_init(d=8, rank=2, n_clients=10, init_scale=1 / 80, seed=0)
    np.testing.assert_allclose(tr.loss[0], np.sum((B0 @ W0.T - pop.Phi) ** 2) / 10)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(step_size=0.0), ValueError, "step_size must be finite and > 0"),
    (dict(step_size=-1.0), ValueError, "step_size must be finite and > 0"),
    (dict(rounds=-1), ValueError, "rounds must be >= 0"),
    (dict(data="sometimes"), ValueError, "data must be one of"),
    (dict(record_theta=1), TypeError, "record_theta must be a bool"),
    (dict(normalization="paper"), ValueError, "normalization must be one of"),
    (dict(aggregation="median"), ValueError, "aggregation must be one of"),
    (dict(gamma1=-0.1), ValueError, "gamma1 must be finite and >= 0"),
    (dict(init_scale=0.0), ValueError, "init_scale must be finite and > 0"),
    (dict(step_size_reg=0.0), ValueError, "step_size_reg must be finite and > 0"),
    (dict(record_every=0), ValueError, "record_every must be >= 1"),
    (dict(init=np.zeros((6, 2))), TypeError, "init must be 'random' or a tuple"),
    (dict(init="zeros"), ValueError, "init must be one of"),
    (dict(init=(np.zeros((5, 2)), np.zeros((5, 2)))), ValueError, r"init\[0\] \(B0\) must have shape"),
    (dict(init=(np.zeros((6, 2)), np.zeros((2, 5)))), ValueError, r"init\[1\] \(W0\) must have shape \(5, 2\)"),
    (dict(data="fresh", batch_size=[3, 4]), ValueError, "batch_size must be a positive int or a sequence of 3"),
    (dict(data="fresh", batch_size=0), ValueError, "batch_size must be >= 1"),
    (dict(batch_size=5, data="fixed"), ValueError, "batch_size is only used with data='fresh'"),
    (dict(batch_size=[5, 5, 5]), ValueError, "batch_size is only used with data='fresh'"),
])
def test_errors(data, kwargs, err, match):
    args = dict(rounds=3, step_size=0.02)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        flute(data, args.pop("rounds"), args.pop("step_size"), **args)


def test_problem_errors(pop):
    with pytest.raises(TypeError, match="problem must be an UnderparameterizedProblem"):
        flute(object(), 3, 0.1)
    with pytest.raises(ValueError, match="data='fixed' needs a problem with a dataset"):
        flute(pop, 3, 0.1, data="fixed")
    with pytest.raises(ValueError, match="data='fixed' needs a problem with a dataset"):
        fedrep(pop, 3, 0.1, data="fixed")


def test_fedrep_runs_on_flute_problem(data):
    # FLUTE's baselines are FedRep itself on the UnderparameterizedProblem (no re-driving module)
    ri = fedrep(data, 3, 0.1, init="random", seed=0)
    assert ri.extra["init_bytes_up"] == 0 and set(ri.extra) >= {"error_truth", "error_target"}
    mom = fedrep(data, 3, 0.1, seed=0)
    assert mom.extra["init_bytes_up"] == 5 * 36 * 8
    np.testing.assert_array_equal(mom.bytes_up, 8 * 5 * 6 * 2 * np.ones(3))
    ev = data.evaluate(mom.B, mom.heads)
    assert mom.extra["error_truth"][-1] == pytest.approx(ev["error_truth"], rel=1e-12)
    fr = fedrep(data, 3, 0.1, data="fresh", seed=1)
    fr2 = fedrep(data, 3, 0.1, data="fresh", seed=1)
    np.testing.assert_array_equal(fr.B, fr2.B)                      # reproducible
    assert not np.allclose(fr.B @ fr.B.T, mom.B @ mom.B.T)          # not the fixed data
    # with fresh samples the moment initialization is drawn on a fresh batch too
    fr0 = fedrep(data, 0, 0.1, data="fresh", seed=1)
    assert subspace_distance(fr0.B, method_of_moments(data.X, data.y, 2)) > 1e-3


def test_deprecated_flute_baseline_wraps_fedrep(data, pop):
    with pytest.warns(DeprecationWarning, match="use fedrep"):
        old = fedrep_flute_baseline(data, 3, 0.1, init="random", seed=0)
    new = fedrep(data, 3, 0.1, init="random", seed=0)
    np.testing.assert_array_equal(old.B, new.B)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="problem must carry a dataset"):
        fedrep_flute_baseline(pop, 3, 0.1)


def test_baseline_trace_belongs_to_returned_model(data):
    # regression: distance[t] used to score B^(t-1), and loss[-1] the heads of the old B
    tr = fedrep(data, 4, 0.1, init="random", seed=0)
    assert tr.distance[-1] == pytest.approx(subspace_distance(data.U_k, tr.B), abs=1e-12)
    assert tr.loss[-1] == pytest.approx(data.population_loss(tr.B, tr.heads), rel=1e-12)
    np.testing.assert_allclose(tr.heads, fit_heads(tr.B, data.X, data.y), atol=1e-10)


def test_zero_rounds_is_the_initialization(pop, data):
    tr = flute(pop, 0, 0.03, seed=0)
    B0, W0 = flute_init(d=8, rank=2, n_clients=10, init_scale=1 / 80, seed=0)
    np.testing.assert_array_equal(tr.B, B0)
    assert tr.loss.shape == (1,) and tr.bytes_up.shape == (0,)
    base = fedrep(data, 0, 0.1, seed=0)
    assert subspace_distance(base.B, method_of_moments(data.X, data.y, 2)) < 1e-12


def test_divergence_returns_last_finite_iterate(pop):
    tr = flute(pop, 400, 0.03, gamma1=0.8, seed=0)
    assert tr.status == "diverged"
    assert np.all(np.isfinite(tr.B)) and np.all(np.isfinite(tr.heads))
