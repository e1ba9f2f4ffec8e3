"""Claims of FLUTE (Liu, Shen & Yang, "Federated representation learning in the
under-parameterized regime", ICML 2024): checkable claims C1–C15 (FLUTE's theorems, remarks and App. C).

Defaults follow App. C (``d = 10``, ``M = 15``, ``lambda_i = 2 min(d, M)/(i + 1)``, ``eta = 0.03``,
``alpha = 1/(10 d)``, noise variance 0.3) and the appendix normalization the theorems analyse.
Every experiment has keyword-only injection points (the algorithm, an estimator, a Gram-matrix
routine) through which the tests feed a deliberately broken variant and check that the verdict
turns to "fails".
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from scipy import stats

from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.algorithms.flute import flute, flute_init
from lowrank_fl.exact import flute as ex
from lowrank_fl.problems.multitask import haar_orthonormal
from lowrank_fl.problems.underparameterized import (UnderparameterizedProblem, appendix_c_spectrum,
                                                    underparameterized)
from verify.claim import SOLVES_KEY, Evidence, claim, omit, solve_record, verdict_from
from verify.criteria import (all_of, band, baseline_check, proportion_interval, reaches_proportion,
                             relaxation, rounds_to)
from verify.stats import fit_loglog_slope, interval_verdict, mean_ci

PAPER = "flute"
ETA = 0.03
NOISE = float(np.sqrt(0.3))     # App. C: N(0, 0.3) read as a variance


def _fig(nrows=1, ncols=1, **kw):
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), **kw)


def _tail_rate(err, high=1e-3, low=1e-11):
    """Per-round contraction factor fitted on the part of ``err`` inside (low, high)."""
    err = np.asarray(err, dtype=float)
    idx = np.flatnonzero((err < high) & (err > low))
    if len(idx) < 5:
        return np.nan
    return float(np.exp(np.polyfit(idx, np.log(err[idx]), 1)[0]))


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
    fig, ax = _fig()
    for k, row in zip(ks, out):
        ax.semilogy(10 * np.arange(len(row[0]["curve"])), row[0]["curve"], label=f"k={k}")
    ax.set_xlabel("round"), ax.set_ylabel("||BW - Phi_k||_F / ||Phi_k||_F"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max rel. error to Phi_k {rel:.1e}, max imbalance {bal:.1e} (< 1e-8)",
                    measured={"max_rel_error": rel, "max_balance": bal, "max_subspace_distance": dist,
                              "k": ks},
                    predicted={"rel_error": 0.0, "balance": 0.0},
                    figure=ctx.save_figure(fig),
                    notes="App. C instance (d = 10, M = 15), eta = 0.03, alpha = 1/(10 d), population "
                          "gradients; a different random Phi per replicate.")


# =============================================================================================
# C2  Linear rate (eq. (8)) and normalization "appendix" vs "main"
# =============================================================================================
def _task_rate(seed, *, k, normalization, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=k, seed=rng)
    tr = algorithm(p, _rounds_to_converge(p, ETA), ETA, normalization=normalization, seed=rng)
    return {"rho": _tail_rate(tr.extra["frob_target"]), "gap": p.gap,
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
                     # 1e-3: pilot runs (population fits agree with 1 - eta Delta/2 to ~1e-7). The sharp
                     # rate is asymptotic: a seed whose init barely excites the slowest mode still shows
                     # a faster transient inside the fit window, so the median over seeds is judged and
                     # the seeds off the sharp rate are counted and reported.
                     "sharp_ok": bool(fin and np.median(devs) < 1e-3)})
    bound_ok = all(r["bound_ok"] for r in rows)
    sharp_ok = all(r["sharp_ok"] for r in rows)
    passed = bound_ok and sharp_ok
    fig, ax = _fig()
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
                    table=rows, figure=ctx.save_figure(fig),
                    notes="Tail fit on 1e-11 < err < 1e-3 of population runs, judged per seed. The paper's "
                          "bound is loose by 8x in the exponent; the sharp population rate "
                          "1 - eta (lambda_k - lambda_(k+1)) is judged too, on the median over seeds "
                          "(|rho - (1 - eta Delta/2)| < 1e-3): it is an asymptotic rate, and a seed whose "
                          "init barely excites the slowest mode still decays faster inside the fit window.")


def _slowed(algorithm, factor):
    """Test helper: ``algorithm`` with the step divided by ``factor`` and ``factor`` times more rounds
    (same horizon in 'time', so it converges, but each round contracts ``factor`` times less)."""
    def run(problem, rounds, step_size, **kw):
        return algorithm(problem, factor * rounds, step_size / factor, **kw)
    return run


# =============================================================================================
# C2 (gap sweep): log(1/rho) is linear in Delta with lambda_1 fixed
# =============================================================================================
def _task_gap_rate(seed, *, g, eta, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, spectrum=[4.0, 3.0, 3.0 - g, 1.0, 0.5], seed=rng)
    # 1e-11 at rate 1 - eta g needs ~25 / (eta g) rounds after the entry phase
    tr = algorithm(p, int(26 / (eta * g)) + 200, eta, seed=rng)
    return {"rho": _tail_rate(tr.extra["frob_target"]), "gap": p.gap}


@claim("flute.thm5_5.gap_linearity", paper=PAPER, reference="Theorem 5.5, eq. (8)",
       statement="With lambda_1 fixed and the gap Delta varied, the population rate satisfies "
                 "log(1/rho) proportional to Delta (log-log slope 1).", kind="scaling")
def _c2c(ctx, *, algorithm=flute):
    gs = ctx.pick([1.5, 1.0, 0.5], [1.5, 1.0, 0.5, 0.25], [1.5, 1.0, 0.7, 0.5, 0.35, 0.25])
    eta = C9_ETA
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
        passed = band(fit.low, fit.high, 0.9, 1.1)
        slope_txt = str(fit)
    fig, ax = _fig()
    ax.loglog(delta, -np.log(rho).mean(axis=1), "o-", label="measured log(1/rho)")
    ax.loglog(delta, eta * delta / 2, "k--", label="eta Delta / 2")
    ax.set_xlabel("Delta"), ax.set_ylabel("log(1/rho)"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"log-log slope of log(1/rho) in Delta {slope_txt} (band [0.9, 1.1])",
                    measured={"Delta": delta, "rho": rho, "slope": fit_d, "slope_ok": passed},
                    predicted={"slope": 1.0, "log(1/rho)": "~ eta Delta / 2"},
                    figure=ctx.save_figure(fig),
                    notes=f"Spectrum [4, 3, 3 - g, 1, 0.5], k = 2, eta = {eta}, population; holds when the "
                          "95% interval over seeds lies in [0.9, 1.1], fails when it lies outside.")


def _task_norm(seed, *, normalization, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng)
    tr = algorithm(p, 650, ETA, normalization=normalization, seed=rng)
    W = tr.heads
    return {"rho": _tail_rate(tr.extra["frob_target"]),
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
    fig, ax = _fig()
    ax.bar(["appendix", "main"], [float(np.mean(-np.log(rho[n]))) for n in rho])
    ax.set_ylabel("-log(rho) per round")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"same limit (rel. err {rel:.1e}); log-rate ratio main/appendix "
                            f"{float(np.mean(ratio)):.3f} (predicted 2)",
                    measured={"rho_appendix": rho["appendix"], "rho_main": rho["main"],
                              "log_rate_ratio": ratio, "max_rel_error": rel},
                    predicted={"log_rate_ratio": 2.0, "rel_error": 0.0},
                    figure=ctx.save_figure(fig),
                    notes="Note §7.1: the main text's L_i carries a factor 2 in its gradient, App. A "
                          "does not; the theorems analyse the appendix version (default).")


# =============================================================================================
# C3  Entry time into region R (Prop. A.2, eq. (16))
# =============================================================================================
def _task_entry(seed, *, alpha, phi_seed, algorithm):
    # one Phi and one init direction per replicate (phi_seed), shared by its alphas, so that t_e is
    # compared across alphas on the same instance (B0, W0 = alpha * G)
    r_phi, r_init = (np.random.default_rng(s) for s in np.random.SeedSequence(phi_seed).spawn(2))
    p = underparameterized(d=10, n_clients=15, rank=4, seed=r_phi)
    G_B, G_W = flute_init(d=10, rank=4, n_clients=15, init_scale=1.0, seed=r_init)
    B0, W0 = alpha * G_B, alpha * G_W
    s0 = ex.region_quantities(ex.theta_embedding(B0, W0, p.Phi), 4)["sigmak_k"]
    TR = ex.entry_time_bound(p.spectrum, 4, ETA, s0)
    rounds = int(1.5 * TR) + 20
    tr = algorithm(p, rounds, ETA, init=(B0, W0), record_theta=True)
    sk2 = tr.extra["sigmak_k"] ** 2
    hit = np.flatnonzero(sk2 >= p.gap / 4)
    return {"t_e": int(hit[0]) if len(hit) else np.inf, "T_R": TR,
            "pred_slope": float(1 / np.log1p(0.5 * ETA * (p.spectrum[3] + p.spectrum[4])))}


@claim("flute.propA2.entry_time", paper=PAPER, reference="Proposition A.2, eq. (16)",
       statement="For a sufficiently small init scale alpha, sigma_k^2(Theta_k^t) >= Delta/4 is reached "
                 "within T_R rounds, and T_R grows like log(1/alpha) with slope "
                 "1/log(1 + (eta/2)(lambda*_k - Delta/2)).", kind="bound")
def _c3(ctx, *, algorithm=flute):
    large = [1e-1, 1e-2]                               # reported: above the small-alpha regime
    alphas = ctx.pick([1e-3, 1e-4, 1e-5], [1e-3, 1e-4, 1e-5, 1e-6], [1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8])
    reps = ctx.pick(2, 4, 8)
    all_alphas = large + alphas
    phi_seeds = [ctx.seed(1000, j) for j in range(reps)]
    grid = [{"alpha": a, "phi_seed": s, "algorithm": algorithm} for s in phi_seeds for a in all_alphas]
    flat = [row[0] for row in ctx.map(_task_entry, grid, replicates=1)]
    te_all = np.array([o["t_e"] for o in flat], dtype=float).reshape(reps, len(all_alphas)).T  # (alphas, reps)
    TR_all = np.array([o["T_R"] for o in flat]).reshape(reps, len(all_alphas)).T
    te, TR = te_all[len(large):], TR_all[len(large):]
    pred_slope = flat[0]["pred_slope"]                 # depends on the spectrum only (App. C)
    within = bool(np.all(te <= TR))
    x = np.log(1 / np.array(alphas))
    if np.all(np.isfinite(te)):
        per_seed = np.polyfit(x, te, 1)[0] / pred_slope   # slope ratio, one per replicate
        m, h = mean_ci(per_seed)
        ratio = {"mean": float(m), "ci_low": float(m - h), "ci_high": float(m + h),
                 "per_seed": per_seed}
        # band [0.75, 1.25]: the formula's slope is asymptotic (the growth factor of sigma_k before
        # the cubic term matters); pilots measure 0.85-1.0 of it
        slope_ok = band(m - h, m + h, 0.75, 1.25)
    else:
        ratio, slope_ok = {"mean": float("inf")}, False
    passed = all_of(within, slope_ok)
    fig, ax = _fig()
    xa = np.log(1 / np.array(all_alphas))
    ax.plot(xa, te_all.mean(axis=1), "o-", label="measured t_e")
    ax.plot(xa, TR_all.mean(axis=1), "s--", label="T_R (eq. 16)")
    ax.axvline(np.log(1 / max(alphas)), color="k", ls=":")
    ax.set_xlabel("log(1/alpha)"), ax.set_ylabel("rounds"), ax.legend()
    rows = [{"alpha": a, "t_e": float(te_all[i].mean()), "T_R": float(TR_all[i].mean()),
             "seeds_with_t_e_above_T_R": int(np.sum(te_all[i] > TR_all[i])), "judged": a in alphas}
            for i, a in enumerate(all_alphas)]
    return Evidence(verdict=verdict_from(passed),
                    summary=f"t_e <= T_R for alpha <= {max(alphas):g}, all seeds: {within}; slope / formula "
                            f"{ratio['mean']:.2f} [{ratio.get('ci_low', np.nan):.2f}, "
                            f"{ratio.get('ci_high', np.nan):.2f}] (band [0.75, 1.25]); seeds above T_R at "
                            f"alpha = 0.1, 0.01: {rows[0]['seeds_with_t_e_above_T_R']}, "
                            f"{rows[1]['seeds_with_t_e_above_T_R']} of {reps} (reported)",
                    measured={"rows": rows, "within": within, "slope_ratio": ratio,
                              "slope_ok": slope_ok},
                    predicted={"slope": pred_slope, "t_e": "<= T_R", "slope_ratio": "in [0.75, 1.25]"},
                    table=rows, figure=ctx.save_figure(fig),
                    notes="k = 4, App. C spectrum, population gradients; per replicate one random Phi and one "
                          "init direction G, B0, W0 = alpha G. Prop. A.2 needs alpha 'sufficiently small' "
                          "(Lemma A.4); its bound is judged for alpha <= 1e-3. At alpha = 0.1 and 0.01 (the "
                          "experiments' 1/(10 d)) t_e exceeds T_R on some instances in pilots (e.g. 66 vs "
                          "46 rounds): reported, not judged. The fourth condition of Claim A.3 "
                          "(sigma_1^2(Theta_res) <= c_1 sigma_k(Theta_k)^(1+kappa)) fails at every alpha "
                          "tried, yet the bound held for alpha <= 1e-3 in pilots. The slope of t_e in "
                          "log(1/alpha) is fitted per replicate; its 95% t-interval decides.")


# =============================================================================================
# C4  Absorbing region (Prop. A.9)
# =============================================================================================
def _task_absorb(seed, *, samples, rounds, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng, noise=NOISE if samples else 0.0,
                           samples_per_client=None)
    tr = algorithm(p, rounds, ETA, record_theta=True, data="fresh" if samples else None,
                   batch_size=samples, seed=rng)
    l1s, lks = 2 * p.spectrum[0], 2 * p.spectrum[1]
    gap = p.gap
    s1, sr, sk = (tr.extra[n] ** 2 for n in ("sigma1", "sigma1_res", "sigmak_k"))
    inR = (s1 <= 2 * l1s) & (sr <= lks - gap / 2) & (sk >= gap / 4)
    hit = np.flatnonzero(inR)
    if tr.status == "diverged":
        return {"entered": bool(len(hit)), "violations": rounds, "max_s1_ratio": np.inf}
    if not len(hit):
        return {"entered": False, "violations": 0, "max_s1_ratio": float(np.nanmax(s1) / (2 * l1s))}
    after = slice(hit[0], None)
    return {"entered": True, "violations": int(np.sum(~inR[after])),
            "max_s1_ratio": float(np.max(s1[after]) / (2 * l1s))}


@claim("flute.propA9.absorbing", paper=PAPER, reference="Proposition A.9 (region R)",
       statement="Once Theta^t enters R = {sigma_1^2(Theta) <= 2 lambda*_1, sigma_1^2(Theta_res) <= "
                 "lambda*_k - Delta/2, sigma_k^2(Theta_k) >= Delta/4} it stays there.", kind="bound")
def _c4(ctx, *, algorithm=flute):
    grid = [{"samples": None, "rounds": ctx.pick(300, 600, 1500), "algorithm": algorithm}]
    out = ctx.map(_task_absorb, grid, replicates=ctx.pick(2, 3, 10))
    if ctx.scale != "smoke":
        grid.append({"samples": ctx.pick(None, 1000, 2000), "rounds": ctx.pick(300, 300, 400),
                     "algorithm": algorithm})
        out += ctx.map(_task_absorb, grid[1:], replicates=3)
    flat = [o for row in out for o in row]
    entered = all(o["entered"] for o in flat)
    viol = sum(o["violations"] for o in flat)
    passed = entered and viol == 0
    fig, ax = _fig()
    ax.bar([f"{'pop' if g['samples'] is None else 'N=' + str(g['samples'])}" for g in grid],
           [sum(o["violations"] for o in row) for row in out])
    ax.set_ylabel("rounds outside R after entry")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"entered R in every run: {entered}; rounds outside R after entry: {viol}",
                    measured={"violations": viol, "entered_all": entered,
                              "max_sigma1_sq_over_2lambda1*": max(o["max_s1_ratio"] for o in flat)},
                    predicted={"violations": 0}, figure=ctx.save_figure(fig),
                    notes="Population runs; quick/full add fresh-sample runs with large N.")


# =============================================================================================
# C5  Inverse-SNR contraction (Lemma A.10)
# =============================================================================================
def _task_snr(seed, *, steps, eta_small, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng)
    # enter R with the reference FLUTE at eta = 0.03 (the lemma is about the steps inside R):
    # find the entry round, then replay the same run up to 5 rounds past it
    warm_seed = int(rng.integers(2 ** 32))
    probe = flute(p, 400, ETA, record_theta=True, seed=warm_seed)
    hit = np.flatnonzero(probe.extra["sigmak_k"] ** 2 >= p.gap / 4)
    if not len(hit):
        return {"entered": False, "worst": np.inf, "frac_exp": 0.0}
    warm = flute(p, int(hit[0]) + 5, ETA, seed=warm_seed)
    res = {}
    for name, eta in (("theory", eta_small), ("experiment", ETA)):
        tr = algorithm(p, steps, eta, init=(warm.B, warm.heads), record_theta=True)
        ratio = (tr.extra["sigma1_res"] / tr.extra["sigmak_k"]) ** 2
        bound = (1 - eta * p.gap / 16) ** 2
        # ratio_(t+1) / (bound * ratio_t): <= 1 where Lemma A.10 holds
        with np.errstate(divide="ignore", invalid="ignore"):
            q = ratio[1:] / (bound * ratio[:-1])
        res[name] = q
    # a non-finite step ratio (sigma_k(Theta_k) = 0 or a diverged run) is a violation, not skipped
    th = res["theory"]
    return {"entered": True, "worst": float(np.max(th)) if np.all(np.isfinite(th)) else np.inf,
            "n_nonfinite": int(np.sum(~np.isfinite(th))),
            "frac_exp": float(np.mean(res["experiment"] <= 1 + 1e-12))}


@claim("flute.lemA10.inverse_snr", paper=PAPER, reference="Lemma A.10",
       statement="Inside R with eta <= Delta^2/(36 lambda*_1^3), the inverse SNR "
                 "sigma_1^2(Theta_res)/sigma_k^2(Theta_k) contracts by (1 - eta Delta/16)^2 per step.",
       kind="bound")
def _c5(ctx, *, algorithm=flute):
    lam = appendix_c_spectrum(10, 15)                  # Phi's spectrum does not depend on the seed
    gap = 2 * (lam[1] - lam[2])                        # Delta at k = 2
    eta_small = gap ** 2 / (36 * (2 * lam[0]) ** 3)
    out = ctx.map(_task_snr, [{"steps": ctx.pick(200, 1000, 2000), "eta_small": eta_small,
                               "algorithm": algorithm}], replicates=ctx.pick(2, 4, 8))[0]
    worst = max(o["worst"] for o in out)
    n_nonfinite = sum(o.get("n_nonfinite", 0) for o in out)
    entered = all(o["entered"] for o in out)
    # 1e-10: the per-step ratio is a quotient of singular values computed to ~1e-15 relative.
    passed = entered and worst <= 1 + 1e-10
    frac = float(np.mean([o["frac_exp"] for o in out]))
    fig, ax = _fig()
    ax.bar(["worst step (theory eta)"], [min(worst, 10.0)])          # inf (non-finite step) clipped
    ax.axhline(1.0, color="k", ls="--")
    ax.set_ylabel("ratio_(t+1) / ((1 - eta Delta/16)^2 ratio_t)")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"worst per-step contraction / bound = {worst:.6f} (<= 1); at eta = 0.03 "
                            f"it holds on {100 * frac:.0f}% of steps",
                    measured={"worst_ratio": worst, "fraction_holding_at_eta_0.03": frac,
                              "eta_theory": eta_small, "entered_all": entered,
                              "nonfinite_steps": n_nonfinite},
                    predicted={"worst_ratio": "<= 1"}, figure=ctx.save_figure(fig),
                    notes="Started inside R (5 rounds after FLUTE at eta = 0.03 enters it), then "
                          "eta = Delta^2/(36 lambda*_1^3) (population). A non-finite step ratio counts "
                          "as a violation (worst = inf).")


# =============================================================================================
# C6  Gradient-discrepancy concentration (Lemmas A.13, A.14)
# =============================================================================================
def _empirical_gram(X):
    """Per-client ``X_i^T X_i / N`` (M, d, d) for X (M, N, d)."""
    return np.swapaxes(X, 1, 2) @ X / X.shape[1]


def _task_discrepancy(seed, *, N, spectrum, k, gram, phi_seed, d=10, noise=NOISE, residual="Phi",
                      sample_seed=None):
    """A_1, A_2 of Lemmas A.13-A.14 at the balanced optimum of a Phi drawn with ``phi_seed``
    (shared by the grid points, so only the samples vary); ``residual`` names the label model the
    noise residual E = y - X phi is taken against ("Phi": the truth, as in the lemma). With
    ``sample_seed`` the samples come from it instead of ``seed`` (common random numbers)."""
    rng = np.random.default_rng(seed if sample_seed is None else sample_seed)
    p = underparameterized(d=d, n_clients=15, rank=k, spectrum=spectrum, noise=noise, seed=phi_seed)
    Bs, Ws = ex.balanced_factors(p.Phi, k)              # Ws (M, k): heads, client axis first
    X, y = p.sample(N, rng)
    R = Bs @ Ws.T - p.Phi                                # (d, M) residual at the optimum
    G = gram(X)
    D = R - np.einsum("mde,em->dm", G, R)                # (I - X_i^T X_i/N) r_i
    A1 = np.linalg.norm(D @ Ws, 2)
    E = y - np.einsum("mnd,dm->mn", X, p.Phi if residual == "Phi" else p.target)
    A2 = np.linalg.norm(np.einsum("mnd,mn->dm", X, E) @ Ws / N, 2)
    return {"A1": float(A1), "A2": float(A2)}


@claim("flute.lemA13.discrepancy", paper=PAPER, reference="Lemmas A.13-A.14, Sec. 5.2",
       statement="At the optimum (B*, W*) the gradient discrepancy A_1 is non-zero in the "
                 "under-parameterized case and decays like N^(-1/2) (as does the noise term A_2); "
                 "it is exactly zero when rank(Phi) <= k and sigma = 0.", kind="scaling")
def _c6(ctx, *, gram=_empirical_gram):
    Ns = ctx.pick([50, 200, 800], [50, 100, 200, 400, 800, 1600], [50, 100, 200, 400, 800, 1600, 3200])
    phi_seed = ctx.seed(1000)
    out = ctx.map(_task_discrepancy, [{"N": N, "spectrum": None, "k": 2, "gram": gram, "phi_seed": phi_seed}
                                      for N in Ns], replicates=ctx.pick(4, 10, 30))
    A1 = np.array([[o["A1"] for o in row] for row in out])
    A2 = np.array([[o["A2"] for o in row] for row in out])
    f1 = fit_loglog_slope(Ns, A1)
    f2 = fit_loglog_slope(Ns, A2)
    over = ctx.map(_task_discrepancy_over, [{"gram": gram, "phi_seed": phi_seed}], replicates=1)[0][0]
    # slope band -0.5 +- 0.1: Monte Carlo noise of a log-log fit over >= 3 decades
    # of N with >= 4 seeds is ~0.03.
    passed = bool(-0.6 <= f1.slope <= -0.4 and -0.6 <= f2.slope <= -0.4 and over < 1e-10
                  and np.all(A1 > 0))
    fig, ax = _fig()
    ax.loglog(Ns, A1.mean(axis=1), "o-", label="A_1 (discrepancy)")
    ax.loglog(Ns, A2.mean(axis=1), "s-", label="A_2 (noise)")
    ax.set_xlabel("N"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"slope of A_1 in N {f1}, of A_2 {f2} (band [-0.6, -0.4]); "
                            f"over-parameterized A_1 = {over:.1e}",
                    measured={"slope_A1": f1.as_dict(), "slope_A2": f2.as_dict(),
                              "A1_overparameterized": over},
                    predicted={"slope": -0.5, "A1_overparameterized": 0.0},
                    figure=ctx.save_figure(fig),
                    notes="App. C instance, k = 2, one Phi (seed recorded); fresh X at the balanced "
                          "optimum (B*, W*). The d- and sigma-sweeps are flute.lemA13.dimension_noise.")


def _task_discrepancy_over(seed, *, gram, phi_seed):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=3, spectrum=[5.0, 3.0, 2.0], seed=phi_seed)
    Bs, Ws = ex.balanced_factors(p.Phi, 3)
    X, _ = p.sample(100, rng)
    R = Bs @ Ws.T - p.Phi
    D = R - np.einsum("mde,em->dm", gram(X), R)
    return float(np.linalg.norm(D @ Ws, 2))


def _gram_first_features(X, n_est=10):
    """Test helper (broken): the Gram matrix estimated on the first ``n_est`` features only, the
    others taken as known (identity): the discrepancy stops growing with d."""
    G = np.broadcast_to(np.eye(X.shape[2]), (X.shape[0],) + (X.shape[2],) * 2).copy()
    Xs = X[:, :, :n_est]
    G[:, :n_est, :n_est] = np.swapaxes(Xs, 1, 2) @ Xs / X.shape[1]
    return G


@claim("flute.lemA13.dimension_noise", paper=PAPER, reference="Lemmas A.13-A.14 (sqrt(d/N) and sigma factors)",
       statement="At fixed spectrum and N, the gradient discrepancy A_1 at the optimum grows like d^(1/2) "
                 "and the noise term A_2 like d^(1/2) and linearly in the noise level sigma.",
       kind="scaling")
def _c6b(ctx, *, gram=_empirical_gram, residual="Phi"):
    ds = ctx.pick([10, 20, 40], [10, 20, 40, 80], [10, 20, 40, 80, 160])
    sigmas = ctx.pick([0.1, 0.3, 1.0], [0.05, 0.1, 0.3, 1.0], [0.03, 0.1, 0.3, 1.0, 3.0])
    N, reps = 400, ctx.pick(4, 10, 30)
    spec = appendix_c_spectrum(10, 15)                 # fixed spectrum (so E is fixed) for every d
    phi_seed = ctx.seed(1000)
    common = {"N": N, "spectrum": spec, "k": 2, "gram": gram, "phi_seed": phi_seed, "residual": residual}
    by_d = ctx.map(_task_discrepancy, [{**common, "d": d} for d in ds], replicates=reps)
    # sigma-sweep with common random numbers (the same X, xi for every sigma of a replicate)
    ss = [ctx.seed(2000, j) for j in range(reps)]
    by_s = ctx.map(_task_discrepancy, [{**common, "noise": sg, "sample_seed": s} for s in ss for sg in sigmas],
                   replicates=1)
    A1d = np.array([[o["A1"] for o in row] for row in by_d])
    A2d = np.array([[o["A2"] for o in row] for row in by_d])
    A2s = np.array([row[0]["A2"] for row in by_s]).reshape(reps, len(sigmas)).T
    fits = {"A1_vs_d": fit_loglog_slope(ds, A1d), "A2_vs_d": fit_loglog_slope(ds, A2d),
            "A2_vs_sigma": fit_loglog_slope(sigmas, A2s)}
    # bands: Lemma A.13 gives +0.5 in d (+-0.1 as for N); A_2 is linear in sigma (+-0.1)
    bands = {"A1_vs_d": (0.4, 0.6), "A2_vs_d": (0.4, 0.6), "A2_vs_sigma": (0.9, 1.1)}
    flags = {key: band(f.low, f.high, *bands[key]) for key, f in fits.items()}
    passed = all_of(*flags.values())
    fig, ax = _fig(1, 2)
    ax[0].loglog(ds, A1d.mean(axis=1), "o-", label="A_1"), ax[0].loglog(ds, A2d.mean(axis=1), "s-", label="A_2")
    ax[0].set_xlabel(f"d (N = {N})"), ax[0].legend()
    ax[1].loglog(sigmas, A2s.mean(axis=1), "s-"), ax[1].set_xlabel("noise sigma"), ax[1].set_ylabel("A_2")
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"{key} slope {f}" for key, f in fits.items())
                            + " (bands [0.4, 0.6], [0.4, 0.6], [0.9, 1.1])",
                    measured={**{f"slope_{key}": f.as_dict() for key, f in fits.items()},
                              **{f"{key}_ok": v for key, v in flags.items()}},
                    predicted={"slope_A1_vs_d": 0.5, "slope_A2_vs_d": 0.5, "slope_A2_vs_sigma": 1.0},
                    figure=ctx.save_figure(fig),
                    notes="M = 15, k = 2, App. C spectrum for d = 10 kept fixed as d grows, N = 400 fresh "
                          "samples at the balanced optimum; 95% t-intervals over seeds decide (holds inside "
                          "the band, fails entirely outside). The sigma-sweep reuses the same samples for "
                          "every sigma, so with the truth as residual model A_2 is exactly linear in sigma: "
                          "it is a consistency check of the noise term (a misspecified residual, e.g. "
                          "against Phi_k, breaks it), the d-slopes are the lemma's content.")


# =============================================================================================
# C7  Statistical error ~ N^(-1/2) (Theorem 5.1)
# =============================================================================================
C7_SPECTRUM = [6.0, 5.0, 4.0, 2.0, 1.5, 1.0]


def _task_sample_scaling(seed, *, N, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=20, n_clients=10, rank=3, spectrum=C7_SPECTRUM, samples_per_client=N, noise=NOISE, seed=rng)
    tr = algorithm(p, 450, ETA, data="fixed", record_every=450, seed=rng)
    return float(tr.extra["error_target"][-1]) if tr.status != "diverged" else np.inf


@claim("flute.thm5_1.sample_scaling", paper=PAPER, reference="Theorem 5.1, eq. (7)",
       statement="The error (1/M) sum_i ||B w_i - B* w_i*|| of FLUTE run to convergence scales like "
                 "N^(-1/2) in the per-client sample size N.", kind="scaling")
def _c7(ctx, *, algorithm=flute):
    Ns = ctx.pick([50, 400], [50, 100, 200, 400, 800, 1600], [50, 100, 200, 400, 800, 1600])
    out = ctx.map(_task_sample_scaling, [{"N": N, "algorithm": algorithm} for N in Ns],
                  replicates=ctx.pick(2, 4, 6))
    err = np.array(out, dtype=float)
    if not np.all(np.isfinite(err)) or np.any(err <= 0):
        return Evidence(verdict="fails", summary="FLUTE did not converge on every instance",
                        measured={"errors": err}, predicted={"slope": -0.5})
    fit = fit_loglog_slope(Ns, err)
    passed = bool(-0.6 <= fit.slope <= -0.4)
    fig, ax = _fig()
    ax.loglog(Ns, err.mean(axis=1), "o-")
    ax.set_xlabel("samples per client N"), ax.set_ylabel("(1/M) sum ||B w_i - Phi_k e_i||")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"fitted slope {fit} (band [-0.6, -0.4])",
                    measured={"slope": fit.as_dict(), "mean_error": err.mean(axis=1)},
                    predicted={"slope": -0.5}, figure=ctx.save_figure(fig),
                    notes="d = 20, M = 10, k = 3, spectrum [6, 5, 4, 2, 1.5, 1], noise variance 0.3, "
                          "fixed dataset, 450 rounds at eta = 0.03 (rate 0.94 per round).")


# =============================================================================================
# C8  M-scaling (Remark 5.2)
# =============================================================================================
C8_SPECTRUM = [6.0, 5.0, 4.0, 2.0, 1.0]


def _task_m_scaling(seed, *, d, N, M, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=d, n_clients=M, rank=3, spectrum=C8_SPECTRUM, samples_per_client=N, noise=NOISE, seed=rng)
    tr = algorithm(p, 450, ETA, data="fixed", record_every=450, seed=rng)
    return float(tr.extra["error_target"][-1]) if tr.status != "diverged" else np.inf


@claim("flute.rem5_2.client_scaling", paper=PAPER, reference="Remark 5.2",
       statement="At fixed N and fixed spectrum, the per-client error falls like M^(-1/2) (or "
                 "faster) while M < d, and the gain flattens once M > d.", kind="scaling")
def _c8(ctx, *, algorithm=flute):
    d = ctx.pick(20, 20, 40)
    N = ctx.pick(60, 100, 200)
    Ms = ctx.pick([5, 10, 20], [5, 10, 20, 40, 80], [6, 12, 24, 48, 96])
    out = ctx.map(_task_m_scaling, [{"d": d, "N": N, "M": M, "algorithm": algorithm} for M in Ms],
                  replicates=ctx.pick(3, 6, 6))        # full: 6 seeds x 5 M's at d = 40 ~ 35 s
    err = np.array(out, dtype=float)
    if not (np.all(np.isfinite(err)) and np.all(err > 0)):
        return Evidence(verdict="fails", summary="FLUTE did not converge on every instance",
                        measured={"errors": err, "converged": False},
                        predicted={"slope_M_le_d": "<= -0.5"})
    low = [i for i, M in enumerate(Ms) if M <= d]
    high = [i for i, M in enumerate(Ms) if M >= d // 2]
    f_low = fit_loglog_slope([Ms[i] for i in low], err[low])
    mono = bool(np.all(np.diff(err.mean(axis=1)) <= 0))
    # slope <= -0.5 (Remark 5.2) judged on the 95% interval over seeds
    slope_ok = interval_verdict(f_low.low, f_low.high, -0.5, side="below")
    measured = {"slope_M_le_d": f_low.as_dict(), "mean_error": err.mean(axis=1), "M": Ms, "d": d,
                "monotone": mono, "slope_ok": slope_ok}
    flags = [mono, slope_ok]
    if len(high) >= 2 and max(Ms) > d:
        f_high = fit_loglog_slope([Ms[i] for i in high], err[high])
        diff = f_high.per_seed - f_low.per_seed             # paired by seed
        m, h = mean_ci(diff)
        flat_ok = interval_verdict(m - h, m + h, 0.0, side="above")
        measured.update({"slope_M_ge_d/2": f_high.as_dict(), "flattening": [float(m), float(h)],
                         "flattening_ok": flat_ok})
        flags.append(flat_ok)
    passed = all_of(*flags)
    fig, ax = _fig()
    ax.loglog(Ms, err.mean(axis=1), "o-")
    ax.axvline(d, color="k", ls=":")
    ax.set_xlabel("clients M"), ax.set_ylabel("(1/M) sum ||B w_i - Phi_k e_i||")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"error non-increasing in M: {mono}; slope for M <= d {f_low} (<= -0.5)"
                            + (f"; slope for M >= d/2 {measured['slope_M_ge_d/2']['slope']:.2f}"
                               if "slope_M_ge_d/2" in measured else ""),
                    measured=measured,
                    predicted={"slope_M_le_d": "<= -0.5 (95% interval)",
                               "flattening": "slope for M >= d/2 larger than for M <= d (paired interval)"},
                    figure=ctx.save_figure(fig),
                    notes="Fixed rank-5 spectrum (E fixed), so per-client column norms shrink like "
                          "M^(-1/2) and the error can fall faster than M^(-1/2) (Remark 5.2 is an upper bound). "
                          "Slopes are fitted per seed; holds when the 95% interval lies below -0.5, fails "
                          "when it lies above, else inconclusive. Smoke scale covers M <= d only (no "
                          "flattening test).")


def _local_ols(problem, rounds, step_size, **kw):
    """Test helper (broken: no collaboration): each client's own least squares, error to Phi_k."""
    theta = np.stack([np.linalg.lstsq(X, y, rcond=None)[0] for X, y in zip(problem.X, problem.y)], axis=1)
    err = float(np.mean(np.linalg.norm(theta - problem.target, axis=0)))
    return SimpleNamespace(status="optimal", extra={"error_target": np.array([err])})


