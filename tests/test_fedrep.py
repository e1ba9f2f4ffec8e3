import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.algorithms.fedrep import fedrep, fedrep_round, head_least_squares, n_participants
from lowrank_fl.exact.multitask import altmin, fit_heads, lemma1_decomposition
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.multitask import multitask_linear


def loop_round(B, X, y, eta, *, head_steps=None, heads=None, alpha=None, qr=True):
    """Straightforward per-client reference of one Algorithm 2 round (no batching)."""
    grads, new_heads = [], []
    for i in range(X.shape[0]):
        Xi, yi = X[i], y[i]
        A = Xi @ B
        if head_steps is None:
            w = np.linalg.lstsq(A, yi, rcond=None)[0]
        else:
            w = np.zeros(B.shape[1]) if heads is None else heads[i].copy()
            for _ in range(head_steps):
                w = w - (alpha or eta) * A.T @ (A @ w - yi) / len(yi)
        grads.append(Xi.T @ (A @ w - yi)[:, None] @ w[None, :] / len(yi))
        new_heads.append(w)
    Bbar = np.mean([B - eta * g for g in grads], axis=0)
    return (np.linalg.qr(Bbar)[0] if qr else Bbar), np.array(new_heads)


def _data(seed=0, n=9, m=6, d=8, k=2, noise=0.1):
    p = multitask_linear(d=d, rank=k, n_clients=n, noise=noise, seed=seed)
    X, y = p.sample(m, seed=seed + 1)
    B = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, k)))[0]
    return p, B, X, y


@given(st.integers(0, 10_000), st.sampled_from([None, 1, 3]), st.booleans())
@settings(max_examples=20, deadline=None)
def test_batched_round_equals_per_client_loop(seed, head_steps, qr):
    _, B, X, y = _data(seed)
    heads = np.random.default_rng(seed + 7).standard_normal((X.shape[0], 2))
    gd = {} if head_steps is None else dict(heads=heads, head_step_size=0.05)  # GD-only options
    out = fedrep_round(B, X, y, 0.2, head_steps=head_steps, orthonormalize=qr, **gd)
    B_ref, W_ref = loop_round(B, X, y, 0.2, head_steps=head_steps, heads=heads, alpha=0.05, qr=qr)
    # Same arithmetic in a different order: agreement to 1e-12 (iterates are O(1)).
    assert np.max(np.abs(out.B - B_ref)) <= 1e-12
    assert np.max(np.abs(out.heads - W_ref)) <= 1e-12
    assert np.allclose(out.B @ out.R, B - 0.2 * out.grad, atol=1e-12)


def test_gradient_orthogonal_to_B_and_R_has_sigma_min_at_least_one():
    # Exact LS heads satisfy the normal equations, so B^T grad = 0 and Bbar^T Bbar = I + eta^2 G^T G.
    _, B, X, y = _data(3, n=20, m=5, d=15, k=3)
    out = fedrep_round(B, X, y, 0.3)
    assert np.max(np.abs(B.T @ out.grad)) < 1e-12
    assert np.linalg.svd(out.R, compute_uv=False)[-1] >= 1 - 1e-12
    assert np.allclose(out.R.T @ out.R, np.eye(3) + 0.09 * out.grad.T @ out.grad, atol=1e-12)


def test_lemma1_identity_exact():
    p = multitask_linear(d=12, rank=3, n_clients=10, seed=2)
    X, _ = p.sample(7, seed=3)
    B = np.linalg.qr(np.random.default_rng(4).standard_normal((12, 3)))[0]
    q = lemma1_decomposition(B, p.B_star, p.heads, X)
    # W^{t+1} = W* B*^T B - F (eq. (16)); both sides O(1), exact algebra => 1e-10.
    assert np.max(np.abs(q["W_next"] - (p.heads @ p.B_star.T @ B - q["F"]))) < 1e-10
    Pi = np.einsum("nmd,nme->nde", X, X) / 7
    H_alt = B.T @ Pi @ (B @ B.T - np.eye(12)) @ p.B_star
    assert np.max(np.abs(q["H"] - H_alt)) < 1e-10


def test_population_rounds_match_closed_form_recursion():
    # m -> inf: Bbar = B + eta (I - B B^T) B* Sigma B*^T B with Sigma = W*^T W* / n (Alg. 2 with Pi_i = I).
    p = multitask_linear(d=10, rank=2, n_clients=8, seed=5)
    B0 = np.linalg.qr(p.B_star + 0.5 * np.random.default_rng(0).standard_normal((10, 2)))[0]
    tr = fedrep(p, 3, 0.2, init=B0, seed=0)
    B = np.linalg.qr(B0)[0]
    Sigma = p.heads.T @ p.heads / 8
    for _ in range(3):
        B = np.linalg.qr(B + 0.2 * (np.eye(10) - B @ B.T) @ p.B_star @ Sigma @ p.B_star.T @ B)[0]
    assert np.max(np.abs(B @ B.T - tr.B @ tr.B.T)) < 1e-12


