"""adapters/: the documented numbers against independent references, at the boundary cases.

Reduction energy exactly at its threshold, ``rank_out`` truncation of the single-output methods
against the dense mean, the client rules at exactly half of the modules, the output writer under
"majority"/"any" with a client contaminated in only some modules, and the λ rule of
:mod:`lowrank_fl.adapters.tuning` (scale ``√(2r)``, geometric midpoint of the rank band).
"""
import json
from pathlib import Path

import numpy as np
import pytest

from lowrank_fl import clair
from lowrank_fl.adapters import ModuleOptions, aggregate_module, load_adapters
from lowrank_fl.adapters.aggregate import ModuleResult, client_decision
from lowrank_fl.adapters.io import ModuleFactors
from lowrank_fl.adapters.reduce import pair_blocks, reduce_module
from lowrank_fl.adapters.run import aggregate_adapters, aggregate_to_dir, write_outputs
from lowrank_fl.adapters.tuning import auto_lambdas, data_scale


# --------------------------------------------------------------------------------------------
# the truncated reduction keeps the fewest directions reaching the energy, and reports the rest
def _graded_module():
    """K = 2 updates on orthogonal directions with energies 0.4, 0.3 | 0.2, 0.1 (total 1):
    the joint spaces' energies are 0.4, 0.3, 0.2, 0.1 on both sides."""
    rng = np.random.default_rng(11)
    U0 = np.linalg.qr(rng.standard_normal((9, 4)))[0]
    V0 = np.linalg.qr(rng.standard_normal((7, 4)))[0]
    sig = np.sqrt([0.4, 0.3, 0.2, 0.1])
    B = [U0[:, :2] * sig[:2], U0[:, 2:] * sig[2:]]          # (out, 2)
    A = [V0[:, :2].T, V0[:, 2:].T]                          # (2, in)
    return ModuleFactors(name="m", A=A, B=B, scaling=np.ones(2))


@pytest.mark.parametrize("energy, dims, discarded", [
    (0.4, 1, 0.6),             # exactly the first direction's energy: one direction
    (0.7, 2, 0.3),             # exactly the cumulative energy of two: two, not three
    (0.7 + 1e-9, 3, 0.1),      # just above: three
    (0.69, 2, 0.3),
    (0.9, 3, 0.1),
    (1.0, 4, 0.0),
])
def test_truncated_reduction_at_the_energy_threshold(energy, dims, discarded):
    red = reduce_module(_graded_module(), energy=energy)
    assert red.dims == (dims, dims)
    assert red.discarded == pytest.approx(discarded, abs=1e-12)
    # the kept energy is the trace of the projected updates (the reference by definition)
    f = _graded_module()
    kept = sum(np.linalg.norm(red.U.T @ f.delta(k) @ red.V) ** 2 for k in range(2))
    assert kept == pytest.approx(1.0 - discarded, abs=1e-12)


# --------------------------------------------------------------------------------------------
# single-output methods with rank_out: the dense mean, truncated by SVD
def _factors(ranks, out=20, inn=16, contaminated=1, seed=0, shared_A=False, noise=0.05):
    rng = np.random.default_rng(seed)
    K, rmax = len(ranks), max(ranks)
    A0 = np.linalg.qr(rng.standard_normal((inn, rmax)))[0].T
    A, B = [], []
    for k, r in enumerate(ranks):
        if shared_A:
            a = A0[:r].copy()
        elif k >= K - contaminated:
            a = rng.standard_normal((r, inn))
        else:
            a = A0[:r] + noise * rng.standard_normal((r, inn))
        A.append(a)
        B.append(rng.standard_normal((out, r)))
    return ModuleFactors(name="m", A=A, B=B, scaling=np.array([8.0 / r for r in ranks]))


def _svd_truncate(M, r):
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, :r] * s[:r]) @ Vt[:r], float(np.sqrt(np.sum(s[r:] ** 2) / np.sum(s ** 2)))


