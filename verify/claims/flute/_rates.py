"""FLUTE, Theorem 5.5 and Remark 5.3: global convergence, the linear rate (8), its gap dependence, the
normalizations of Algorithm 1, the over-parameterized case and the fresh-sample floor."""
from __future__ import annotations

import numpy as np

from lowrank_fl.algorithms.flute import flute
from lowrank_fl.problems.underparameterized import appendix_c_spectrum, underparameterized
from verify.claim import Evidence, claim, verdict_from
from verify.stats import fit_loglog_slope, mean_ci

from ._support import ETA, GAP_SWEEP_ETA, NOISE, PAPER, band_verdict, figure, tail_rate


def _rounds_to_converge(problem, eta, digits=12.0, extra=300):
    """Rounds for the population error to fall ``10^-digits`` at rate ``1 - eta Delta / 2``."""
    return int(np.ceil(digits * np.log(10) / (eta * problem.gap / 2))) + extra


# =============================================================================================
# C1  Global convergence from a tiny data-independent initialization
# =============================================================================================
def _task_global(seed, *, k, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=k, seed=rng)
    rounds = _rounds_to_converge(p, ETA)
    tr = algorithm(p, rounds, ETA, record_every=10, seed=rng)
    W = tr.heads                                          # (M, k): the paper's W^T
    rel = float(np.linalg.norm(tr.B @ W.T - p.target) / np.linalg.norm(p.target))
    bal = float(np.linalg.norm(tr.B.T @ tr.B - W.T @ W))
    curve = tr.extra["frob_target"][::10] / np.linalg.norm(p.target)
    return {"rel": rel if np.isfinite(rel) else np.inf, "balance": bal if np.isfinite(bal) else np.inf,
            "distance": float(tr.distance[-1]), "curve": curve, "rounds": rounds}


@claim("flute.thm5_5.global_convergence", paper=PAPER, reference="Remark 4.1, Theorem 5.5, eq. (3)",
       statement="From a small data-independent N(0, alpha^2) initialization, population FLUTE "
                 "(gamma1 = 2 gamma2) converges to the truncated SVD Phi_k with balanced factors.",
       kind="comparison")
def _c1(ctx, *, algorithm=flute):
    ks = ctx.pick([2], [2, 4], [2, 4, 6, 8])
    out = ctx.map(_task_global, [{"k": k, "algorithm": algorithm} for k in ks],
                  replicates=ctx.pick(2, 5, 20))
    rel = max(o["rel"] for row in out for o in row)
    bal = max(o["balance"] for row in out for o in row)
    dist = max(o["distance"] for row in out for o in row)
    # 1e-8: population iterations reach 1e-14 (pilot runs); 1e-8 leaves room for slow seeds.
    passed = rel < 1e-8 and bal < 1e-8
    fig, ax = figure()
    for k, row in zip(ks, out):
        ax.semilogy(10 * np.arange(len(row[0]["curve"])), row[0]["curve"], label=f"k={k}")
    ax.set_xlabel("round"), ax.set_ylabel("||BW - Phi_k||_F / ||Phi_k||_F"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max rel. error to Phi_k {rel:.1e}, max imbalance {bal:.1e} (< 1e-8)",
                    measured={"max_rel_error": rel, "max_balance": bal, "max_subspace_distance": dist,
                              "k": ks},
                    predicted={"rel_error": 0.0, "balance": 0.0},
                    figure=ctx.save_figure(fig, title="error to Phi_k, first seed per k"),
                    notes="App. C instance (d = 10, M = 15), eta = 0.03, alpha = 1/(10 d), population "
                          "gradients; a different random Phi per replicate.")


# =============================================================================================
# C2  Linear rate (eq. (8)) and normalization "appendix" vs "main"
# =============================================================================================
def _task_rate(seed, *, k, normalization, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=k, seed=rng)
    tr = algorithm(p, _rounds_to_converge(p, ETA), ETA, normalization=normalization, seed=rng)
    return {"rho": tail_rate(tr.extra["frob_target"]), "gap": p.gap,
            "curve": tr.extra["frob_target"][::5]}


@claim("flute.thm5_5.rate", paper=PAPER, reference="Theorem 5.5, eq. (8)",
       statement="The error ||B^t W^t - Phi_k|| decays at least as fast as (1 - eta Delta / 16)^t "
                 "(appendix normalization); in the population case the rate is exactly "
                 "1 - eta Delta / 2.", kind="rate")
