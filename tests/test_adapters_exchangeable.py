"""The exchangeability of the collaborating clients (the pair pattern across modules) and the
``refine="exchangeable"`` refinement, pinned against independent computations on explicit update
vectors (numpy least squares, ``np.corrcoef``, a dense refinement)."""
import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.exchangeable import (MIN_CLIENTS, ALPHA, exchangeability, pair_residuals,
                                              pattern_statistic)
from lowrank_fl.adapters.noharm import EXCHANGEABLE_WEIGHT, refine_weights


def _grams(U):
    """Per-module Grams (M, K, K) of explicit update vectors U (M, K, D)."""
    return np.einsum("mkd,mjd->mkj", U, U)


def _exchangeable(rng, M=6, K=10, D=80, shared=0.6):
    """Noise around one shared direction that clients carry in different amounts (uneven training):
    exchangeable — who resembles whom is chance in every module."""
    t = rng.standard_normal(D)
    amount = rng.uniform(0.3, 3.0, K)                           # the same client amount in every module
    return shared * amount[None, :, None] * t + rng.standard_normal((M, K, D))


def _structured(rng, M=6, K=10, D=80, groups=3, strength=0.8):
    """Clients in groups, each group a task of its own in every module: a pair pattern that repeats."""
    g = np.arange(K) % groups
    U = np.empty((M, K, D))
    for m in range(M):
        tasks = rng.standard_normal((groups, D))
        U[m] = strength * tasks[g] + rng.standard_normal((K, D))
    return U


def _reference_residuals(U):
    """The same residuals from first principles: cosines of the explicit vectors, scipy's least
    squares for the one-factor fit over the pairs (started at the library's solution: the fit is
    non-convex, the test is that the library stops at a stationary point scipy cannot improve), the
    standardisation by the unshared fractions."""
    from scipy.optimize import least_squares

    from lowrank_fl.adapters.exchangeable import _one_factor

    M, K, _ = U.shape
    j, k = np.triu_indices(K, 1)
    out = []
    n = np.linalg.norm(U, axis=2)
    C = np.einsum("mkd,mjd->mkj", U, U) / (n[:, :, None] * n[:, None, :])
    start = _one_factor(C)
    for m in range(M):
        c = C[m][j, k]
        fit = least_squares(lambda v: c - v[j] * v[k], start[m], xtol=1e-15, ftol=1e-15, gtol=1e-15)
        v = fit.x
        q = np.sqrt(1 - v ** 2)
        out.append((c - v[j] * v[k]) / (q[j] * q[k]))
    return np.array(out)


def test_pair_residuals_and_statistic_match_an_explicit_computation():
    rng = np.random.default_rng(0)
    U = _exchangeable(rng, M=4, K=7, D=40, shared=1.0)
    E = pair_residuals(_grams(U))
    np.testing.assert_allclose(E, _reference_residuals(U), atol=1e-7)
    Un = E / np.linalg.norm(E, axis=1, keepdims=True)
    want = (Un @ Un.T)[~np.eye(4, dtype=bool)].mean()
    assert pattern_statistic(E) == pytest.approx(want, abs=1e-12)
    # members: the same as the sub-federation's own computation
    keep = np.array([True, True, False, True, True, True, False])
    np.testing.assert_allclose(pair_residuals(_grams(U), keep), pair_residuals(_grams(U[:, keep])), atol=1e-12)


def test_one_factor_fit_removes_an_exact_product_pattern():
    """Cosines that are exactly v_j v_k off the diagonal leave residuals 0."""
    from lowrank_fl.adapters.exchangeable import _one_factor

    v = np.array([[0.2, 0.5, -0.3, 0.7, 0.1, 0.4]])
    C = v[:, :, None] * v[:, None, :]
    np.testing.assert_allclose(np.abs(_one_factor(C)), np.abs(v), atol=1e-8)


def test_client_amounts_of_a_shared_direction_are_not_a_pattern():
    """Clients carrying a shared direction in amounts from 0.3 to 3 (the same in every module) give
    cosines rho_j rho_k in every module; the one-factor fit takes that out: T stays at chance."""
    rng = np.random.default_rng(1)
    Ts = [exchangeability(_grams(_exchangeable(rng, shared=1.0))).statistic for _ in range(40)]
    assert abs(np.mean(Ts)) < 0.03 and np.max(Ts) < 0.2            # one T's sd is about 0.05 here