@pytest.mark.parametrize("method", ["fedavg-factors", "ffa", "fedavg", "flexlora"])
@pytest.mark.parametrize("rank_out", [1, 2])
def test_rank_out_of_single_output_methods_is_the_truncated_dense_aggregate(method, rank_out):
    K = 3
    f = _factors([3] * K, seed=5, shared_A=(method == "ffa"))
    S = [f.scaling[k] * f.B[k] for k in range(K)]
    if method in ("fedavg-factors", "ffa"):      # mean(s_k B_k) mean(A_k), formed densely
        dense = np.mean(S, axis=0) @ np.mean(f.A, axis=0)
    else:
        dense = np.mean([f.delta(k) for k in range(K)], axis=0)
        if method == "flexlora":
            dense = _svd_truncate(dense, 3)[0]
    res = aggregate_module(f, ModuleOptions(method=method, output_dtype="float64"))
    B, A, err = res.outputs(0)
    assert err == 0.0
    np.testing.assert_allclose(B @ A, dense, atol=1e-11 * np.abs(dense).max())
    ref, ref_err = _svd_truncate(dense, rank_out)
    Bt, At, err = res.outputs(0, rank_out=rank_out)
    assert Bt.shape[1] == At.shape[0] == rank_out
    np.testing.assert_allclose(Bt @ At, ref, atol=1e-10 * np.abs(dense).max())
    assert err == pytest.approx(ref_err, rel=1e-9)


# --------------------------------------------------------------------------------------------
# client rules: "majority" keeps a client benign in exactly half of the modules
def _results(flags):
    return [ModuleResult(name=f"m{i}", method="clair", shape=(4, 4), ranks=[2] * len(b),
                         reduced_dims=(4, 4), discarded=0.0, benign=list(b))
            for i, b in enumerate(flags)]


def test_client_rules_at_exactly_half():
    flags = [[True, True, False, True],
             [True, False, False, True],
             [True, True, True, False],
             [True, False, True, False]]
    # client 0: 4/4 benign; 1: 2/4 (exactly half); 2: 2/4; 3: 2/4 -> majority keeps all four
    res = _results(flags)
    np.testing.assert_array_equal(client_decision(res, "majority"), [True, True, True, True])
    # "any" would keep client 0 alone (three of four flagged): not a strict majority, so the guard
    # (lowrank_fl.adapters.guard) makes it the undecided set, everyone keeping their own
    np.testing.assert_array_equal(client_decision(res, "any"), [False, False, False, False])
    assert client_decision(res, "per-module") is None
    # three modules: one benign of three is below half, two of three above
    res3 = _results([[True, True, False], [True, False, False], [True, True, True]])
    np.testing.assert_array_equal(client_decision(res3, "majority"), [True, True, False])
    with pytest.raises(ValueError, match="client_rule"):
        client_decision(res3, "most")


# --------------------------------------------------------------------------------------------
# the writer under "majority" / "any": a client contaminated in only some modules
K_MIX, R_MIX, SHAPE = 6, 3, (24, 20)
N_MODULES = 4
#: client -> modules where it is contaminated (client 5: exactly half; client 4: one of four)
PARTIAL = {5: (0, 1), 4: (0,)}


def _write_partial(root: Path, seed=0) -> list[Path]:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    q, p = SHAPE
    tensors = [dict() for _ in range(K_MIX)]
    names = [f"model.layers.{i}.self_attn.q_proj" for i in range(N_MODULES)]
    for i, name in enumerate(names):
        A0 = np.linalg.qr(rng.standard_normal((p, R_MIX)))[0].T
        for k in range(K_MIX):
            if i in PARTIAL.get(k, ()):
                A = np.linalg.qr(rng.standard_normal((p, R_MIX)))[0].T
            else:
                A = A0 + 0.02 * rng.standard_normal((R_MIX, p))
            key = f"base_model.model.{name}"
            tensors[k][f"{key}.lora_A.weight"] = A.astype(np.float32)
            tensors[k][f"{key}.lora_B.weight"] = rng.standard_normal((q, R_MIX)).astype(np.float32)
    dirs = []
    for k in range(K_MIX):
        d = root / f"c{k}"
        d.mkdir(parents=True)
        save_file(tensors[k], str(d / "adapter_model.safetensors"))
        cfg = {"peft_type": "LORA", "r": R_MIX, "lora_alpha": 2 * R_MIX, "use_rslora": False,
               "target_modules": ["q_proj"], "rank_pattern": {}, "alpha_pattern": {}}
        (d / "adapter_config.json").write_text(json.dumps(cfg))
        dirs.append(d)
    return dirs


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    root = tmp_path_factory.mktemp("partial")
    ad = load_adapters(_write_partial(root))
    opts = ModuleOptions(output_dtype="float64", tol=1e-10)
    return ad, opts, aggregate_adapters(ad, opts, progress=False)


