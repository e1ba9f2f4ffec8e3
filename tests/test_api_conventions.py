"""The one vocabulary (README "Glossary"): every public federated method and generator follows it.

These tests read signatures only; behaviour is tested beside each method.
"""
import inspect

import pytest

import lowrank_fl.algorithms as algorithms
import lowrank_fl.problems as problems
from lowrank_fl import clair
from lowrank_fl.algorithms.lora_aggregation import rolora_matrix
from lowrank_fl.results import SolverResult, Trace

FEDERATED = [algorithms.fedrep, algorithms.fedsgd, algorithms.flute, algorithms.fedavg,
             algorithms.dgd, algorithms.rolora, algorithms.ffa_lora, algorithms.fedavg_lora,
             algorithms.federated_lora_matrix, rolora_matrix]
GENERATORS = [problems.multitask_linear, problems.underparameterized, problems.rank_one_lora,
              problems.lora_matrix_problem, problems.paper_instance,
              problems.proposition1_instance, problems.haar_orthonormal]

# names retired by the convention: each concept has one name (they survive only as deprecated
# **keywords that warn, never as visible parameters)
RETIRED = {"fresh_samples", "sample_mode", "mode", "participation", "step", "a0", "b0", "A0",
           "B0", "delta0", "samples", "K", "n", "k", "r"}
SHARED_DEFAULTS = {"data": None, "batch_size": None, "clients_per_round": None, "local_steps": 1,
                   "seed": None}


def _named(sig):
    return [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]


@pytest.mark.parametrize("method", FEDERATED, ids=lambda f: f.__name__)
def test_federated_method_signature(method):
    sig = inspect.signature(method)
    params = _named(sig)
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["problem", "rounds", "step_size"], positional
    keyword = [p for p in params if p.kind is p.KEYWORD_ONLY]
    assert keyword and keyword[-1].name == "seed", "seed is last and keyword-only"
    names = {p.name for p in params}
    assert not names & RETIRED, names & RETIRED
    assert {"data", "init", "seed"} <= names
    for p in params:
        if p.name in SHARED_DEFAULTS:
            assert p.default == SHARED_DEFAULTS[p.name], (p.name, p.default)
    extra = [p for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD]
    assert all(p.name == "deprecated" for p in extra)


def test_shared_concepts_have_one_name_across_methods():
    # a concept that two methods share is spelled, defaulted and ordered the same way
    seen = {}
    for method in FEDERATED:
        for p in _named(inspect.signature(method)):
            if p.name in SHARED_DEFAULTS:
                seen.setdefault(p.name, set()).add((p.kind, p.default))
    assert all(len(v) == 1 for v in seen.values()), seen
    assert {"data", "batch_size", "clients_per_round", "local_steps", "seed"} <= set(seen)


# old size names a generator may still show for one release (default None), each warning when used
SIZE_ALIASES = {"k": "rank", "K": "n_clients", "n": "samples_per_client", "r": "rank"}
GENERATOR_CALLS = {
    problems.multitask_linear: dict(d=6, rank=2, n_clients=3),
    problems.underparameterized: dict(d=6, rank=2, n_clients=3),
    problems.paper_instance: dict(d=6, rank=2, n_clients=3),
    problems.proposition1_instance: dict(d=6, rank=2, n_clients=3, delta0=0.5),
    problems.haar_orthonormal: dict(d=6, rank=2),
    problems.rank_one_lora: dict(d=6, n_clients=3),
    problems.lora_matrix_problem: dict(d=6, n_clients=3, rank=2),
}


