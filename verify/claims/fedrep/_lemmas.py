"""FedRep, the lemmas behind Theorem 1 and Claim 1: Lemma 1's exact identities, the scaling of
Lemmas 2, 4 and 5, and the failure of RIP for the row-sparse operator (App. B.5)."""
from __future__ import annotations

import math

import numpy as np

from lowrank_fl.algorithms.fedrep import fedrep_round
from lowrank_fl.exact.multitask import lemma1_decomposition
from lowrank_fl.problems.multitask import multitask_linear
from verify.claim import Evidence, claim, verdict_from
from verify.stats import fit_loglog_slope

from ._support import PAPER, all_of, band, pyplot, rngs, warm_start


# ====================================================================== C5
def _task_identities(seed, d, k, n, m, round_options):
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    X, y = p.sample(m, rr)
    B = np.linalg.qr(p.B_star + 0.7 * rr.standard_normal((d, k)))[0]
    q = lemma1_decomposition(B, p.B_star, p.heads, X)
    eta = 0.2
    opts = dict(round_options or {})
    out = fedrep_round(B, X, y, eta, **opts)
    lemma1 = np.max(np.abs(q["W_next"] - (p.heads @ p.B_star.T @ B - q["F"])))
    Pi = np.einsum("nmd,nme->nde", X, X) / m
    H = B.T @ Pi @ (B @ B.T - np.eye(d)) @ p.B_star
    Bperp = np.linalg.svd(np.eye(d) - p.B_star @ p.B_star.T)[0][:, :d - k]
    Qt = out.heads @ B.T - p.heads @ p.B_star.T
    return {"lemma1": float(lemma1),
            "head_match": float(np.max(np.abs(out.heads - q["W_next"]))),
            "H": float(np.max(np.abs(q["H"] - H))),
            "Bperp_Q": float(np.max(np.abs(Bperp.T @ Qt.T - Bperp.T @ B @ out.heads.T))),
            "BtG": float(np.max(np.abs(B.T @ out.grad))),
            "sigma_min_R": float(np.linalg.svd(out.R, compute_uv=False)[-1])}


@claim("fedrep.lemma1.exact_identities", paper=PAPER, reference="Lemma 1, eqs. (16), (35); (62); (91)-(92)",
       statement="For exact least-squares heads: W^{t+1} = W* B*^T B^t - F with f_i = G_i^{-1}(G_i D_i - C_i) w_i*, "
                 "H_i = B^T Pi_i (B B^T - I) B*, B^T grad = 0, and hence sigma_min(R^{t+1}) >= 1.",
       kind="identity")
def _c5(ctx, *, round_options=None):
    reps = ctx.pick(3, 10, 30)
    grid = [{"d": d, "k": k, "n": n, "m": m, "round_options": round_options}
            for d, k, n, m in ctx.pick([(12, 2, 10, 6)], [(12, 2, 10, 6), (30, 3, 40, 8)],
                                       [(12, 2, 10, 6), (30, 3, 40, 8), (60, 5, 100, 10)])]
    out = [o for res in ctx.map(_task_identities, grid, replicates=reps) for o in res]
    worst = {key: max(o[key] for o in out) for key in ("lemma1", "head_match", "H", "Bperp_Q", "BtG")}
    smin = min(o["sigma_min_R"] for o in out)
    passed = bool(all(v <= 1e-10 for v in worst.values()) and smin >= 1 - 1e-12)
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"max residual {max(worst.values()):.1e} (<= 1e-10); min sigma_min(R) = {smin:.12f} (>= 1)",
        measured={**worst, "sigma_min_R_min": smin},
        predicted={"residuals": "<= 1e-10", "sigma_min_R": ">= 1"},
        notes="With exact least-squares heads the cross term the paper bounds in (80)-(81) is exactly 0, so "
              "||R^{-1}|| <= 1 deterministically (stronger than (92)). Tolerance 1e-10: float64 algebra on O(1) "
              "quantities with condition numbers ~1e2.")


def gaussian_design(problem, m, rng):
    """The lemmas' design: ``m`` fresh inputs x ~ N(0, I_d) per client, X (n, m, d). A claim's
    ``design`` option replaces it (same signature)."""
    X, _ = problem.sample(m, rng)
    return X


def _task_lemma4(seed, d, k, n, ms, dist0, design):
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    B = warm_start(p.B_star, 1 - dist0 ** 2, rr)
    vals = []
    for m in ms:
        X = design(p, m, rr)
        F = lemma1_decomposition(B, p.B_star, p.heads, X)["F"]
        vals.append(np.linalg.norm(F) / (np.linalg.norm(p.heads, 2) * dist0))
    return np.array(vals)


@claim("fedrep.lemma4.F_scaling", paper=PAPER, reference="Lemmas 2-4, eq. (48)",
       statement="||F||_F / (||W*||_2 dist(B^t, B*)) decays like m^{-1/2} (delta_k ~ k^{3/2} sqrt(log(rn)/m)).",
       kind="scaling")
