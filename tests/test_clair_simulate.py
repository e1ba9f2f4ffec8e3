"""Tests of the CLAIR instance generators (§7 simulation and the general model (3)–(4))."""
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lowrank_fl.clair.simulate import ClairInstance, ar1_covariance, generate, simulate
from lowrank_fl.linalg import block_norms


# ----------------------------------------------------------------------------------------------
# §7 simulation
def test_sec7_local_ols_error_matches_theory():
    # E||What - W||_F^2 = tr(Sigma) E tr((X X^T)^{-1}) = q p / (n - p - 1) (inverse Wishart mean;
    # tr Sigma = q for the unit-diagonal AR(1) covariance). Monte Carlo over 4 x 50 clients:
    # tolerance = 4 sample standard errors of the mean (false alarm ~ 1e-4 under the CLT; the
    # seeds are fixed, so the outcome is deterministic).
    p, q, n, K = 5, 5, 20, 50
    errs = np.concatenate([
        np.einsum("kij,kij->k", inst.errors, inst.errors)
        for inst in (simulate(p=p, q=q, n_clients=K, samples_per_client=n, seed=s) for s in range(4))])
    expected = q * p / (n - p - 1)
    se = errs.std(ddof=1) / np.sqrt(errs.size)
    assert abs(errs.mean() - expected) < 4 * se
    assert simulate(p=p, q=q, n_clients=K, samples_per_client=n, seed=0).params["expected_local_error"] == pytest.approx(expected)


@pytest.mark.parametrize("variant, half_width", [("unit-variance", np.sqrt(3.0)), ("uniform", 1.0)])
def test_sec7_contamination_variance(variant, half_width):
    p, q, r, K = 20, 20, 2, 20
    inst = simulate(p=p, q=q, n_clients=K, samples_per_client=30, rank=r, variant=variant, seed=7)
    c = inst.params["c"]
    assert c in (3.0, 4.0, 5.0, 6.0)
    Z = inst.Delta[~inst.benign] * np.sqrt(q * (p - r)) / c      # the raw entries
    var = half_width ** 2 / 3                                    # 1 or 1/3
    # Unif[-a, a]: Var(Z^2) = 4 a^4 / 45; 5 standard errors of the mean of Z^2.
    se = np.sqrt(4 * half_width ** 4 / 45 / Z.size)
    assert abs(np.mean(Z ** 2) - var) < 5 * se
    assert np.abs(Z).max() <= half_width + 1e-12                 # the support tells them apart
    assert np.abs(Z).max() > 0.95 * half_width


def test_sec7_structure():
    p, q, r, K = 10, 8, 2, 10
    inst = simulate(p=p, q=q, n_clients=K, samples_per_client=40, rank=r, seed=3)
    assert isinstance(inst, ClairInstance) and inst.design == "sec7"
    assert inst.W_hat.shape == inst.W.shape == (K, q, p)
    assert inst.benign.sum() == K - round(0.4 * K)
    # benign: W = W0 + 0.8 B A with B entrywise Unif[-1, 1]  (stored B = 0.8 B^(k))
    b = inst.benign
    assert np.allclose(inst.W[b], inst.W0 + inst.B[b] @ inst.A, atol=1e-12)
    assert np.abs(inst.B).max() <= 0.8 and np.abs(inst.A).max() <= 1.0
    assert np.all(inst.B[~b] == 0)
    # A is not orthonormal; the projector is A^T (A A^T)^{-1} A
    A = inst.A
    assert not np.allclose(A @ A.T, np.eye(r))
    assert np.allclose(inst.projector, A.T @ np.linalg.solve(A @ A.T, A), atol=1e-12)
    # noise covariance: AR(1), correlation 0.25, unit diagonal
    Sig = inst.params["noise_covariance"]
    assert np.allclose(np.diag(Sig), 1.0) and Sig[0, 1] == pytest.approx(0.25)
    assert Sig[0, 2] == pytest.approx(0.0625)