def test_population_moments_init_is_exact():
    p = multitask_linear(d=15, rank=3, n_clients=20, seed=1)
    tr = fedrep(p, 0, 0.1, seed=0)
    assert tr.distance[0] < 1e-12


def test_converges_linearly_with_fresh_samples_and_records_everything():
    p = multitask_linear(d=30, rank=2, n_clients=100, seed=0)
    eta = 1 / 8
    tr = fedrep(p, 100, eta, data="fresh", batch_size=10, seed=1)
    assert tr.status == "completed" and tr.rounds == 100
    # linear convergence: log dist(B^t, B*) is a straight line in t (R^2 > 0.99; a sublinear
    # 1/t decay over these two decades would give R^2 ~ 0.8) whose slope is at least Theorem 1's
    # rate log(1 - eta E0 sigma_min^2 / 2), E0 = 1 - dist0^2, sigma_min^2 of W*^T W* / n
    t = np.arange(101)
    logd = np.log(tr.distance)
    slope, icpt = np.polyfit(t, logd, 1)
    r2 = 1 - np.var(logd - (slope * t + icpt)) / np.var(logd)
    smin2 = np.linalg.eigvalsh(p.heads.T @ p.heads / 100)[0]
    assert r2 > 0.99
    assert slope <= np.log(1 - eta * (1 - tr.distance[0] ** 2) * smin2 / 2)
    assert np.all(tr.extra["sigma_min_R"][1:] >= 1 - 1e-12)
    assert tr.bytes_up.shape == (100,) and np.all(tr.bytes_up == 8 * 100 * 30 * 2)
    assert tr.extra["init_bytes_up"] == 100 * 30 * 30 * 8
    assert tr.B.shape == (30, 2) and tr.heads.shape == (100, 2)
    assert tr.loss[-1] < tr.loss[0]


def test_fixed_dataset_regime_and_split_batch():
    p = multitask_linear(d=10, rank=2, n_clients=100, samples_per_client=6, noise=1e-3, seed=0)
    tr = fedrep(p, 300, 0.25, data="fixed", seed=1)
    # on a fixed dataset FedRep converges (linearly) to the empirical minimizer, which AltMin
    # computes exactly: after 300 rounds the two subspaces agree to 1e-8 (measured ~5e-11)
    am = altmin(p.X, p.y, 2, max_iter=500, tol=1e-15)
    assert subspace_distance(am.B, tr.B) < 1e-8
    q = multitask_linear(d=10, rank=2, n_clients=100, samples_per_client=12, noise=1e-3, seed=0)
    tr2 = fedrep(q, 100, 0.25, data="fixed", batch="split", seed=1)
    assert tr2.status == "completed" and tr2.distance[-1] < tr2.distance[0]


def test_pgd_and_random_inits():
    p = multitask_linear(d=20, rank=2, n_clients=100, samples_per_client=10, seed=0)
    # noiseless data: B* is an exact fixed point, so the tolerance 1e-10 (1e6 x machine
    # precision) must be reached; status "optimal" says it was, within 200 rounds
    tr = fedrep(p, 200, 0.5, init="pgd", data="fixed", tol=1e-10, seed=3)
    assert tr.distance[0] < 0.5 and tr.status == "optimal"
    q = multitask_linear(d=20, rank=2, n_clients=100, seed=0)
    assert fedrep(q, 0, 0.1, init="pgd", data="fresh", batch_size=10, seed=1).distance[0] < 0.5
    with pytest.raises(ValueError, match="init='pgd' needs samples"):
        fedrep(q, 1, 0.1, init="pgd", seed=1)
    r = fedrep(q, 0, 0.1, init="random", data="fresh", batch_size=10, seed=1)
    assert 0.5 < r.distance[0] <= 1.0        # a random 2-dim subspace of R^20 is far from B*


def test_partial_participation_uses_rn_clients():
    assert n_participants(0.1, 100) == 10 and n_participants(0.001, 100) == 1
    p = multitask_linear(d=20, rank=2, n_clients=50, seed=0)
    tr = fedrep(p, 5, 0.1, clients_per_round=10, data="fresh", batch_size=8, seed=3)
    part = tr.extra["participants"]
    assert part.shape == (5, 10)
    assert all(len(set(row)) == 10 for row in part)
    assert np.all(tr.bytes_down == 8 * 10 * 20 * 2)


