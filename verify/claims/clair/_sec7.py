"""CLAIR claims, §7 simulation: Tables 1-2 reproduction, FedAvg negative transfer and the
contamination-variance reading (§7, Tables 1-2).

Design: :func:`lowrank_fl.clair.simulate.simulate` (40% contaminated, local OLS). CLAIR is
:func:`lowrank_fl.clair.pipeline.fit` with w_g = 1/K, alpha = 0.5, the "largest-gap" tau_n and
lam_L = c1 K^{-1/2}, lam_S = c2 K^{-3/2}. The paper does not report c1, c2; our rule (per
configuration): c1 = 1 and lam_S/lam_L = c2/(c1 K) is the geometric midpoint of the band of
ratios where rank(Lhat) = r on a pilot replicate with its own seed (``lambda_path``; ratios
c2/c1 in [1, 12] on a log grid). Table 1's "CLAIR" is the average over all K clients with
excluded clients at their local OLS estimate (inferred from Table 1's numbers; the paper does not say).

Tables 1 and 2 come from the same runs: ``clair.sec7.table2`` evaluates its runs under the seeds
of ``clair.sec7.table1`` (the sweep cache serves them once).
"""
from __future__ import annotations

import warnings

import numpy as np

from lowrank_fl.clair.pipeline import (detection_counts, fedavg, fit, lambda_path, oracle_fedavg)
from lowrank_fl.clair.simulate import simulate

from ...claim import SOLVES_KEY, Evidence, claim, solve_record, verdict_from
from ...criteria import relaxation
from ._support import t3

__all__: list[str] = []

R = 2
CONFIGS = [(10, 10, 100), (20, 20, 150), (50, 50, 300)]
KS = (5, 10, 20)
# Paper's Table 1: (p, K) -> (Local, CLAIR, FedAvg (Oracle), FedAvg); Table 2: (accuracy, recall)
TABLE1 = {(10, 5): (1.121, 1.109, 6.102, 15.262), (10, 10): (1.117, 0.722, 7.457, 17.094),
          (10, 20): (1.126, 0.648, 8.156, 18.144), (20, 5): (3.085, 2.055, 24.715, 35.575),
          (20, 10): (3.093, 1.735, 29.977, 38.623), (20, 20): (3.097, 1.581, 32.617, 41.660),
          (50, 5): (10.052, 6.070, 148.871, 179.855), (50, 10): (10.054, 5.146, 183.551, 201.606),
          (50, 20): (10.041, 4.678, 200.977, 212.679)}
TABLE2 = {(10, 5): (0.980, 0.990), (10, 10): (1.0, 1.0), (10, 20): (1.0, 1.0), (20, 5): (1.0, 1.0),
          (20, 10): (1.0, 1.0), (20, 20): (1.0, 1.0), (50, 5): (0.916, 0.790), (50, 10): (0.920, 0.800),
          (50, 20): (0.900, 0.750)}
_E_C2 = np.mean(np.array([3, 4, 5, 6]) ** 2)      # 21.5
_SOLVER = {"tol": 1e-4, "max_iter": 5000}          # relative duality gap; P_Ahat stable to ~1e-6 (pilot)


# --------------------------------------------------------------------------------------------
# analytic predictions (local OLS error q p/(n - p - 1); FedAvg bias from the §7 design)
def _pred_local(p, q, n):
    return q * p / (n - p - 1)


def _pred_oracle_fedavg(p, q, n, K):
    m = K - int(round(0.4 * K))
    mb = 0.64 * q * p * R / 9
    loc = _pred_local(p, q, n)
    return (m / K) * ((1 - 1 / m) * mb + loc / m) + (1 - m / K) * loc


def _pred_fedavg(p, q, n, K, variant="unit-variance"):
    m = K - int(round(0.4 * K))
    mb = 0.64 * q * p * R / 9
    mc = _E_C2 * p / (p - R) * (1.0 if variant == "unit-variance" else 1 / 3)
    return (1 - 1 / K) * ((m / K) * mb + (1 - m / K) * mc) + _pred_local(p, q, n) / K


def _pred_oracle_clair(p, q, n, K):
    m = K - int(round(0.4 * K))
    loc = _pred_local(p, q, n)
    return (m / K) * (1 - (m - 1) * (p - R) / (m * p)) * loc + (1 - m / K) * loc


# --------------------------------------------------------------------------------------------
# tasks
def _ols(inst):
    return np.asarray(inst.W_hat)


def _shrunk_ols(inst):
    """Broken variant: a biased (shrunken) local estimator."""
    return 0.5 * np.asarray(inst.W_hat)


def _fedavg_is_local(W_hat):
    """Broken variant: a "FedAvg" that returns the local estimates."""
    return np.asarray(W_hat, float).copy()


