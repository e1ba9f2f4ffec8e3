"""A client whose A factor is its common LoRA initialization reversed (a sign-flipped factor,
:mod:`lowrank_fl.adapters.init_reversal`), pinned against a computation by hand, at the thresholds'
boundaries, on honest factors in another gauge (which must never be flagged), and end to end
where no statistic of the updates can see the flip."""
import json
import math

import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.aggregate import client_decision
from lowrank_fl.adapters.decision import detection_sentence
from lowrank_fl.adapters.detect_updates import update_flags
from lowrank_fl.adapters.init_reversal import (MIRROR_RADIUS, REVERSED_COSINE, SHARED_DRIFT, SIGN_CHANCE, InitCosines,
                                               init_cosines, modules_reversed, modules_tested,
                                               reversed_init_flags, typical_init_cosines)


def _by_hand(A):
    """(row cosines (K, r), reversed (K,)) with loops: the typical A entry by entry (the median), each
    row's cosine with its own typical row, ||A_k - Ā||, ||A_k + Ā||, the median drift."""
    K, r, p = len(A), A[0].shape[0], A[0].shape[1]
    med = [[sorted(a[i, j] for a in A)[K // 2] if K % 2 else
            0.5 * sum(sorted(a[i, j] for a in A)[K // 2 - 1:K // 2 + 1]) for j in range(p)] for i in range(r)]
    ref = np.array(med)
    cos = np.array([[float(a[i] @ ref[i]) / (np.linalg.norm(a[i]) * np.linalg.norm(ref[i])) for i in range(r)]
                    for a in A])
    drift = [float(np.sqrt(sum((a[i, j] - ref[i, j]) ** 2 for i in range(r) for j in range(p)))) for a in A]
    mirror = [float(np.sqrt(sum((a[i, j] + ref[i, j]) ** 2 for i in range(r) for j in range(p)))) for a in A]
    typical = sorted(drift)[K // 2] if K % 2 else 0.5 * sum(sorted(drift)[K // 2 - 1:K // 2 + 1])
    rev = np.array([all(c < -0.5 for c in cos[k]) and mirror[k] <= 2 * typical and drift[k] > mirror[k]
                    for k in range(K)])
    return cos, rev


def _trained(K=8, r=4, p=40, drift=0.1, seed=0):
    """PEFT-like A factors: a common (non-orthogonal) init, each client drifted by about ``drift`` of its norm."""
    rng = np.random.default_rng(seed)
    A0 = rng.uniform(-1, 1, (r, p)) / np.sqrt(p)
    return [A0 + drift * np.linalg.norm(A0) / np.sqrt(r * p) * rng.standard_normal((r, p)) for _ in range(K)]


def _ic(A, B=None):
    """init_cosines with trained-like B's (independent random columns) unless ``B`` is given."""
    rng = np.random.default_rng(len(A))
    return init_cosines(A, [rng.standard_normal((12, len(a))) for a in A] if B is None else B)


def test_the_evidence_matches_a_computation_by_hand_for_odd_and_even_k():
    assert (REVERSED_COSINE, MIRROR_RADIUS, SHARED_DRIFT) == (-0.5, 2.0, 0.5)
    for K in (7, 8):
        A = _trained(K=K, seed=K)
        A[2] = -A[2]
        c = _ic(A)
        cos, rev = _by_hand(A)
        np.testing.assert_allclose(c.mean, cos.mean(axis=1), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(c.lowest, cos.min(axis=1), rtol=1e-12, atol=1e-14)
        assert c.is_reversed.tolist() == rev.astype(float).tolist() == [0, 0, 1] + [0] * (K - 3)


def test_a_flipped_a_is_flagged_in_at_least_half_of_its_modules():
    A = _trained(K=6)
    clean = _ic(A)
    one = _ic([-a if k == 0 else a for k, a in enumerate(A)])
    def chance(c, n, r=4):                                # P(at least c of n modules reversed by random signs)
        q = 2.0 ** -r
        return sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(c, n + 1))

    cases = ((3, 0), (4, 4), (3, 3), (2, 2), (1, 3), (5, 5))
    flags = [bool(reversed_init_flags([one] * a + [clean] * b, 6)[0]) for a, b in cases]
    want = [2 * a >= a + b and chance(a, a + b) <= SIGN_CHANCE for a, b in cases]
    assert flags == want == [True, True, False, False, False, True]   # 3 of 3: 2.4e-4; 3 of 6: 4.0e-3
    assert reversed_init_flags([one, one, one, None, None], 6).tolist() == [True] + [False] * 5   # untested
    assert not reversed_init_flags([None, None], 6).any()
    assert modules_tested([one, None, clean], 6).tolist() == [2] * 6
    assert modules_reversed([one, None, clean, one], 6).tolist() == [2] + [0] * 5


def test_each_condition_is_needed_at_its_boundary():
    """Every row below -1/2 (one row above it: not reversed), and -A_k within two typical drifts of Ā."""
    A = _trained(K=9, r=3, p=40, drift=0.2, seed=4)
    part = [a.copy() for a in A]
    part[0][:2] *= -1                                    # 2 of 3 rows: not every row
    c = _ic(part)
    assert c.lowest[0] < REVERSED_COSINE < _by_hand(part)[0][0].max() and c.is_reversed[0] == 0.0
    # -A_0 pushed out of the mirrored cloud: along -Ā, its rows still reversed, just past 2 typical drifts
    ref = np.median(np.stack(A), axis=0)
    typical = np.median([np.linalg.norm(a - ref) for a in A])
    u = ref / np.linalg.norm(ref)
    for extra, reversed_ in ((1.6, True), (2.4, False)):
        far = [a.copy() for a in A]
        far[0] = -ref - extra * typical * u             # ||A_0 + Ā|| about extra × typical (Ā moves a little)
        c = _ic(far)
        cos, rev = _by_hand(far)
        ref2 = np.median(np.stack(far), axis=0)
        ratio = np.linalg.norm(far[0] + ref2) / np.median([np.linalg.norm(a - ref2) for a in far])
        assert (ratio <= MIRROR_RADIUS) == reversed_ and cos[0].max() < REVERSED_COSINE
        assert c.is_reversed[0] == float(rev[0]) == float(reversed_)


@pytest.mark.parametrize("factor", [1e-3, 3.0, 1e6])
def test_a_scaled_or_far_drifted_client_is_not_reversed(factor):
    A = _trained(K=8, drift=0.3)
    A[1] = A[1] * factor
    rng = np.random.default_rng(5)
    A[2] = A[2] + 5 * np.linalg.norm(A[2]) * rng.standard_normal(A[2].shape) / np.sqrt(A[2].size)
    c = _ic(A)
    assert c is not None and not reversed_init_flags([c], 8).any()
    np.testing.assert_allclose(c.mean[1], _by_hand(A)[0][1].mean(), rtol=1e-12)


def test_honest_factors_in_another_gauge_are_never_reversed():
    """A client that re-factors its own adapter by an SVD (the same product, rows pointing anywhere) is not
    reversed, over many draws; nor one whose rank components are permuted. So is a flip hidden by a change
    of gauge (the documented limit: the test reads the naive flip only)."""
    rng = np.random.default_rng(11)
    hits = 0
    for seed in range(300):
        A = _trained(K=8, r=2, p=40, drift=0.3, seed=seed)
        B = [rng.standard_normal((12, 2)) for _ in A]
        U, s, Vt = np.linalg.svd(B[0] @ A[0], full_matrices=False)
        sign = rng.choice([-1.0, 1.0], 2)
        A[0], B[0] = np.sqrt(s[:2, None]) * Vt[:2] * sign[:, None], U[:, :2] * np.sqrt(s[:2]) * sign
        A[1], B[1] = A[1][::-1], B[1][:, ::-1]           # rank components swapped
        hits += int(reversed_init_flags([init_cosines(A, B)], 8).any())
    assert hits == 0


def test_an_honest_client_re_signing_each_rank_component_is_not_flagged():
    """A tool that gives each rank component a sign of its own (B's column and A's row together: the same
    product) reverses a whole module with probability 2^-r; at rank 2 over four modules that is 1/4 a
    module, and the binomial tail keeps every such client unflagged over many draws, while a naive flip
    of the same federation, at rank 2, needs five modules."""
    rng = np.random.default_rng(3)
    hits = 0
    for seed in range(300):
        mods = [_trained(K=8, r=2, p=48, drift=0.2, seed=1000 * seed + m) for m in range(4)]
        signs = rng.choice([-1.0, 1.0], (4, 2))
        evidence = [_ic([a * sg[:, None] if k == 0 else a for k, a in enumerate(A)]) for A, sg in zip(mods, signs)]
        hits += int(reversed_init_flags(evidence, 8)[0])
    assert hits == 0
    five = [_ic([-a if k == 0 else a for k, a in enumerate(_trained(K=8, r=2, p=48, seed=m))]) for m in range(5)]
    assert reversed_init_flags(five, 8)[0] and not reversed_init_flags(five[:4], 8)[0]   # (1/4)^5 ~ 1e-3


def test_narrow_or_non_finite_modules_are_not_tested():
    A = _trained(K=6, p=31)
    assert _ic(A) is None and _ic(_trained(K=6, p=32)) is not None        # MIN_WIDTH = 32 input features
    A = _trained(K=6)
    A[2][1, 3] = np.nan
    assert _ic(A) is None


def test_zero_rows_and_other_ranks():
    A = _trained(K=6)
    zero_row = [a.copy() for a in A]
    zero_row[0] = -zero_row[0]
    zero_row[0][1] = 0.0              # a zero row: -A_0 is no longer among the others (a partial flip)
    c = _ic(zero_row)
    assert c.is_reversed[0] == 0.0 and c.lowest[0] < REVERSED_COSINE and np.isfinite(c.mean[0])
    padded = [a.copy() for a in A]
    padded[0] = np.vstack([-padded[0], np.zeros((1, 40))])    # another shape: not tested for that client
    c = _ic(padded)
    assert np.isnan(c.mean[0]) and not reversed_init_flags([c], 6).any() and modules_tested([c], 6)[0] == 0
    zero = [a.copy() for a in A]
    zero[3] = np.zeros_like(zero[3])                      # an untrained (all-zero) A: not tested, not flagged
    c = _ic(zero)
    assert np.isnan(c.mean[3]) and not reversed_init_flags([c], 6).any()


def test_modules_that_cannot_show_a_common_init_are_not_tested():
    rng = np.random.default_rng(2)
    A = _trained(K=6)
    assert _ic(A[:2]) is None                                            # no majority to take
    assert _ic([a[:1] for a in A]) is None                               # rank 1
    assert _ic(A[:2] + [rng.standard_normal((5, 40)) for _ in range(4)]) is None    # no 3 of one rank... 4 are
    assert _ic([rng.standard_normal((4, 40)) for _ in range(6)]) is None          # independent inits
    assert _ic([rng.standard_normal((4, 40)) for _ in range(3)]) is None          # ... also three of them
    assert _ic(_trained(K=6, drift=0.6)) is None                         # drifted past SHARED_DRIFT


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, "bfloat16"])
@pytest.mark.parametrize("p", [32, 64, 4096])
def test_svd_factors_are_not_tested_even_in_half_precision(dtype, p):
    """Factors written by an SVD (A's rows and B's columns orthogonal, each sign a convention) of
    near-identical updates: a client whose signs all came out the other way is not called reversed,
    also after rounding to float16 or bfloat16 (which leaves the pairwise cosines at about
    0.005/sqrt(n), far below the 0.1/sqrt(n) of the gate, while random rows give about 1/sqrt(n))."""
    rng = np.random.default_rng(p)
    W = rng.standard_normal((20, p))
    out, outB = [], []
    for k in range(9):
        U, s, Vt = np.linalg.svd(W + 1e-3 * rng.standard_normal(W.shape), full_matrices=False)
        sign = -1.0 if k == 0 else 1.0
        A, B = np.sqrt(s[:4, None]) * Vt[:4] * sign, U[:, :4] * np.sqrt(s[:4]) * sign
        if dtype == "bfloat16":          # round to 8 significant bits, as bfloat16 stores it
            A, B = (np.ldexp(np.round(m * 256) / 256, e) for m, e in (np.frexp(A), np.frexp(B)))
        else:
            A, B = A.astype(dtype).astype(float), B.astype(dtype).astype(float)
        out.append(A)
        outB.append(B)
    assert _ic(out, outB) is None and not reversed_init_flags([_ic(out, outB)], 9).any()
    # a common orthonormal initialization (rows of A orthogonal, as an SVD's) with trained, non-orthogonal
    # B's is tested, and its flipped client found
    Q = np.linalg.qr(rng.standard_normal((p, 4)))[0].T
    common = [(-1.0 if k == 0 else 1.0) * (Q + 0.01 * rng.standard_normal((4, p)) / np.sqrt(p)) for k in range(9)]
    assert reversed_init_flags([_ic(common)] * 3, 9).tolist() == [True] + [False] * 8     # 3 modules at rank 4


def test_typical_cosines_are_each_clients_median_over_its_tested_modules():
    a = InitCosines(np.array([0.8, -0.9, np.nan]), np.array([0.0, 1.0, np.nan]), np.zeros(3))
    b = InitCosines(np.array([0.5, -0.6, 0.3]), np.zeros(3), np.zeros(3))
    got = typical_init_cosines([a, None, b, b], 3)
    np.testing.assert_allclose(got, [0.5, -0.6, 0.3])                    # client 2: not tested in a
    assert np.isnan(typical_init_cosines([None], 3)).all()


def _federation(seed, attack=None, K=10, modules=3, q=24, p=40, r=4):
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
        results = res.aggregation.results
        assert not update_flags(np.array([r.gram for r in results]), np.array([r.outside for r in results])).any()
        assert det["updates"]["init_modules"] == {f"c{k}": 3 for k in range(10)}
        assert det["updates"]["init_reversed_modules"] == {"c0": 3, **{f"c{k}": 0 for k in range(1, 10)}}
        assert client_decision(res.aggregation.results, "updates").tolist() == [False] + [True] * 9
        for n in (f"c{k}" for k in range(1, 10)):                 # as if c0 had not taken part
            for m, (A, B, s) in res.outputs[n].items():
                A2, B2, s2 = refit.outputs[n][m]
                np.testing.assert_allclose(s * B @ A, s2 * B2 @ A2, rtol=1e-9, atol=1e-12)
        A, B, s = res.outputs["c0"]["layer0.q_proj"]                  # its own adapter, unchanged
        A0, B0, s0 = _federation(seed, attack)["c0"]["layer0.q_proj"]
        np.testing.assert_allclose(s * B @ A, s0 * B0 @ A0, rtol=1e-12, atol=1e-15)
        text = detection_sentence(json.loads(json.dumps(det)))
        assert "c0 (its A factor is the common LoRA initialization reversed" in text


def test_the_command_flags_a_flipped_a_in_half_precision_files_and_says_why(tmp_path, capsys):
    """End to end on float16 adapter directories (`adapters synthetic`): client_00's lora_A negated in
    every module is flagged as reversed, with the clause; its lora_B negated instead (the same -ΔW) is
    not seen, and the "nothing flagged" sentence then gives the test's limit."""
    from safetensors.numpy import load_file, save_file

    from lowrank_fl.cli import main

    fed = tmp_path / "fed"
    assert main(["adapters", "synthetic", "--out", str(fed), "--shape", "32x48", "--rank", "4", "--seed", "3",
                 "--contaminated", "0"]) == 0
    f = fed / "client_00" / "adapter_model.safetensors"
    orig = load_file(str(f))
    for letter, flagged in (("A", ["client_00"]), ("B", [])):
        save_file({k: (-v if f"lora_{letter}" in k else v) for k, v in orig.items()}, str(f))
        out = tmp_path / f"out_{letter}"
        capsys.readouterr()
        assert main(["adapters", "aggregate", *sorted(str(p) for p in fed.glob("client_*")), "--out", str(out)]) == 0
        said = capsys.readouterr().out
        det = json.loads((out / "summary.json").read_text())["detection"]
        assert det["flagged"] == det["updates"]["by_reversed_init"] == flagged
        assert det["updates"]["init_modules"] == {f"client_{k:02d}": 4 for k in range(10)}
        cos = det["updates"]["init_cosines"]
        assert (cos["client_00"] < -0.9) == (letter == "A") and min(cos[f"client_{k:02d}"] for k in range(1, 10)) > 0.9
        if flagged:
            assert ("client_00 (its A factor is the common LoRA initialization reversed: every row below a cosine of "
                    "-0.5 with its typical row and -A among the others' A, in 4 of the 4 module(s) tested") in said
        else:
            low = min(cos, key=cos.get)
            assert (f"A reversed against the common init: lowest mean row cosine {cos[low]:.2f} ({low}) / every row "
                    "below -0.5 and -A among the others' A") in said