def test_permutation_p_value_is_calibrated_under_exchangeability():
    """Under exchangeability the permutation p-value is (about) uniform: over 200 federations the
    share below 0.05 lies within binomial limits (5 %: 99.9 % interval 1-11 %), below 0.5 near a
    half (binomial 99.9 %: 38-62 %); with the additive fit alone it was 20-45 % below 0.05 here."""
    rng = np.random.default_rng(2)
    for kw in ({"M": 5, "K": 8, "D": 60, "shared": 1.0}, {"M": 4, "K": 10, "D": 30, "shared": 0.3}):
        ps = np.array([exchangeability(_grams(_exchangeable(rng, **kw)), seed=i).p_value for i in range(200)])
        assert 2 <= np.sum(ps < 0.05) <= 22
        assert 76 <= np.sum(ps < 0.5) <= 124
        assert ps.min() >= 1 / 1000 and ps.max() <= 1


def test_repeated_pair_pattern_is_called_structured():
    rng = np.random.default_rng(3)
    for _ in range(5):
        ex = exchangeability(_grams(_structured(rng)))
        assert not ex.exchangeable and ex.p_value == pytest.approx(1 / 1000) and ex.statistic > 0.3
        assert "same clients resemble each other" in ex.reason
    # exchangeable federations are called structured at rate ALPHA: at most 2 of 20 (binomial 99.9 %)
    calls = [exchangeability(_grams(_exchangeable(rng)), seed=i) for i in range(20)]
    assert sum(not ex.exchangeable for ex in calls) <= 2
    assert all((ex.p_value >= ALPHA) == ex.exchangeable for ex in calls)
    assert all("look like noise" in ex.reason for ex in calls if ex.exchangeable)


def test_undecided_below_five_clients_or_two_modules():
    rng = np.random.default_rng(4)
    U = _exchangeable(rng, M=3, K=MIN_CLIENTS)
    assert exchangeability(_grams(U)).exchangeable
    few = exchangeability(_grams(U[:, :MIN_CLIENTS - 1]))
    assert not few.exchangeable and np.isnan(few.statistic) and few.reason.startswith("undecided: 4 ")
    one = exchangeability(_grams(U[:1]))
    assert not one.exchangeable and one.modules == 1 and "module" in one.reason
    Z = U.copy()
    Z[1:, 0] = 0.0                                              # client 0 untrained in modules 1, 2
    assert exchangeability(_grams(Z)).modules == 1              # those modules are not read
    assert one.as_dict()["statistic"] is None and one.as_dict()["exchangeable"] is None
    with pytest.raises(ValueError, match="members"):
        exchangeability(_grams(U), np.ones(3, bool))
    with pytest.raises(ValueError, match="n_permutations"):
        exchangeability(_grams(U), n_permutations=0)
    with pytest.raises(ValueError, match="alpha"):
        exchangeability(_grams(U), alpha=1.5)


def test_the_exchangeable_weight_keeps_half_of_the_means_noise_reduction():
    """(1 - w) u_k + w mean(u) over n independent noise vectors leaves (1 + 1/n)/2 of the noise
    energy at w = 1 - 1/sqrt(2), whatever n (Monte Carlo over many coordinates)."""
    rng = np.random.default_rng(5)
    w = EXCHANGEABLE_WEIGHT
    assert w == pytest.approx(0.29289321881345254, abs=1e-15)
    for n in (2, 5, 10, 40):
        E = rng.standard_normal((n, 400_000))
        out = (1 - w) * E + w * E.mean(axis=0)
        left = np.mean(np.sum(out ** 2, axis=1)) / np.mean(np.sum(E ** 2, axis=1))
        assert left == pytest.approx((1 + 1 / n) / 2, rel=5e-3)


def test_exchangeable_refinement_floors_only_an_exchangeable_set():
    rng = np.random.default_rng(6)
    b = np.ones(10, bool)
    U = _exchangeable(rng, shared=0.2)
    G = _grams(U)
    assert exchangeability(G).exchangeable
    flat = U.transpose(1, 0, 2).reshape(10, -1)                    # whole adapters (modules stacked)
    mean = flat.mean(axis=0)
    cos = np.array([np.dot(flat[k], (flat.sum(0) - flat[k]) / 9) / np.linalg.norm(flat[k])
                    / np.linalg.norm((flat.sum(0) - flat[k]) / 9) for k in range(10)])
    cap = np.minimum(1.0, np.linalg.norm(flat, axis=1) / np.linalg.norm(mean - flat, axis=1))
    a = refine_weights(G, b, "exchangeable")
    np.testing.assert_allclose(a, np.maximum(np.clip(cos, 0, 1), EXCHANGEABLE_WEIGHT) * cap, atol=1e-12)
    assert np.sum(cap < 1) >= 1 and np.sum(a == EXCHANGEABLE_WEIGHT) >= 5   # both cases occur here
    S = _grams(_structured(rng))
    np.testing.assert_array_equal(refine_weights(S, b, "exchangeable"), refine_weights(S, b, "agreement"))