def _client_mse(est, W):
    return float(np.mean(np.sum((est - W) ** 2, axis=(1, 2))))


def _task_pilot(seed, p, q, n, K, variant, n_ratios):
    """Choose lam_S/lam_L (with lam_L = K^{-1/2}) as the middle of the rank(Lhat) = r band."""
    inst = simulate(p=p, q=q, n_clients=K, samples_per_client=n, rank=R, variant=variant, seed=seed)
    ratios = np.geomspace(1.0, 12.0, n_ratios) / K
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = lambda_path(inst.W_hat, K ** -0.5, ratios, rank=R, **_SOLVER)
    ranks = path.numerical_rank[0]
    if path.band is not None:
        ratio = float(np.sqrt(path.band[0] * path.band[1]))
    else:  # no ratio gives rank r: the smallest ratio with rank >= r (or the largest ratio)
        above = np.flatnonzero(ranks >= R)
        ratio = float(ratios[above[0]] if above.size else ratios[-1])
    return {"ratio": ratio, "ranks": ranks.tolist(), "ratios": ratios.tolist(), "band": path.band}


def _task_sec7(seed, p, q, n, K, variant, ratio, estimator, tau):
    inst = simulate(p=p, q=q, n_clients=K, samples_per_client=n, rank=R, variant=variant, seed=seed)
    W = np.asarray(inst.W)
    W_hat = estimator(inst)
    lam_L = K ** -0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit(W_hat, lam_L, ratio * lam_L, rank=R, alpha=0.5, tau=tau, **_SOLVER)
    counts = detection_counts(res.benign, inst.benign)
    # Algorithm 1's P_Ahat is the top-r right singular subspace of L_hat: re-derived here from an
    # independent SVD of the returned L_hat (judged only with a clear singular gap sigma_r > 2 sigma_r+1
    # and sigma_r above rounding, 1e-6 sigma_1 as clair.fit's numerical rank: below that the top-r
    # subspace is LAPACK's arbitrary completion, not a property of L_hat)
    s_L, V_L = np.linalg.svd(np.asarray(res.solution.L), full_matrices=False)[1:]
    # (the 1e-6 sigma_1 floor was added after a run; the original check, gap alone, is kept for the
    # report's relaxation record)
    gap_only = bool(s_L[R - 1] > 2 * (s_L[R] if s_L.size > R else 0.0))
    gap_ok = gap_only and s_L[R - 1] > 1e-6 * s_L[0]
    dev = float(np.linalg.norm(res.projector - V_L[:R].T @ V_L[:R], 2))
    proj_dev = dev if gap_ok else float("nan")
    proj_dev_gap_only = dev if gap_only else float("nan")
    # tau_n of a separated split is the midpoint of the largest gap of the sorted pair norms (§7's
    # "largest gap", our reading), re-derived from the returned norms
    tau_dev = float("nan")
    if tau == "largest-gap" and res.separated:
        x = np.sort(np.asarray(res.block_norms))
        i = int(np.argmax(np.diff(x)))
        tau_dev = float(abs(res.tau - 0.5 * (x[i] + x[i + 1])) / x[-1])
    return {"local": _client_mse(W_hat, W), "clair": _client_mse(res.refined, W),
            "oracle_fedavg": _client_mse(oracle_fedavg(W_hat, inst.benign), W),
            "fedavg": _client_mse(fedavg(W_hat), W), "c": float(inst.params["c"]),
            "P_err": float(np.linalg.norm(res.projector - np.asarray(inst.projector), 2)),
            "accuracy": counts.accuracy, "recall": counts.contaminated_recall, "tp": counts.tp,
            "tn": counts.tn, "fp": counts.fp, "fn": counts.fn, "exact": counts.exact,
            "status": res.solution.status, "gap": float(res.solution.gap), "numerical_rank": int(res.numerical_rank),
            "projector_deviation": proj_dev, "projector_deviation_gap_only": proj_dev_gap_only,
            "tau_deviation": tau_dev,
            SOLVES_KEY: [solve_record(res.solution, tol=10 * _SOLVER.get("tol", 1e-8), what="program (7) in clair.fit")]}


def _task_baselines(seed, p, q, n, K, variant, fedavg_fn=fedavg):
    inst = simulate(p=p, q=q, n_clients=K, samples_per_client=n, rank=R, variant=variant, seed=seed)
    W, W_hat = np.asarray(inst.W), np.asarray(inst.W_hat)
    return {"local": _client_mse(W_hat, W), "fedavg": _client_mse(fedavg_fn(W_hat), W),
            "oracle_fedavg": _client_mse(oracle_fedavg(W_hat, inst.benign), W), "c": float(inst.params["c"])}


