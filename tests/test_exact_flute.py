import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lowrank_fl.exact import flute as ex
from lowrank_fl.problems.underparameterized import underparameterized
from lowrank_fl.results import ConvergenceWarning


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


@settings(max_examples=30, deadline=None)
@given(d=st.integers(2, 7), k=st.integers(1, 4), M=st.integers(1, 7),
       g1=st.floats(0, 2), g2=st.floats(0, 2), seed=st.integers(0, 10_000))
def test_regularizer_identity(d, k, M, g1, g2, seed):
    # -g1||BW||^2 + g2(||B^TB||^2 + ||WW^T||^2) = g2||B^TB - WW^T||^2 + (2g2 - g1)||BW||^2
    # (paper's (k, M) W; the functions take the heads (M, k), its transpose)
    B, W = _rand((d, k), seed), _rand((k, M), seed + 1).T
    lhs = ex.regularizer(B, W, g1, g2)
    rhs = ex.regularizer_balanced_form(B, W, g1, g2)
    assert abs(lhs - rhs) <= 1e-10 * (1 + abs(lhs))


def _fd_grad(f, A, h=1e-6):
    G = np.zeros_like(A)
    for idx in np.ndindex(A.shape):
        E = np.zeros_like(A)
        E[idx] = h
        G[idx] = (f(A + E) - f(A - E)) / (2 * h)
    return G


@pytest.mark.parametrize("normalization", ["appendix", "main"])
@pytest.mark.parametrize("aggregation", ["sum", "mean"])
def test_gradients_match_finite_differences(normalization, aggregation):
    # Central differences with h = 1e-6: truncation O(h^2 |f'''|) ~ 1e-11 and round-off
    # O(eps |f| / h) ~ 1e-9 for |f| ~ 10, so a 1e-6 absolute tolerance is ample yet catches any
    # factor-of-2 or sign error (gradient entries are O(1)).
    p = underparameterized(d=5, n_clients=4, rank=2, samples_per_client=6, noise=0.3, seed=2)
    B, W = _rand((5, 2), 0), _rand((2, 4), 1).T
    assert ex.data_gradients(B, W, p.X, p.y)[1].shape == (4, 2)          # client axis first
    kw = dict(gamma1=0.3, gamma2=0.1, normalization=normalization, aggregation=aggregation)
    gB, gW = ex.data_gradients(B, W, p.X, p.y, normalization=normalization, aggregation=aggregation)
    rB, rW = ex.regularizer_gradients(B, W, 0.3, 0.1)
    fB = _fd_grad(lambda A: ex.flute_objective(A, W, p.X, p.y, **kw), B)
    fW = _fd_grad(lambda A: ex.flute_objective(B, A, p.X, p.y, **kw), W)
    np.testing.assert_allclose(gB + rB, fB, atol=1e-6)
    np.testing.assert_allclose(gW + rW, fW, atol=1e-6)
    pB, pW = ex.population_data_gradients(B, W, p.Phi, normalization=normalization,
                                          aggregation=aggregation)
    qB = _fd_grad(lambda A: ex.population_objective(A, W, p.Phi, noise=0.3, **kw), B)
    np.testing.assert_allclose(pB + rB, qB, atol=1e-6)
    qW = _fd_grad(lambda A: ex.population_objective(B, A, p.Phi, noise=0.3, **kw), W)
    np.testing.assert_allclose(pW + rW, qW, atol=1e-6)


def test_appendix_step_form_at_theory_gammas():
    # C14 (vi): with g1 = 1/4, g2 = 1/8 the eq. (6) gradients are (1/2)B(B^TB - WW^T), -(1/2)(..)W
    B, W = _rand((6, 3), 3), _rand((3, 5), 4).T                         # heads W (M, k)
    rB, rW = ex.regularizer_gradients(B, W, 0.25, 0.125)
    D = B.T @ B - W.T @ W                                                # paper's B^TB - WW^T
    np.testing.assert_allclose(rB, 0.5 * B @ D, atol=1e-12)
    np.testing.assert_allclose(rW, -0.5 * W @ D, atol=1e-12)