def test_sec7_contamination_factor_and_fixed_c():
    a = simulate(p=10, q=10, n_clients=10, samples_per_client=30, seed=5, c=4.0)
    b = simulate(p=10, q=10, n_clients=10, samples_per_client=30, seed=5, c=4.0, contamination_factor=0.8)
    assert a.params["c"] == 4.0
    bad = ~a.benign
    assert np.allclose(b.Delta[bad], 0.8 * a.Delta[bad], atol=1e-14)
    assert np.allclose(b.Delta[~bad], a.Delta[~bad], atol=1e-14)
    # no signal at all: said, and the contaminated clients are W0 exactly (Delta = 0)
    for kw in (dict(c=0.0), dict(c=4.0, contamination_factor=0.0)):
        with pytest.warns(UserWarning, match=r"the 4 contaminated client\(s\) get no perturbation"):
            z = simulate(p=10, q=10, n_clients=10, samples_per_client=30, seed=5, **kw)
        assert np.array_equal(z.Delta[~z.benign], np.zeros_like(z.Delta[~z.benign]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # nobody contaminated: nothing to warn about
        simulate(p=10, q=10, n_clients=10, samples_per_client=30, seed=5, c=0.0, contaminated=0)


def test_ar1_covariance():
    S = ar1_covariance(4, 0.5)
    assert np.allclose(S, 0.5 ** np.abs(np.subtract.outer(np.arange(4), np.arange(4))))


# ----------------------------------------------------------------------------------------------
# determinism
@pytest.mark.parametrize("make", [
    lambda seed: simulate(p=6, q=5, n_clients=6, samples_per_client=20, seed=seed),
    lambda seed: generate(n_clients=6, p=5, q=4, rank=2, contaminated=2, delta=0.2, noise=0.1, seed=seed),
])
def test_same_seed_same_numbers(make):
    a, b, c = make(11), make(11), make(12)
    for name in ("W_hat", "W", "W0", "A", "B", "A_clients", "benign"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.W_hat, c.W_hat)
    g1 = make(np.random.default_rng(3))
    g2 = make(np.random.default_rng(3))
    assert np.array_equal(g1.W_hat, g2.W_hat)


def test_instance_arrays_are_read_only():
    inst = generate(n_clients=4, p=5, q=4, rank=1, seed=0)
    with pytest.raises(ValueError):
        inst.W_hat[0, 0, 0] = 1.0


# ----------------------------------------------------------------------------------------------
# general generator
def test_noiseless_option_and_canonical_components():
    K, p, q, r = 7, 6, 4, 2
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=2, seed=4)
    assert np.array_equal(inst.W_hat, inst.W)                      # noise=0: What = W
    assert np.abs(inst.errors).max() == 0
    assert np.allclose(inst.A @ inst.A.T, np.eye(r), atol=1e-12)    # orthonormal rows
    assert np.allclose(inst.D0, inst.D, atol=1e-12)                 # delta = 0: D = D0
    assert np.allclose(inst.D_hat, inst.D, atol=1e-12)
    G = K * (K - 1) // 2
    assert inst.G == G and inst.pairs.shape == (G, 2)
    assert inst.s == G - (K - 2) * (K - 3) // 2                     # s = G - C(|C|, 2)
    L0 = inst.L0.reshape(G, q, p)
    S0 = inst.S0.reshape(G, q, p)
    assert np.all(L0[inst.I] == 0) and np.all(S0[~inst.I] == 0)     # (11), (14)
    assert np.allclose(inst.L0 @ inst.projector, inst.L0, atol=1e-12)   # (13)
    assert np.linalg.matrix_rank(inst.L0, tol=1e-9) == r              # (12)
    LA, Sp = inst.canonical()
    assert np.allclose(LA + Sp, inst.D0, atol=1e-12)
    sp = block_norms(Sp.reshape(G, q, p))
    assert sp[~inst.I].max() < 1e-12                                  # zero on benign pairs
    assert inst.beta_min > 0.1
    j, k = inst.pairs.T
    mixed = inst.benign[j] != inst.benign[k]
    assert inst.beta_min == pytest.approx(sp[mixed].min())


@settings(max_examples=25, deadline=None)
@given(frac=st.floats(0.0, 1.0), r=st.integers(1, 3), extra=st.integers(1, 4),
       seed=st.integers(0, 2 ** 16))
@example(frac=1e-9, r=1, extra=1, seed=0)      # tiny delta: no cancellation in 1 - cos(theta)
@example(frac=1.0, r=3, extra=1, seed=0)       # largest delta, p - r < r
def test_misalignment_bound_eq4(frac, r, extra, seed):
    p = r + extra
    delta = frac * np.sqrt(2 * min(r, p - r))
    inst = generate(n_clients=6, p=p, q=r + 1, rank=r, contaminated=1, delta=delta, seed=seed)
    b = inst.benign
    Ak = inst.A_clients[b]
    assert np.allclose(Ak @ np.swapaxes(Ak, 1, 2), np.eye(r), atol=1e-10)   # orthonormal rows
    dist = np.sqrt(np.einsum("kij,kij->k", Ak - inst.A, Ak - inst.A))
    assert np.all(dist <= delta + 1e-10)                                     # (4)
    assert inst.delta == pytest.approx(delta, abs=1e-10)
    # (4) is stated after the best rotation: Procrustes min_O ||O^T A^(k) - A||_F <= delta too
    U, _, Vt = np.linalg.svd(Ak @ inst.A.T)
    O = U @ Vt
    rot = np.sqrt(np.einsum("kij,kij->k", np.swapaxes(O, 1, 2) @ Ak - inst.A,
                            np.swapaxes(O, 1, 2) @ Ak - inst.A))
    assert np.all(rot <= delta + 1e-10)
    # D = L0 + S0 + E0 and E0 vanishes on I (eq. (16) without estimation error)
    G, q = inst.G, inst.q
    assert np.allclose(inst.L0 + inst.S0 + inst.E0, inst.D, atol=1e-12)
    assert np.all(inst.E0.reshape(G, q, p)[inst.I] == 0)


def test_per_client_noise_levels():
    K, p, q = 5, 30, 30
    tau = np.array([0.0, 0.1, 0.2, 0.5, 1.0])
    inst = generate(n_clients=K, p=p, q=q, rank=2, contaminated=1, noise=tau, seed=2)
    assert np.all(inst.errors[0] == 0)
    sd = inst.errors.reshape(K, -1).std(axis=1)
    # 900 entries per client: the sample sd has relative s.e. ~ 1/sqrt(2*900) ~ 2.4%; allow 10%.
    assert np.allclose(sd[1:], tau[1:], rtol=0.1)
    assert np.array_equal(inst.params["noise"], tau)


def test_contamination_scale():
    inst = generate(n_clients=10, p=20, q=20, rank=2, contaminated=5, contamination_scale=3.0, seed=1)
    Z = inst.Delta[~inst.benign]
    # 2000 N(0, 9) entries: sample sd within 10% (relative s.e. ~1.6%).
    assert Z.std() == pytest.approx(3.0, rel=0.1)
    assert (~inst.benign).sum() == 5


# ----------------------------------------------------------------------------------------------
# errors
_SIM = dict(p=4, q=4, n_clients=5, samples_per_client=20)
_GEN = dict(n_clients=5, p=4, q=3, rank=1)


@pytest.mark.parametrize("kwargs, exc, match", [
    (_SIM | dict(rank=4), ValueError, "rank must satisfy"),
    (_SIM | dict(n_clients=1), ValueError, "n_clients must be >= 2"),
    (_SIM | dict(samples_per_client=5), ValueError, "samples_per_client must be >= 6"),
    (_SIM | dict(contaminated=0.4), TypeError, r"contaminated is a count of clients, got 0.4; "
                                               r"for a fraction f pass round\(f \* n_clients\) "
                                               r"\(here 2\)"),
    (_SIM | dict(contaminated=4), ValueError, "contaminated must be <= n_clients - 2 = 3"),
    (_SIM | dict(contaminated=-1), ValueError, "contaminated must be >= 0"),
    (dict(p=4, q=4, n_clients=2, samples_per_client=20), ValueError,
     "default 40 % contamination gives 1 contaminated clients"),
    (_SIM | dict(variant="normal"), ValueError, "variant must be one of"),
    (_SIM | dict(correlation=1.0), ValueError, "correlation must lie in"),
    (_SIM | dict(c=-1.0), ValueError, "c must be finite"),
    (_SIM | dict(p=4.5), TypeError, "p must be an integer"),
    (dict(p=4, q=4, samples_per_client=20), TypeError, "missing required keyword argument: 'n_clients'"),
    (_SIM | dict(K=5), TypeError, "pass n_clients only"),
])
def test_simulate_errors(kwargs, exc, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(exc, match=match):
            simulate(**kwargs)


@pytest.mark.parametrize("kwargs, exc, match", [
    (_GEN | dict(rank=3), ValueError, "rank must satisfy"),
    (_GEN | dict(rank=0), ValueError, "rank must be >= 1"),
    (_GEN | dict(n_clients=1), ValueError, "n_clients must be >= 2"),
    (_GEN | dict(contaminated=4), ValueError, "contaminated must be <= n_clients - 2"),
    (_GEN | dict(contaminated=-1), ValueError, "contaminated must be >= 0"),
    (_GEN | dict(contaminated=0.2), TypeError, "contaminated is a count of clients"),
    (_GEN | dict(delta=2.0), ValueError, "delta must be <="),
    (_GEN | dict(delta=-0.1), ValueError, "delta must be finite and >= 0"),
    (_GEN | dict(noise=[0.1, 0.2]), ValueError, r"noise must be a scalar or have shape \(5,\)"),
    (_GEN | dict(noise=-0.1), ValueError, "noise must be >= 0"),
    (_GEN | dict(noise=np.nan), ValueError, "noise must be finite"),
    (_GEN | dict(contamination_scale=0.0), ValueError, "contamination_scale must be"),
    (_GEN | dict(seed=-3), ValueError, "seed must be a non-negative"),
])
def test_generate_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        generate(**kwargs)


def test_sizes_are_keyword_only_and_old_names_warn():
    with pytest.raises(TypeError):
        simulate(10, 10, 10, 30)                                  # noqa: the old positional form
    with pytest.raises(TypeError):
        generate(6, 5, 4, 2)
    new = simulate(p=6, q=5, n_clients=6, samples_per_client=20, rank=2, seed=1)
    with pytest.warns(DeprecationWarning, match="use n_clients="):
        old = simulate(p=6, q=5, K=6, samples_per_client=20, rank=2, seed=1)
    np.testing.assert_array_equal(old.W_hat, new.W_hat)
    with pytest.warns(DeprecationWarning, match="use samples_per_client="):
        simulate(p=6, q=5, n_clients=6, n=20, seed=1)
    with pytest.warns(DeprecationWarning, match="use rank="):
        g = generate(n_clients=5, p=4, q=3, r=1, seed=0)
    np.testing.assert_array_equal(g.W_hat, generate(n_clients=5, p=4, q=3, rank=1, seed=0).W_hat)
    # the default is the paper's 40 %, as a count; an explicit count gives the same instance
    assert (~new.benign).sum() == round(0.4 * 6) == new.params["n_contaminated"]
    same = simulate(p=6, q=5, n_clients=6, samples_per_client=20, rank=2, contaminated=2, seed=1)
    np.testing.assert_array_equal(same.W_hat, new.W_hat)
    assert simulate(p=6, q=5, n_clients=6, samples_per_client=20, contaminated=0,
                    seed=1).benign.all()


def test_instance_shapes_must_agree():
    import dataclasses

    from lowrank_fl.clair.contrasts import contaminated_pairs

    inst = generate(n_clients=5, p=4, q=3, rank=2, contaminated=1, seed=0)
    with pytest.raises(ValueError, match=r"ClairInstance: B must have shape \(5, 3, 2\)"):
        dataclasses.replace(inst, B=inst.B[:, :, :1])
    with pytest.raises(ValueError, match=r"ClairInstance: benign must have shape \(5,\)"):
        ClairInstance(W_hat=inst.W_hat, W=inst.W, W0=inst.W0, A=inst.A, B=inst.B,
                      A_clients=inst.A_clients, benign=inst.benign[:4], rank=2)
    assert dataclasses.replace(inst).K == 5
    # contaminated pairs come from the library's own helper (one definition)
    np.testing.assert_array_equal(inst.contaminated_pairs, contaminated_pairs(inst.benign))
    np.testing.assert_allclose(ar1_covariance(3, 0.5)[0], [1.0, 0.5, 0.25])