@pytest.mark.parametrize("generator", GENERATORS, ids=lambda f: f.__name__)
def test_generators_take_sizes_as_keywords_only(generator):
    params = _named(inspect.signature(generator))
    assert all(p.kind is p.KEYWORD_ONLY for p in params), \
        [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
    assert params[-1].name == "seed" or params[-1].name in SIZE_ALIASES
    assert any(p.name == "seed" for p in params)
    kwargs = GENERATOR_CALLS[generator]
    generator(**kwargs, seed=0)
    for p in params:
        if p.name in SIZE_ALIASES:   # a deprecated size alias: visible, defaulting to None, warns
            assert p.default is None, p.name
            new = SIZE_ALIASES[p.name]
            call = {**{k: v for k, v in kwargs.items() if k != new}, p.name: kwargs[new]}
            with pytest.warns(DeprecationWarning, match=new):
                generator(**call, seed=0)


def test_clair_generators_share_the_names():
    for generator in (clair.simulate, clair.generate):
        params = _named(inspect.signature(generator))
        names = {p.name for p in params}
        assert {"n_clients", "rank", "p", "q", "contaminated", "seed"} <= names, names
        assert all(p.kind is p.KEYWORD_ONLY for p in params)
        sizes = dict(n_clients=4, p=3, q=3, rank=1, samples_per_client=20)
        for p in params:
            if p.name in SIZE_ALIASES:   # the paper's K, n, r: visible for one release, warn
                assert p.default is None, p.name
                new = SIZE_ALIASES[p.name]
                call = {k: v for k, v in sizes.items() if k != new and k in names}
                call[p.name] = sizes[new]
                with pytest.warns(DeprecationWarning, match=new):
                    generator(**call, contaminated=1, seed=0)
            else:
                assert p.name not in RETIRED, p.name
    with pytest.raises(TypeError, match="contaminated"):
        clair.generate(n_clients=4, p=3, q=3, rank=1, contaminated=0.4, seed=0)


def test_solvers_name_method_and_solver_apart():
    sig = inspect.signature(clair.solve_penalized)
    names = list(sig.parameters)
    assert names[:4] == ["D", "q", "lam_L", "lam_S"]
    for name in ("method", "solver", "solver_options", "step_size", "tol", "max_iter"):
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    if "step" in names:   # the retired name survives one release and warns
        D = clair.contrasts(clair.generate(n_clients=3, p=3, q=3, rank=1, contaminated=0, seed=0).W_hat)
        with pytest.warns(DeprecationWarning, match="step_size"):
            clair.solve_penalized(D, 3, 0.1, 0.1, method="proxgrad", step=0.5, max_iter=2, tol=None)
    fit = inspect.signature(clair.fit)
    assert list(fit.parameters)[:3] == ["W_hat", "lam_L", "lam_S"]
    assert all(p.kind is not p.VAR_KEYWORD for p in fit.parameters.values()), \
        "solver options are an explicit solver_options mapping"


def test_results_are_read_only():
    import numpy as np

    tr = Trace(method="x", distance=np.zeros(3), loss=np.zeros(3), bytes_up=np.zeros(2),
               bytes_down=np.zeros(2), extra={"curve": np.zeros(3)})
    with pytest.raises(ValueError, match="read-only"):
        tr.distance[0] = -1
    with pytest.raises(ValueError, match="read-only"):
        tr.extra["curve"][0] = -1
    with pytest.raises(TypeError):
        tr.extra["new"] = 1
    res = SolverResult(objective=1.0, gap=0.0, iterations=1, status="optimal", solver="x",
                       history={"gap": np.zeros(2)})
    with pytest.raises(ValueError, match="read-only"):
        res.history["gap"][0] = 1


def test_a_clair_fit_is_read_only():
    import numpy as np

    inst = clair.simulate(n_clients=6, samples_per_client=40, p=6, q=5, seed=0)
    res = clair.fit(inst.W_hat, 1 / 6 ** 0.5, 3.5 / 6 ** 1.5, rank=2)
    for name in ("projector", "benign", "refined", "block_norms", "votes", "singular_values"):
        arr = getattr(res, name)
        assert isinstance(arr, np.ndarray), name
        with pytest.raises(ValueError, match="read-only"):
            arr.flat[0] = arr.flat[0]