def test_data_gradients_equal_population_under_orthogonal_design():
    # With X_i^T X_i / N = I exactly and noiseless labels the empirical gradients are the
    # population ones (Q = Q~ = 0 in eqs. (11)-(12)).
    p = underparameterized(d=4, n_clients=3, rank=2, seed=5)
    N = 8
    Q = np.stack([np.linalg.qr(_rand((N, 4), s))[0] for s in range(3)]) * np.sqrt(N)
    y = np.einsum("ind,di->in", Q, p.Phi)
    B, W = _rand((4, 2), 1), _rand((2, 3), 2).T
    for norm in ("appendix", "main"):
        g = ex.data_gradients(B, W, Q, y, normalization=norm)
        h = ex.population_data_gradients(B, W, p.Phi, normalization=norm)
        np.testing.assert_allclose(g[0], h[0], atol=1e-12)
        np.testing.assert_allclose(g[1], h[1], atol=1e-12)


def test_data_weight_values():
    assert ex.data_weight("appendix") == 0.5 and ex.data_weight("main") == 1.0
    assert ex.data_weight("main", "mean", 4) == 0.25
    with pytest.raises(ValueError, match="n_clients is required"):
        ex.data_weight("main", "mean")
    with pytest.raises(ValueError, match="normalization must be one of"):
        ex.data_weight("paper")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        ex.data_weight("main", "median")


def test_truncated_target_and_balanced_factors():
    p = underparameterized(d=7, n_clients=5, rank=3, seed=1)
    t = ex.truncated_target(p.Phi, 3)
    np.testing.assert_allclose(t.Phi_k, p.target, atol=1e-12)
    assert np.isclose(t.value, p.floor) and np.isclose(t.gap, p.gap)
    B, W = ex.balanced_factors(p.Phi, 3)
    assert W.shape == (5, 3)                                             # heads, client axis first
    np.testing.assert_allclose(B @ W.T, p.target, atol=1e-12)
    np.testing.assert_allclose(B.T @ B, W.T @ W, atol=1e-12)
    np.testing.assert_allclose(np.diag(B.T @ B), p.spectrum[:3], atol=1e-12)
    with pytest.raises(ValueError, match="k must be <= 5"):
        ex.truncated_target(p.Phi, 6)


@pytest.mark.parametrize("g1, g2", [(0.25, 0.125), (0.125, 0.125), (0.3, 0.125), (0.0, 0.2)])
@pytest.mark.parametrize("normalization", ["appendix", "main"])
def test_regularized_minimizer_is_stationary(g1, g2, normalization):
    # The closed form a/(a + 2g2 - g1) Phi_k with balanced factors zeroes the full population
    # gradient (data + penalty); exact arithmetic up to 1e-10.
    p = underparameterized(d=6, n_clients=5, rank=2, seed=2)
    Z = ex.regularized_minimizer(p.Phi, 2, gamma1=g1, gamma2=g2, normalization=normalization)
    a = ex.data_weight(normalization)
    np.testing.assert_allclose(Z, a / (a + 2 * g2 - g1) * p.target, atol=1e-12)
    B, W = ex.balanced_factors(Z, 2)
    gB, gW = ex.population_data_gradients(B, W, p.Phi, normalization=normalization)
    rB, rW = ex.regularizer_gradients(B, W, g1, g2)
    assert np.max(np.abs(gB + rB)) < 1e-10 and np.max(np.abs(gW + rW)) < 1e-10


def test_divergence_boundary_paper_vs_correct():
    assert ex.divergence_boundary(0.125, statement="paper") == 0.25
    assert ex.divergence_boundary(0.125) == 0.75                       # 2 g2 + 1/2
    assert ex.divergence_boundary(0.125, normalization="main") == 1.25  # 2 g2 + 1
    assert ex.divergence_boundary(0.125, normalization="main", aggregation="mean",
                                  n_clients=4) == 0.5
    assert ex.is_unbounded(0.8, 0.125) and not ex.is_unbounded(0.3, 0.125)
    p = underparameterized(d=5, n_clients=4, rank=2, seed=0)
    with pytest.raises(ValueError, match="unbounded below"):
        ex.regularized_minimizer(p.Phi, 2, gamma1=0.8, gamma2=0.125)
    with pytest.raises(ValueError, match="statement must be one of"):
        ex.divergence_boundary(0.125, statement="both")
    with pytest.raises(ValueError, match="gamma2 must be finite and >= 0"):
        ex.divergence_boundary(-1.0)