def test_same_seed_same_trace():
    p = multitask_linear(d=20, rank=2, n_clients=30, seed=0)
    a = fedrep(p, 10, 0.1, clients_per_round=15, data="fresh", batch_size=8, seed=4)
    b = fedrep(p, 10, 0.1, clients_per_round=15, data="fresh", batch_size=8, seed=4)
    assert np.array_equal(a.distance, b.distance) and np.array_equal(a.B, b.B)


def test_head_gd_variant_warm_starts_and_differs_from_exact():
    p = multitask_linear(d=20, rank=2, n_clients=50, seed=0)
    exact = fedrep(p, 20, 0.1, data="fresh", batch_size=10, seed=2)
    gd = fedrep(p, 20, 0.1, data="fresh", batch_size=10, head_steps=1, seed=2)
    assert gd.method == "fedrep[head_steps=1]"
    assert gd.distance[-1] > exact.distance[-1]
    # warm start: round 2's head GD starts from round 1's heads (fixed data: deterministic)
    q = multitask_linear(d=10, rank=2, n_clients=8, samples_per_client=6, seed=1)
    B0 = np.linalg.qr(np.random.default_rng(0).standard_normal((10, 2)))[0]
    tr = fedrep(q, 2, 0.1, init=B0, head_steps=1, head_step_size=0.3, data="fixed", seed=0)
    r1 = fedrep_round(B0, q.X, q.y, 0.1, head_steps=1, head_step_size=0.3)
    r2 = fedrep_round(r1.B, q.X, q.y, 0.1, head_steps=1, head_step_size=0.3, heads=r1.heads)
    cold = fedrep_round(r1.B, q.X, q.y, 0.1, head_steps=1, head_step_size=0.3)
    np.testing.assert_allclose(tr.extra["round_heads"], r2.heads, atol=1e-12)
    np.testing.assert_allclose(tr.B, r2.B, atol=1e-12)
    assert np.max(np.abs(cold.heads - r2.heads)) > 1e-3


def test_tolerance_stops_early_with_status_optimal():
    p = multitask_linear(d=20, rank=2, n_clients=50, seed=0)
    tr = fedrep(p, 200, 0.2, data="fresh", batch_size=10, tol=1e-6, seed=1)
    assert tr.status == "optimal"
    last = int(np.max(np.nonzero(np.isfinite(tr.distance))[0]))
    assert tr.distance[last] <= 1e-6 < tr.distance[last - 1] and last < 200
    assert np.all(np.isnan(tr.distance[last + 1:]))


def test_divergence_is_reported_with_round():
    p = multitask_linear(d=20, rank=2, n_clients=30, seed=0)
    tr = fedrep(p, 40, 0.1, data="fresh", batch_size=10, head_steps=10, head_step_size=100.0, seed=1)
    assert tr.status == "diverged" and 1 <= tr.diverged_at <= 40
    assert np.all(np.isnan(tr.distance[tr.diverged_at:]))


def test_fit_heads_matches_round_heads():
    _, B, X, y = _data(1)
    assert np.allclose(fedrep_round(B, X, y, 0.1).heads, fit_heads(B, X, y), atol=1e-12)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(step_size=0.0), ValueError, "step_size must be finite and > 0"),
    (dict(step_size=-1.0), ValueError, "step_size must be finite and > 0"),
    (dict(clients_per_round=0), ValueError, "clients_per_round must be >= 1"),
    (dict(clients_per_round=31), ValueError, "clients_per_round must be <= 30"),
    (dict(clients_per_round=0.5), TypeError, "clients_per_round must be an integer"),
    (dict(init="pca"), ValueError, "init must be one of"),
    (dict(init=np.ones((5, 2))), ValueError, r"init must have shape \(20, 2\)"),
    (dict(batch="halves"), ValueError, "batch must be one of"),
    (dict(head_steps=0), ValueError, "head_steps must be >= 1"),
    (dict(head_step_size=-0.1), ValueError, "head_step_size must be finite and > 0"),
    (dict(head_step_size=0.1), ValueError, "head_step_size applies to head gradient steps only"),
    (dict(orthonormalize="yes"), TypeError, "orthonormalize must be a bool"),
    (dict(data="fixed"), ValueError, "data='fixed' needs a problem with a dataset"),
    (dict(data="empirical"), ValueError, "data must be one of"),
    (dict(data="fresh"), ValueError, "data='fresh' needs batch_size"),
    (dict(data="fresh", batch_size=0), ValueError, "batch_size must be >= 1"),
    (dict(batch_size=4), ValueError, "batch_size is only used with data='fresh'"),
    (dict(init=np.zeros((20, 2))), ValueError, "init must be a full-column-rank"),
    (dict(init=np.ones((20, 2))), ValueError, "init must be a full-column-rank"),
    (dict(init=np.full((20, 2), np.nan)), ValueError, "init must be finite"),
    (dict(sample_mode="fresh"), TypeError, "unexpected keyword argument 'sample_mode'"),
    (dict(rounds=-1), ValueError, "rounds must be >= 0"),
    (dict(tol=0.0), ValueError, "tol must be finite and > 0"),
])
def test_bad_input(kwargs, err, match):
    p = multitask_linear(d=20, rank=2, n_clients=30, seed=0)
    args = dict(rounds=3, step_size=0.1)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        fedrep(p, args.pop("rounds"), args.pop("step_size"), seed=0, **args)