def _c2(ctx, *, algorithm=flute):
    ks = ctx.pick([2], [2, 4], [2, 4, 6, 8])
    grid = [{"k": k, "normalization": "appendix", "algorithm": algorithm} for k in ks]
    out = ctx.map(_task_rate, grid, replicates=ctx.pick(2, 4, 10))
    rows = []
    for k, row in zip(ks, out):
        rho = np.array([o["rho"] for o in row])
        gaps = np.array([o["gap"] for o in row])
        bound = 1 - ETA * gaps / 16
        sharp = 1 - ETA * gaps / 2
        fin = bool(np.all(np.isfinite(rho)))
        m, h = mean_ci(rho) if len(rho) > 1 else (rho.mean(), np.nan)
        devs = np.abs(rho - sharp) if fin else np.full(len(rho), np.inf)
        dev = float(np.max(devs))
        rows.append({"k": k, "rho_fit": float(m), "ci_half": float(h),
                     "rho_bound": float(bound.mean()), "rho_sharp_mean": float(sharp.mean()),
                     "max_abs_dev_from_sharp": dev, "median_abs_dev_from_sharp": float(np.median(devs)),
                     "seeds_off_sharp": int(np.sum(devs >= 1e-3)),
                     "bound_ok": bool(fin and np.all(rho <= bound)),
                     # 1e-3 on the median over seeds (why: the claim's notes)
                     "sharp_ok": bool(fin and np.median(devs) < 1e-3)})
    bound_ok = all(r["bound_ok"] for r in rows)
    sharp_ok = all(r["sharp_ok"] for r in rows)
    passed = bound_ok and sharp_ok
    fig, ax = figure()
    for k, row in zip(ks, out):
        ax.semilogy(5 * np.arange(len(row[0]["curve"])), row[0]["curve"], label=f"k={k}")
    ax.set_xlabel("round"), ax.set_ylabel("||BW - Phi_k||_F"), ax.legend()
    worst = max(r["rho_fit"] - r["rho_bound"] for r in rows)
    dev = max(r["median_abs_dev_from_sharp"] for r in rows)
    off = sum(r["seeds_off_sharp"] for r in rows)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"fitted rho <= 1 - eta Delta/16 for every seed: {bound_ok} (worst margin "
                            f"{worst:+.4f}); median |rho - (1 - eta Delta/2)| = {dev:.1e} < 1e-3: {sharp_ok} "
                            f"({off} seed(s) off by >= 1e-3: transient)",
                    measured={"rows": rows, "bound_ok": bound_ok, "sharp_ok": sharp_ok},
                    predicted={"rho_bound": "1 - eta Delta / 16",
                               "rho_population": "1 - eta Delta / 2 within 1e-3 (pilot runs)"},
                    table=rows,
                    figure=ctx.save_figure(fig, title="error to Phi_k, first seed per k"),
                    notes="Tail fit on 1e-11 < err < 1e-3 of population runs, judged per seed. The paper's "
                          "bound is loose by 8x in the exponent; the sharp population rate "
                          "1 - eta (lambda_k - lambda_(k+1)) is judged too, on the median over seeds "
                          "(|rho - (1 - eta Delta/2)| < 1e-3; population fits agree with it to ~1e-7 in pilots): it is "
                          "an asymptotic rate, and a seed whose init barely excites the slowest mode still "
                          "decays faster inside the fit window, so the seeds off it by >= 1e-3 are counted "
                          "and reported.")




# =============================================================================================
# C2 (gap sweep): log(1/rho) is linear in Delta with lambda_1 fixed
# =============================================================================================
def _task_gap_rate(seed, *, g, eta, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, spectrum=[4.0, 3.0, 3.0 - g, 1.0, 0.5], seed=rng)
    # 1e-11 at rate 1 - eta g needs ~25 / (eta g) rounds after the entry phase
    tr = algorithm(p, int(26 / (eta * g)) + 200, eta, seed=rng)
    return {"rho": tail_rate(tr.extra["frob_target"]), "gap": p.gap}


@claim("flute.thm5_5.gap_linearity", paper=PAPER, reference="Theorem 5.5, eq. (8)",
       statement="With lambda_1 fixed and the gap Delta varied, the population rate satisfies "
                 "log(1/rho) proportional to Delta (log-log slope 1).", kind="scaling")