@pytest.mark.parametrize("d, M", [(6, 4), (4, 6), (5, 5)])
def test_theta_recursion_reproduces_population_step(d, M):
    # C14 (i): eq. (13) with R = 0 is an exact identity (padded case d != M included)
    p = underparameterized(d=d, n_clients=M, rank=2, seed=3)
    B, W = 0.3 * _rand((d, 2), 1), 0.3 * _rand((2, M), 2).T
    eta = 0.05
    gB, gW = ex.population_data_gradients(B, W, p.Phi)
    rB, rW = ex.regularizer_gradients(B, W)
    B1, W1 = B - eta * (gB + rB), W - eta * (gW + rW)
    T0 = ex.theta_embedding(B, W, p.Phi)
    T1 = ex.theta_step(T0, ex.lambda_tilde(p.Phi), eta)
    np.testing.assert_allclose(ex.theta_embedding(B1, W1, p.Phi), T1, atol=1e-12)
    assert T0.shape == (2 * max(d, M), 2)


def test_lemma_a18_and_region_quantities():
    p = underparameterized(d=6, n_clients=5, rank=2, seed=4)
    for s in range(5):
        B, W = _rand((6, 2), s), _rand((2, 5), s + 10).T
        T = ex.theta_embedding(B, W, p.Phi)
        lam = ex.lambda_tilde(p.Phi)
        target = np.zeros((T.shape[0],) * 2)
        target[:2, :2] = np.diag(lam[:2])
        # Lemma A.18: ||BW - Phi_k||_F <= ||Theta Theta^T - diag(Lambda~_k, 0)||_F
        assert np.linalg.norm(B @ W.T - p.target) <= np.linalg.norm(T @ T.T - target) + 1e-12
        q = ex.region_quantities(T, 2)
        assert np.isclose(q["sigma1"], np.linalg.norm(T, 2))
        assert np.isclose(q["sigmak_k"], np.linalg.svd(T[:2], compute_uv=False)[-1])
    B, W = ex.balanced_factors(p.Phi, 2)
    T = ex.theta_embedding(B, W, p.Phi)
    # at the balanced optimum Theta Theta^T = diag(Lambda~_k, 0): sigma_k^2(Theta_k) = 2 lambda_k
    q = ex.region_quantities(T, 2)
    assert np.isclose(q["sigmak_k"] ** 2, 2 * p.spectrum[1]) and q["sigma1_res"] < 1e-12


def test_entry_time_bound_formula():
    s = np.array([4.0, 3.0, 1.0])
    # lambda*_k = 6, Delta = 4, lambda*_k - Delta/2 = 4
    val = ex.entry_time_bound(s, 2, 0.1, 0.01)
    assert np.isclose(val, np.log(4 / (4 * 1e-4)) / (2 * np.log(1.2)))
    with pytest.raises(ValueError, match="sigmak0 must be finite and > 0"):
        ex.entry_time_bound(s, 2, 0.1, 0.0)
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        ex.entry_time_bound(s, 2, -0.1, 0.1)


def test_ols_truncated_svd_exact_for_noiseless_data():
    p = underparameterized(d=4, n_clients=5, rank=2, samples_per_client=12, seed=6)
    np.testing.assert_allclose(ex.ols_truncated_svd(p.X, p.y, 2), p.target, atol=1e-10)
    q = underparameterized(d=6, n_clients=5, rank=2, samples_per_client=4, seed=6)
    with pytest.raises(ValueError, match="N >= d"):
        ex.ols_truncated_svd(q.X, q.y, 2)


def test_altmin_erm_is_stationary_and_beats_random_rank_k():
    p = underparameterized(d=6, n_clients=8, rank=2, samples_per_client=10, noise=0.5, seed=7)
    res = ex.altmin_erm(p.X, p.y, 2, seed=0)
    assert res.status == "optimal" and np.isnan(res.gap)
    # first-order stationarity of (1/2N) sum ||X_i B w_i - y_i||^2 (the 1e-11 relative
    # Z-change stop of a linearly convergent sweep leaves gradients well below 1e-6)
    gB, gW = ex.data_gradients(res.B, res.W, p.X, p.y)
    assert np.max(np.abs(gB)) < 1e-6 and np.max(np.abs(gW)) < 1e-6
    f = ex.flute_objective(res.B, res.W, p.X, p.y, gamma1=0, gamma2=0)
    assert np.isclose(f, res.objective, rtol=1e-10)
    # the ERM is at least as good as the true target restricted to rank k
    Bt, Wt = ex.balanced_factors(p.Phi, 2)
    assert res.objective <= ex.flute_objective(Bt, Wt, p.X, p.y, gamma1=0, gamma2=0)