# --------------------------------------------------------------------------------------------
def _configs(ctx):
    return ctx.pick(smoke=[(10, 10, 100, 10)],
                    quick=[(10, 10, 100, 5), (10, 10, 100, 10), (10, 10, 100, 20), (20, 20, 150, 5),
                           (20, 20, 150, 10)],
                    full=[(p, q, n, K) for p, q, n in CONFIGS for K in KS])


def _sec7_runs(ctx, *, estimator, tau, variant="unit-variance"):
    """Pilot + main runs under the seeds of ``clair.sec7.table1`` (shared by Tables 1 and 2)."""
    configs = _configs(ctx)
    reps = ctx.pick(smoke=3, quick=8, full=100)
    pilot_ctx = ctx.for_claim("clair.sec7.table1/pilot")
    pilots = pilot_ctx.map(_task_pilot, [{"p": p, "q": q, "n": n, "K": K, "variant": variant,
                                          "n_ratios": ctx.pick(7, 9, 11)} for p, q, n, K in configs],
                           replicates=1)
    main_ctx = ctx.for_claim("clair.sec7.table1")
    grid = [{"p": p, "q": q, "n": n, "K": K, "variant": variant, "ratio": pl[0]["ratio"],
             "estimator": estimator, "tau": tau} for (p, q, n, K), pl in zip(configs, pilots)]
    out = main_ctx.map(_task_sec7, grid, replicates=reps)
    ctx.seeds_used.extend(pilot_ctx.seeds_used + main_ctx.seeds_used)
    return configs, [pl[0] for pl in pilots], out


def _ms(values):
    x = np.asarray(values, dtype=float)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan")


def _close(mean, se, n, ref, frac) -> bool | None:
    """Is the mean within ``frac * |ref|`` of ``ref``? True/False, or None when the check cannot tell.

    With the Monte Carlo half-width ``h = t * s.e.`` (``t``: 3-s.e. Student-t multiplier): False when
    even ``|mean - ref| - h`` exceeds the band (clearly outside); None when ``h`` exceeds the band (the
    replicates cannot resolve the stated tolerance); otherwise ``|mean - ref| <= band``.
    """
    half, band, dev = t3(n) * se, frac * abs(ref), abs(mean - ref)
    if not np.isfinite(half):
        return None
    if dev - half > band:
        return False
    if half > band:
        return None
    return bool(dev <= band)


def _negative(mean, se, n) -> bool | None:
    """Is the (paired) mean difference < 0 (strictly)? Three-way on the interval mean ± t s.e.:
    True if the interval lies below 0, False if it lies at or above 0, None if it straddles 0."""
    half = t3(n) * se
    if not np.isfinite(half):
        return None
    return True if mean + half < 0 else (False if mean - half >= 0 else None)


def _families_verdict(checks: dict) -> bool | None:
    """False if any judged check fails; True if every family has a judged check and all pass."""
    flat = [c for v in checks.values() for c in v]
    if False in flat:
        return False
    if all(any(c is not None for c in v) for v in checks.values() if v):
        return True
    return None


def _count(v) -> str:
    return f"{sum(c is True for c in v)}/{sum(c is not None for c in v)} judged of {len(v)}"


def _why_unjudged(checks: dict, resolution: dict, replicates: int) -> str:
    """Why a family has no judged check, for the summary: a tolerance check is left undecided when
    the Monte Carlo half-width t * s.e. exceeds its band (``resolution`` holds that ratio per
    setting), which few replicates (smoke, quick) cannot resolve."""
    reasons = []
    for k, v in checks.items():
        if not v or any(c is not None for c in v):
            continue
        r = [x for x in resolution.get(k, []) if np.isfinite(x)]
        if r:
            span = f"{min(r):.1f}" if f"{min(r):.1f}" == f"{max(r):.1f}" else f"{min(r):.1f}-{max(r):.1f}"
            reasons.append(f"{k}: the half-width t * s.e. is {span} times the band")
        elif k == "clair_lt_local":
            reasons.append(f"{k}: every paired interval straddles 0")
        elif k == "projector_is_top_r":
            reasons.append(f"{k}: no replicate had a clear singular gap")
        else:
            reasons.append(f"{k}: the interval is not finite")
    if not reasons:
        return ""
    return (f". Not judged with {replicates} replicates per setting (full scale runs 100): "
            + "; ".join(reasons))


def _fedavg_cv(o, p, K, variant="unit-variance"):
    """FedAvg error with the replicate-level signal c as control variate.

    FedAvg's expected error is linear in c^2 (coefficient (1 - 1/K)(|C^c|/K) p/(p-r) v, v the
    entry variance) and E c^2 = 21.5 is known, so subtracting that term's deviation keeps the mean
    and removes the dominant (4-point) variance of c.
    """
    v = 1.0 if variant == "unit-variance" else 1 / 3
    nc = int(round(0.4 * K))
    return o["fedavg"] - (1 - 1 / K) * (nc / K) * (o["c"] ** 2 - _E_C2) * p / (p - R) * v