# =============================================================================================
# C9  Gap dependence (Remarks 5.3, 5.7)
# =============================================================================================
C9_ETA = 0.075


def _task_gap(seed, *, g, N, rounds, algorithm):
    rng = np.random.default_rng(seed)
    spec = [4.0, 3.0, 3.0 - g, 1.0, 0.5]
    p = underparameterized(d=10, n_clients=15, rank=2, spectrum=spec, seed=rng)
    pop = algorithm(p, rounds, C9_ETA, record_every=10, seed=rng)
    e = pop.extra["frob_target"] / np.linalg.norm(p.target)
    hit = np.flatnonzero(e < 1e-6)
    q = underparameterized(d=10, n_clients=15, rank=2, spectrum=spec, samples_per_client=N, noise=NOISE, seed=rng)
    fixed = algorithm(q, rounds, C9_ETA, data="fixed", record_every=rounds, seed=rng)
    return {"iters": int(hit[0]) if len(hit) else np.inf, "error": float(fixed.extra["error_target"][-1])}


@claim("flute.rem5_7.gap_dependence", paper=PAPER, reference="Remarks 5.3 and 5.7",
       statement="A smaller spectral gap Delta means more iterations to converge and a larger "
                 "final error at fixed N.", kind="scaling")
def _c9(ctx, *, algorithm=flute):
    gs = ctx.pick([1.0, 0.2], [2.0, 1.0, 0.5, 0.2], [2.0, 1.0, 0.5, 0.3, 0.2])
    # 1e-6 at rate 1 - eta g needs ~14 / (eta g) rounds after the entry phase
    rounds = int(14 / (C9_ETA * min(gs))) + 200
    out = ctx.map(_task_gap, [{"g": g, "N": 40, "rounds": rounds, "algorithm": algorithm} for g in gs],
                  replicates=ctx.pick(2, 6, 20))
    iters = np.array([[o["iters"] for o in row] for row in out], dtype=float)
    err = np.array([[o["error"] for o in row] for row in out])
    it_mono = bool(np.all(np.diff(iters.mean(axis=1)) > 0))
    rho = stats.spearmanr(np.repeat(gs, err.shape[1]), err.ravel()).statistic
    err_mono = bool(np.all(np.diff(err.mean(axis=1)) > 0))
    passed = it_mono and err_mono
    fig, ax = _fig(1, 2)
    ax[0].plot(2 * np.array(gs), iters.mean(axis=1), "o-"), ax[0].set_xlabel("Delta")
    ax[0].set_ylabel("rounds to 1e-6 (population)")
    ax[1].plot(2 * np.array(gs), err.mean(axis=1), "o-"), ax[1].set_xlabel("Delta")
    ax[1].set_ylabel("final error (N = 40)")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"iterations increase as Delta shrinks: {it_mono}; mean final error "
                            f"increases: {err_mono} (Spearman {rho:.2f})",
                    measured={"Delta": 2 * np.array(gs), "iterations": iters.mean(axis=1),
                              "final_error": err.mean(axis=1), "spearman_error_vs_gap": float(rho)},
                    predicted={"monotone": "decreasing in Delta"}, figure=ctx.save_figure(fig),
                    notes="Spectrum [4, 3, 3 - g, 1, 0.5], k = 2, eta = 0.075; only monotonicity is "
                          "tested (the bound's Delta^-6 constants are loose).")