def test_altmin_erm_max_iter_warns_and_errors():
    p = underparameterized(d=6, n_clients=8, rank=2, samples_per_client=10, noise=0.5, seed=7)
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        r = ex.altmin_erm(p.X, p.y, 2, max_iter=1, restarts=1, seed=0)
    assert r.status == "max_iter"
    with pytest.raises(ValueError, match="k must be <= 5"):
        ex.altmin_erm(p.X, p.y, 6)
    with pytest.raises(ValueError, match="y must have shape"):
        ex.altmin_erm(p.X, p.y[:, :3], 2)


@pytest.mark.parametrize("call, match", [
    (lambda B, W: ex.regularizer(B, W.T, 0.1, 0.1), "W must have shape"),
    (lambda B, W: ex.population_data_gradients(B, W, np.zeros((4, 3))), "B must have shape"),
    (lambda B, W: ex.data_gradients(B, W, np.zeros((2, 3, 5)), np.zeros((2, 3))), "X must have shape"),
    (lambda B, W: ex.theta_embedding(B, W, np.zeros((5,))), "Phi must have 2 dimensions"),
    (lambda B, W: ex.theta_step(np.zeros((4, 2)), np.zeros(3), 0.1), "lam_tilde must have shape"),
    (lambda B, W: ex.region_quantities(np.zeros((4, 2)), 3), "k must be <= 2"),
])
def test_shape_errors(call, match):
    B, W = np.ones((5, 2)), np.ones((3, 2))                              # heads (M, k)
    with pytest.raises(ValueError, match=match):
        call(B, W)


def test_nuclear_relaxation_estimate_recovers_subspace_and_agrees_with_cvxpy():
    # noiseless, N >> d: the relaxation's rank-k truncation is close to Phi_k's subspace
    p = underparameterized(d=5, n_clients=6, rank=2, spectrum=[4.0, 3.0, 0.3], samples_per_client=60, seed=9)
    Zp, rp = ex.nuclear_relaxation_estimate(p.X, p.y, 2, 0.05)
    Zc, rc = ex.nuclear_relaxation_estimate(p.X, p.y, 2, 0.05, method="cvxpy")
    assert rp.status == "optimal" and rc.status == "optimal"
    # both solve the same convex program: agreement to the solvers' accuracy (1e-5 relative)
    assert np.linalg.norm(Zp - Zc) / np.linalg.norm(Zc) < 1e-5
    from lowrank_fl.linalg import subspace_distance
    assert subspace_distance(p.U_k, np.linalg.svd(Zp)[0][:, :2]) < 0.1
    assert Zp.shape == (5, 6)
    with pytest.raises(ValueError, match="method must be one of"):
        ex.nuclear_relaxation_estimate(p.X, p.y, 2, 0.05, method="admm")
    with pytest.warns(DeprecationWarning, match="use 'method'"):
        old = ex.nuclear_relaxation_estimate(p.X, p.y, 2, 0.05, solver="prox")
    np.testing.assert_array_equal(old.Z_k, Zp)


def test_theta_step_and_altmin_erm_validation():
    p = underparameterized(d=4, n_clients=3, rank=2, samples_per_client=1, seed=0)
    with pytest.raises(ValueError, match="X must have N >= k samples per client"):
        ex.altmin_erm(p.X, p.y, 2)
    T = np.ones((8, 2))
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        ex.theta_step(T, np.ones(8), 0.0)
    with pytest.raises(ValueError, match=r"lam_tilde must have shape \(8\)"):
        ex.theta_step(T, np.ones(7), 0.1)


def test_embed_factors_equals_theta_embedding():
    p = underparameterized(d=5, n_clients=7, rank=2, seed=2)
    rng = np.random.default_rng(0)
    B, W = rng.standard_normal((5, 2)), rng.standard_normal((2, 7)).T
    U, _, V = ex.padded_svd(p.Phi)
    np.testing.assert_array_equal(ex.embed_factors(B, W, U, V), ex.theta_embedding(B, W, p.Phi))