def _fmt(m, s):
    return f"{m:.3f} ± {s:.3f}"


#: plausible c2 (lam_S = c2 K^{-3/2}, lam_L = K^{-1/2}): a factor 2 either side of Theorem 2's c2 = 3;
#: the paper does not report its lambdas, so its CLAIR column is compared with this band
C2_BAND = (1.5, 3.0, 6.0)


def _lambda_band(ctx, configs, estimator, tau, variant="unit-variance"):
    """CLAIR's MSE at each c2 of :data:`C2_BAND` (fewer replicates than the main runs)."""
    sub = ctx.for_claim("clair.sec7.table1/lambda")
    grid = [{"p": p, "q": q, "n": n, "K": K, "variant": variant, "ratio": c2 / K, "estimator": estimator,
             "tau": tau} for p, q, n, K in configs for c2 in C2_BAND]
    out = sub.map(_task_sec7, grid, replicates=ctx.pick(smoke=4, quick=6, full=20))
    ctx.seeds_used.extend(sub.seeds_used)
    return [[_ms([o["clair"] for o in out[i * len(C2_BAND) + j]]) + (len(out[i * len(C2_BAND) + j]),)
             for j in range(len(C2_BAND))] for i in range(len(configs))]


@claim("clair.sec7.table1", paper="clair", reference="§7, Table 1",
       statement="Mean squared coefficient error over all clients: FedAvg >> Local, CLAIR < Local in every "
                 "setting (Table 1), with Local = qp/(n-p-1) and CLAIR near the oracle-gain prediction.",
       kind="comparison")
