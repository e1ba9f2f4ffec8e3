"""Every federated algorithm's Trace describes the parameters it returns.

One row per (algorithm, regime) in ``CASES``: ``run()`` returns ``(trace, truth, loss_at)`` where
``truth`` is the ground-truth representation and ``loss_at(trace)`` is the problem's own loss at
the returned parameters (``problem.population_loss`` with the heads the method uses). The test
checks

* ``trace.distance[-1] == subspace_distance(truth, trace.B, rank_deficient="span")``;
* ``trace.loss[-1] == loss_at(trace)``.

Both sides are computed from the same arrays by the same formulas (possibly in another order),
so they agree to rounding: relative 1e-10 on the loss, absolute 1e-12 on the distance (in [0, 1]).
To add an algorithm, append a row.
"""
import numpy as np
import pytest

from lowrank_fl.algorithms.fedavg import dgd, fedavg
from lowrank_fl.algorithms.lora_aggregation import federated_lora_matrix
from lowrank_fl.algorithms.rolora import fedavg_lora, ffa_lora, rolora
from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.algorithms.fedrep_baselines import fedsgd
from lowrank_fl.algorithms.flute import flute
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.lora import lora_matrix_problem, rank_one_lora
from lowrank_fl.problems.multitask import multitask_linear
from lowrank_fl.problems.underparameterized import underparameterized


def _mt(data=False):
    return multitask_linear(d=10, rank=2, n_clients=12, samples_per_client=8 if data else None, noise=0.1, seed=0)


def _up(data=False):
    return underparameterized(d=6, n_clients=8, rank=2, samples_per_client=9 if data else None, noise=0.2, seed=1)


def _shared_head_loss(p):
    """FedAvg / FedSGD train one head ``w`` used by every client."""
    return lambda tr: p.population_loss(tr.B, np.tile(tr.extra["w"], (p.n_clients, 1)))


def _heads_loss(p):
    return lambda tr: p.population_loss(tr.B, tr.heads)


def _fedrep(**kw):
    def run():
        p = _mt(data=kw.get("data") == "fixed")
        return fedrep(p, 6, 0.2, seed=2, **kw), p.B_star, _heads_loss(p)
    return run


def _fedsgd(**kw):
    def run():
        p = _mt(data=True)
        return fedsgd(p, 6, 0.1, seed=2, **kw), p.B_star, _shared_head_loss(p)
    return run


def _fedavg(**kw):
    def run():
        p = _mt(data=True)
        return fedavg(p, 4, 0.05, local_steps=3, seed=2, **kw), p.B_star, _shared_head_loss(p)
    return run


def _flute(with_data, **kw):
    def run():
        p = _up(with_data)
        return flute(p, 30, 0.03, seed=2, **kw), p.U_k, _heads_loss(p)
    return run


def _fedrep_on_flute(**kw):
    """FedRep on FLUTE's problem: the loss is the problem's own (FLUTE's MSE convention)."""
    def run():
        p = _up(data=True)
        return fedrep(p, 5, 0.1, seed=2, **kw), p.U_k, _heads_loss(p)
    return run


def _dgd(**kw):
    def run():
        p = _mt(data=True)
        return dgd(p, 5, 0.05, seed=2, **kw), p.B_star, _shared_head_loss(p)
    return run


def _lora(algorithm, samples, *args, **kw):
    """Rank-one LoRA toy: the representation is ``a`` (trace.a), the loss the population loss (246)."""
    def run():
        p = rank_one_lora(d=8, n_clients=4, gamma=0.4, samples_per_client=12 if samples else None, seed=3)
        return (algorithm(p, 5, *args, init=0.6, seed=2, **kw), p.a_star[:, None],
                lambda tr: p.population_loss(tr.a, tr.b))
    return run


def _lora_matrix(method):
    def run():
        p = lora_matrix_problem(d=6, n_clients=4, rank=2, gamma=0.5, seed=4)
        return (federated_lora_matrix(p, 6, 0.05, method=method, local_steps=2, seed=2), p.A_star.T,
                lambda tr: p.loss(tr.a, tr.b))
    return run