def _c5b(ctx, *, design=gaussian_design):
    ms = ctx.pick((10, 40, 160), (10, 20, 40, 80, 160, 320), (10, 20, 40, 80, 160, 320, 640))
    reps = ctx.pick(10, 20, 50)
    out = ctx.map(_task_lemma4, [{"d": 20, "k": 2, "n": 30, "ms": ms, "dist0": 0.5, "design": design}],
                  replicates=reps)[0]
    Y = np.array(out).T                                  # (len(ms), reps)
    fit = fit_loglog_slope(ms, Y)
    # holds: mean in [-0.6, -0.4] and CI inside [-0.7, -0.3]; fails: mean outside and CI excludes -0.5
    if -0.6 <= fit.slope <= -0.4 and -0.7 <= fit.low and fit.high <= -0.3:
        passed = True
    elif not (-0.6 <= fit.slope <= -0.4) and not (fit.low <= -0.5 <= fit.high):
        passed = False
    else:
        passed = None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(ms, Y.mean(axis=1), "o-", label=f"measured, slope {fit}")
    ax.loglog(ms, Y.mean(axis=1)[0] * (np.array(ms) / ms[0]) ** -0.5, "--", label="m^-1/2")
    ax.set_xlabel("m")
    ax.set_ylabel("||F|| / (||W*|| dist)")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig, title="||F|| / (||W*|| dist) vs m")
    return Evidence(verdict=verdict_from(passed), summary=f"slope {fit} (want within [-0.6, -0.4])",
                    measured=fit.as_dict(), predicted={"slope": -0.5}, figure=path,
                    notes="d = 20, k = 2, n = 30, fixed B at dist 0.5. Holds: mean slope in [-0.6, -0.4] with 95% CI "
                          "inside [-0.7, -0.3]; fails: mean outside and CI excluding -0.5; else inconclusive.")


def _task_lemma5(seed, d, k, n, m, design):
    """Lemma 5's (1/rn) ||(A*A(Q)/m - Q)^T W||_2 / dist and Lemma 2's mean_i (1 - sigma_min(G^i)),
    at a fixed B (dist 0.5) with the m -> inf heads W = Theta* B, on a batch independent of W."""
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    B = warm_start(p.B_star, 0.75, rr)                   # dist(B, B*) = 0.5
    W = p.theta @ B                                      # (n, k)
    Q = W @ B.T - p.theta                                # (n, d) rows q_i = B w_i - theta_i*
    X = design(p, m, rr)
    AQ = np.einsum("nmd,nm->nd", X, np.einsum("nmd,nd->nm", X, Q)) / m
    lemma5 = np.linalg.norm((AQ - Q).T @ W, 2) / n / 0.5
    XB = X @ B                                           # (n, m, k)
    G = np.swapaxes(XB, 1, 2) @ XB / m                   # G^i = B^T X_i^T X_i B / m
    smin = np.linalg.svd(G, compute_uv=False)[:, -1]
    return {"lemma5": float(lemma5), "lemma2": float(np.mean(1 - smin))}


@claim("fedrep.lemma5.concentration", paper=PAPER, reference="Lemmas 2 and 5 (App. B.2)",
       statement="The Lemma 5 deviation (1/rn) ||(A*A(Q)/m - Q)^T W||_2 / dist scales like sqrt(d/(rn m)) "
                 "(exponents 1/2, -1/2, -1/2 in d, rn, m), and Lemma 2's sigma_min(G^i) >= 1 - C sqrt(k/m) "
                 "(1 - sigma_min decays like m^(-1/2)).",
       kind="scaling")