# =============================================================================================
# C10  Example 1: averaging local optima fails
# =============================================================================================
def _task_example1(seed, *, M, algorithm):
    rng = np.random.default_rng(seed)
    lam = np.linspace(5.0, 1.0, M)       # gap 4/(M-1) >= 0.2: converges within 3000 rounds
    U = haar_orthonormal(d=2 * M, rank=M, seed=rng)
    p = UnderparameterizedProblem(U=U, spectrum=lam, V=np.eye(M), k=1)
    u1 = U[:, 0]

    def cos(v):
        return float(abs(v @ u1) / np.linalg.norm(v))

    plain = cos(U.mean(axis=1))                          # w_i = lambda_i: B = mean u_i
    weighted = cos(U @ np.sqrt(lam / M))                 # w_i = sqrt(lambda_i / M)
    tr = algorithm(p, 3000, 0.05, record_every=3000, seed=rng)
    return {"plain": plain, "weighted": weighted, "pred_plain": 1 / np.sqrt(M),
            "pred_weighted": float(np.sqrt(lam[0] / lam.sum())), "flute_dist": float(tr.distance[-1])}


@claim("flute.ex1.averaging", paper=PAPER, reference="Example 1 (Sec. 4.1)",
       statement="Averaging local optima gives |cos(avg, u_1)| = 1/sqrt(M) (or sqrt(lambda_1 / "
                 "sum lambda_i) with sqrt-weights), while FLUTE recovers span(u_1).", kind="comparison")