def _table1(ctx, *, estimator=_ols, tau="largest-gap"):
    configs, pilots, out = _sec7_runs(ctx, estimator=estimator, tau=tau)
    bands = _lambda_band(ctx, configs, estimator, tau)
    rows, checks = [], {"local_2pct": [], "fedavg_5pct": [], "oracle_fedavg_5pct": [], "clair_lt_local": [],
                        "clair_vs_oracle_10pct": [], "clair_paper_in_lambda_band": [], "projector_is_top_r": []}
    original_projector = []         # the projector check as first written (singular gap only)
    resolution = {k: [] for k in checks}   # half-width / band of each tolerance check (> 1: undecided)
    for (p, q, n, K), pl, reps, lam in zip(configs, pilots, out, bands):
        get = {key: _ms([o[key] for o in reps]) for key in ("local", "clair", "oracle_fedavg")}
        get["fedavg"] = _ms([_fedavg_cv(o, p, K) for o in reps])
        nr = len(reps)
        diff = _ms([o["clair"] - o["local"] for o in reps])
        paper = TABLE1[(p, K)]
        pl_, po, pf, pc = (_pred_local(p, q, n), _pred_oracle_fedavg(p, q, n, K), _pred_fedavg(p, q, n, K),
                           _pred_oracle_clair(p, q, n, K))
        def tol(family, m, s, ref, frac, nr=nr):
            resolution[family].append(t3(nr) * s / (frac * abs(ref)))
            checks[family].append(_close(m, s, nr, ref, frac))

        tol("local_2pct", *get["local"], pl_, 0.02)
        tol("fedavg_5pct", *get["fedavg"], paper[3], 0.05)
        tol("oracle_fedavg_5pct", *get["oracle_fedavg"], paper[2], 0.05)
        checks["clair_lt_local"].append(_negative(*diff, nr))
        if p >= 20:
            tol("clair_vs_oracle_10pct", *get["clair"], pc, 0.10)
        # the paper's CLAIR number against our lambda-sensitivity band: inside [min, max] of the mean
        # MSE over C2_BAND, widened by each end's Monte Carlo half-width (t * s.e.)
        lo = min(m - t3(k) * se for m, se, k in lam)
        hi = max(m + t3(k) * se for m, se, k in lam)
        checks["clair_paper_in_lambda_band"].append(None if not np.isfinite(lo + hi) else bool(lo <= paper[1] <= hi))
        deficient = float(np.mean([o["numerical_rank"] < R for o in reps]))
        devs = [o["projector_deviation"] for o in reps if np.isfinite(o["projector_deviation"])]
        # 1e-8: two SVDs of the same L_hat agree to rounding on a subspace with a singular gap >= 2x
        checks["projector_is_top_r"].append(bool(max(devs) <= 1e-8) if devs else None)
        devs0 = [o["projector_deviation_gap_only"] for o in reps if np.isfinite(o["projector_deviation_gap_only"])]
        original_projector.append(bool(max(devs0) <= 1e-8) if devs0 else None)
        band = pl["band"]
        rows.append({"(p,q)": f"({p},{q})", "n": n, "K": K, "c1": 1.0, "c2": pl["ratio"] * K,
                     "pilot c2 band (rank r)": None if band is None else [band[0] * K, band[1] * K],
                     "Local (paper)": paper[0], "Local (ours)": _fmt(*get["local"]), "Local (qp/(n-p-1))": pl_,
                     "CLAIR (paper)": paper[1], "CLAIR (ours)": _fmt(*get["clair"]), "CLAIR (oracle pred.)": pc,
                     "CLAIR over c2 " + "/".join(map(str, C2_BAND)): [round(m, 3) for m, _, _ in lam],
                     "rank(L_hat) < r (fraction, completed)": deficient,
                     "FedAvg-O (paper)": paper[2], "FedAvg-O (ours)": _fmt(*get["oracle_fedavg"]),
                     "FedAvg-O (pred.)": po, "FedAvg (paper)": paper[3], "FedAvg (ours)": _fmt(*get["fedavg"]),
                     "FedAvg (pred., unit var.)": pf,
                     "||P_Ahat-P_A||": float(np.mean([o["P_err"] for o in reps]))})
    passed = _families_verdict(checks)
    summary = ("passing/judged: " + ", ".join(f"{k}: {_count(v)}" for k, v in checks.items())
               + _why_unjudged(checks, resolution, min(len(r) for r in out)))
    fig_path = _table1_figure(ctx, rows)
    judged0 = [x for x in original_projector if x is not None]
    relaxed = [x for x in checks["projector_is_top_r"] if x is not None]
    relax = relaxation(
        "P_Ahat equals the top-r right singular subspace of an independent SVD of L_hat (to 1e-8) in "
        "every replicate with a singular gap sigma_r > 2 sigma_r+1", all(judged0) if judged0 else None,
        relaxed="the same, judged only where also sigma_r > 1e-6 sigma_1 (clair.fit's numerical rank)",
        relaxed_outcome=all(relaxed) if relaxed else None,
        reason="changed after a run: where L_hat's r-th singular value is at rounding level, the top-r "
               "subspace is LAPACK's arbitrary completion of a numerically rank-deficient matrix, and two "
               "SVDs need not return the same one (a derivation, not a property of the data)")
    return Evidence(verdict=verdict_from(passed), summary=summary, table=rows, figure=fig_path,
                    measured={"checks": {k: [None if x is None else bool(x) for x in v] for k, v in checks.items()},
                              "c2": [row["c2"] for row in rows]}, relaxations=[relax],
                    predicted={"local": [row["Local (qp/(n-p-1))"] for row in rows],
                               "oracle_clair": [row["CLAIR (oracle pred.)"] for row in rows]},
                    notes="The paper's CLAIR column is compared with our lambda-sensitivity band (c2 in "
                          f"{C2_BAND}, lam_S = c2 K^(-3/2), lam_L = K^(-1/2); the paper does not report its "
                          "lambdas): it must lie inside the band's range widened by the Monte Carlo half-width. "
                          "When L_hat has numerical rank below r (column 'rank(L_hat) < r'), P_A_hat is "
                          "completed to rank r by the next right singular vectors of L_hat (clair.fit, "
                          "rank_mode='top'): directions of a numerically zero part, i.e. LAPACK's basis; the "
                          "completion moves cells (e.g. (10,10), K = 5 from 0.961 to 0.881 against "
                          "rank_mode='numerical'). "
                          "Tolerance checks (stated %): not judged (None) where the Monte Carlo half-width t * s.e. "
                          "(t: Student-t multiplier of a 3-s.e. band) exceeds the band, failed where the mean is "
                          "outside the band by more than t * s.e.; CLAIR < Local on the paired difference's "
                          "interval. Verdict: fails if any judged check fails, holds if every family has a "
                          "judged check and all pass, else inconclusive; at smoke and quick scale (3 and 8 replicates) "
                          "the half-widths usually exceed the 2-10% bands, so those checks are not judged (None, "
                          "shown as a dash) and the summary says by how much. FedAvg uses the signal c as control variate (its mean is unchanged). Contamination: unit-variance reading (see "
                          "clair.sec7.contamination_variance). c1 = 1, c2 from the pilot rank band rule; "
                          "FISTA with relative duality gap 1e-4.")


def _table1_figure(ctx, rows):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = [f"{r['(p,q)']} K={r['K']}" for r in rows]
    x = np.arange(len(rows))
    for key, mk in [("Local (ours)", "o"), ("CLAIR (ours)", "s")]:
        ax.plot(x, [float(r[key].split(" ± ")[0]) / r["Local (qp/(n-p-1))"] for r in rows], mk, label=key)
    ax.plot(x, [r["CLAIR (paper)"] / r["Local (qp/(n-p-1))"] for r in rows], "x", label="CLAIR (paper)")
    ax.plot(x, [r["CLAIR (oracle pred.)"] / r["Local (qp/(n-p-1))"] for r in rows], "_", ms=14,
            label="oracle-CLAIR pred.")
    ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("MSE / (qp/(n-p-1))")
    ax.legend(fontsize=7)
    return ctx.save_figure(fig)