def _c5c(ctx, *, design=gaussian_design):
    reps = ctx.pick(4, 10, 30)
    base = {"d": 40, "k": 2, "n": 50, "m": 20, "design": design}
    sweeps = {"d": ctx.pick((20, 40, 80), (20, 40, 80, 160), (20, 40, 80, 160, 320)),
              "n": ctx.pick((25, 50, 100), (25, 50, 100, 200), (25, 50, 100, 200, 400)),
              "m": ctx.pick((10, 20, 40), (10, 20, 40, 80), (10, 20, 40, 80, 160))}
    # d: the spectral norm of the d x k deviation grows like sqrt(d) + sqrt(k) (matrix concentration),
    # whose log-log slope over the d grid is below 1/2 (0.44 at k = 2, d = 20..160): the band is
    # centred on it; n and m enter as 1/sqrt(rn m) exactly
    dd = np.array(sweeps["d"], dtype=float)
    expo = {"d": float(np.polyfit(np.log(dd), np.log(np.sqrt(dd) + math.sqrt(base["k"])), 1)[0]),
            "n": -0.5, "m": -0.5}
    fits, flags = {}, {}
    for key, vals in sweeps.items():
        out = ctx.map(_task_lemma5, [{**base, key: v} for v in vals], replicates=reps)
        Y = np.array([[o["lemma5"] for o in row] for row in out])
        fits[f"lemma5_vs_{key}"] = fit_loglog_slope(vals, Y)
        # accept exponents within +-0.1 of (1/2, -1/2, -1/2), judged on the 95% interval
        flags[f"lemma5_{key}_ok"] = band(fits[f"lemma5_vs_{key}"], expo[key] - 0.1, expo[key] + 0.1)
        if key == "m":
            Z = np.array([[o["lemma2"] for o in row] for row in out])
            fits["lemma2_vs_m"] = fit_loglog_slope(vals, Z)
            flags["lemma2_m_ok"] = band(fits["lemma2_vs_m"], -0.6, -0.4)
            m_vals, Z_mean = vals, Z.mean(axis=1)
    passed = all_of(*flags.values())
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(m_vals, Z_mean, "o-", label="mean_i 1 - sigma_min(G^i)")
    ax.loglog(m_vals, Z_mean[0] * (np.array(m_vals) / m_vals[0]) ** -0.5, "k--", label="m^-1/2")
    ax.set_xlabel("m")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig, title="Lemma 2: 1 - sigma_min(G) vs m")
    return Evidence(
        verdict=verdict_from(passed),
        summary="; ".join(f"{key} slope {f}" for key, f in fits.items()),
        measured={**{f"slope_{key}": f.as_dict() for key, f in fits.items()}, **flags},
        predicted={"lemma5_vs_d": expo["d"], "lemma5_vs_n": -0.5, "lemma5_vs_m": -0.5, "lemma2_vs_m": -0.5},
        figure=path,
        notes="Base d = 40, k = 2, n = 50 (r = 1), m = 20; B at dist 0.5, m -> inf heads, a batch "
              "independent of W (the independence Lemma 5's proof assumes). Holds when every 95% interval "
              "lies within +-0.1 of the exponent, fails when one lies entirely outside. The d exponent is "
              "the log-log slope of sqrt(d) + sqrt(k) over the d grid (the spectral norm of a d x k "
              "deviation), slightly below the asymptotic 1/2.")


# ====================================================================== C10
def _task_rip(seed, d, m, n, k, design_scale):
    rng = rngs(seed, 1)[0]
    x = rng.standard_normal(d) * design_scale
    X = rng.standard_normal((m - 1, d)) * design_scale
    # A(e_1 x_1^T) = [<x_1^j, x_1>]_j; ratio ||A(M)||^2 / (m ||M||_F^2)
    Mx = np.concatenate([[x @ x], X @ x])
    rho = float(Mx @ Mx / (m * (x @ x)))
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rng)
    Xs, _ = p.sample(m, rng)
    Xs *= design_scale
    M = p.theta
    Am = np.einsum("nmd,nd->nm", Xs, M)
    fixed = float(np.sum(Am * Am) / (n * m) / (np.sum(M * M) / n))
    return {"rho": rho, "fixed": fixed}


@claim("fedrep.claim1.no_rip", paper=PAPER, reference="Claim 1 (App. B.5)",
       statement="For m <= d/2 the row-sparse operator (1/sqrt m) A fails 1-RIP: for M = e_1 x_1^T the ratio "
                 "||A(M)||^2/(m ||M||_F^2) >= d/(2m), while for a fixed incoherent rank-k M it concentrates at 1.",
       kind="bound")
def _c10(ctx, *, design_scale=1.0):
    reps = ctx.pick(100, 300, 1000)
    grid = [{"d": d, "m": m, "n": 50, "k": 2, "design_scale": design_scale}
            for d, m in ctx.pick([(50, 10)], [(50, 10), (100, 20)], [(50, 10), (100, 20), (200, 50)])]
    out = ctx.map(_task_rip, grid, replicates=reps)
    rows, ok = [], True
    for g, res in zip(grid, out):
        rho = np.array([o["rho"] for o in res])
        fixed = np.array([o["fixed"] for o in res])
        frac = float(np.mean(rho >= g["d"] / (2 * g["m"])))
        sd_pred = math.sqrt(2 / (g["n"] * g["m"]))
        fixed_ok = bool(abs(fixed.mean() - 1) <= 4 * sd_pred / math.sqrt(len(fixed)) + 0.01
                        and fixed.std() <= 2 * sd_pred)
        ok &= frac >= 0.99 and fixed_ok
        rows.append({"d": g["d"], "m": g["m"], "fraction_rho_ge_d_over_2m": frac,
                     "fixed_M_mean": float(fixed.mean()), "fixed_M_sd": float(fixed.std()),
                     "fixed_M_sd_pred": sd_pred})
    return Evidence(
        verdict=verdict_from(bool(ok)),
        summary="; ".join(f"d={r['d']}, m={r['m']}: P(rho >= d/2m) = {r['fraction_rho_ge_d_over_2m']:.3f}, "
                          f"fixed M ratio {r['fixed_M_mean']:.3f} ± {r['fixed_M_sd']:.3f}" for r in rows),
        measured={"rows": rows}, predicted={"fraction": ">= 0.99", "fixed_M": "mean 1, sd ~ sqrt(2/(nm))"},
        table=rows, notes="Uniform RIP fails; concentration for a fixed row-incoherent M does not depend on d.")