def _c10(ctx, *, algorithm=flute):
    out = ctx.map(_task_example1, [{"M": M, "algorithm": algorithm} for M in ctx.pick([5], [5, 10], [5, 10, 20])],
                  replicates=ctx.pick(2, 4, 10))
    flat = [o for row in out for o in row]
    id_err = max(max(abs(o["plain"] - o["pred_plain"]), abs(o["weighted"] - o["pred_weighted"]))
                 for o in flat)
    dist = max(o["flute_dist"] for o in flat)
    # identities: exact up to rounding (1e-12); FLUTE: principal angle < 1e-6 (Example 1)
    passed = id_err < 1e-12 and dist < 1e-6
    fig, ax = _fig()
    ax.bar(["avg (w=lambda)", "avg (w=sqrt)", "FLUTE"],
           [np.mean([o["plain"] for o in flat]), np.mean([o["weighted"] for o in flat]),
            np.mean([np.sqrt(1 - o["flute_dist"] ** 2) for o in flat])])
    ax.set_ylabel("|cos angle to u_1|")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"averaging identities to {id_err:.1e}; FLUTE sin-angle to u_1 {dist:.1e} (< 1e-6)",
                    measured={"identity_error": id_err, "flute_max_sin_angle": dist,
                              "mean_cos_plain_avg": float(np.mean([o["plain"] for o in flat]))},
                    predicted={"cos_plain_avg": "1/sqrt(M)", "flute_sin_angle": 0.0},
                    figure=ctx.save_figure(fig),
                    notes="Phi = U diag(lambda) (V = I), d = 2M, k = 1, population gradients.")


