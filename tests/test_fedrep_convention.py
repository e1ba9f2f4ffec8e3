"""The shared vocabulary of the multitask family (FedRep, FedSGD, FLUTE, FedAvg, D-GD): one
signature shape, one data-regime parameter, participation as a count, deprecated aliases that
warn, problems built from data without a ground truth, tolerance statuses, and checked inputs."""
import inspect
import warnings

import numpy as np
import pytest

from lowrank_fl.algorithms.fedavg import dgd, fedavg, fine_tune
from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.algorithms.fedrep_baselines import fedsgd
from lowrank_fl.algorithms.flute import flute, flute_init
from lowrank_fl.exact import fedavg_ft as exf
from lowrank_fl.exact import flute as exl
from lowrank_fl.exact.multitask import altmin
from lowrank_fl.problems import (MultitaskProblem, UnderparameterizedProblem, haar_orthonormal,
                                 multitask_linear, new_client, paper_instance,
                                 proposition1_instance, underparameterized)
from lowrank_fl.problems.dataset import Samples
from lowrank_fl.results import ConvergenceWarning

METHODS = (fedrep, fedsgd, flute, fedavg, dgd)
HEADS = np.random.default_rng(0).standard_normal((10, 3))     # diverse heads (mu > 0)


def _mt(data=True, **kw):
    return multitask_linear(d=10, rank=2, n_clients=12, samples_per_client=8 if data else None,
                            noise=0.1, seed=0, **kw)


def _up(data=True):
    return underparameterized(d=6, n_clients=8, rank=2, samples_per_client=9 if data else None,
                              noise=0.2, seed=1)


# ------------------------------------------------------------------ one signature shape
@pytest.mark.parametrize("method", METHODS, ids=lambda f: f.__name__)
def test_signature_shape(method):
    params = inspect.signature(method).parameters
    names = list(params)
    assert names[:3] == ["problem", "rounds", "step_size"]
    named = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert named[-1] == "seed"                                   # seed last (before **deprecated)
    for name in named[3:]:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert {"data", "batch_size", "init"} <= set(named)
    for old in ("fresh_samples", "participation", "mode", "samples"):
        assert old not in named                                  # only as deprecated aliases


