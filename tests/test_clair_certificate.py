"""Prop. S1 certificate, Lemma S3, Lemmas S7/S8, Block-IC and the Theorem 1 window (25)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowrank_fl.clair.certificate import (block_incoherence, block_leverages, build_certificate,
                                          lemma_s3_residual, rho_prime, theorem1_window,
                                          theorem1_x)
from lowrank_fl.clair.contrasts import contaminated_pairs, contrasts
from lowrank_fl.clair.oracle import solve_oracle_smooth
from lowrank_fl.clair.simulate import generate


def _noiseless(K, p, q, r, contaminated, seed):
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=contaminated, seed=seed)
    D0 = contrasts(inst.W)
    I = contaminated_pairs(inst.benign)
    L0 = D0.copy()
    L0.reshape(I.size, q, p)[I] = 0.0             # L0 vanishes on I; equals D0 off I (eq. (11))
    return inst, D0, I, L0


@pytest.fixture(scope="module")
def oracle_case():
    inst, D0, I, L0 = _noiseless(10, 5, 3, 2, 2, seed=4)
    s = int(I.sum())
    lam_L, lam_S = 1.0, 0.8 / np.sqrt(s)
    o = solve_oracle_smooth(D0, 3, inst.A, I, lam_L, lam_S)
    return inst, D0, I, L0, o, lam_L, lam_S


def test_certificate_identities(oracle_case):
    inst, D0, I, L0, o, lam_L, lam_S = oracle_case
    q, r, s = 3, 2, int(I.sum())
    c = build_certificate(o.L, o.S, I, q, r, lam_L, lam_S)
    # P_T(Q) = lam_L U'V'^T holds by construction: rounding only
    assert c.tangent_residual < 1e-10
    # P_I(Q) = lam_S P_I(H) holds up to the Lemma S3 residual, i.e. the accuracy of the smooth
    # oracle solve (the smooth reduced form reaches 1e-8 to 1e-10)
    s3 = lemma_s3_residual(o.L, o.S, I, q, r, lam_L, lam_S)
    # Lemma S3 by hand: lam_L P_I U'V'^T against lam_S P_I(H P_V') with H = S_g/||S_g|| on I
    U, _, Vt = np.linalg.svd(o.L, full_matrices=False)
    U, V = U[:, :r], Vt[:r].T
    rows = np.repeat(I, q)
    H = _sign_matrix(o.S, I, q)
    lhs, rhs = lam_L * U[rows] @ V.T, lam_S * H[rows] @ V @ V.T
    by_hand = np.linalg.norm(lhs - rhs) / max(np.linalg.norm(lhs), np.linalg.norm(rhs))
    # both evaluate the same expression in a different order: rounding-level agreement
    assert s3 == pytest.approx(by_hand, rel=1e-6, abs=1e-14)
    assert s3 < 1e-6 and c.lemma_s3_residual == pytest.approx(by_hand, rel=1e-6, abs=1e-14)
    assert c.support_residual < 1e-6
    # Lemma S8: rho' < 1; Lemma S7: rho' <= (lam_S/lam_L) sqrt(s)
    assert 0 <= c.rho_prime < 1
    assert c.rho_prime <= lam_S / lam_L * np.sqrt(s) + 1e-12
    U = np.linalg.svd(o.L, full_matrices=False)[0][:, :r]
    assert rho_prime(U, I, q) == pytest.approx(c.rho_prime, rel=1e-10)
    # a perturbed (non-optimal) point breaks Lemma S3
    S_bad = o.S * (1 + 0.1 * np.random.default_rng(0).standard_normal(o.S.shape))
    assert lemma_s3_residual(o.L, S_bad, I, q, r, lam_L, lam_S) > 1e-3


def _sign_matrix(S, I, q):
    """H of S1.1: S_g / ||S_g||_F on the contaminated blocks (all live here), 0 elsewhere."""
    Sb = S.reshape(I.size, q, -1)
    H = np.zeros_like(Sb)
    nrm = np.linalg.norm(Sb.reshape(I.size, -1), axis=1)
    H[I] = Sb[I] / nrm[I, None, None]
    return H.reshape(S.shape)


def test_woodbury_matches_dense_inverse(oracle_case):
    """Z = (I - P_I P_U' P_I)^{-1} R (S1.4): the Woodbury construction equals a dense solve
    (a (Gq x Gq) matrix is fine at this test size, never in the library)."""
    inst, D0, I, L0, o, lam_L, lam_S = oracle_case
    q, r = 3, 2
    c = build_certificate(o.L, o.S, I, q, r, lam_L, lam_S)
    U, _, Vt = np.linalg.svd(o.L, full_matrices=False)
    U, V = U[:, :r], Vt[:r].T
    n = o.L.shape[0]
    PI = np.diag(np.repeat(I, q).astype(float))
    PU = U @ U.T
    H = _sign_matrix(o.S, I, q)
    Rm = lam_S * PI @ (H - H @ V @ V.T)
    Z = np.linalg.solve(np.eye(n) - PI @ PU @ PI, Rm)
    Qd = lam_L * U @ V.T + (np.eye(n) - PU) @ Z
    np.testing.assert_allclose(c.Q, Qd, atol=1e-10)


def test_prop_s1_certificate_inside_window():
    """Prop. S1: where window (25) is non-empty (one contaminated client, K = 240, r = 1;
    measured), the certificate at a ratio inside it has a_hat < a and b_hat < b."""
    a = b = 0.99
    found = False
    for seed in range(12):
        inst, D0, I, L0 = _noiseless(240, 4, 3, 1, 1, seed=seed)
        G, s = I.size, int(I.sum())
        mu = block_incoherence(L0, 3, 1)
        win = theorem1_window(mu, 1, s, G, a, b)
        if win is None:
            continue
        found = True
        ratio = np.sqrt(win[0] * win[1])
        o = solve_oracle_smooth(D0, 3, inst.A, I, 1.0, ratio)
        c = build_certificate(o.L, o.S, I, 3, 1, 1.0, ratio)
        assert c.a_hat < a and c.b_hat < b
        assert c.valid(a, b)
        break
    assert found, "no instance with a non-empty Theorem 1 window among 12 seeds"


def test_block_incoherence_lower_bound():
    """mu >= G/(G - s) for the model-induced L0 (Block-IC of the model-induced L0); leverages sum to r."""
    for seed in range(3):
        inst, D0, I, L0 = _noiseless(9, 5, 3, 2, 2, seed=seed)
        G, s = I.size, int(I.sum())
        lev = block_leverages(L0, 3, 2)
        assert lev.sum() == pytest.approx(2.0, rel=1e-12)
        assert np.all(lev[I] < 1e-20)                 # rows of U vanish on I: rho = 0 (flag 1)
        assert block_incoherence(L0, 3, 2) >= G / (G - s) - 1e-12


def test_theorem1_window_numbers():
    """(25) at mu = r = s = 1, G = 100, a = b = 1/2: x = 0.1 < ab/(1+a)^2 = 1/9, window
    (0.1/0.35, 0.5/1.5) = (2/7, 1/3); at G = 64, x = 0.125 > 1/9: empty."""
    low, high = theorem1_window(1.0, 1, 1, 100, 0.5, 0.5)
    assert low == pytest.approx(2 / 7, rel=1e-12) and high == pytest.approx(1 / 3, rel=1e-12)
    assert theorem1_window(1.0, 1, 1, 64, 0.5, 0.5) is None
    assert theorem1_window(1.0, 1, 0, 64, 0.5, 0.5) == (pytest.approx(0.25), np.inf)


def test_certificate_needs_rho_prime_below_one(oracle_case):
    """(S1.4) needs I - P_I P_U' P_I invertible: when the contaminated rows carry all of U
    (rho' = 1) build_certificate refuses instead of solving a singular system."""
    inst, D0, I, L0, o, lam_L, lam_S = oracle_case
    q, r = 3, 2
    L = o.L.copy()
    L.reshape(I.size, q, -1)[~I] = 0.0                  # U lives on I rows only: U_I^T U_I = I
    with pytest.raises(ValueError, match="rho' = .* must be < 1"):
        build_certificate(L, o.S, I, q, r, lam_L, lam_S)


def test_zero_block_threshold_is_scale_free(oracle_case):
    """Rescaling (L', S') by c (the oracle is homogeneous) changes no residual: thresholds are
    relative to the data, not floored at 1."""
    inst, D0, I, L0, o, lam_L, lam_S = oracle_case
    ref = build_certificate(o.L, o.S, I, 3, 2, lam_L, lam_S)
    for c in (1e-12, 1e4):                 # 1e-12: every block fell below a floor of 1
        sc = build_certificate(c * o.L, c * o.S, I, 3, 2, lam_L, lam_S)
        assert sc.a_hat == pytest.approx(ref.a_hat, rel=1e-8)
        assert sc.b_hat == pytest.approx(ref.b_hat, rel=1e-8)
        assert sc.sign_ok == ref.sign_ok
        assert lemma_s3_residual(c * o.L, c * o.S, I, 3, 2, lam_L, lam_S) == pytest.approx(
            ref.lemma_s3_residual, rel=1e-6, abs=1e-14)


@settings(max_examples=60, deadline=None)
@given(mu=st.floats(1.0, 20.0), r=st.integers(1, 4), G=st.integers(2, 50000),
       frac=st.floats(0.0, 1.0), a=st.floats(0.01, 0.99), b=st.floats(0.01, 0.99))
def test_theorem1_window_property(mu, r, G, frac, a, b):
    s = int(frac * G)
    x = np.sqrt(mu * r * s / G)
    win = theorem1_window(mu, r, s, G, a, b)
    if x < a * b / (1 + a) ** 2 * (1 - 1e-9):
        assert win is not None
        low, high = win
        assert 0 < low < high
        assert low == pytest.approx(np.sqrt(mu * r / G) / (b - (1 + a) * x))
        if s:
            assert high == pytest.approx(a / ((1 + a) * np.sqrt(s)))
        else:
            assert high == np.inf
    elif x > a * b / (1 + a) ** 2 * (1 + 1e-9):
        assert win is None
    # ab/(1+a)^2 < 1/4: a non-empty window needs mu r s / G < 1/16
    if win is not None:
        assert mu * r * s / G < 1 / 16


def test_certificate_errors(oracle_case):
    inst, D0, I, L0, o, lam_L, lam_S = oracle_case
    with pytest.raises(ValueError, match=r"I_mask must be a boolean array of shape \(45,\)"):
        build_certificate(o.L, o.S, I[:-1], 3, 2, lam_L, lam_S)
    with pytest.raises(ValueError, match="L must have rank >= r=2"):
        build_certificate(np.zeros_like(o.L), o.S, I, 3, 2, lam_L, lam_S)
    with pytest.raises(ValueError, match="S must have shape"):
        build_certificate(o.L, o.S[:3], I, 3, 2, lam_L, lam_S)
    with pytest.raises(ValueError, match="multiple of q=4"):
        lemma_s3_residual(o.L, o.S, I, 4, 2, lam_L, lam_S)
    with pytest.raises(ValueError, match="lam_S must be finite and > 0"):
        build_certificate(o.L, o.S, I, 3, 2, lam_L, 0.0)
    with pytest.raises(ValueError, match=r"a must lie in \(0.0, 1.0\)"):
        theorem1_window(2.0, 1, 3, 10, 1.0, 0.5)
    with pytest.raises(ValueError, match="s must be <= 10"):
        theorem1_window(2.0, 1, 11, 10, 0.5, 0.5)
    with pytest.raises(ValueError, match="mu must be finite and > 0"):
        theorem1_x(0.0, 1, 1, 10)
    with pytest.raises(ValueError, match="r must be <= "):
        block_incoherence(L0, 3, 10)
    with pytest.raises(ValueError, match="zero_tol must be finite and > 0"):
        lemma_s3_residual(o.L, o.S, I, 3, 2, lam_L, lam_S, zero_tol=-1.0)
    with pytest.raises(ValueError, match="zero_tol must be finite and > 0"):
        build_certificate(o.L, o.S, I, 3, 2, lam_L, lam_S, zero_tol=float("nan"))
