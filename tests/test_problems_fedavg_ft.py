"""Instances of lowrank_fl.problems.fedavg_ft: App. C.1 experiment, new client, Proposition 1."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.algorithms.fedavg import dgd
from lowrank_fl.exact.fedavg_ft import head_statistics
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.fedavg_ft import (new_client, paper_init, paper_instance,
                                           proposition1_instance)
from lowrank_fl.problems.multitask import multitask_linear


def test_paper_instance_defaults_and_init():
    inst = paper_instance(seed=0)
    p = inst.problem
    assert (p.d, p.k, p.n_clients) == (100, 5, 40) and inst.step_size == 0.4
    # Delta_0 = I - alpha B0^T B0 = 0 up to rounding of a QR factor
    assert np.max(np.abs(np.eye(5) - 0.4 * inst.B0.T @ inst.B0)) < 1e-12
    assert np.array_equal(inst.w0, np.zeros(5))
    assert np.array_equal(inst.stats.mean, head_statistics(p.heads).mean)
    assert 0.9 < inst.delta0 <= 1.0          # random init in d = 100 is almost orthogonal (notes 7.4)


def test_paper_instance_seeded_and_finite_sample():
    a = paper_instance(d=10, rank=2, n_clients=5, samples_per_client=7, noise=0.1, seed=3)
    b = paper_instance(d=10, rank=2, n_clients=5, samples_per_client=7, noise=0.1, seed=3)
    assert np.array_equal(a.B0, b.B0) and np.array_equal(a.problem.X, b.problem.X)
    assert a.problem.X.shape == (5, 7, 10) and a.problem.y.shape == (5, 7)
    assert not np.array_equal(a.B0, paper_instance(d=10, rank=2, n_clients=5, seed=4).B0)


def test_paper_init_errors():
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        paper_init(d=5, rank=2, step_size=0.0)


def test_new_client_model():
    p = multitask_linear(d=9, rank=2, n_clients=4, seed=1)
    cl = new_client(p, samples_per_client=6, noise=0.0, seed=2)
    assert cl.X.shape == (6, 9) and np.allclose(cl.y, cl.X @ cl.beta, atol=1e-13)
    assert np.allclose(cl.beta, p.B_star @ cl.head)
    cl2 = new_client(p, samples_per_client=6, head=[1.0, 2.0], seed=2)
    assert np.array_equal(cl2.head, [1.0, 2.0]) and cl2.noise == 0.1
    with pytest.raises(TypeError, match="problem must be a MultitaskProblem"):
        new_client("p", samples_per_client=3)
    with pytest.raises(ValueError, match="samples_per_client must be >= 1"):
        new_client(p, samples_per_client=0)
    with pytest.raises(ValueError, match=r"head must have shape \(2\)"):
        new_client(p, samples_per_client=3, head=[1.0])
    with pytest.raises(ValueError, match="noise must be finite and >= 0"):
        new_client(p, samples_per_client=3, noise=-1.0)


# Construction identities are exact up to rounding of a few (d, k) products: 1e-12.
@settings(max_examples=20, deadline=None)
@given(k=st.integers(2, 4), extra=st.integers(0, 5), delta0=st.floats(0.01, 0.5),
       seed=st.integers(0, 2**16))
def test_proposition1_construction(k, extra, delta0, seed):
    d = 2 * k - 1 + extra
    inst = proposition1_instance(d=d, rank=k, n_clients=7, delta0=delta0, seed=seed)
    Bs, Br = inst.problem.B_star, inst.reflected.B_star
    wbar = inst.problem.heads.mean(axis=0)
    assert np.max(np.abs(Bs.T @ Bs - np.eye(k))) < 1e-12 and np.max(np.abs(Br.T @ Br - np.eye(k))) < 1e-12
    assert abs(subspace_distance(inst.B0, Bs) - delta0) < 1e-12
    assert abs(subspace_distance(inst.B0, Br) - delta0) < 1e-12
    np.testing.assert_allclose(Bs @ wbar, Br @ wbar, atol=1e-12)
    Q = np.linalg.qr(inst.B0)[0]
    t = Bs @ wbar
    assert np.linalg.norm(t - Q @ (Q.T @ t)) < 1e-12 * (1 + np.linalg.norm(t))
    # (69) with equality (all k-1 angles equal in this construction)
    assert abs(subspace_distance(Bs, Br) - 2 * delta0 * np.sqrt(1 - delta0**2)) < 1e-10


def test_proposition1_dgd_frozen_at_delta0():
    inst = proposition1_instance(d=12, rank=3, n_clients=8, delta0=0.2, seed=3)
    a = dgd(inst.problem, 100, 0.4, init=inst.init)
    b = dgd(inst.reflected, 100, 0.4, init=inst.init)
    assert np.max(np.abs(a.B - b.B)) < 1e-12
    assert np.max(np.abs(a.distance - 0.2)) < 1e-10 and np.max(np.abs(b.distance - 0.2)) < 1e-10


def test_proposition1_given_B0():
    B0 = np.eye(8)[:, :3] * 2.0
    inst = proposition1_instance(d=8, rank=3, n_clients=5, delta0=0.4, B0=B0, seed=0)
    assert np.array_equal(inst.B0, B0) and abs(subspace_distance(B0, inst.problem.B_star) - 0.4) < 1e-12


@pytest.mark.parametrize("args, kw, match", [
    ((8, 1, 5, 0.3), {}, "k must be >= 2"),
    ((4, 3, 5, 0.3), {}, "d must be at least 2k - 1 = 5"),
    ((8, 3, 5, 0.6), {}, r"delta0 must lie in \(0.0, 0.5\]"),
    ((8, 3, 5, 0.0), {}, r"delta0 must lie in \(0.0, 0.5\]"),
    ((8, 2, 2, 0.3), dict(heads=np.array([[1.0, 0.0], [-1.0, 0.0]])), "heads must have a nonzero mean"),
    ((8, 2, 2, 0.3), dict(B0=np.ones((8, 2))), "B0 must have full column rank"),
    ((8, 2, 2, 0.3), dict(step_size=0.0), "step_size must be finite and > 0"),
])
def test_proposition1_errors(args, kw, match):
    with pytest.raises(ValueError, match=match):
        proposition1_instance(**dict(zip(("d", "rank", "n_clients", "delta0"), args)), **kw)