def test_shared_names_for_shared_concepts():
    for method in (fedrep, fedsgd, fedavg):
        assert "clients_per_round" in inspect.signature(method).parameters
    assert inspect.signature(fedavg).parameters["local_steps"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("generator, kwargs", [
    (multitask_linear, dict(d=6, rank=2, n_clients=4)),
    (underparameterized, dict(d=6, n_clients=4, rank=2)),
    (paper_instance, dict(d=6, rank=2, n_clients=4)),
    (proposition1_instance, dict(d=6, rank=2, n_clients=4, delta0=0.3)),
    (haar_orthonormal, dict(d=6, rank=2)),
    (flute_init, dict(d=6, rank=2, n_clients=4)),
])
def test_generators_take_sizes_as_keywords_only(generator, kwargs):
    generator(seed=0, **kwargs)                                   # keywords work
    with pytest.raises(TypeError):
        generator(*kwargs.values())                               # positional sizes do not


# ------------------------------------------------------------------ deprecated aliases
@pytest.mark.parametrize("old, new, new_name", [
    (lambda: fedrep(_mt(False), 3, 0.2, participation=0.5, seed=1),
     lambda: fedrep(_mt(False), 3, 0.2, clients_per_round=6, seed=1), "clients_per_round"),
    (lambda: fedrep(_mt(), 3, 0.2, fresh_samples=False, seed=1),
     lambda: fedrep(_mt(), 3, 0.2, data="fixed", seed=1), "data"),
    (lambda: fedrep(_mt(False), 3, 0.2, fresh_samples=True, batch_size=5, seed=1),
     lambda: fedrep(_mt(False), 3, 0.2, data="fresh", batch_size=5, seed=1), "data"),
    (lambda: fedsgd(_mt(), 3, 0.1, participation=0.5, seed=1),
     lambda: fedsgd(_mt(), 3, 0.1, clients_per_round=6, seed=1), "clients_per_round"),
    (lambda: fedsgd(_mt(False), 3, 0.1, fresh_samples=True, seed=1),
     lambda: fedsgd(_mt(False), 3, 0.1, data="population", seed=1), "data"),
    (lambda: flute(_up(), 3, 0.03, samples=4, seed=1),
     lambda: flute(_up(), 3, 0.03, data="fresh", batch_size=4, seed=1), "batch_size"),
    (lambda: flute(_up(), 3, 0.03, fresh_samples=False, seed=1),
     lambda: flute(_up(), 3, 0.03, data="fixed", seed=1), "data"),
    (lambda: fedavg(_mt(), 3, 0.05, mode="empirical", seed=1),
     lambda: fedavg(_mt(), 3, 0.05, data="fixed", seed=1), "data"),
    (lambda: dgd(_mt(), 3, 0.05, mode="population", seed=1),
     lambda: dgd(_mt(), 3, 0.05, data="population", seed=1), "data"),
], ids=["fedrep-participation", "fedrep-fresh_samples-False", "fedrep-fresh_samples-True",
        "fedsgd-participation", "fedsgd-fresh_samples", "flute-samples", "flute-fresh_samples",
        "fedavg-mode", "dgd-mode"])
def test_deprecated_method_aliases_warn_and_agree(old, new, new_name):
    with pytest.warns(DeprecationWarning, match=f"use '{new_name}'"):
        a = old()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        b = new()
    np.testing.assert_array_equal(a.B, b.B)
    assert dict(a.config) == dict(b.config)


@pytest.mark.parametrize("old, new, new_name", [
    (lambda: multitask_linear(d=6, k=2, n_clients=4, seed=0),
     lambda: multitask_linear(d=6, rank=2, n_clients=4, seed=0), "rank"),
    (lambda: underparameterized(d=6, n_clients=4, k=2, seed=0),
     lambda: underparameterized(d=6, n_clients=4, rank=2, seed=0), "rank"),
    (lambda: paper_instance(d=6, k=2, n_clients=4, seed=0),
     lambda: paper_instance(d=6, rank=2, n_clients=4, seed=0), "rank"),
    (lambda: proposition1_instance(d=6, k=2, n_clients=4, delta0=0.3, seed=0),
     lambda: proposition1_instance(d=6, rank=2, n_clients=4, delta0=0.3, seed=0), "rank"),
    (lambda: haar_orthonormal(d=6, k=2, seed=0), lambda: haar_orthonormal(d=6, rank=2, seed=0), "rank"),
    (lambda: flute_init(d=6, k=2, n_clients=4, seed=0),
     lambda: flute_init(d=6, rank=2, n_clients=4, seed=0), "rank"),
    (lambda: new_client(_mt(False), n=5, seed=0),
     lambda: new_client(_mt(False), samples_per_client=5, seed=0), "samples_per_client"),
])
def test_deprecated_size_aliases_warn_and_agree(old, new, new_name):
    with pytest.warns(DeprecationWarning, match=f"use '{new_name}'"):
        a = old()
    b = new()
    flat = lambda x: [np.asarray(v) for v in (x if isinstance(x, tuple) else (  # noqa: E731
        getattr(x, "X", None) if hasattr(x, "X") else getattr(x, "B0", x),))]
    for u, v in zip(flat(a), flat(b)):
        np.testing.assert_array_equal(u, v)


def test_other_deprecated_aliases():
    p = _mt(False)
    inst = paper_instance(d=10, rank=2, n_clients=6, seed=0)
    cl = new_client(inst.problem, samples_per_client=8, seed=1)
    with pytest.warns(DeprecationWarning, match="use 'samples_per_client'"):
        a = fine_tune(inst.problem, inst.B0, np.ones(2), steps=2, n=8, seed=1)
    assert a.full_error == fine_tune(cl, inst.B0, np.ones(2), steps=2).full_error
    q = _mt()
    with pytest.warns(DeprecationWarning, match="'seed' is deprecated and ignored"):
        r = altmin(q.X, q.y, 2, seed=3)
    np.testing.assert_array_equal(r.B, altmin(q.X, q.y, 2).B)
    for bad in (dict(participation=0.5, clients_per_round=3), dict(fresh_samples=True, data="fresh")):
        with pytest.raises(TypeError, match="deprecated alias"), pytest.warns(DeprecationWarning):
            fedrep(p, 2, 0.1, seed=0, **bad)
    with pytest.raises(TypeError, match="got both 'rank' and its deprecated alias 'k'"):
        multitask_linear(d=6, rank=2, k=2, n_clients=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sample_mode'"):
        fedsgd(p, 2, 0.1, sample_mode="fresh")


# ------------------------------------------------------------------ data regimes
def test_default_regime_follows_the_problem_and_is_recorded():
    for method, step in ((fedrep, 0.2), (fedsgd, 0.1), (fedavg, 0.05), (dgd, 0.05)):
        assert method(_mt(), 2, step, seed=0).config["data"] == "fixed", method.__name__
        assert method(_mt(False), 2, step, seed=0).config["data"] == "population", method.__name__
    assert flute(_up(), 2, 0.03, seed=0).config["data"] == "fixed"
    assert flute(_up(False), 2, 0.03, seed=0).config["data"] == "population"


@pytest.mark.parametrize("method, step", [(fedrep, 0.2), (fedsgd, 0.1), (fedavg, 0.05)],
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_fresh_regime_draws_new_batches(method, step):
    p = _mt()
    fresh = method(p, 3, step, data="fresh", seed=0)
    assert fresh.config["data"] == "fresh" and fresh.config["batch_size"] == 8
    assert not np.allclose(fresh.B, method(p, 3, step, data="fixed", seed=0).B)
    again = method(p, 3, step, data="fresh", seed=0)
    np.testing.assert_array_equal(fresh.B, again.B)                      # deterministic
    with pytest.raises(ValueError, match="batch_size is only used with data='fresh'"):
        method(p, 3, step, data="fixed", batch_size=4)
    with pytest.raises(ValueError, match="data='fresh' needs batch_size"):
        method(_mt(False), 3, step, data="fresh")


def test_fedavg_fresh_batches_equal_the_kernel_on_drawn_samples():
    from lowrank_fl.algorithms.fedavg import fedavg_round
    from lowrank_fl.validation import as_generator
    p = _mt(False)
    inst_init = (np.linalg.qr(np.random.default_rng(2).standard_normal((10, 2)))[0], np.ones(2))
    tr = fedavg(p, 2, 0.05, data="fresh", batch_size=5, local_steps=2, init=inst_init, seed=4)
    rng = as_generator(4, stream="fedavg")
    B, w = inst_init
    for _ in range(2):
        X, y = p.sample(5, rng, clients=np.arange(12))
        B, w, _ = fedavg_round(B, w, 0.05, local_steps=2, X=X, y=y)
    np.testing.assert_allclose(tr.B, B, atol=1e-12)


# ------------------------------------------------------------------ participation
def test_clients_per_round_without_replacement_and_rank_warning():
    p = _mt(False)
    tr = fedrep(p, 6, 0.2, clients_per_round=5, seed=3)
    part = tr.extra["participants"]
    assert part.shape == (6, 5) and tr.config["clients_per_round"] == 5
    assert all(len(set(row)) == 5 for row in part)                       # no client twice a round
    assert len({tuple(r) for r in part}) > 1                              # resampled each round
    with pytest.warns(UserWarning, match="clients_per_round=1 is below the rank 2"):
        one = fedrep(p, 3, 0.2, clients_per_round=1, seed=3)             # FedRep's Fig. 3 setting
    assert one.extra["participants"].shape == (3, 1)
    for method in (fedrep, fedsgd, fedavg):
        with pytest.raises(ValueError, match="clients_per_round must be <= 12"):
            method(p, 2, 0.1, clients_per_round=13)
        with pytest.raises(TypeError, match="clients_per_round must be an integer"):
            method(p, 2, 0.1, clients_per_round=0.5)


# ------------------------------------------------------------------ problems from data
def test_multitask_from_data_has_no_truth_metrics():
    ref = _mt()
    p = MultitaskProblem.from_data(ref.X, ref.y, rank=2)
    assert not p.has_truth and p.truth_basis is None and p.d == 10 and p.n_clients == 12
    tr = fedrep(p, 5, 0.2, seed=1)
    assert tr.distance is None and tr.final_distance is None and tr.config["data"] == "fixed"
    assert tr.loss[-1] == pytest.approx(p.empirical_loss(tr.B, tr.heads), rel=1e-12)
    # same iterates as on the problem with truth (the truth only feeds the metrics)
    np.testing.assert_allclose(tr.B, fedrep(ref, 5, 0.2, seed=1).B, atol=1e-12)
    s = fedsgd(p, 3, 0.1, seed=1)
    assert s.distance is None and np.all(np.isfinite(s.loss))
    for call, match in ((lambda: p.population_loss(tr.B, tr.heads), "needs the ground truth"),
                        (lambda: p.sample(3, 0), "needs the ground truth"),
                        (lambda: p.theta, "needs the ground truth"),
                        (lambda: fedrep(p, 2, 0.1, data="population"), "data='population'"),
                        (lambda: fedrep(p, 2, 0.1, data="fresh"), "data='fresh'"),
                        (lambda: fedrep(p, 2, 0.1, tol=1e-3), "tol stops on the distance"),
                        (lambda: fedavg(p, 2, 0.1), "built from data")):
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(ValueError, match="rank must be smaller than d"):
        MultitaskProblem.from_data(ref.X, ref.y, rank=10)
    with pytest.raises(ValueError, match="needs a ground truth .* or a dataset"):
        MultitaskProblem(rank=2)


def test_underparameterized_from_data_runs_fedrep():
    ref = _up()
    p = UnderparameterizedProblem.from_data(ref.X, ref.y, rank=2)
    assert not p.has_truth and p.rank == 2 and p.n_clients == 8
    tr = fedrep(p, 4, 0.1, seed=0)
    assert tr.distance is None
    assert tr.loss[-1] == pytest.approx(p.empirical_loss(tr.B, tr.heads), rel=1e-12)
    assert "error_truth" not in tr.extra                                  # needs Phi: absent
    with pytest.raises(ValueError, match="needs the ground truth Phi"):
        p.Phi
    with pytest.raises(ValueError, match="built from data"):
        flute(p, 2, 0.03)


def test_sample_has_one_return_contract():
    for p in (_mt(False), _up(False)):
        s = p.sample(4, 0, clients=np.array([1, 3]))
        assert isinstance(s, Samples) and s.X.shape == (2, 4, p.d) and s.y.shape == (2, 4)
        X, y = p.sample(4, 0)
        assert X.shape == (p.n_clients, 4, p.d) and y.shape == (p.n_clients, 4)


def test_evaluate_hook_is_what_fedrep_records():
    for p in (_mt(), _up()):
        tr = fedrep(p, 3, 0.1, seed=0)
        ev = p.evaluate(tr.B, tr.heads)
        assert tr.loss[-1] == pytest.approx(ev["loss"], rel=1e-12)
        assert tr.final_distance == pytest.approx(ev["distance"], abs=1e-12)


# ------------------------------------------------------------------ tolerance statuses
def test_tol_reached_is_optimal_with_a_finite_final_distance():
    p = multitask_linear(d=20, rank=2, n_clients=50, seed=0)
    B0 = np.linalg.qr(p.B_star + 0.5 * np.random.default_rng(0).standard_normal((20, 2)))[0]
    tr = fedrep(p, 300, 0.2, init=B0, tol=1e-6, seed=1)
    assert tr.status == "optimal" and tr.config["tol"] == 1e-6
    assert np.isfinite(tr.final_distance) and tr.final_distance <= 1e-6
    assert np.isnan(tr.distance[-1])                                       # stopped early
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)                 # no warning when met
        fedrep(p, 300, 0.2, init=B0, tol=1e-6, seed=1)


def test_tol_not_reached_is_max_iter_with_a_warning():
    p = multitask_linear(d=20, rank=2, n_clients=50, seed=0)
    with pytest.warns(ConvergenceWarning, match="round cap before its tolerance"):
        tr = fedrep(p, 3, 0.01, init="random", tol=1e-10, seed=1)
    assert tr.status == "max_iter" and tr.final_distance == tr.distance[-1] > 1e-10
    assert fedrep(p, 3, 0.01, init="random", seed=1).status == "completed"   # no tol: completed


def test_divergence_warns_in_every_method():
    mt, up = _mt(), _up(False)
    runs = [lambda: fedrep(mt, 30, 0.1, head_steps=10, head_step_size=100.0, seed=1),
            lambda: fedsgd(mt, 200, 50.0, seed=0),
            lambda: fedavg(mt, 200, 50.0, local_steps=2, seed=0),
            lambda: dgd(mt, 200, 50.0, seed=0),
            lambda: flute(up, 400, 0.03, gamma1=0.8, seed=0)]
    for run in runs:
        with pytest.warns(ConvergenceWarning, match="diverged"):
            tr = run()
        assert tr.status == "diverged"
        assert np.isfinite(tr.final_distance)                 # the last finite iterate's distance


# ------------------------------------------------------------------ checked inputs (issue 10)
@pytest.mark.parametrize("call, name", [
    (lambda: flute(_up(False), 2, 0.03, init=(np.zeros((6, 2)), np.zeros((2, 8)))), "init"),
    (lambda: fedrep(_mt(), 2, 0.1, init=np.zeros((10, 2))), "init"),
    (lambda: fedsgd(_mt(), 2, 0.1, init=np.zeros((10, 2))), "init"),
    (lambda: fedrep(_mt(), 2, 0.1, init=np.outer(np.ones(10), [1.0, 2.0])), "init"),
    (lambda: fedavg(_mt(), 2, 0.1, init=(np.zeros((10, 2)), np.zeros(2))), "init B0"),
    (lambda: exl.regularizer(np.ones((3, 1)), np.ones((4, 1)), -1.0, 0.1), "gamma1"),
    (lambda: exl.regularizer(np.ones((3, 1)), np.ones((4, 1)), 0.2, np.nan), "gamma2"),
    (lambda: exl.regularizer_balanced_form(np.ones((3, 1)), np.ones((4, 1)), np.inf, 0.1), "gamma1"),
    (lambda: exl.regularizer_gradients(np.ones((3, 1)), np.ones((4, 1)), 0.2, -0.1), "gamma2"),
    (lambda: exl.population_objective(np.ones((3, 1)), np.ones((4, 1)), np.ones((3, 4)),
                                      noise=-1.0), "noise"),
    (lambda: exl.regularized_minimizer(np.eye(3), 1, gamma1=np.nan), "gamma1"),
    (lambda: exl.is_unbounded(np.nan, 0.1), "gamma1"),
    (lambda: exl.divergence_boundary(-0.1), "gamma2"),
    (lambda: exl.nuclear_relaxation_estimate(np.ones((3, 4, 2)), np.ones((3, 4)), 1, -0.1), "mu"),
    (lambda: exl.nuclear_relaxation_estimate(np.ones((3, 4, 2)), np.ones((3, 4)), 1, 0.1,
                                             tol=np.nan), "tol"),
    (lambda: exf.theorem2_constants(HEADS, 0.1, 2, c3=-1.0), "c3"),
    (lambda: exf.theorem2_constants(HEADS, 0.1, 2, c3=np.nan), "c3"),
    (lambda: exf.theorem2_constants(HEADS, np.nan, 2), "delta0"),
    (lambda: exf.theorem2_constants(HEADS, 0.1, 2, step_size=-0.1), "step_size"),
    (lambda: exf.dgd_invariant_lower_bound(np.eye(4)[:, :2], np.eye(4)[:, :2], np.eye(2),
                                           rtol=-1.0), "rtol"),
    (lambda: exf.head_only_expected_error(np.eye(4)[:, :2], np.ones(4), np.nan, 10), "noise"),
])
def test_bad_scalars_and_inits_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_theorem2_step_size_is_positive_for_valid_constants():
    c = exf.theorem2_constants(HEADS, 0.1, 2, c3=1.0)
    assert c.step_size_bound > 0 and c.step_size == c.step_size_bound


def test_trace_final_distance_contract():
    from lowrank_fl.results import Trace
    nan = np.nan
    t = Trace(method="x", distance=np.array([0.5, 0.2, nan]), loss=np.zeros(3),
              bytes_up=np.zeros(2), bytes_down=np.zeros(2))
    assert t.final_distance == 0.2 and t.rounds == 2
    t = Trace(method="x", distance=None, loss=np.zeros(3), bytes_up=np.zeros(2),
              bytes_down=np.zeros(2))
    assert t.final_distance is None and t.rounds == 2