def _c2c(ctx, *, algorithm=flute):
    gs = ctx.pick([1.5, 1.0, 0.5], [1.5, 1.0, 0.5, 0.25], [1.5, 1.0, 0.7, 0.5, 0.35, 0.25])
    eta = GAP_SWEEP_ETA
    out = ctx.map(_task_gap_rate, [{"g": g, "eta": eta, "algorithm": algorithm} for g in gs],
                  replicates=ctx.pick(2, 3, 5))
    rho = np.array([[o["rho"] for o in row] for row in out])
    delta = 2 * np.array(gs)
    if not (np.all(np.isfinite(rho)) and np.all(rho < 1)):
        fit_d, passed = None, False
        slope_txt = "no tail fit (not converged)"
    else:
        fit = fit_loglog_slope(delta, -np.log(rho))
        fit_d = fit.as_dict()
        # band 1 +- 0.1: log(1/(1 - x)) = x + x^2/2 + ... bends the slope by < 0.03 at eta Delta/2 <= 0.11
        passed = band_verdict(fit.low, fit.high, 0.9, 1.1)
        slope_txt = str(fit)
    fig, ax = figure()
    ax.loglog(delta, -np.log(rho).mean(axis=1), "o-", label="measured log(1/rho)")
    ax.loglog(delta, eta * delta / 2, "k--", label="eta Delta / 2")
    ax.set_xlabel("Delta"), ax.set_ylabel("log(1/rho)"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"log-log slope of log(1/rho) in Delta {slope_txt} (band [0.9, 1.1])",
                    measured={"Delta": delta, "rho": rho, "slope": fit_d, "slope_ok": passed},
                    predicted={"slope": 1.0, "log(1/rho)": "~ eta Delta / 2"},
                    figure=ctx.save_figure(fig, title="log(1/rho) vs Delta"),
                    notes=f"Spectrum [4, 3, 3 - g, 1, 0.5], k = 2, eta = {eta}, population; holds when the "
                          "95% interval over seeds lies in [0.9, 1.1], fails when it lies outside.")


def _task_norm(seed, *, normalization, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng)
    tr = algorithm(p, 650, ETA, normalization=normalization, seed=rng)
    W = tr.heads
    return {"rho": tail_rate(tr.extra["frob_target"]),
            "rel": float(np.linalg.norm(tr.B @ W.T - p.target) / np.linalg.norm(p.target)),
            "gap": p.gap}


@claim("flute.alg1.normalization", paper=PAPER, reference="Algorithm 1, eqs. (4)-(5) vs App. A.1",
       statement="The main-text normalization (data gradient with the factor 2) and the appendix one "
                 "have the same limit Phi_k for gamma1 = 2 gamma2, and the main one contracts twice as "
                 "fast in the exponent (1 - eta Delta vs 1 - eta Delta/2).", kind="comparison")
def _c2b(ctx, *, algorithm=flute):
    grid = [{"normalization": n, "algorithm": algorithm} for n in ("appendix", "main")]
    out = ctx.map(_task_norm, grid, replicates=ctx.pick(1, 4, 10))
    rho = {n: np.array([o["rho"] for o in row]) for n, row in zip(("appendix", "main"), out)}
    rel = max(o["rel"] for row in out for o in row)
    ratio = np.log(rho["main"]) / np.log(rho["appendix"])
    # ratio of log-rates: 2 for a factor-2 data gradient (to first order in eta; 5% covers
    # the O(eta Delta) curvature of log(1 - x)).
    passed = bool(rel < 1e-8 and np.all(np.abs(ratio - 2) < 0.1))
    fig, ax = figure()
    ax.bar(["appendix", "main"], [float(np.mean(-np.log(rho[n]))) for n in rho])
    ax.set_ylabel("-log(rho) per round")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"same limit (rel. err {rel:.1e}); log-rate ratio main/appendix "
                            f"{float(np.mean(ratio)):.3f} (predicted 2)",
                    measured={"rho_appendix": rho["appendix"], "rho_main": rho["main"],
                              "log_rate_ratio": ratio, "max_rel_error": rel},
                    predicted={"log_rate_ratio": 2.0, "rel_error": 0.0},
                    figure=ctx.save_figure(fig, title="log-rate: appendix vs main"),
                    notes="Eqs. (4)-(5): the main text's L_i carries a factor 2 in its gradient, App. A.1 "
                          "does not; the theorems analyse the appendix version (default).")


# =============================================================================================
# C13  Over-parameterized special case (Remark 5.3)
# =============================================================================================
def _task_over(seed, *, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=4, spectrum=[10.0, 6.0, 4.0, 2.5], seed=rng)
    tr = algorithm(p, 500, ETA, seed=rng)
    return {"err": float(np.linalg.norm(tr.B @ tr.heads.T - p.Phi) / np.linalg.norm(p.Phi)),
            "rho": tail_rate(tr.extra["frob_target"])}


@claim("flute.rem5_3.overparameterized", paper=PAPER, reference="Remark 5.3",
       statement="When rank(Phi) <= k, FLUTE still converges to Phi itself, at population rate "
                 "1 - eta lambda_k (= 1 - eta Delta/2 with lambda_(k+1) = 0).", kind="rate")
