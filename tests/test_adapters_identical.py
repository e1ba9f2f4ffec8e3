"""Clients whose updates are all the same to rounding: (7) has zero contrasts and nothing is solved.

Solved on what the reduction leaves (rounding), (7) used to report "optimal" with relative duality
gaps of -0.2 to 0.5 and flag clients of identical adapters in the per-module sets (8)."""
from __future__ import annotations

import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.degenerate import IDENTICAL_RULE


def _same(K=6, modules=3, q=24, p=20, r=4, eps=0.0, seed=0):
    """K copies of one adapter per module (float32 values, as a file holds them); client 0's B
    moved by ``eps`` (relative)."""
    rng = np.random.default_rng(seed)
    out = {f"c{k}": {} for k in range(K)}
    for m in range(modules):
        A = rng.standard_normal((r, p)).astype(np.float32).astype(float)
        B = rng.standard_normal((q, r)).astype(np.float32).astype(float)
        E = rng.standard_normal((q, r))
        for k in range(K):
            Bk = B + (eps * np.linalg.norm(B) / np.linalg.norm(E) * E if k == 0 else 0.0)
            out[f"c{k}"][f"layer{m}.q_proj"] = (A.copy(), Bk, 2.0)
    return out


@pytest.mark.parametrize("refine", ["exchangeable", "paper"])
@pytest.mark.parametrize("lam", [None, (0.1, 0.05)])
def test_identical_clients_solve_nothing_flag_nobody_and_keep_their_adapters(refine, lam):
    f = _same()
    opts = ModuleOptions(output_dtype="float64", **({} if lam is None else dict(lam_L=lam[0], lam_S=lam[1])))
    res = aggregate_factors(f, opts, refine=refine)
    s = res.summary
    assert s["detection"]["flagged"] == []
    for m in s["modules"].values():
        assert (m["status"], m["relative_gap"], m["iterations"], m["lam_rule"]) == ("optimal", 0.0, 0, IDENTICAL_RULE)
        assert m["benign"] == [True] * 6 and m["block_norms"] == [0.0] * 15
        assert (m["lam_L"], m["lam_S"]) == ((None, None) if lam is None else lam)
    for k, name in enumerate(f):
        for mod, (A, B, sc) in f[name].items():
            A_out, B_out, s_out = res.outputs[name][mod]
            got = s_out * B_out @ A_out
            # (9) with M̄ = M_k returns M_k (up to the reduction's rounding)
            np.testing.assert_allclose(got, sc * B @ A, rtol=0, atol=1e-12 * np.abs(sc * B @ A).max())


@pytest.mark.parametrize("eps", [1e-1, 1e-3, 1e-5, 1e-6])
def test_one_client_apart_from_identical_ones_is_solved_and_certified(eps):
    # client 0 is eps (relative) from five identical clients: the ten pairs of identical clients
    # have zero contrasts (exactly, not the reduction's rounding), the five others are solved. The
    # factored form cannot hold a contrast 1e-5 of the updates (its Grams cancel to ~1e-6: its
    # certificate broke, or crawled to max_iter): "auto" then forms the dense contrasts from the
    # start, and both must agree with the dense solve asked for
    fac = aggregate_factors(_same(eps=eps), ModuleOptions(output_dtype="float64")).summary
    den = aggregate_factors(_same(eps=eps), ModuleOptions(output_dtype="float64", contrasts="dense")).summary
    for name, m in fac["modules"].items():
        d = den["modules"][name]
        assert m["lam_rule"] == d["lam_rule"] == "band"
        assert m["contrasts"] == ("factored" if eps >= 1e-3 else "dense (clients within 1e-4 of each other)")
        assert d["contrasts"] == "dense"
        for r in (m, d):
            assert r["status"] == "optimal" and abs(r["relative_gap"]) <= 1e-6
            assert r["iterations"] <= 50            # 1275-2000 before the zero pairs were exact
            assert r["contrast_norms"][5:] == r["block_norms"][5:] == [0.0] * 10
            assert min(r["contrast_norms"][:5]) > 0
        # λ's scale comes from the contrast norms, which the factored form holds to ~1e-16 / eps^2
        np.testing.assert_allclose(m["lam_L"], d["lam_L"], rtol=1e-3)
        assert m["benign"] == d["benign"]
        # the contrast norms are the data's (the factored form's Grams hold them to ~1e-16 / eps^2);
        # after the projection of (8) they are rounding on both paths (P′ holds the one contrast)
        np.testing.assert_allclose(m["contrast_norms"], d["contrast_norms"], rtol=1e-9, atol=0)
        c = max(d["contrast_norms"])
        np.testing.assert_allclose(m["block_norms"], d["block_norms"], rtol=0, atol=1e-6 * c)


def test_contrast_scale_ignores_exactly_zero_pairs():
    from lowrank_fl.adapters.tuning import data_scale
    D = np.zeros((4 * 3, 5))
    D[:3] = 2.0 / np.sqrt(15)                   # one pair of four at Frobenius norm 2
    assert data_scale(D, 3, rank=2) == pytest.approx(2.0 / 2.0)
    assert data_scale(np.zeros((6, 5)), 3, rank=2) == 0.0


def test_a_factored_solve_that_ends_uncertified_is_solved_again_on_the_dense_contrasts(monkeypatch):
    # the fallback for what the up-front test does not foresee: any factored solve of (7) that
    # ends "inaccurate", "stalled" or at max_iter is solved again on the dense contrasts
    import dataclasses

    from lowrank_fl.adapters import aggregate as agg
    from lowrank_fl.clair.factored import PairContrasts

    real = agg.solve_module

    def uncertified(D, *a, **kw):
        sol = real(D, *a, **kw)
        return dataclasses.replace(sol, status="max_iter") if isinstance(D, PairContrasts) else sol

    monkeypatch.setattr(agg, "solve_module", uncertified)
    f = _same(eps=1e-1)
    got = aggregate_factors(f, ModuleOptions(output_dtype="float64")).summary
    want = aggregate_factors(f, ModuleOptions(output_dtype="float64", contrasts="dense")).summary
    for name, m in got["modules"].items():
        assert m["contrasts"] == "dense (factored: max_iter)" and m["status"] == "optimal"
        assert m["benign"] == want["modules"][name]["benign"]
        np.testing.assert_allclose(m["block_norms"], want["modules"][name]["block_norms"], rtol=0,
                                   atol=1e-6 * max(want["modules"][name]["contrast_norms"]))
    # asked for explicitly, the factored form is kept and its status reported
    kept = aggregate_factors(f, ModuleOptions(output_dtype="float64", contrasts="factored")).summary
    assert all(m["contrasts"] == "factored" and m["status"] == "max_iter" for m in kept["modules"].values())