@claim("clair.sec7.table2", paper="clair", reference="§7, Table 2; Theorem 3",
       statement="Collaborative-set recovery in the §7 simulation: accuracy ≈ 1 for p <= 20 (Table 2), "
                 "with contaminated recall reported as in the paper; tau_n is the midpoint of the largest gap "
                 "of the pair norms (our reading of §7's rule).", kind="comparison")
def _table2(ctx, *, estimator=_ols, tau="largest-gap"):
    configs, pilots, out = _sec7_runs(ctx, estimator=estimator, tau=tau)
    rows, ok = [], []
    for (p, q, n, K), reps in zip(configs, out):
        acc, rec = _ms([o["accuracy"] for o in reps]), _ms([o["recall"] for o in reps])
        paper = TABLE2[(p, K)]
        if p <= 20:
            ok.append(acc[0] >= 0.95)
        devs = [o["tau_deviation"] for o in reps if np.isfinite(o["tau_deviation"])]
        if devs:                        # 1e-9 relative: a midpoint recomputed from the same norms
            ok.append(max(devs) <= 1e-9)
        rows.append({"(p,q)": f"({p},{q})", "n": n, "K": K, "accuracy (paper)": paper[0],
                     "accuracy (ours)": _fmt(*acc), "recall (paper)": paper[1], "recall (ours)": _fmt(*rec),
                     "TP": float(np.mean([o["tp"] for o in reps])), "TN": float(np.mean([o["tn"] for o in reps])),
                     "FP": float(np.mean([o["fp"] for o in reps])), "FN": float(np.mean([o["fn"] for o in reps])),
                     "P(Chat=C)": float(np.mean([o["exact"] for o in reps])),
                     # flagged: our detection is better than the paper's beyond Monte Carlo error
                     "accuracy above the paper's": bool(acc[0] - t3(len(reps)) * acc[1] > paper[0])
                     if np.isfinite(acc[1]) else bool(acc[0] > paper[0])})
    passed = all(ok) if ok else None
    above = [r for r in rows if r["accuracy above the paper's"]]
    return Evidence(verdict=verdict_from(passed),
                    summary=f"accuracy >= 0.95 (and tau_n at the largest gap's midpoint) in {sum(ok)}/{len(ok)} checks; "
                            f"accuracy above the paper's (flagged) in {len(above)}/{len(rows)}; "
                            + "; ".join(f"{r['(p,q)']} K={r['K']}: {r['accuracy (ours)']}" for r in rows[:4]),
                    table=rows, measured={"accuracy": [r["accuracy (ours)"] for r in rows],
                                          "accuracy_above_paper": [f"{r['(p,q)']} K={r['K']}" for r in above]},
                    predicted={"accuracy (paper)": [r["accuracy (paper)"] for r in rows]},
                    notes="Flagged, not judged: where our detection accuracy exceeds the paper's beyond "
                          "Monte Carlo error (e.g. 1.000 vs 0.98 at (10,10), K = 5; 0.97-1.00 vs 0.90-0.92 at "
                          "p = 50 at full scale) the paper's runs differ from ours in a way §7 does not "
                          "specify (tau_n rule, lambdas), so their CLAIR column is not a like-for-like target. "
                          "Benign = positive class: TP benign kept, TN contaminated excluded. Same runs "
                          "(seeds) as clair.sec7.table1.")


# --------------------------------------------------------------------------------------------
def _baseline_configs(ctx):
    return ctx.pick(smoke=[(10, 10, 100, 5), (20, 20, 150, 10)],
                    quick=[(p, q, n, K) for p, q, n in CONFIGS[:2] for K in KS] + [(50, 50, 300, 5)],
                    full=[(p, q, n, K) for p, q, n in CONFIGS for K in KS])


@claim("clair.sec7.fedavg_negative_transfer", paper="clair", reference="§7, Table 1 (FedAvg columns)",
       statement="FedAvg over all clients and oracle FedAvg over the benign clients are both worse than "
                 "local OLS in every setting (benign heterogeneity bias ~ (1-1/|C|) 0.64 qpr/9).",
       kind="comparison")