# =============================================================================================
# C11  FLUTE vs FedRep / FedRep(RI) (Fig. 1 / Fig. 3)
# =============================================================================================
def _erm_objective(p, B, W):
    """``(1/2) sum_i (1/N) ||X_i B w_i - y_i||^2`` (the ERM's objective, ErmResult's normalisation)."""
    r = np.einsum("mnd,dm->mn", p.X, B @ W.T) - p.y
    return 0.5 * float(np.sum(np.mean(r * r, axis=1)))


def _task_vs_fedrep(seed, *, k, rounds, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=k, samples_per_client=20, noise=NOISE, seed=rng)
    fl = algorithm(p, rounds, ETA, data="fixed", seed=rng).extra["error_truth"]
    fr_tr = fedrep(p, rounds, 0.1, init="moments", seed=rng)
    fr = fr_tr.extra["error_truth"]
    ri = fedrep(p, rounds, 0.1, init="random", seed=rng).extra["error_truth"]
    erm = ex.altmin_erm(p.X, p.y, k)       # FedRep's own reference: the empirical rank-k ERM
    plateau_fl, plateau_fr = float(fl[-1]), float(fr[-1])
    level = 1.05 * min(plateau_fl, float(ri[-1]))
    return {"plateau_flute": plateau_fl, "plateau_fedrep": plateau_fr,
            "plateau_fedrep_ri": float(ri[-1]), "early_flute": float(fl[10]),
            "early_fedrep": float(fr[10]), "rounds_flute": rounds_to(fl, level),
            "rounds_fedrep_ri": rounds_to(ri, level),
            "fedrep_objective": _erm_objective(p, fr_tr.B, fr_tr.heads), "erm_objective": float(erm.objective),
            "curves": [fl[::10], fr[::10], ri[::10]],
            SOLVES_KEY: [solve_record(erm, what="AltMin rank-k ERM"), solve_record(fr_tr, what="FedRep")]}


@claim("flute.fig1.vs_fedrep", paper=PAPER, reference="Figures 1 and 3 (App. C)",
       statement="FedRep (moment init) has lower error early on, but FLUTE eventually reaches a lower "
                 "or equal error than FedRep.", kind="comparison")
def _c11(ctx, *, algorithm=flute):
    ks = ctx.pick([2], [2, 4], [2, 4, 6, 8])
    rounds = ctx.pick(300, 800, 1500)
    out = ctx.map(_task_vs_fedrep, [{"k": k, "rounds": rounds, "algorithm": algorithm} for k in ks],
                  replicates=ctx.pick(2, 6, 12))
    rows, flags, worst = [], [], None
    for k, row in zip(ks, out):
        # per-seed plateau ratio FLUTE / FedRep - 1 and round-10 gap, decided on t-intervals over
        # seeds: late "FLUTE <= FedRep + 1%" (criterion (i), Figs. 1 and 3), early "FedRep < FLUTE"
        ratio = np.array([o["plateau_flute"] / o["plateau_fedrep"] - 1 for o in row])
        early_gap = np.array([o["early_fedrep"] - o["early_flute"] for o in row])
        rm, rh = mean_ci(ratio)
        em, eh = mean_ci(early_gap)
        late = interval_verdict(float(rm - rh), float(rm + rh), 0.01, side="below")
        if not np.all(np.isfinite([o["plateau_flute"] for o in row])):
            late = False                                     # FLUTE blew up: it never gets below FedRep
        early = interval_verdict(float(em - eh), float(em + eh), 0.0, side="below")
        flags += [late, early]
        pf = float(np.mean([o["plateau_flute"] for o in row]))
        pr = float(np.mean([o["plateau_fedrep"] for o in row]))
        rows.append({"k": k, "late_ok": late, "early_ok": early, "plateau_ratio_minus_1": float(rm),
                     "plateau_ratio_ci": [float(rm - rh), float(rm + rh)],
                     "round10_gap_fedrep_minus_flute": float(em), "round10_gap_ci": [float(em - eh), float(em + eh)],
                     "plateau_flute": pf, "plateau_fedrep": pr,
                     "plateau_fedrep_ri": float(np.mean([o["plateau_fedrep_ri"] for o in row])),
                     "error_round10_flute": float(np.mean([o["early_flute"] for o in row])),
                     "error_round10_fedrep": float(np.mean([o["early_fedrep"] for o in row])),
                     "rounds_to_1.05plateau_flute": float(np.mean([o["rounds_flute"] for o in row])),
                     "rounds_to_1.05plateau_fedrep_ri": float(np.mean([o["rounds_fedrep_ri"] for o in row]))})
        r = rows[-1]
        # (ii), (iii), reported only (see the claim's notes)
        r["ii_flute_fewer_rounds_than_ri"] = bool(r["rounds_to_1.05plateau_flute"]
                                                  < r["rounds_to_1.05plateau_fedrep_ri"])
        r["iii_plateau_gap_fedrep_minus_flute"] = float(pr - pf)
        margin = float(rm + rh) - 0.01                      # how close k comes to deciding "fails"
        if worst is None or margin > worst[0]:
            worst = (margin, k, row)
    passed = all_of(*flags)
    # the baseline first: FedRep (moment init) must reach its own reference, the empirical rank-k ERM
    # (AltMin, 3 restarts), to 1e-3 relative in objective on every seed
    fr_obj = np.array([o["fedrep_objective"] for row in out for o in row])
    erm_obj = np.array([o["erm_objective"] for row in out for o in row])
    baselines = [baseline_check("FedRep (moment init) objective vs the AltMin rank-k ERM, worst seed",
                                float(np.max(fr_obj / erm_obj)), 1.0, rtol=1e-3)]
    gaps = [r["iii_plateau_gap_fedrep_minus_flute"] for r in rows]
    # the plot shows the k whose interval comes closest to deciding the verdict, mean over seeds
    _, k_dec, row_dec = worst
    fig, ax = _fig()
    for j, name in enumerate(("FLUTE", "FedRep", "FedRep(RI)")):
        curve = np.mean([o["curves"][j] for o in row_dec], axis=0)
        ax.plot(10 * np.arange(len(curve)), curve, label=name)
    ax.set_title(f"k = {k_dec} (deciding case), mean of {len(row_dec)} seeds")
    ax.set_xlabel("round"), ax.set_ylabel("(1/M) sum ||B w_i - phi_i||"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"k={r['k']}: plateau FLUTE/FedRep - 1 = {r['plateau_ratio_minus_1']:+.1e} "
                                      f"[{r['plateau_ratio_ci'][0]:+.1e}, {r['plateau_ratio_ci'][1]:+.1e}] (<= 1%), "
                                      f"round-10 error {r['error_round10_flute']:.2f} vs {r['error_round10_fedrep']:.2f}"
                                      for r in rows),
                    measured={"rows": rows, "late_ok": all_of(*[r["late_ok"] for r in rows]),
                              "early_ok": all_of(*[r["early_ok"] for r in rows]), "deciding_k": k_dec,
                              "iii_gap_decreasing_in_k (reported)": bool(np.all(np.diff(gaps) <= 0))
                              if len(gaps) > 1 else None},
                    table=rows, baselines=baselines,
                    predicted={"plateau": "FLUTE <= FedRep (+1%), 95% t-interval of the per-seed ratio",
                               "early": "FedRep < FLUTE at round 10, 95% t-interval of the per-seed gap",
                               "baseline": "FedRep reaches the AltMin rank-k ERM objective (1e-3 relative)",
                               "(ii) rounds FLUTE < FedRep(RI), reported": True,
                               "(iii) gap decreasing in k, reported": True},
                    relaxations=[relaxation("mean plateau over the seeds: FLUTE <= 1.01 FedRep (4 seeds at "
                                            "full scale)", all(r["plateau_flute"] <= 1.01 * r["plateau_fedrep"]
                                                               for r in rows),
                                            relaxed="95% t-interval of the per-seed ratio FLUTE/FedRep - 1 "
                                                    "below 0.01 (12 seeds at full scale)",
                                            relaxed_outcome=all_of(*[r["late_ok"] for r in rows]),
                                            reason="a bare mean over 4 seeds flipped between scales; issue 9 "
                                                   "asks for intervals over enough seeds (not a looser band)")],
                    figure=ctx.save_figure(fig),
                    notes="Fixed dataset (N = 20, M = 15, d = 10, noise variance 0.3), FLUTE eta = 0.03, "
                          "FedRep eta = 0.1 (not reported by the paper). With a fixed dataset all three "
                          "target the same empirical rank-k ERM, which is non-convex: FLUTE can stall at "
                          "a spurious stationary point (seen at k = 4, objective 14.68 vs ERM 14.64) and "
                          "FedRep's moment init can end at a spurious point whose error to the ground "
                          "truth is lower than the ERM's. Criteria (ii) (FLUTE needs fewer rounds than "
                          "FedRep(RI)) and (iii) (the gap shrinks with k) are reported, not judged: "
                          "FedRep(RI)'s round counts depend on its step size, which the paper does not "
                          "report, and with a fixed dataset the three plateaus coincide (same empirical "
                          "ERM, Remark 4.1 on the empirical eq. (4)), so the gap of (iii) is within seed noise.")