def test_partial_contamination_is_detected_per_module(partial):
    ad, _, agg = partial
    for i, r in enumerate(agg.results):
        want = [i not in PARTIAL.get(k, ()) for k in range(K_MIX)]
        assert r.benign == want, (r.name, r.block_norms)
    maj = client_decision(agg.results, "majority")
    anyr = client_decision(agg.results, "any")
    np.testing.assert_array_equal(maj, [True] * 5 + [True])        # client 5: exactly half
    np.testing.assert_array_equal(anyr, [True] * 4 + [False, False])


def _read_delta(d: Path, module: str) -> np.ndarray:
    from safetensors.numpy import load_file

    cfg = json.loads((d / "adapter_config.json").read_text())
    t = load_file(str(d / "adapter_model.safetensors"))
    A = t[f"{module}.lora_A.weight"].astype(float)
    B = t[f"{module}.lora_B.weight"].astype(float)
    r = A.shape[0]
    key = module[len("base_model.model."):]
    alpha = next((v for k, v in cfg.get("alpha_pattern", {}).items()
                  if __import__("re").match(rf"(.*\.)?({k})$", key)), cfg["lora_alpha"])
    s = alpha / (np.sqrt(r) if cfg.get("use_rslora") else r)
    return s * B @ A


@pytest.mark.parametrize("rule", ["majority", "any", "per-module"])
def test_streamed_outputs_follow_the_client_rule(partial, tmp_path, rule):
    """Every output equals the refinement (9) with the rule's set, computed by clair.fit's
    projector on the full ΔW (of the kept clients where a client-level rule flagged someone) and
    refine_closed_form; excluded clients keep their own ΔW."""
    ad, opts, agg = partial
    out = tmp_path / rule
    agg2, summary = aggregate_to_dir(ad, opts, out, client_rule=rule, progress=False, refine="paper",
                                     output="merged")
    decided = client_decision(agg.results, rule)
    for r in agg.results:
        f = ad.factors(r.name)
        W = np.stack([f.delta(k) for k in range(K_MIX)])
        fit = clair.fit(W, rank=r.rank, lam_L=r.lam_L, lam_S=r.lam_S, tol=1e-10)
        assert list(fit.benign) == r.benign
        b = np.asarray(r.benign if decided is None else decided)
        refit = summary["modules"][r.name]["refit"]
        if refit is not None:      # the client-level rule flagged someone: (7) again without them
            assert refit["excluded"] == list(np.flatnonzero(~b))
            fit = clair.fit(W[b], rank=r.rank, lam_L=refit["lam_L"], lam_S=refit["lam_S"], tol=1e-10)
        refined = clair.refine_closed_form(W, fit.projector, b)
        for k, name in enumerate(ad.names):
            got = _read_delta(out / name, r.name)
            want = refined[k] if b[k] else W[k]
            assert np.linalg.norm(got - want) <= 2e-6 * np.linalg.norm(want), (rule, r.name, k)
    # the non-streamed path writes the same files
    out2 = tmp_path / (rule + "-2")
    write_outputs(agg, out2, client_rule=rule, output="merged", refine="paper")
    for name in ad.names:
        for m in ad.modules:
            np.testing.assert_allclose(_read_delta(out2 / name, m), _read_delta(out / name, m),
                                       rtol=0, atol=1e-6 * np.abs(_read_delta(out / name, m)).max())
    if rule != "per-module":
        assert summary["client_benign"][rule] == dict(zip(ad.names, map(bool, decided)))