def _c13(ctx, *, algorithm=flute):
    out = ctx.map(_task_over, [{"algorithm": algorithm}], replicates=ctx.pick(2, 4, 10))[0]
    err = max(o["err"] for o in out)
    rho = np.array([o["rho"] for o in out])
    pred = 1 - ETA * 2.5
    # rate tolerance 1e-3 (pilot: measured 0.92497 vs 0.925)
    passed = bool(err < 1e-8 and np.all(np.abs(rho - pred) < 1e-3))
    fig, ax = figure()
    ax.bar(["fitted rho", "1 - eta lambda_k"], [float(np.mean(rho)) if np.all(np.isfinite(rho)) else 0.0, pred])
    ax.set_ylim(0.9, 0.95)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"rel. error to Phi {err:.1e} (< 1e-8); rate {np.mean(rho):.5f} vs {pred:.5f}",
                    measured={"max_rel_error": err, "rho": rho},
                    predicted={"rel_error": 0.0, "rho": pred},
                    figure=ctx.save_figure(fig, title="fitted rate vs 1 - eta lambda_k"),
                    notes="d = 10, M = 15, k = 4, lambda = (10, 6, 4, 2.5), noiseless population.")


# =============================================================================================
# C15  Theorem 5.5 with fresh samples: geometric decay to a floor ~ N^(-1/2)
# =============================================================================================
def _task_fresh(seed, *, N, rounds, phi_seed, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, noise=NOISE, seed=phi_seed)     # one Phi for every N
    tr = algorithm(p, rounds, ETA, data="fresh", batch_size=N, seed=rng)
    return tr.extra["error_target"]


@claim("flute.thm5_5.fresh_samples", paper=PAPER, reference="Theorem 5.5, eq. (8), Remark 5.6",
       statement="With fresh samples per round the error decays geometrically, at least at rate "
                 "1 - eta Delta/16, down to a floor that scales like N^(-1/2).", kind="rate")
def _c15(ctx, *, algorithm=flute):
    Ns = ctx.pick([100, 400], [100, 400, 1600], [100, 400, 1600])
    rounds = ctx.pick(200, 350, 500)
    phi_seed = ctx.seed(1000)
    out = ctx.map(_task_fresh, [{"N": N, "rounds": rounds, "phi_seed": phi_seed, "algorithm": algorithm}
                                for N in Ns], replicates=ctx.pick(1, 3, 6))
    lam = appendix_c_spectrum(10, 15)                  # the gap depends on the spectrum only
    bound = np.log(1 - ETA * 2 * (lam[1] - lam[2]) / 16)
    slopes, floors = [], []
    for row in out:
        fl_row, sl_row = [], []
        for e in row:
            e = np.asarray(e)
            if not np.all(np.isfinite(e)):
                sl_row.append(np.inf), fl_row.append(np.inf)
                continue
            floor = float(np.median(e[-rounds // 4:]))
            start = int(np.argmax(e < 0.5 * e[0]))
            stop = int(np.argmax(e < 3 * floor))
            seg = np.arange(start, max(stop, start + 5))
            sl_row.append(float(np.polyfit(seg, np.log(e[seg]), 1)[0]))
            fl_row.append(floor)
        slopes.append(sl_row), floors.append(fl_row)
    slopes, floors = np.array(slopes), np.array(floors)
    decay_ok = bool(np.all(slopes <= bound))
    if np.all(np.isfinite(floors)) and np.all(floors > 0):
        fit = fit_loglog_slope(Ns, floors)
        # floor slope band [-0.7, -0.3]: the plateau is the stationary spread of a constant-step
        # stochastic iteration, ~ sqrt(eta / N); 1-6 seeds and 3 N's leave ~0.1 of noise.
        floor_ok = -0.7 <= fit.slope <= -0.3
        fit_d = fit.as_dict()
    else:
        floor_ok, fit_d = False, None
    passed = decay_ok and floor_ok
    fig, ax = figure()
    for N, row in zip(Ns, out):
        ax.semilogy(row[0], label=f"N={N}")
    ax.set_xlabel("round"), ax.set_ylabel("(1/M) sum ||B w_i - B* w_i*||"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"pre-plateau log-slope max {np.max(slopes):.4f} <= bound {bound:.4f}: "
                            f"{decay_ok}; floor slope in N {fit_d['slope'] if fit_d else float('nan'):.2f}",
                    measured={"slopes": slopes, "floors": floors, "floor_fit": fit_d,
                              "decay_ok": decay_ok, "floor_ok": bool(floor_ok)},
                    predicted={"slope_bound": bound, "floor_slope": -0.5},
                    figure=ctx.save_figure(fig, title="error per round, first seed per N"),
                    notes="Constant N per round (not the theorem's growing N_t), App. C instance k = 2, "
                          "noise variance 0.3.")