# =============================================================================================
# C12  gamma: closed-form limit, divergence boundary (erratum), small-N ablation (Fig. 4)
# =============================================================================================
GAMMAS = [(0.25, 0.125, "appendix"), (0.125, 0.125, "appendix"), (1 / 12, 0.125, "appendix"),
          (0.3, 0.125, "appendix"), (0.5, 0.125, "appendix"), (0.25, 0.125, "main"),
          (0.125, 0.125, "main")]


def _task_limit(seed, *, g1, g2, normalization, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng)
    tr = algorithm(p, 1500, ETA, gamma1=g1, gamma2=g2, normalization=normalization,
                   record_every=1500, seed=rng)
    Z = ex.regularized_minimizer(p.Phi, 2, gamma1=g1, gamma2=g2, normalization=normalization)
    if tr.status == "diverged":
        return {"err": np.inf, "scale": np.nan}
    BW = tr.B @ tr.heads.T
    return {"err": float(np.linalg.norm(BW - Z) / np.linalg.norm(Z)),
            "scale": float(np.sum(BW * p.target) / np.sum(p.target ** 2))}


@claim("flute.eq4.regularized_limit", paper=PAPER, reference="eq. (4) (population minimizer a/(a + 2 g2 - g1) Phi_k)",
       statement="Population FLUTE converges to Phi_k / (1 + 2(2 gamma2 - gamma1)) (appendix; "
                 "Phi_k / (1 + 2 gamma2 - gamma1) main) whenever the objective is bounded below.",
       kind="identity")
def _c12a(ctx, *, algorithm=flute):
    gam = ctx.pick(GAMMAS[:2] + GAMMAS[3:4], GAMMAS, GAMMAS)
    out = ctx.map(_task_limit, [{"g1": a, "g2": b, "normalization": n, "algorithm": algorithm}
                                for a, b, n in gam], replicates=ctx.pick(1, 3, 5))
    rows = [{"gamma1": a, "gamma2": b, "normalization": n,
             "predicted_scale": ex.data_weight(n) / (ex.data_weight(n) + 2 * b - a),
             "measured_scale": float(np.mean([o["scale"] for o in row])),
             "max_rel_error": max(o["err"] for o in row)} for (a, b, n), row in zip(gam, out)]
    worst = max(r["max_rel_error"] for r in rows)
    passed = worst < 1e-8                                  # 1e-8: closed form vs iteration
    fig, ax = _fig()
    ax.plot([r["predicted_scale"] for r in rows], [r["measured_scale"] for r in rows], "o")
    ax.plot([0.7, 2.1], [0.7, 2.1], "k:")
    ax.set_xlabel("predicted scale a/(a + 2 g2 - g1)"), ax.set_ylabel("measured <BW, Phi_k>/||Phi_k||^2")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"limit equals the scaled Phi_k to {worst:.1e} relative (< 1e-8)",
                    measured={"rows": rows}, predicted={"rel_error": 0.0}, table=rows,
                    figure=ctx.save_figure(fig))


def _task_boundary(seed, *, g1, normalization, eta, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng)
    tr = algorithm(p, 1500, eta, gamma1=g1, gamma2=0.125, normalization=normalization,
                   record_every=1500, seed=rng)
    if tr.status == "diverged":
        return {"diverged": True, "err": np.nan}
    if ex.is_unbounded(g1, 0.125, normalization=normalization):
        return {"diverged": False, "err": np.inf}        # no minimizer to converge to
    Z = ex.regularized_minimizer(p.Phi, 2, gamma1=g1, gamma2=0.125, normalization=normalization)
    return {"diverged": False, "err": float(np.linalg.norm(tr.B @ tr.heads.T - Z) / np.linalg.norm(Z))}


def _task_boundary_finite(seed, *, g1, N, rounds, algorithm):
    """App. C's own setting (the Fig. 4 instance): fixed data, d = 10, k = 6, M = 10, N samples."""
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=10, rank=6, samples_per_client=N, noise=NOISE, seed=rng)
    init = flute_init(d=10, rank=6, n_clients=10, init_scale=0.01, seed=rng)
    tr = algorithm(p, rounds, ETA, gamma1=g1, gamma2=0.125, data="fixed", init=init, record_every=rounds)
    return {"diverged": tr.status == "diverged"}


@claim("flute.appC.gamma_boundary", paper=PAPER, reference="App. C (Fig. 4 discussion), eq. (4)",
       statement="App. C: 'We do not set gamma1 > 2 gamma2 because ... ||BW||_F usually diverges'. In App. C's "
                 "finite-sample runs (fixed data, the Fig. 4 instance) FLUTE with 2 gamma2 < gamma1 < 2 gamma2 + a "
                 "diverges in most runs. (Reported beside it: the population objective is bounded there and "
                 "FLUTE converges to an inflated Phi_k; it diverges only for gamma1 >= 2 gamma2 + a.)",
       kind="phase transition")