def test_bad_problem_and_round_input():
    with pytest.raises(TypeError, match="problem must be a MultitaskProblem"):
        fedrep({"B_star": 1}, 3, 0.1)
    _, B, X, y = _data(0)
    with pytest.raises(ValueError, match=r"X must have shape \(\?, \?, 8\)"):
        fedrep_round(B, X[..., :5], y, 0.1)
    with pytest.raises(ValueError, match=r"y must have shape \(9, 6\)"):
        fedrep_round(B, X, y[:, :3], 0.1)
    with pytest.raises(ValueError, match="batch='split' needs at least 2 samples"):
        fedrep_round(B, X[:, :1], y[:, :1], 0.1, batch="split")


def test_options_of_the_other_regime_are_rejected():
    p = multitask_linear(d=8, rank=2, n_clients=6, samples_per_client=5, seed=0)
    with pytest.raises(ValueError, match="batch_size is only used with data='fresh'"):
        fedrep(p, 1, 0.1, data="fixed", batch_size=4, seed=0)
    with pytest.raises(ValueError, match="init_samples applies to drawn samples only"):
        fedrep(p, 1, 0.1, data="fixed", init_samples=4, seed=0)
    _, B, X, y = _data(0)
    with pytest.raises(ValueError, match="heads applies to head gradient steps only"):
        fedrep_round(B, X, y, 0.1, heads=np.zeros((9, 2)))
    with pytest.raises(ValueError, match="head_step_size applies to head gradient steps only"):
        fedrep_round(B, X, y, 0.1, head_step_size=0.1)
    with pytest.raises(TypeError, match="orthonormalize must be a bool"):
        fedrep_round(B, X, y, 0.1, orthonormalize=0)


def test_round_rejects_square_representation():
    _, _, X, y = _data(0)
    with pytest.raises(ValueError, match=r"B must have k < d columns .* got shape \(8, 8\)"):
        fedrep_round(np.eye(8), X, y, 0.1)


def test_heads_are_minimum_norm_when_underdetermined():
    # m = 1 < k = 2: infinitely many exact heads; the pseudo-inverse gives the minimum-norm one
    rng = np.random.default_rng(0)
    XB = rng.standard_normal((3, 1, 2))
    y = rng.standard_normal((3, 1))
    W = head_least_squares(XB, y)
    ref = np.stack([np.linalg.pinv(XB[i]) @ y[i] for i in range(3)])
    np.testing.assert_allclose(W, ref, atol=1e-12)


def test_loss_is_population_loss_of_returned_model_in_every_regime():
    # package convention: loss[t] = problem.population_loss(B^t, W^t), W^t = Alg. 2's exact heads
    pop = multitask_linear(d=12, rank=2, n_clients=20, noise=0.1, seed=0)
    tr = fedrep(pop, 5, 0.2, seed=1)
    assert tr.loss[-1] == pytest.approx(pop.population_loss(tr.B, tr.heads), rel=1e-12)
    # population heads are optimal: the loss is min_W F(B, W) = ||(I - BB^T) Theta^T||^2/(2n) + s^2/2
    R = pop.theta - pop.theta @ tr.B @ tr.B.T
    assert tr.loss[-1] == pytest.approx(0.5 * np.mean(np.sum(R * R, axis=1)) + 0.005, rel=1e-10)
    fix = multitask_linear(d=12, rank=2, n_clients=20, samples_per_client=8, noise=0.1, seed=0)
    tr = fedrep(fix, 5, 0.2, data="fixed", seed=1)
    np.testing.assert_allclose(tr.heads, fit_heads(tr.B, fix.X, fix.y), atol=1e-12)
    assert tr.loss[-1] == pytest.approx(fix.population_loss(tr.B, tr.heads), rel=1e-12)