def test_exchangeable_output_and_summary_on_a_noise_federation():
    """Independent noise updates (one task the base solves): the output is (1 - a) ΔW_k + a mean
    with a = max(cos, 1 - 1/sqrt(2)) (dense reference); the summary reports the statistic."""
    rng = np.random.default_rng(7)
    K, p, q, r = 8, 30, 24, 3
    f = {f"c{k}": {f"m{m}": (rng.standard_normal((r, p)), rng.standard_normal((q, r)), 1.0) for m in range(3)}
         for k in range(K)}
    res = aggregate_factors(f, ModuleOptions(output_dtype="float64"), refine="exchangeable", output="merged")
    ref = res.summary["refinement"]
    assert res.summary["detection"]["flagged"] == []
    ex = ref["exchangeability"]
    assert ex["exchangeable"] and ex["p_value"] >= ALPHA and ex["clients"] == K and ex["modules"] == 3
    assert ref["floor"] == pytest.approx(EXCHANGEABLE_WEIGHT)
    dense = {n: {m: s * B @ A for m, (A, B, s) in v.items()} for n, v in f.items()}
    for n in f:
        a = ref["clients"][n]["weight"]
        assert a == pytest.approx(EXCHANGEABLE_WEIGHT, abs=1e-12)           # noise: cosines below the floor
        assert "exchangeable" in ref["clients"][n]["why"]
        for m in dense[n]:
            mean = np.mean([dense[j][m] for j in f], axis=0)
            A, B, s = res.outputs[n][m]
            np.testing.assert_allclose(s * B @ A, (1 - a) * dense[n][m] + a * mean, rtol=1e-9, atol=1e-12)


def test_sentence_says_why_everyone_moved_or_not():
    from lowrank_fl.adapters.decision import refinement_sentence

    rng = np.random.default_rng(8)
    K, p, q, r = 8, 30, 24, 3
    f = {f"c{k}": {f"m{m}": (rng.standard_normal((r, p)), rng.standard_normal((q, r)), 1.0) for m in range(3)}
         for k in range(K)}
    res = aggregate_factors(f, ModuleOptions(output_dtype="float64"), refine="exchangeable")
    text = refinement_sentence(res.summary["refinement"])
    assert "does not repeat across modules" in text and f"at least {EXCHANGEABLE_WEIGHT:.3g} of the way" in text
    # two groups of clients, each a task of its own in every module: structured, agreement alone
    tasks = {m: [rng.standard_normal((q, r)) for _ in range(2)] for m in range(3)}
    A0 = {m: rng.standard_normal((r, p)) for m in range(3)}
    g = {f"c{k}": {f"m{m}": (A0[m], 2.0 * tasks[m][k % 2] + 0.5 * rng.standard_normal((q, r)), 1.0)
                   for m in range(3)} for k in range(K)}
    res = aggregate_factors(g, ModuleOptions(output_dtype="float64"), refine="exchangeable")
    ref = res.summary["refinement"]
    assert ref["floor"] == 0 and not ref["exchangeability"]["exchangeable"]
    assert res.summary["detection"]["flagged"] == []
    grams = np.array([r_.gram for r_ in res.aggregation.results])
    np.testing.assert_allclose([ref["clients"][n]["weight"] for n in g],
                               refine_weights(grams, np.ones(K, bool), "agreement"), atol=1e-12)
    assert "by its agreement alone" in refinement_sentence(ref)


def test_default_is_exchangeable_and_other_modes_report_their_floor():
    from lowrank_fl.adapters import DEFAULT_REFINE
    from lowrank_fl.adapters.noharm import SHRINK_WEIGHT

    assert DEFAULT_REFINE == "exchangeable"
    rng = np.random.default_rng(9)
    f = {f"c{k}": {f"m{m}": (rng.standard_normal((3, 20)), rng.standard_normal((16, 3)), 1.0) for m in range(2)}
         for k in range(6)}
    default = aggregate_factors(f, ModuleOptions(output_dtype="float64")).summary["refinement"]
    assert default["mode"] == "exchangeable" and default["exchangeability"]["clients"] == 6
    for refine, floor in (("agreement", 0.0), ("shrink", SHRINK_WEIGHT), ("paper", 0.0), ("own", 0.0)):
        ref = aggregate_factors(f, ModuleOptions(output_dtype="float64"), refine=refine).summary["refinement"]
        assert ref["floor"] == floor and ref["exchangeability"] is None