def _c12b(ctx, *, algorithm=flute):
    # judged: the setting the remark is about (finite samples, N <= d as in Fig. 4)
    fin_cases = [(0.3, 8), (0.5, 8), (0.3, 10), (0.5, 10)]
    rounds = ctx.pick(500, 1500, 2500)
    fin = ctx.map(_task_boundary_finite, [{"g1": g, "N": N, "rounds": rounds, "algorithm": algorithm}
                                          for g, N in fin_cases], replicates=ctx.pick(2, 5, 10))
    n_div = sum(o["diverged"] for row in fin for o in row)
    n_fin = sum(len(row) for row in fin)
    low, high = proportion_interval(n_div, n_fin)
    passed = reaches_proportion(n_div, n_fin, 0.5)         # "usually": more than half of the runs
    fin_rows = [{"gamma1": g, "N": N, "diverged": sum(o["diverged"] for o in row), "runs": len(row)}
                for (g, N), row in zip(fin_cases, fin)]
    # reported (extension): the population boundary is 2 gamma2 + a, not 2 gamma2
    cases = [(0.3, "appendix", ETA), (0.5, "appendix", ETA), (0.8, "appendix", ETA),
             (1.0, "appendix", ETA)]
    if ctx.scale != "smoke":
        cases += [(0.5, "main", 0.01), (1.0, "main", 0.005), (1.5, "main", 0.005)]
    out = ctx.map(_task_boundary, [{"g1": g, "normalization": n, "eta": e, "algorithm": algorithm}
                                   for g, n, e in cases], replicates=ctx.pick(1, 2, 5))
    rows = []
    for (g, n, e), row in zip(cases, out):
        rows.append({"gamma1": g, "normalization": n,
                     "paper_says_diverges": g > ex.divergence_boundary(0.125, statement="paper"),
                     "correct_boundary_says_diverges": ex.is_unbounded(g, 0.125, normalization=n),
                     "diverged": all(o["diverged"] for o in row),
                     "converged_to_closed_form": all((not o["diverged"]) and o["err"] < 1e-6 for o in row)})
    counter = [r for r in rows if r["paper_says_diverges"] and not r["correct_boundary_says_diverges"]]
    fig, ax = _fig()
    ax.scatter([r["gamma1"] for r in rows], [r["normalization"] == "main" for r in rows],
               c=["red" if r["diverged"] else "green" for r in rows], label="population")
    ax.scatter([r["gamma1"] for r in fin_rows], [-1] * len(fin_rows),
               c=["red" if r["diverged"] > r["runs"] / 2 else "green" for r in fin_rows], marker="s")
    ax.axvline(0.25, color="k", ls=":", label="paper: 2 gamma2")
    ax.axvline(0.75, color="b", ls="--", label="population, appendix: 2 gamma2 + 1/2")
    ax.set_xlabel("gamma1 (gamma2 = 1/8); red: diverged"), ax.legend(fontsize=7)
    ax.set_yticks([-1, 0, 1], ["finite (App. C)", "population", "population (main)"])
    return Evidence(verdict=verdict_from(passed),
                    summary=f"App. C's finite-sample setting: {n_div}/{n_fin} runs with 2 gamma2 < gamma1 < "
                            f"2 gamma2 + a diverge (95% interval [{low:.2f}, {high:.2f}], 'usually' = > 1/2); "
                            f"population (reported): {sum(r['converged_to_closed_form'] for r in counter)}/"
                            f"{len(counter)} such settings converge to the inflated closed form",
                    measured={"finite_rows": fin_rows, "diverged_fraction_ci": [low, high],
                              "population_rows": rows}, table=fin_rows + rows,
                    predicted={"finite": "most runs diverge (App. C)", "population_boundary_appendix": 0.75,
                               "population_boundary_main": 1.25},
                    figure=ctx.save_figure(fig),
                    notes="The remark is about App. C's finite-sample runs, where it holds; no erratum. "
                          "Population runs (gamma2 = 1/8; main normalization at smaller eta) show that the "
                          "objective itself is bounded up to gamma1 < 2 gamma2 + a: the divergence in the "
                          "finite-sample runs comes from the data term (N <= d), an extension finding that "
                          "is reported, not judged.")


def _task_ablation(seed, *, N, ratios, rounds, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=10, rank=6, samples_per_client=N, noise=NOISE, seed=rng)
    init = flute_init(d=10, rank=6, n_clients=10, init_scale=0.01, seed=rng)
    res = []
    for r in ratios:
        tr = algorithm(p, rounds, ETA, gamma1=r * 0.125, gamma2=0.125, data="fixed",
                       init=init, record_every=rounds)
        res.append(float(tr.extra["error_truth"][-1]) if tr.status != "diverged" else np.inf)
    return res


@claim("flute.fig4.gamma_ablation", paper=PAPER, reference="Figure 4 (App. C)",
       statement="For N in {8, 9, 10} (d = 10, k = 6, M = 10), gamma1 = gamma2 gives a lower final "
                 "error than gamma1 = 2 gamma2 and gamma1 = (2/3) gamma2.", kind="comparison")
def _c12c(ctx, *, algorithm=flute):
    Ns = ctx.pick([8], [8, 10], [8, 9, 10])
    ratios = (2.0, 1.0, 2 / 3)
    rounds = ctx.pick(500, 1500, 2500)
    out = ctx.map(_task_ablation, [{"N": N, "ratios": ratios, "rounds": rounds, "algorithm": algorithm}
                                   for N in Ns], replicates=ctx.pick(3, 10, 20))
    rows, verdicts = [], []
    for N, row in zip(Ns, out):
        E = np.array(row)                                    # (reps, 3)
        d_hi = E[:, 0] - E[:, 1]                             # 2 g2 minus g2 (> 0: g2 better)
        d_lo = E[:, 2] - E[:, 1]
        m_hi, h_hi = mean_ci(d_hi)
        m_lo, h_lo = mean_ci(d_lo)
        if m_hi - h_hi > 0 and m_lo - h_lo > 0:
            verdicts.append(True)
        elif m_hi + h_hi < 0 or m_lo + h_lo < 0:
            verdicts.append(False)
        else:
            verdicts.append(None)
        rows.append({"N": N, "err_g1=2g2": float(E[:, 0].mean()), "err_g1=g2": float(E[:, 1].mean()),
                     "err_g1=2g2/3": float(E[:, 2].mean()), "diff_2g2_minus_g2": [float(m_hi), float(h_hi)],
                     "diff_2g2/3_minus_g2": [float(m_lo), float(h_lo)]})
    passed = False if False in verdicts else (None if None in verdicts else True)
    fig, ax = _fig()
    for j, lab in enumerate(("g1=2g2", "g1=g2", "g1=2g2/3")):
        ax.plot(Ns, [np.mean(np.array(row)[:, j]) for row in out], "o-", label=lab)
    ax.set_xlabel("N"), ax.set_ylabel("final (1/M) sum ||B w_i - phi_i||"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"N={r['N']}: {r['err_g1=2g2']:.2f} / {r['err_g1=g2']:.2f} / "
                                      f"{r['err_g1=2g2/3']:.2f} (2g2 / g2 / 2g2/3)" for r in rows),
                    measured={"rows": rows}, table=rows,
                    predicted={"best": "gamma1 = gamma2"}, figure=ctx.save_figure(fig),
                    notes="gamma2 = 1/8 (absolute values not given by the paper), fixed dataset, "
                          f"{rounds} rounds at eta = 0.03, same init for the three gammas; paired "
                          "differences with 95% t-intervals decide (inconclusive when they straddle 0). "
                          "With N < d and gamma1 = 2 gamma2 the error keeps growing slowly (over-fitting "
                          "towards the empirical ERM), so the ranking only sharpens with more rounds.")


# =============================================================================================
# C13  Over-parameterized special case (Remark 5.3)
# =============================================================================================
def _task_over(seed, *, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=4, spectrum=[10.0, 6.0, 4.0, 2.5], seed=rng)
    tr = algorithm(p, 500, ETA, seed=rng)
    return {"err": float(np.linalg.norm(tr.B @ tr.heads.T - p.Phi) / np.linalg.norm(p.Phi)),
            "rho": _tail_rate(tr.extra["frob_target"])}


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
    fig, ax = _fig()
    ax.bar(["fitted rho", "1 - eta lambda_k"], [float(np.mean(rho)) if np.all(np.isfinite(rho)) else 0.0, pred])
    ax.set_ylim(0.9, 0.95)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"rel. error to Phi {err:.1e} (< 1e-8); rate {np.mean(rho):.5f} vs {pred:.5f}",
                    measured={"max_rel_error": err, "rho": rho},
                    predicted={"rel_error": 0.0, "rho": pred}, figure=ctx.save_figure(fig),
                    notes="d = 10, M = 15, k = 4, lambda = (10, 6, 4, 2.5), noiseless population.")


# =============================================================================================
# C14  Exact identities of App. A
# =============================================================================================
def _task_identities(seed, *, algorithm):
    rng = np.random.default_rng(seed)
    out = {}
    for d, M in ((8, 5), (5, 8)):
        p = underparameterized(d=d, n_clients=M, rank=2, seed=rng)
        # heads W (M, k), client axis first (drawn in the paper's (k, M) order)
        B, W = 0.3 * rng.standard_normal((d, 2)), 0.3 * rng.standard_normal((2, M)).T
        eta = 0.05
        tr = algorithm(p, 1, eta, init=(B, W))
        T1 = ex.theta_step(ex.theta_embedding(B, W, p.Phi), ex.lambda_tilde(p.Phi), eta)
        out[f"theta_recursion_{d}x{M}"] = float(np.max(np.abs(
            ex.theta_embedding(tr.B, tr.heads, p.Phi) - T1)))
        Bs, Ws = ex.balanced_factors(p.Phi, 2)
        per_client = np.sum(np.linalg.norm(B @ W.T - Bs @ Ws.T, axis=0) ** 2)
        out[f"sum_identity_{d}x{M}"] = float(abs(per_client - np.linalg.norm(B @ W.T - Bs @ Ws.T) ** 2))
        T = ex.theta_embedding(B, W, p.Phi)
        lam = ex.lambda_tilde(p.Phi)
        tgt = np.zeros((T.shape[0],) * 2)
        tgt[:2, :2] = np.diag(lam[:2])
        out[f"lemmaA18_slack_{d}x{M}"] = float(np.linalg.norm(B @ W.T - p.target)
                                               - np.linalg.norm(T @ T.T - tgt))
        out[f"regularizer_identity_{d}x{M}"] = abs(ex.regularizer(B, W, 0.3, 0.1)
                                                   - ex.regularizer_balanced_form(B, W, 0.3, 0.1))
        rB, rW = ex.regularizer_gradients(B, W, 0.25, 0.125)
        D = B.T @ B - W.T @ W                            # the paper's B^T B - W W^T
        out[f"step_form_{d}x{M}"] = float(max(np.max(np.abs(rB - 0.5 * B @ D)),
                                              np.max(np.abs(rW + 0.5 * W @ D))))
    return out


@claim("flute.appA.identities", paper=PAPER, reference="App. A.1 eqs. (11)-(13), Lemma A.18, eq. (6)",
       statement="The Theta recursion (13) reproduces the (B, W) recursion exactly; "
                 "sum_i ||B w_i - B* w_i*||^2 = ||BW - B*W*||_F^2; ||BW - Phi_k||_F <= "
                 "||Theta Theta^T - diag(Lambda~_k, 0)||_F; the regularizer identity and the "
                 "gamma = (1/4, 1/8) step form hold.", kind="identity")