CASES = {
    "fedrep/population": _fedrep(),
    "fedrep/fresh": _fedrep(data="fresh", batch_size=6),
    "fedrep/fixed": _fedrep(data="fixed"),
    "fedrep/no-qr": _fedrep(orthonormalize=False),
    "fedrep/head-gd": _fedrep(head_steps=2, data="fresh", batch_size=6),
    "fedrep/partial": _fedrep(clients_per_round=4),
    "fedsgd/fixed": _fedsgd(),
    "fedsgd/population": _fedsgd(data="population", clients_per_round=6),
    "fedsgd/fresh": _fedsgd(data="fresh", batch_size=5),
    "fedavg/population": _fedavg(data="population"),
    "fedavg/fresh": _fedavg(data="fresh", batch_size=5),
    "fedavg/empirical": _fedavg(data="fixed"),
    "flute/population": _flute(False),
    "flute/fixed": _flute(True, data="fixed"),
    "flute/fresh": _flute(True, data="fresh"),
    "fedrep-on-flute/moments": _fedrep_on_flute(),
    "fedrep-on-flute/random": _fedrep_on_flute(init="random", data="fresh"),
    "fedrep-on-flute/population": _fedrep_on_flute(data="population"),
    "dgd/population": _dgd(data="population"),
    "dgd/empirical": _dgd(data="fixed"),
    "fedavg/partial": _fedavg(clients_per_round=5),
    "rolora/population": _lora(rolora, False, 0.2),
    "rolora/reuse": _lora(rolora, True, 0.2),
    "rolora/fresh": _lora(rolora, True, 0.2, data="fresh"),
    "ffa_lora/argmin": _lora(ffa_lora, True),
    "ffa_lora/gd": _lora(ffa_lora, False, 0.1, local="gd", local_steps=3),
    "fedavg_lora/population": _lora(fedavg_lora, False, 0.05, local_steps=3),
    "fedavg_lora/reuse": _lora(fedavg_lora, True, 0.05, local_steps=2, normalize=True),
    "federated_lora_matrix/rolora": _lora_matrix("rolora"),
    "federated_lora_matrix/ffa": _lora_matrix("ffa"),
    "federated_lora_matrix/fedavg": _lora_matrix("fedavg"),
    "federated_lora_matrix/flexlora": _lora_matrix("flexlora"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trace_describes_returned_parameters(name):
    tr, truth, loss_at = CASES[name]()
    assert tr.status == "completed"
    rep = tr.B if tr.B is not None else np.atleast_2d(tr.a).T   # LoRA methods: a (d,) / A (r, in): row space
    assert tr.distance[-1] == pytest.approx(
        subspace_distance(truth, rep, rank_deficient="span"), abs=1e-12)
    assert tr.loss[-1] == pytest.approx(loss_at(tr), rel=1e-10)


def test_multitask_losses_share_one_scale():
    # At the ground truth all methods on a MultitaskProblem report noise^2 / 2 (eq. (6)): with
    # identical client heads, FedRep, FedSGD and FedAvg all converge to B* w* and their losses
    # agree. Population regime, rounds chosen to converge to ~1e-10 (rates measured: <= 0.9/round).
    w = np.array([1.0, 0.5])
    p = multitask_linear(d=8, rank=2, n_clients=6, heads=np.tile(w, (6, 1)), noise=0.3, seed=0)
    floor = 0.5 * 0.3 ** 2
    rep = fedrep(p, 50, 0.5, seed=1)
    sgd = fedsgd(p, 400, 0.5, seed=1)
    avg = fedavg(p, 400, 0.5, local_steps=1, seed=1)
    for tr in (rep, sgd, avg):
        assert tr.status == "completed", tr.method
        assert tr.loss[-1] == pytest.approx(floor, abs=1e-8), tr.method