def test_a_zero_update_neither_decides_nor_cancels_the_test_and_does_not_move():
    """A client whose update is zero — exactly in its Gram, or to rounding through the factor path
    (B multiplied by 0) — is left out of the test (the others keep the floor they get without it)
    and keeps its (zero) adapter, reported as a zero update."""
    from lowrank_fl.adapters.decision import refinement_sentence

    rng = np.random.default_rng(10)
    U = rng.standard_normal((4, 8, 40))
    without = exchangeability(_grams(np.delete(U, 3, axis=1)))
    U[:, 3] = 0.0
    ex = exchangeability(_grams(U))
    assert ex.clients == 7 and ex.modules == 4 and ex.statistic == pytest.approx(without.statistic, abs=1e-12)
    a = refine_weights(_grams(U), np.ones(8, bool), "exchangeable")
    assert a[3] == 0 and np.all(np.delete(a, 3) >= EXCHANGEABLE_WEIGHT * 0.999)
    K, p, q, r = 8, 12, 10, 2
    f = {f"c{k}": {f"m{m}": (rng.standard_normal((r, p)), rng.standard_normal((q, r)) * (0.0 if k == 3 else 1.0),
                             1.0) for m in range(4)} for k in range(K)}
    ref = aggregate_factors(f, ModuleOptions(output_dtype="float64")).summary["refinement"]
    c3 = ref["clients"]["c3"]
    assert c3["weight"] == 0 and c3["agreement"] is None and c3["full_change"] is None
    assert c3["why"].startswith("its update is zero") and ref["exchangeability"]["clients"] == K - 1
    assert "c3 keeps its own adapter (its update is zero)" in refinement_sentence(ref)


def test_exchangeability_names_bad_grams_and_members():
    G = _grams(_exchangeable(np.random.default_rng(11), M=2, K=6))
    with pytest.raises(ValueError, match="grams must be"):
        exchangeability(G[None])
    asym = G.copy()
    asym[0, 0, 1] += 1.0
    with pytest.raises(ValueError, match="grams must be symmetric"):
        exchangeability(asym)
    with pytest.raises(ValueError, match="members"):
        exchangeability(G, np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="members"):
        exchangeability(G, [1, 0, 2, 1, 1, 1])
    assert exchangeability(G, [1, 1, 1, 1, 1, 0]).clients == 5                   # 0/1 integers are fine
    with pytest.raises(ValueError, match="refine"):
        aggregate_factors({"a": {"m": (np.ones((1, 3)), np.ones((2, 1)), 1.0)}}, refine="Exchangeable")


@pytest.mark.parametrize("refine", ["exchangeable", "shrink"])
def test_why_credits_the_agreement_when_the_weight_is_the_agreement_up_to_rounding(refine):
    """The module mean of the applied weights can sit an ulp above the agreement; the reason must
    still be the agreement (and never "look exchangeable" in a structured set, where the floor is 0)."""
    from lowrank_fl.adapters.noharm import agreement
    from lowrank_fl.adapters.plan import refinement_summary

    rng = np.random.default_rng(8)
    K, p, q, r = 8, 30, 24, 3
    tasks = {m: [rng.standard_normal((q, r)) for _ in range(2)] for m in range(3)}
    A0 = {m: rng.standard_normal((r, p)) for m in range(3)}
    g = {f"c{k}": {f"m{m}": (A0[m], 2.0 * tasks[m][k % 2] + 0.5 * rng.standard_normal((q, r)), 1.0)
                   for m in range(3)} for k in range(K)}
    res = aggregate_factors(g, ModuleOptions(output_dtype="float64"), refine=refine)
    results = res.aggregation.results
    grams = np.array([r_.gram for r_ in results])
    cos = agreement(grams, np.ones(K, bool))
    if refine == "shrink":
        assert np.all(cos > 0.2)                                   # the agreement, not the floor, decides
    else:
        assert res.summary["refinement"]["floor"] == 0
    bumped = {r_.name: cos * (1 + 4e-16) for r_ in results}          # one rounding step above
    ref = refinement_summary(results, np.ones(K, bool), list(g), refine, bumped)
    for n in g:
        why = ref["clients"][n]["why"]
        assert why.endswith("its agreement (cosine) with the others' mean"), why
        assert "exchangeable" not in why and "at least" not in why
    # where the agreement is below the floor (independent noise updates), the floor is named
    f = {f"c{k}": {f"m{m}": (rng.standard_normal((r, p)), rng.standard_normal((q, r)), 1.0) for m in range(3)}
         for k in range(K)}
    noise = aggregate_factors(f, ModuleOptions(output_dtype="float64"), refine=refine).summary["refinement"]
    assert noise["floor"] > 0.2 - 1e-12
    assert all(f"at least {noise['floor']:.3g} of the way" in noise["clients"][n]["why"]
               or f"at least {noise['floor']:g} of the way" in noise["clients"][n]["why"] for n in f)