def _negative_transfer(ctx, *, variant="unit-variance", fedavg_fn=fedavg):
    configs = _baseline_configs(ctx)
    reps = ctx.pick(smoke=10, quick=20, full=100)      # cheap tasks (~3 ms): 10 replicates resolve smoke
    out = ctx.map(_task_baselines, [{"p": p, "q": q, "n": n, "K": K, "variant": variant, "fedavg_fn": fedavg_fn}
                                    for p, q, n, K in configs], replicates=reps)
    rows, ok = [], []
    for (p, q, n, K), r in zip(configs, out):
        loc, fa, ofa = (_ms([o[k] for o in r]) for k in ("local", "fedavg", "oracle_fedavg"))
        # paired differences Local - FedAvg(-O) < 0, judged on their t-intervals
        d_fa = _negative(*_ms([o["local"] - o["fedavg"] for o in r]), len(r))
        d_ofa = _negative(*_ms([o["local"] - o["oracle_fedavg"] for o in r]), len(r))
        good = False if False in (d_fa, d_ofa) else (None if None in (d_fa, d_ofa) else True)
        ok.append(good)
        rows.append({"(p,q)": f"({p},{q})", "K": K, "Local": _fmt(*loc), "FedAvg": _fmt(*fa),
                     "FedAvg (pred.)": _pred_fedavg(p, q, n, K, variant), "FedAvg-O": _fmt(*ofa),
                     "FedAvg-O (pred.)": _pred_oracle_fedavg(p, q, n, K), "both worse than Local": good})
    passed = False if False in ok else (None if None in ok else True)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"FedAvg and oracle FedAvg worse than Local (paired t-interval) in {_count(ok)} settings",
                    table=rows, measured={"worse": ok},
                    predicted={"FedAvg > Local": True, "FedAvg-O > Local": True,
                               "Local (qp/(n-p-1))": [_pred_local(p, q, n) for p, q, n, K in configs],
                               "FedAvg": [_pred_fedavg(p, q, n, K, variant) for p, q, n, K in configs],
                               "FedAvg-O": [_pred_oracle_fedavg(p, q, n, K) for p, q, n, K in configs]})


@claim("clair.sec7.contamination_variance", paper="clair", reference="§7 design text vs Table 1 FedAvg column "
       "(the text says Unif[-1, 1]; Table 1's FedAvg column implies unit variance)",
       statement="The contamination entries 'Unif[-1,1] scaled by c/sqrt(q(p-r))' do not reproduce Table 1's "
                 "FedAvg column; unit-variance entries do (within 5%).", kind="comparison")
def _contamination_variance(ctx, *, readings=("unit-variance", "uniform")):
    configs = _baseline_configs(ctx)
    reps = ctx.pick(smoke=10, quick=20, full=100)      # cheap tasks (~3 ms): 10 replicates resolve smoke
    grid = [{"p": p, "q": q, "n": n, "K": K, "variant": v} for v in readings for p, q, n, K in configs]
    out = ctx.map(_task_baselines, grid, replicates=reps)
    rows, match, informative, dist = [], {v: [] for v in readings}, [], {v: [] for v in readings}
    for g, r in zip(grid, out):
        p, q, n, K = g["p"], g["q"], g["n"], g["K"]
        m, s = _ms([_fedavg_cv(o, p, K, g["variant"]) for o in r])
        paper = TABLE1[(p, K)][3]
        pu, pf = _pred_fedavg(p, q, n, K), _pred_fedavg(p, q, n, K, "uniform")
        good = _close(m, s, len(r), paper, 0.05)
        # a configuration discriminates the readings when their predictions differ by > 10%
        disc = abs(pu - pf) > 0.10 * paper
        if g["variant"] == readings[0]:
            informative.append(disc)
        match[g["variant"]].append(good)
        dist[g["variant"]].append(abs(m - paper))
        rows.append({"reading": g["variant"], "(p,q)": f"({p},{q})", "K": K, "FedAvg (ours)": _fmt(m, s),
                     "FedAvg (paper)": paper, "pred. unit-variance": pu, "pred. uniform": pf,
                     "within 5%": good, "discriminating": disc})
    unit, unif = match[readings[0]], match[readings[1]]
    used = [i for i, d in enumerate(informative) if d]
    closer = [dist[readings[0]][i] < dist[readings[1]][i] for i in used]
    # per discriminating setting: the first reading matches (True) and the second does not (False)
    verdicts = [False if (unit[i] is False or unif[i] is True) else
                (True if (unit[i] is True and unif[i] is False) else None) for i in used]
    passed = False if False in verdicts else (True if verdicts and None not in verdicts else None)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"on {len(used)} discriminating settings: {readings[0]} within 5% of Table 1's FedAvg "
                            f"in {_count([unit[i] for i in used])}, {readings[1]} within 5% in "
                            f"{_count([unif[i] for i in used])}; {readings[0]} closer in {sum(closer)}",
                    table=rows, measured={**{k: v for k, v in match.items()}, "discriminating": used,
                                          "setting_verdicts": verdicts},
                    predicted={f"FedAvg ({v})": [_pred_fedavg(p, q, n, K, v) for p, q, n, K in configs]
                               for v in readings} | {"FedAvg (paper)": [TABLE1[(p, K)][3] for p, q, n, K in configs],
                                                     "match": {readings[0]: True, readings[1]: False}},
                    notes="Within 5%: judged only where the t * s.e. half-width is below the 5% band (else "
                          "None), failed where the mean is outside the band by more than t * s.e. Default "
                          "simulate() reading: unit-variance. The 0.8 factor is not applied to the "
                          "perturbation (contamination_factor=1). At (50,50) the two readings predict FedAvg "
                          "within 3% of each other (benign heterogeneity dominates), so only settings whose "
                          "predictions differ by > 10% decide.")