def _c14(ctx, *, algorithm=flute):
    out = ctx.map(_task_identities, [{"algorithm": algorithm}], replicates=ctx.pick(3, 10, 50))[0]
    keys = out[0].keys()
    worst = {k: max(o[k] for o in out) for k in keys}
    eq = max(v for k, v in worst.items() if not k.startswith("lemmaA18"))
    slack = max(v for k, v in worst.items() if k.startswith("lemmaA18"))
    # 1e-10: all identities are exact algebra on O(1) numbers (rounding ~1e-14)
    passed = eq < 1e-10 and slack <= 1e-12
    fig, ax = _fig()
    ax.bar(range(len(worst)), [max(abs(v), 1e-17) for v in worst.values()])
    ax.set_yscale("log"), ax.set_xticks(range(len(worst)), list(worst), rotation=90, fontsize=6)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"identities exact to {eq:.1e}; Lemma A.18 slack max {slack:.2e} (<= 0)",
                    measured=worst, predicted={"identities": 0.0, "lemmaA18_slack": "<= 0"},
                    figure=ctx.save_figure(fig),
                    notes="Padded cases d > M and d < M; gradients against finite differences are "
                          "unit tests (tests/test_exact_flute.py).")


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
    fig, ax = _fig()
    for N, row in zip(Ns, out):
        ax.semilogy(row[0], label=f"N={N}")
    ax.set_xlabel("round"), ax.set_ylabel("(1/M) sum ||B w_i - B* w_i*||"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"pre-plateau log-slope max {np.max(slopes):.4f} <= bound {bound:.4f}: "
                            f"{decay_ok}; floor slope in N {fit_d['slope'] if fit_d else float('nan'):.2f}",
                    measured={"slopes": slopes, "floors": floors, "floor_fit": fit_d,
                              "decay_ok": decay_ok, "floor_ok": bool(floor_ok)},
                    predicted={"slope_bound": bound, "floor_slope": -0.5},
                    figure=ctx.save_figure(fig),
                    notes="Constant N per round (not the theorem's growing N_t), App. C instance k = 2, "
                          "noise variance 0.3.")


# =============================================================================================
# Solver vs exact: FLUTE on a fixed dataset == the empirical rank-k ERM (AltMin reference)
# =============================================================================================
def _stationarity(p, B, W):
    """Norm of the gradient of eq. (4) (data term + penalty, gamma1 = 2 gamma2) at (B, W), relative to
    the norm of the data gradient at the zero-head start scale (||X^T y|| / N summed)."""
    gB, gW = ex.data_gradients(B, W, p.X, p.y)
    rB, rW = ex.regularizer_gradients(B, W)
    scale = float(np.linalg.norm(np.einsum("mnd,mn->d", p.X, p.y))) / p.X.shape[1]
    return float(np.hypot(np.linalg.norm(gB + rB), np.linalg.norm(gW + rW)) / scale)


def _task_erm(seed, *, k, algorithm, extra_rounds=0):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=k, samples_per_client=20, noise=NOISE, seed=rng)
    tr = algorithm(p, 2000, ETA, data="fixed", record_every=2000, seed=rng)
    erm = ex.altmin_erm(p.X, p.y, k, seed=rng)
    Zn, _ = ex.nuclear_relaxation_estimate(p.X, p.y, k, 0.3)
    if tr.status == "diverged":
        return {"rel": np.inf, "obj_gap": np.inf, "nuc_dist": np.nan, "erm_status": erm.status,
                "class": "diverged", "grad": np.inf}

    def classify(tr):
        BW = tr.B @ tr.heads.T
        f = ex.flute_objective(tr.B, tr.heads, p.X, p.y, gamma1=0.0, gamma2=0.0)
        rel = float(np.linalg.norm(BW - erm.Z) / np.linalg.norm(erm.Z))
        grad = _stationarity(p, tr.B, tr.heads)
        # at the ERM (1e-6: linear convergence to ~1e-12); stationary elsewhere: a spurious point
        # (relative gradient <= 1e-10, objective above the ERM's); otherwise still moving (slow)
        cls = "erm" if rel < 1e-6 else ("spurious" if grad <= 1e-10 else "slow")
        return cls, rel, float(f - erm.objective), grad, BW

    cls, rel, gap, grad, BW = classify(tr)
    out = {"rel": rel, "obj_gap": gap, "erm_status": erm.status, "flute_dist": float(tr.distance[-1]),
           "nuc_dist": float(np.linalg.norm(Zn - BW) / np.linalg.norm(BW)), "class": cls, "grad": grad,
           "class_2000": cls}
    if cls == "slow" and extra_rounds:                 # continue from the last iterate
        tr2 = algorithm(p, extra_rounds, ETA, data="fixed", init=(tr.B, tr.heads),
                        record_every=extra_rounds, seed=rng)
        if tr2.status != "diverged":
            grad_before = grad
            cls, rel, gap, grad, _ = classify(tr2)
            # still not stationary: slow if the gradient kept falling (10x over the extension),
            # stuck (not converging to a stationary point at all) otherwise
            if cls == "slow" and grad > 0.1 * grad_before:
                cls = "stuck"
            out.update({"class": cls, "rel": rel, "obj_gap": gap, "grad": grad})
    return out


@claim("flute.alg1.empirical_erm", paper=PAPER,
       reference="extension (NOT IN PAPER): Remark 4.1's population statement carried to the empirical eq. (4)",
       statement="With a fixed dataset reused every round and gamma1 = 2 gamma2, FLUTE from a small random "
                 "init ends at a stationary point of the empirical objective: the rank-k ERM (computed "
                 "independently by alternating least squares with restarts) or a spurious stationary point; "
                 "runs that are neither after 2000 rounds are slow, and reach one given more rounds.",
       kind="comparison")
def _c_erm(ctx, *, algorithm=flute):
    ks = ctx.pick([2], [2, 4], [2, 4, 6])
    extra = ctx.pick(2000, 8000, 18000)
    out = ctx.map(_task_erm, [{"k": k, "algorithm": algorithm, "extra_rounds": extra} for k in ks],
                  replicates=ctx.pick(2, 4, 10))
    flat = [o for row in out for o in row]
    counts = {c: sum(o["class"] == c for o in flat) for c in ("erm", "spurious", "slow", "stuck", "diverged")}
    slow_2000 = sum(o["class_2000"] == "slow" for o in flat)
    erm_ok = all(o["erm_status"] == "optimal" for o in flat)
    rel = min(o["rel"] for o in flat)
    ogap = max(abs(o["obj_gap"]) for o in flat if o["class"] == "erm") if counts["erm"] else float("nan")
    # judged: every run ends at the ERM or at a stationary point; still-slow runs leave it undecided
    if not erm_ok or counts["diverged"] or counts["stuck"] or (counts["erm"] and not ogap < 1e-8):
        passed = False
    elif counts["slow"]:
        passed = None
    else:
        passed = True
    fig, ax = _fig()
    ax.bar(list(counts), list(counts.values()))
    ax.set_ylabel(f"runs (of {len(flat)})"), ax.set_title("FLUTE's end point on a fixed dataset")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"FLUTE ends at the AltMin ERM in {counts['erm']}/{len(flat)} runs, at a spurious "
                            f"stationary point in {counts['spurious']}, still moving in {counts['slow']} "
                            f"({slow_2000} slow after 2000 rounds, continued {extra} more); worst objective gap "
                            f"at the ERM {ogap:.1e}",
                    measured={"counts": counts, "slow_after_2000": slow_2000, "min_rel_distance": rel,
                              "max_objective_gap_at_erm": ogap,
                              "runs": [{k: o[k] for k in ("class", "class_2000", "rel", "obj_gap", "grad")}
                                       for o in flat],
                              "nuclear_relaxation_rel_distance": [o["nuc_dist"] for o in flat]},
                    predicted={"end point": "the ERM or a stationary point of eq. (4) (relative gradient <= 1e-10)"},
                    figure=ctx.save_figure(fig),
                    notes="An extension finding, not a check of a statement of the paper: Remark 4.1 (small-init "
                          "global convergence) is about the population objective. d = 10, M = 15, N = 20, "
                          "noise variance 0.3, eta = 0.03. A run is at the ERM when its BW is within 1e-6 "
                          "(relative) of AltMin's; spurious when the gradient of eq. (4) is below 1e-10 "
                          "(relative) elsewhere; otherwise continued from its last iterate: slow when its "
                          "gradient then falls tenfold (undecided), stuck (fails) when it does not. "
                          "The nuclear-norm relaxation (truncated to rank k) is a different estimator; its "
                          "distance is reported, not judged.")


# =============================================================================================
# Not checked
# =============================================================================================
omit("flute.table1.cifar", paper=PAPER, reference="Table 1, Sec. 7.2, Figs. 5-12",
     statement="General FLUTE / FLUTE* beat FedRep, FedPer, FedRoD, FedCP, ... on CIFAR-10/100 "
               "partitions, with better neural-collapse (NC2) structure.",
     reason="Needs CNN training on CIFAR (general FLUTE, Algorithm 2): outside this toolkit's "
            "linear/low-rank scope. The note (§4.2) records that plain FLUTE is not best in three "
            "columns of the paper's own table; only FLUTE* is.")
omit("flute.thm5_1.constants", paper=PAPER, reference="Theorem 5.1 (N bound), Remark 5.3",
     statement="The per-client sample requirement grows like lambda_1^4 / (eta^2 Delta^6) "
               "(or (lambda_1*/Delta)^10 overall).",
     reason="The absolute constants c, c' are unspecified and the bound is loose by orders of "
            "magnitude; only the N^(-1/2) and M scalings (flute.thm5_1.sample_scaling, "
            "flute.rem5_2.client_scaling) and the gap monotonicity (flute.rem5_7.gap_dependence) "
            "are falsifiable. verify.conditions.flute reports the bound with c = 1.")
