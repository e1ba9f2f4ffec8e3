"""FedAvg / D-GD / fine-tuning (lowrank_fl.algorithms.fedavg) against per-client loops and closed forms."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.algorithms.fedavg import (MAX_LOCAL_STEPS, FineTuneResult, dgd, fedavg,
                                          fedavg_round, fine_tune)
from lowrank_fl.exact.fedavg_ft import global_objective, gradient_norm
from lowrank_fl.problems.fedavg_ft import new_client, paper_instance
from lowrank_fl.problems.multitask import multitask_linear
from lowrank_fl.results import ConvergenceWarning

from _fedavg_reference import loop_round

# Iterates are O(1/sqrt(alpha)) ~ 1.6 and a round is a few dozen flops per entry, so a batched
# round and the per-client loop agree to ~1e-15; 1e-12 leaves room for summation order only.
TOL = 1e-12


@pytest.fixture(scope="module")
def inst():
    return paper_instance(d=12, rank=3, n_clients=8, step_size=0.3, samples_per_client=6, noise=0.1, seed=4)


def _warm(inst, rounds=3):
    """A state with w != 0 (at init w0 = 0 the first B-step is trivial)."""
    tr = fedavg(inst.problem, rounds, 0.3, local_steps=2, init=inst.init)
    return tr.B, tr.extra["w"]


@pytest.mark.parametrize("tau", [1, 2, 5])
def test_batched_round_equals_loop_population(inst, tau):
    B, w = _warm(inst)
    th = inst.problem.theta[[0, 2, 5]]
    got = fedavg_round(B, w, 0.3, local_steps=tau, targets=th)
    ref = loop_round(B, w, tau, 0.3, targets=th)
    assert np.max(np.abs(got[0] - ref[0])) <= TOL and np.max(np.abs(got[1] - ref[1])) <= TOL


@pytest.mark.parametrize("tau", [1, 3])
@pytest.mark.parametrize("n", [6, 20])          # n <= d: kernel (sample-space) form; n > d: direct form
def test_batched_round_equals_loop_empirical(inst, tau, n):
    B, w = _warm(inst)
    X, y = inst.problem.sample(n, seed=9)
    got = fedavg_round(B, w, 0.3, local_steps=tau, X=X, y=y)
    ref = loop_round(B, w, tau, 0.3, X=X, y=y)
    assert np.max(np.abs(got[0] - ref[0])) <= TOL and np.max(np.abs(got[1] - ref[1])) <= TOL
    path = fedavg_round(B, w, 0.3, local_steps=tau, X=X, y=y, return_path=True)[2]
    np.testing.assert_allclose(path["B"][:, -1].mean(axis=0), ref[0], atol=TOL, rtol=0)
    g0 = np.einsum("mnd,mn->md", X, np.einsum("mnd,d->mn", X, B @ w) - y) / n
    np.testing.assert_allclose(path["grad"][:, 0], g0, atol=TOL, rtol=0)


def test_empirical_fedavg_trace_equals_loop(inst):
    p = inst.problem
    # a Generator seed is used as is, so the loop can replay the same client draws
    tr = fedavg(p, 3, 0.3, local_steps=2, clients_per_round=5, init=inst.init, data="fixed",
                seed=np.random.default_rng(2))
    rng = np.random.default_rng(2)
    B, w = inst.B0, inst.w0
    for _ in range(3):
        idx = np.sort(rng.choice(8, size=5, replace=False))
        B, w = loop_round(B, w, 2, 0.3, X=p.X[idx], y=p.y[idx])
    assert np.max(np.abs(tr.B - B)) <= TOL and np.max(np.abs(tr.extra["w"] - w)) <= TOL


@settings(max_examples=25, deadline=None)
@given(d=st.integers(3, 9), k=st.integers(1, 2), m=st.integers(1, 5), tau=st.integers(1, 4),
       alpha=st.floats(0.01, 0.5), seed=st.integers(0, 2**16))
def test_round_equals_loop_property(d, k, m, tau, alpha, seed):
    rng = np.random.default_rng(seed)
    B, w, th = rng.standard_normal((d, k)), 0.5 * rng.standard_normal(k), rng.standard_normal((m, d))
    got = fedavg_round(B, w, alpha, local_steps=tau, targets=th)
    ref = loop_round(B, w, tau, alpha, targets=th)
    scale = 1 + np.max(np.abs(ref[0]))
    assert np.max(np.abs(got[0] - ref[0])) <= TOL * scale
    assert np.max(np.abs(got[1] - ref[1])) <= TOL * scale


def test_return_path_is_consistent(inst):
    B, w = _warm(inst)
    th = inst.problem.theta
    Bn, wn, path = fedavg_round(B, w, 0.3, local_steps=3, targets=th, return_path=True)
    assert path["B"].shape == (8, 4, 12, 3) and path["w"].shape == (8, 4, 3)
    np.testing.assert_allclose(path["B"][:, -1].mean(axis=0), Bn, atol=TOL, rtol=0)
    np.testing.assert_allclose(path["w"][:, -1].mean(axis=0), wn, atol=TOL, rtol=0)
    # each local step is the simultaneous update from the old (B, w)
    e = np.einsum("mdk,mk->md", path["B"][:, 1], path["w"][:, 1]) - th
    np.testing.assert_allclose(path["B"][:, 2], path["B"][:, 1] - 0.3 * np.einsum("md,mk->mdk", e, path["w"][:, 1]), atol=TOL, rtol=0)


def test_fedavg_trace_equals_loop_with_sampling(inst):
    p = inst.problem
    tr = fedavg(p, 4, 0.3, local_steps=2, clients_per_round=3, init=inst.init, data="population",
                seed=np.random.default_rng(11))
    rng = np.random.default_rng(11)
    B, w = inst.B0, inst.w0
    for _ in range(4):
        idx = np.sort(rng.choice(8, size=3, replace=False))
        B, w = loop_round(B, w, 2, 0.3, targets=p.theta[idx])
    assert np.max(np.abs(tr.B - B)) <= TOL and np.max(np.abs(tr.extra["w"] - w)) <= TOL
    assert tr.bytes_up.shape == (4,) and tr.bytes_up[0] == 8 * 3 * (12 * 3 + 3)


def test_trace_metrics_match_exact_references(inst):
    p = inst.problem
    tr = fedavg(p, 5, 0.3, local_steps=2, init=inst.init)
    W = np.broadcast_to(tr.extra["w"], (p.n_clients, p.k))
    # Trace.loss is the toolkit's MultitaskProblem convention (FedRep eq. (6), with 1/2 and the
    # noise term); the paper's objective (7) is extra["objective"]. Both are O(1) sums of a few
    # dozen products: 1e-12 relative leaves room for the closed form's reordering only.
    assert np.isclose(tr.loss[-1], p.population_loss(tr.B, W), rtol=1e-12, atol=0)
    assert np.isclose(tr.extra["objective"][-1], global_objective(tr.B, tr.extra["w"], p.B_star, p.heads),
                      rtol=1e-12, atol=0)
    assert np.isclose(tr.loss[-1], 0.5 * tr.extra["objective"][-1] + 0.5 * p.noise ** 2, rtol=1e-12)
    assert np.isclose(tr.extra["grad_norm"][-1], gradient_norm(tr.B, tr.extra["w"], p.B_star, p.heads),
                      rtol=1e-10, atol=1e-15)
    assert tr.extra["delta_norm"][0] < 1e-12  # paper init: alpha B0^T B0 = I


def test_empirical_mode_records_empirical_loss(inst):
    tr = fedavg(inst.problem, 3, 0.3, local_steps=2, init=inst.init, data="fixed")
    p = inst.problem
    resid = p.y - np.einsum("nmd,d->nm", p.X, tr.B @ tr.extra["w"])
    assert np.isclose(tr.extra["empirical_loss"][-1], 0.5 * np.mean(resid ** 2), rtol=1e-12)


def test_dgd_is_eq70(inst):
    p = inst.problem
    tr = dgd(p, 6, 0.3, init=inst.init, data="population")
    B, w = inst.B0, inst.w0
    target = p.B_star @ p.heads.mean(axis=0)
    for _ in range(6):
        e = B @ w - target
        B, w = B - 0.3 * np.outer(e, w), w - 0.3 * B.T @ e
    assert tr.method == "dgd"
    assert np.max(np.abs(tr.B - B)) <= TOL and np.max(np.abs(tr.extra["w"] - w)) <= TOL


def test_paper_init_first_dgd_step_keeps_B(inst):
    # w0 = 0 makes the first B-step vanish (App. C.1's init: the B-gradient is e w^T)
    tr = dgd(inst.problem, 1, 0.3, init=inst.init)
    assert np.array_equal(tr.B, inst.B0)


def test_same_seed_same_trace(inst):
    a = fedavg(inst.problem, 5, 0.3, local_steps=2, clients_per_round=4, seed=3)
    b = fedavg(inst.problem, 5, 0.3, local_steps=2, clients_per_round=4, seed=3)
    c = fedavg(inst.problem, 5, 0.3, local_steps=2, clients_per_round=4, seed=4)
    assert np.array_equal(a.distance, b.distance) and not np.array_equal(a.distance, c.distance)


def test_divergence_is_reported(inst):
    tr = fedavg(inst.problem, 200, 50.0, local_steps=2, init=inst.init)
    assert tr.status == "diverged" and isinstance(tr.diverged_at, int) and tr.diverged_at >= 1
    assert np.all(np.isnan(tr.distance[tr.diverged_at:]))
    assert np.all(np.isfinite(tr.distance[:tr.diverged_at]))
    # the returned model is the last finite iterate: rerunning diverged_at - 1 rounds gives it
    assert np.all(np.isfinite(tr.B)) and np.all(np.isfinite(tr.extra["w"]))
    ref = fedavg(inst.problem, tr.diverged_at - 1, 50.0, local_steps=2, init=inst.init)
    assert ref.status == "completed"
    assert np.array_equal(tr.B, ref.B) and np.array_equal(tr.extra["w"], ref.extra["w"])


def test_zero_rounds_is_the_initialization(inst):
    tr = fedavg(inst.problem, 0, 0.3, local_steps=2, init=inst.init)
    assert tr.distance.shape == (1,) and tr.bytes_up.shape == (0,)
    assert np.array_equal(tr.B, inst.B0) and np.array_equal(tr.extra["w"], inst.w0)
    assert tr.distance[0] == pytest.approx(inst.delta0, abs=1e-12)


@pytest.mark.parametrize("tau", [40])
def test_long_local_path_equals_loop(inst, tau):
    # the r < s corrections are one batched sum per step: check a long path against the loop;
    # 40 steps of O(1) updates accumulate ~40x the one-round rounding (1e-15): 1e-11 is ample
    B, w = _warm(inst)
    th = inst.problem.theta
    got = fedavg_round(B, w, 0.05, local_steps=tau, targets=th)
    ref = loop_round(B, w, tau, 0.05, targets=th)
    assert np.max(np.abs(got[0] - ref[0])) <= 1e-11 and np.max(np.abs(got[1] - ref[1])) <= 1e-11
    X, y = inst.problem.X, inst.problem.y
    got = fedavg_round(B, w, 0.05, local_steps=tau, X=X, y=y)
    ref = loop_round(B, w, tau, 0.05, X=X, y=y)
    assert np.max(np.abs(got[0] - ref[0])) <= 1e-11 and np.max(np.abs(got[1] - ref[1])) <= 1e-11


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(rounds=-1), ValueError, "rounds must be >= 0"),
    (dict(local_steps=0), ValueError, "local_steps must be >= 1"),
    (dict(local_steps=MAX_LOCAL_STEPS + 1), ValueError, f"local_steps must be <= {MAX_LOCAL_STEPS}"),
    (dict(step_size=0.0), ValueError, "step_size must be finite and > 0"),
    (dict(step_size=-1.0), ValueError, "step_size must be finite and > 0"),
    (dict(clients_per_round=0), ValueError, "clients_per_round must be >= 1"),
    (dict(clients_per_round=9), ValueError, "clients_per_round must be <= 8"),
    (dict(data="sgd"), ValueError, "data must be one of"),
    (dict(data="population", batch_size=3), ValueError, "batch_size is only used with data='fresh'"),
    (dict(init=(np.zeros((12, 3)), np.zeros(3))), ValueError, "init B0 must have full column rank"),
    (dict(init="random"), ValueError, "init must be one of"),
    (dict(init=np.zeros((12, 3))), TypeError, "init must be 'paper' or a pair"),
    (dict(init=(np.ones((11, 3)), np.zeros(3))), ValueError, r"init B0 must have shape \(12, 3\)"),
    (dict(init=(np.ones((12, 3)), np.zeros(3))), ValueError, "init B0 must have full column rank"),
    (dict(init=(np.eye(12)[:, :3], np.zeros(4))), ValueError, r"init w0 must have shape \(3\)"),
])
def test_fedavg_errors(inst, kwargs, exc, match):
    args = dict(rounds=2, local_steps=2, step_size=0.3)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        fedavg(inst.problem, args.pop("rounds"), args.pop("step_size"), local_steps=args.pop("local_steps"), **args)


def test_fedavg_problem_type_and_empirical_without_data():
    with pytest.raises(TypeError, match="problem must be a MultitaskProblem"):
        fedavg({"B_star": 1}, 2, 0.1, local_steps=2)
    p = multitask_linear(d=6, rank=2, n_clients=4, seed=0)
    with pytest.raises(ValueError, match="data='fixed' needs a problem with a dataset"):
        fedavg(p, 2, 0.1, local_steps=2, data="fixed")


def test_k_not_below_d_is_rejected():
    with pytest.raises(ValueError, match="k must be smaller than d"):
        paper_instance(d=4, rank=4, n_clients=3, seed=0)


# ----------------------------------------------------------------------------- fine-tuning
@pytest.fixture(scope="module")
def trained(inst):
    tr = fedavg(inst.problem, 40, 0.3, local_steps=2, init=inst.init)
    return tr.B, tr.extra["w"]


def test_head_only_ls_equals_lstsq(inst, trained):
    B, w = trained
    cl = new_client(inst.problem, samples_per_client=15, seed=2)
    res = fine_tune(cl, B, w, steps=5)
    Q = np.linalg.qr(B)[0]
    w_ref = np.linalg.lstsq(cl.X @ Q, cl.y, rcond=None)[0]
    # lstsq on the same (n, k) system: identical up to the sign convention of the QR basis
    np.testing.assert_allclose(res.head_ls_beta, Q @ w_ref, atol=1e-12, rtol=0)
    assert np.isclose(res.head_ls_error, np.sum((Q @ w_ref - cl.beta) ** 2), rtol=1e-10)
    assert isinstance(res, FineTuneResult)


def test_full_gd_matches_manual_and_descends(inst, trained):
    B, w = trained
    cl = new_client(inst.problem, samples_per_client=15, seed=2)
    res = fine_tune(cl, B, w, steps=30, step_size=0.01)
    Bm, wm = B.copy(), w.copy()
    for _ in range(30):
        g = cl.X.T @ (cl.X @ (Bm @ wm) - cl.y) / 15
        Bm, wm = Bm - 0.01 * np.outer(g, wm), wm - 0.01 * Bm.T @ g
    assert np.max(np.abs(res.full_B - Bm)) <= TOL and np.max(np.abs(res.full_w - wm)) <= TOL
    assert res.full_loss[-1] < res.full_loss[0]
    assert np.isclose(res.full_error, np.sum((Bm @ wm - cl.beta) ** 2), rtol=1e-12)


def test_fine_tune_zero_steps_and_tuple_input(inst, trained):
    B, w = trained
    cl = new_client(inst.problem, samples_per_client=10, seed=5)
    res = fine_tune((cl.X, cl.y), B, w, steps=0)
    assert np.array_equal(res.full_B, B) and np.isnan(res.full_error) and np.isnan(res.head_ls_error)


def test_fine_tune_divergence(inst, trained):
    B, w = trained
    cl = new_client(inst.problem, samples_per_client=10, seed=5)
    with pytest.warns(ConvergenceWarning, match="fine_tune.*diverged"):
        res = fine_tune(cl, B, w, steps=500, step_size=100.0)
    assert res.status == "diverged" and res.diverged_at is not None and np.isnan(res.full_error)


@pytest.mark.parametrize("call, exc, match", [
    (lambda B, w, cl: fine_tune("data", B, w), TypeError, "client must be a NewClient"),
    (lambda B, w, cl: fine_tune((cl.X, cl.y[:-1]), B, w), ValueError, r"y must have shape \(10\)"),
    (lambda B, w, cl: fine_tune(cl, B[:-1], w), ValueError, r"B must have shape \(12, \?\)"),
    (lambda B, w, cl: fine_tune(cl, B, w[:-1]), ValueError, r"w must have shape \(3\)"),
    (lambda B, w, cl: fine_tune((cl.X, cl.y, cl.beta[:-1]), B, w), ValueError, "beta_star must have shape"),
    (lambda B, w, cl: fine_tune(cl, B, w, steps=-1), ValueError, "steps must be >= 0"),
    (lambda B, w, cl: fine_tune(cl, B, w, step_size=0), ValueError, "step_size must be finite and > 0"),
])
def test_fine_tune_errors(inst, trained, call, exc, match):
    cl = new_client(inst.problem, samples_per_client=10, seed=1)
    with pytest.raises(exc, match=match):
        call(*trained, cl)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(), ValueError, "give either targets"),
    (dict(targets=np.zeros((2, 12)), X=np.zeros((2, 3, 12)), y=np.zeros((2, 3))), ValueError, "give either targets"),
    (dict(X=np.zeros((2, 3, 12))), ValueError, "X and y must be given together"),
    (dict(targets=np.zeros((2, 11))), ValueError, r"targets must have shape \(\?, 12\)"),
    (dict(X=np.zeros((2, 3, 11)), y=np.zeros((2, 3))), ValueError, r"X must have shape \(\?, \?, 12\)"),
    (dict(X=np.zeros((2, 3, 12)), y=np.zeros((2, 4))), ValueError, r"y must have shape \(2, 3\)"),
    (dict(X=np.zeros((2, 3, 12)), y=np.zeros((2, 3)), gram=np.zeros((2, 3, 4))), ValueError,
     r"gram must have shape \(2, 3, 3\)"),
    (dict(targets=np.zeros((2, 12)), w=np.zeros(4)), ValueError, r"w must have shape \(3\)"),
    (dict(targets=np.zeros((2, 12)), local_steps=0), ValueError, "local_steps must be >= 1"),
    (dict(targets=np.zeros((2, 12)), step_size=-0.1), ValueError, "step_size must be finite and > 0"),
    (dict(targets=np.zeros((2, 12)), B=np.full((12, 3), np.nan)), ValueError, "B must be finite"),
    (dict(targets=np.zeros((2, 12)), B=np.eye(12), w=np.zeros(12)), ValueError,
     r"B must have fewer columns than rows \(k < d"),
])
def test_fedavg_round_errors(kwargs, exc, match):
    args = dict(B=np.eye(12)[:, :3], w=np.zeros(3), local_steps=2, step_size=0.1)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        fedavg_round(args.pop("B"), args.pop("w"), args.pop("step_size"), local_steps=args.pop("local_steps"), **args)


def test_fine_tune_from_problem_draws_new_client(inst, trained):
    B, w = trained
    res = fine_tune(inst.problem, B, w, steps=3, samples_per_client=9, seed=4)
    cl = new_client(inst.problem, samples_per_client=9, noise=0.1, seed=4)
    ref = fine_tune(cl, B, w, steps=3)
    assert res.full_error == ref.full_error and np.array_equal(res.head_ls_beta, ref.head_ls_beta)
    with pytest.raises(ValueError, match="samples_per_client \\(the new client's number of samples\\) is required"):
        fine_tune(inst.problem, B, w)