# --------------------------------------------------------------------------------------------
# No contamination and a single contaminated client (the largest-gap rule must be able to say
# "no separation"). Criteria fixed before any run: over all replicates pooled across the
# configurations, the 95% Clopper-Pearson interval of the success rate decides: holds if its
# lower end is >= 0.8, fails if its upper end is < 0.8, inconclusive otherwise (too few runs).
_PURITY_LAMBDAS = (1.0, 3.5)          # lam_L = c1 K^{-1/2}, lam_S = c2 K^{-3/2} (§7 scalings)
_PURITY_LEVEL = 0.8


def _task_purity(seed, p, q, n, K, contaminated, tau):
    inst = simulate(p=p, q=q, n_clients=K, samples_per_client=n, rank=R, contaminated=contaminated,
                    seed=seed)
    c1, c2 = _PURITY_LAMBDAS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fit(inst.W_hat, c1 * K ** -0.5, c2 * K ** -1.5, rank=R, tau=tau, **_SOLVER)
    warned_small = any("collaborative set has" in str(w.message) for w in caught)
    return {"exact": bool(np.array_equal(res.benign, inst.benign)), "kept": int(res.benign.sum()),
            "separated": bool(res.separated), "warned_small": warned_small,
            "local": _client_mse(inst.W_hat, inst.W), "clair": _client_mse(res.refined, inst.W)}


def _clopper_pearson(k: int, n: int, level: float = 0.95):
    from scipy import stats

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def _purity_claim(ctx, contaminated, tau):
    configs = ctx.pick(smoke=[(10, 10, 100, 10)],
                       quick=[(10, 10, 100, 5), (10, 10, 100, 10), (10, 10, 100, 20),
                              (20, 20, 150, 10)],
                       full=[(p, q, n, K) for p, q, n in CONFIGS[:2] for K in KS])
    out = ctx.map(_task_purity, [{"p": p, "q": q, "n": n, "K": K, "contaminated": contaminated,
                                  "tau": tau}
                                 for p, q, n, K in configs], replicates=ctx.pick(4, 20, 50))
    flat = [o for row in out for o in row]
    k, n = sum(o["exact"] for o in flat), len(flat)
    lo, hi = _clopper_pearson(k, n)
    passed = True if lo >= _PURITY_LEVEL else (False if hi < _PURITY_LEVEL else None)
    per_config = {f"p={p},K={K}": float(np.mean([o["exact"] for o in row]))
                  for (p, q, n_, K), row in zip(configs, out)}
    gain = float(np.mean([o["clair"] / o["local"] for o in flat]))
    summary = (f"C_hat = C in {k}/{n} runs (95% CI [{lo:.3f}, {hi:.3f}], want lower end >= "
               f"{_PURITY_LEVEL}); per configuration {per_config}; mean MSE ratio CLAIR/local "
               f"{gain:.3f}; runs warning of < 2 kept clients: {sum(o['warned_small'] for o in flat)}")
    return Evidence(verdict=verdict_from(passed), summary=summary,
                    measured={"exact": k, "runs": n, "ci": [lo, hi], "per_config": per_config,
                              "mse_ratio": gain,
                              "separated": float(np.mean([o["separated"] for o in flat]))},
                    predicted={"rate_at_least": _PURITY_LEVEL})


@claim("clair.sec7.no_contamination", paper="clair", reference="(8); §7 design with every client benign",
       statement="With no contaminated client, CLAIR with the largest-gap tau_n keeps every client "
                 "(C_hat = [K]) and never reports an empty or one-client set.", kind="comparison")
def _no_contamination(ctx, *, tau="largest-gap"):
    return _purity_claim(ctx, 0, tau)


@claim("clair.sec7.one_contaminated", paper="clair", reference="(8); Theorem 3(ii); §7 design",
       statement="With exactly one contaminated client, CLAIR with the largest-gap tau_n excludes it "
                 "and keeps every benign client (C_hat = C).", kind="comparison")
def _one_contaminated(ctx, *, tau="largest-gap"):
    return _purity_claim(ctx, 1, tau)