# --------------------------------------------------------------------------------------------
# tuning: λ_L = K^{-1/2} ŝ 2^{-j} with ŝ = median ||D_g|| / sqrt(2 r); λ_S/λ_L the band's
# geometric midpoint
def test_data_scale_by_hand():
    D = np.zeros((3 * 2, 2))
    D[0:2] = [[3.0, 0.0], [0.0, 4.0]]           # ||D_1|| = 5
    D[2:4] = [[1.0, 0.0], [0.0, 0.0]]           # ||D_2|| = 1
    D[4:6] = [[0.0, 6.0], [8.0, 0.0]]           # ||D_3|| = 10
    assert data_scale(D, 2, 2) == pytest.approx(5.0 / 2.0, rel=1e-15)   # median 5 / sqrt(4)
    assert data_scale(D, 2, 8) == pytest.approx(5.0 / 4.0, rel=1e-15)
    assert data_scale(-D, 2, 1) == pytest.approx(5.0 / np.sqrt(2.0), rel=1e-15)


@pytest.mark.parametrize("seed, ranks", [(7, [3] * 6), (3, [4] * 8), (1, [2] * 5)])
def test_auto_lambdas_scale_and_geometric_midpoint(seed, ranks):
    f = _factors(ranks, out=30, inn=24, seed=seed)
    red = reduce_module(f)
    D, h = pair_blocks(red)
    K, r = len(ranks), ranks[0]
    G = K * (K - 1) // 2
    norms = np.linalg.norm(D.reshape(G, h, -1), axis=(1, 2))
    s_hand = float(np.median(norms)) / np.sqrt(2 * r)
    lam = auto_lambdas(D, h, K, r)
    assert lam.rule in ("band", "fallback")
    halvings = np.log2(s_hand / np.sqrt(K) / lam.lam_L)
    assert halvings == pytest.approx(round(halvings), abs=1e-9) and 0 <= round(halvings) <= 3
    grid = np.geomspace(1.0, 12.0, 5) / K
    if lam.rule == "fallback":
        assert np.min(np.abs(grid - lam.lam_S / lam.lam_L)) <= 1e-12 * grid[-1]
        return
    lo, hi = lam.band
    assert np.min(np.abs(grid - lo)) <= 1e-15 * hi and np.min(np.abs(grid - hi)) <= 1e-15 * hi
    assert lam.lam_S / lam.lam_L == pytest.approx(np.sqrt(lo * hi), rel=1e-12)


def test_auto_lambdas_wide_band_midpoint_is_geometric():
    """A band over several ratios of a fine grid (25 ratios): λ_S/λ_L is the band's geometric
    midpoint, which here differs from the arithmetic one by more than 1 %."""
    f = _factors([2] * 8, out=30, inn=24, seed=2, noise=1e-3)
    D, h = pair_blocks(reduce_module(f))
    lam = auto_lambdas(D, h, 8, 2, n_ratios=25)
    assert lam.rule == "band"
    lo, hi = lam.band
    grid = np.geomspace(1.0, 12.0, 25) / 8
    assert hi / lo > 1.3 and np.min(np.abs(grid - lo)) <= 1e-15 and np.min(np.abs(grid - hi)) <= 1e-15
    ratio = lam.lam_S / lam.lam_L
    assert ratio == pytest.approx(np.sqrt(lo * hi), rel=1e-12)
    assert abs(ratio - (lo + hi) / 2) > 0.01 * ratio
    assert lam.lam_L == pytest.approx(np.median(np.linalg.norm(D.reshape(28, h, -1), axis=(1, 2)))
                                      / np.sqrt(2 * 2) / np.sqrt(8), rel=1e-12)


@pytest.mark.parametrize("mask, want", [
    ([0, 1, 1, 0, 1, 1, 1, 0], (4.0, 6.0)),        # the longest run, inside
    ([1, 0, 0, 1, 1, 1, 1, 1], (3.0, 7.0)),        # ending at the last ratio
    ([1, 1, 0, 1, 1, 0, 0, 0], (0.0, 1.0)),        # ties: the first
    ([0, 0, 0, 1, 0, 0, 0, 0], (3.0, 3.0)),        # one ratio
    ([0] * 8, None),
])
def test_rank_band_is_the_longest_run(mask, want):
    from lowrank_fl.clair.pipeline import longest_run

    assert longest_run(np.arange(8.0), np.array(mask, bool)) == want
