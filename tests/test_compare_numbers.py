"""compare/: the certificates' scales, the comparison's rank and lower bound, the memory
estimates, each against a hand computation or an independent CVXPY optimum."""
import cvxpy as cp
import numpy as np
import pytest

from lowrank_fl.clair import contrasts, solve_penalized
from lowrank_fl.clair.simulate import generate
from lowrank_fl.compare import compare_clair, compare_noiseless, runners
from lowrank_fl.compare.certify import NoiselessCertifier, numerical_rank
from lowrank_fl.compare.methods import estimate_memory


def _block_norms(D, q):
    return np.linalg.norm(D.reshape(-1, q, D.shape[1]), axis=(1, 2))


# --------------------------------------------------------------------------------------------
# (24)'s scale: the better (smaller) of the two trivial feasible points
@pytest.mark.parametrize("lam_L, lam_S", [(1.0, 0.05), (0.05, 1.0), (0.3, 0.3)])
def test_noiseless_scale_is_the_smaller_trivial_objective(lam_L, lam_S):
    inst = generate(n_clients=4, p=4, q=3, rank=2, contaminated=1, noise=0.0, seed=2)
    D = contrasts(inst.W)
    nuc = np.linalg.svd(D, compute_uv=False).sum()
    blk = _block_norms(D, 3).sum()
    c = NoiselessCertifier(D, 3, 4, lam_L, lam_S)
    assert c.scale == pytest.approx(min(lam_L * nuc, lam_S * blk), rel=1e-13)
    # each trivial point's certified objective is one of the two, the scale the smaller
    objs = [c.certify({"L": D, "Q": np.zeros_like(D)})["objective"],
            c.certify({"L": np.zeros_like(D), "Q": np.zeros_like(D)})["objective"]]
    assert sorted(objs) == pytest.approx(sorted([lam_L * nuc, lam_S * blk]), rel=1e-12)
    assert c.scale == pytest.approx(min(objs), rel=1e-12)


def test_noiseless_comparison_reports_that_scale():
    inst = generate(n_clients=4, p=4, q=3, rank=2, contaminated=1, noise=0.0, seed=2)
    D = contrasts(inst.W)
    lam_L, lam_S = 1.0, 1.0 / np.sqrt(inst.s)
    c = compare_noiseless(inst.W, lam_L, lam_S, methods=["cvxpy:CLARABEL"])
    nuc = np.linalg.svd(D, compute_uv=False).sum()
    blk = _block_norms(D, 3).sum()
    assert lam_L * nuc != pytest.approx(lam_S * blk, rel=1e-2)
    assert c.scale == pytest.approx(min(lam_L * nuc, lam_S * blk), rel=1e-12)


# --------------------------------------------------------------------------------------------
# the comparison's rank and lower bound come from the best-certified method
@pytest.fixture(scope="module")
def small():
    inst = generate(n_clients=5, p=4, q=4, rank=2, contaminated=1, noise=1e-3, seed=3)
    lam_L = 1e-2
    return inst, lam_L, float(lam_L / np.sqrt(inst.s))


def _cvxpy_optimum(D, q, lam_L, lam_S, K):
    G = D.shape[0] // q
    L, S = cp.Variable(D.shape), cp.Variable(D.shape)
    R = D - L - S
    obj = sum(0.5 / K * cp.sum_squares(R[g * q:(g + 1) * q]) + lam_S * cp.norm(S[g * q:(g + 1) * q], "fro")
              for g in range(G)) + lam_L * cp.normNuc(L)
    prob = cp.Problem(cp.Minimize(obj))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert prob.status == "optimal"
    return float(prob.value)


def _crafted_runner(data, kind, solver, nuclear, options):
    """``proxgrad`` returns a poor point of full rank (the optimum plus a full-rank bump);
    ``fista`` the optimum."""
    out = runners.run_clair(data, "iterative", None, None, {**options, "method": "fista"})
    if options["method"] == "proxgrad":
        D = data["D"]
        bump = np.zeros_like(D)
        bump[:D.shape[1]] = 0.05 * np.eye(D.shape[1]) * np.abs(D).max()
        out["point"]["L"] = out["point"]["L"] + bump
    return out


def test_rank_and_lower_bound_from_the_best_certified_method(small, monkeypatch):
    inst, lam_L, lam_S = small
    monkeypatch.setitem(runners.RUNNERS, "clair", _crafted_runner)
    # the poor method first, so "the first" or "the worst" picks differ from "the best"
    c = compare_clair(inst.W_hat, lam_L, lam_S, methods=["proxgrad", "fista"], tol=1e-10)
    poor, good = c.row("proxgrad"), c.row("fista")
    assert poor.relative_gap > 100 * max(good.relative_gap, 1e-12)
    assert poor.dual < good.dual
    assert poor.rank > good.rank == 2
    assert c.settings["rank"] == good.rank == 2
    assert "fista" in c.settings["rank_rule"]
    assert c.lower_bound == good.dual and c.lower_bound_method == "fista"
    # the certified lower bound brackets the optimum computed independently by CVXPY
    D = contrasts(inst.W_hat)
    p_star = _cvxpy_optimum(D, 4, lam_L, lam_S, 5)
    assert c.lower_bound <= p_star + 1e-9 * c.scale
    assert p_star - c.lower_bound <= 1e-8 * c.scale
    assert good.objective >= p_star - 1e-9 * c.scale and poor.objective > p_star


def test_rank_rule_given_and_numerical_rank(small):
    inst, lam_L, lam_S = small
    D = contrasts(inst.W_hat)
    ref = solve_penalized(D, 4, lam_L, lam_S, tol=1e-10, max_iter=100_000)
    s = np.linalg.svd(ref.L, compute_uv=False)
    assert numerical_rank(ref.L, np.linalg.norm(D, 2)) == int(np.sum(s > 1e-6 * np.linalg.norm(D, 2)))
    c = compare_clair(inst.W_hat, lam_L, lam_S, methods=["fista"], tol=1e-10, rank=3)
    assert c.settings["rank"] == 3 and c.settings["rank_rule"] == "given"


# --------------------------------------------------------------------------------------------
# memory estimates: the block-Schur form has G cones of size q + p
def _svec(n):
    return n * (n + 1) / 2


@pytest.mark.parametrize("K, q, p", [(5, 4, 4), (20, 10, 10), (8, 3, 7)])
def test_schur_memory_estimate_counts_every_cone(K, q, p):
    G = K * (K - 1) // 2
    sizes = {"rows": G * q, "cols": p, "blocks": G, "block_rows": q}
    scalars = 2 * G * q * p + G * _svec(q + p)
    ipm = 8.0 * _svec(q + p) ** 2 * G + 4096.0 * scalars
    assert estimate_memory("clair", "conic", "CLARABEL", "schur", sizes) == pytest.approx(ipm, rel=1e-14)
    fo = 4 * 8.0 * (q + p) ** 2 * G + 4096.0 * scalars
    assert estimate_memory("clair", "conic", "SCS", "schur", sizes) == pytest.approx(fo, rel=1e-14)
    n = G * q + p
    nn = 8.0 * _svec(n) ** 2 + 4096.0 * (2 * G * q * p + _svec(n))
    assert estimate_memory("clair", "conic", "CLARABEL", "normNuc", sizes) == pytest.approx(nn, rel=1e-14)
    assert estimate_memory("clair", "iterative", None, None, sizes) == 16 * 8.0 * G * q * p
