"""A client whose A factor is reversed against the federation's common LoRA initialization
(:mod:`lowrank_fl.adapters.init_reversal`), pinned against row cosines computed by hand, at the
thresholds' boundaries, and end to end where no statistic of the updates can see the flip."""
import json

import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.aggregate import client_decision
from lowrank_fl.adapters.decision import detection_sentence
from lowrank_fl.adapters.init_reversal import (REVERSED_COSINE, SHARED_COSINE, init_cosines,
                                               reversed_init_flags, typical_init_cosines)


def _by_hand(A):
    """Per client and row cos(A_k[i], median_j A_j[i]), with loops (the median taken entry by entry)."""
    K, r, p = len(A), A[0].shape[0], A[0].shape[1]
    ref = np.array([[sorted(a[i, j] for a in A)[K // 2] if K % 2 else
                     0.5 * sum(sorted(a[i, j] for a in A)[K // 2 - 1:K // 2 + 1]) for j in range(p)]
                    for i in range(r)])
    return np.array([[float(a[i] @ ref[i]) / (np.linalg.norm(a[i]) * np.linalg.norm(ref[i]))
                      for i in range(r)] for a in A])


def _trained(K=8, r=4, p=30, drift=0.3, seed=0):
    """PEFT-like A factors: a common (non-orthogonal) init, each client drifted by ``drift`` of its norm."""
    rng = np.random.default_rng(seed)
    A0 = rng.uniform(-1, 1, (r, p)) / np.sqrt(p)
    return [A0 + drift * np.linalg.norm(A0) / np.sqrt(r * p) * rng.standard_normal((r, p)) for _ in range(K)]


def test_cosines_match_a_computation_by_hand_for_odd_and_even_k():
    for K in (7, 8):
        A = _trained(K=K, seed=K)
        A[2] = -A[2]
        c = init_cosines(A)
        np.testing.assert_allclose(c, _by_hand(A), rtol=1e-12, atol=1e-14)
        assert c[2].max() < REVERSED_COSINE and np.delete(c, 2, axis=0).min() > SHARED_COSINE


def test_flag_needs_every_row_reversed_in_at_least_half_of_the_modules():
    A = _trained(K=6)
    one = init_cosines([-a if k == 0 else a for k, a in enumerate(A)])
    partly = [a.copy() for a in A]
    partly[0][:3] *= -1                                  # 3 of 4 rows: not a reversal of the init
    part = init_cosines(partly)
    clean = init_cosines(A)
    assert part[0, :3].max() < REVERSED_COSINE < part[0, 3]
    assert not reversed_init_flags([part, part], 6).any()
    flags = [reversed_init_flags([one] * a + [clean] * b, 6)[0] for a, b in ((1, 1), (2, 2), (1, 2), (1, 3))]
    assert flags == [True, True, False, False]           # half of the modules suffices, less does not
    # a module that could not be tested does not count against it
    assert reversed_init_flags([one, None, None], 6).tolist() == [True] + [False] * 5
    assert not reversed_init_flags([None, None], 6).any()


def test_the_threshold_is_strict_at_minus_one_half():
    c = np.full((4, 2), 0.9)
    c[0] = [REVERSED_COSINE, -0.9]
    assert not reversed_init_flags([c], 4).any()
    c[0] = [np.nextafter(REVERSED_COSINE, -1), -0.9]
    assert reversed_init_flags([c], 4).tolist() == [True, False, False, False]


@pytest.mark.parametrize("factor", [1e-3, 3.0, 1e6])
def test_a_scaled_or_far_drifted_client_is_not_reversed(factor):
    A = _trained(K=8, drift=0.8)
    A[1] = A[1] * factor                                 # cosines are blind to size
    rng = np.random.default_rng(5)
    A[2] = A[2] + 5 * np.linalg.norm(A[2]) * rng.standard_normal(A[2].shape) / np.sqrt(A[2].size)
    c = init_cosines(A)
    assert c is not None and not reversed_init_flags([c], 8).any()
    np.testing.assert_allclose(c[1], _by_hand(A)[1], rtol=1e-12)


def test_modules_that_cannot_show_a_common_init_are_not_tested():
    rng = np.random.default_rng(2)
    A = _trained(K=6)
    assert init_cosines(A[:2]) is None                                   # no majority to take
    assert init_cosines([a[:1] for a in A]) is None                      # rank 1: a sign is all it has
    assert init_cosines(A[:3] + [rng.standard_normal((5, 30)) for _ in range(3)]) is None    # ranks differ
    assert init_cosines([rng.standard_normal((4, 30)) for _ in range(6)]) is None    # independent inits
    # SVD factors (orthonormal rows, each sign a convention): a client whose every sign came out the
    # other way is not called reversed
    _, _, Vt = np.linalg.svd(rng.standard_normal((20, 30)), full_matrices=False)
    svd = [Vt[:4] * (-1.0 if k == 0 else 1.0) for k in range(6)]
    assert init_cosines(svd) is None and not reversed_init_flags([init_cosines(svd)], 6).any()


def test_typical_cosines_are_each_clients_median_over_its_tested_modules():
    a = np.array([[0.9, 0.7], [-1.0, -0.8], [1.0, np.nan]])
    b = np.array([[0.5, 0.5], [-0.6, -0.6], [0.2, 0.4]])
    got = typical_init_cosines([a, None, b, b], 3)
    np.testing.assert_allclose(got, [0.5, -0.6, 0.3])                    # client 2: module a has a NaN row
    assert np.isnan(typical_init_cosines([None], 3)).all()


def _federation(seed, attack=None, K=10, modules=3, q=24, p=20, r=4):
    """Common init, independent B's (no shared direction: -ΔW_k has the distribution of ΔW_k)."""
    rng = np.random.default_rng(seed)
    out = {f"c{k}": {} for k in range(K)}
    for m in range(modules):
        A0 = rng.uniform(-1, 1, (r, p)) / np.sqrt(p)
        for k in range(K):
            A = A0 + 0.1 * rng.standard_normal((r, p)) / np.sqrt(p)
            B = 0.05 * rng.standard_normal((q, r))
            if k == 0 and attack == "A":
                A = -A
            if k == 0 and attack == "AB":
                A, B = -A, -B
            if k == 0 and attack == "B":
                B = -B
            out[f"c{k}"][f"layer{m}.q_proj"] = (A, B, 2.0)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_a_flipped_factor_is_flagged_and_steers_nothing_where_no_update_statistic_sees_it(seed):
    opts = ModuleOptions(output_dtype="float64")
    clean = aggregate_factors(_federation(seed), opts)
    flip_b = aggregate_factors(_federation(seed, "B"), opts)
    assert clean.summary["detection"]["flagged"] == flip_b.summary["detection"]["flagged"] == []
    refit = aggregate_factors({n: f for n, f in _federation(seed).items() if n != "c0"}, opts)
    for attack in ("A", "AB"):
        res = aggregate_factors(_federation(seed, attack), opts)
        det = res.summary["detection"]
        assert det["flagged"] == ["c0"] and det["updates"]["by_reversed_init"] == ["c0"]
        assert det["updates"]["init_cosines"]["c0"] < -0.9 < 0.9 < det["updates"]["init_cosines"]["c1"]
        # the other evidence alone flags nobody: the flip is invisible in the updates
        assert det["updates"]["by_direction"] == det["updates"]["by_size"] == det["updates"]["by_profile"] == []
        assert client_decision(res.aggregation.results, "updates").tolist() == [False] + [True] * 9
        for n in (f"c{k}" for k in range(1, 10)):                 # as if c0 had not taken part
            for m, (A, B, s) in res.outputs[n].items():
                A2, B2, s2 = refit.outputs[n][m]
                np.testing.assert_allclose(s * B @ A, s2 * B2 @ A2, rtol=1e-9, atol=1e-12)
        A, B, s = res.outputs["c0"]["layer0.q_proj"]                  # its own adapter, unchanged
        A0, B0, s0 = _federation(seed, attack)["c0"]["layer0.q_proj"]
        np.testing.assert_allclose(s * B @ A, s0 * B0 @ A0, rtol=1e-12, atol=1e-15)
        text = detection_sentence(json.loads(json.dumps(det)))
        assert "c0 (its A factor reversed against the federation's common LoRA initialization" in text
