"""FLUTE, App. A: entry time into region R (Prop. A.2), its absorption (Prop. A.9), the inverse-SNR
contraction (Lemma A.10), the gradient discrepancy (Lemmas A.13-A.14) and the exact identities of
App. A.1."""
from __future__ import annotations

import numpy as np

from lowrank_fl.algorithms.flute import flute, flute_init
from lowrank_fl.exact import flute as ex
from lowrank_fl.problems.underparameterized import appendix_c_spectrum, underparameterized
from verify.claim import Evidence, claim, verdict_from
from verify.stats import fit_loglog_slope, mean_ci

from ._support import ETA, NOISE, PAPER, all_of, band_verdict, figure


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
        # band [0.75, 1.25] (why: the claim's notes)
        slope_ok = band_verdict(m - h, m + h, 0.75, 1.25)
    else:
        ratio, slope_ok = {"mean": float("inf")}, False
    passed = all_of(within, slope_ok)
    fig, ax = figure()
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
                    table=rows,
                    figure=ctx.save_figure(fig, title="t_e and T_R vs log(1/alpha)"),
                    notes="k = 4, App. C spectrum, population gradients; per replicate one random Phi and one "
                          "init direction G, B0, W0 = alpha G. Prop. A.2 needs alpha 'sufficiently small' "
                          "(Lemma A.4); its bound is judged for alpha <= 1e-3. At alpha = 0.1 and 0.01 (the "
                          "experiments' 1/(10 d)) t_e exceeds T_R on some instances in pilots (e.g. 66 vs "
                          "46 rounds): reported, not judged. The fourth condition of Claim A.3 "
                          "(sigma_1^2(Theta_res) <= c_1 sigma_k(Theta_k)^(1+kappa)) fails at every alpha "
                          "tried, yet the bound held for alpha <= 1e-3 in pilots. The slope of t_e in "
                          "log(1/alpha) is fitted per replicate; its 95% t-interval decides, in the band [0.75, 1.25] "
                          "of the formula's slope: that slope is asymptotic (the growth factor of sigma_k "
                          "before the cubic term matters), pilots measure 0.85-1.0 of it.")


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
    fig, ax = figure()
    ax.bar([f"{'pop' if g['samples'] is None else 'N=' + str(g['samples'])}" for g in grid],
           [sum(o["violations"] for o in row) for row in out])
    ax.set_ylabel("rounds outside R after entry")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"entered R in every run: {entered}; rounds outside R after entry: {viol}",
                    measured={"violations": viol, "entered_all": entered,
                              "max_sigma1_sq_over_2lambda1*": max(o["max_s1_ratio"] for o in flat)},
                    predicted={"violations": 0},
                    figure=ctx.save_figure(fig, title="rounds outside R after entry"),
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
    fig, ax = figure()
    ax.bar(["worst step (theory eta)"], [min(worst, 10.0)])          # inf (non-finite step) clipped
    ax.axhline(1.0, color="k", ls="--")
    ax.set_ylabel("ratio_(t+1) / ((1 - eta Delta/16)^2 ratio_t)")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"worst per-step contraction / bound = {worst:.6f} (<= 1); at eta = 0.03 "
                            f"it holds on {100 * frac:.0f}% of steps",
                    measured={"worst_ratio": worst, "fraction_holding_at_eta_0.03": frac,
                              "eta_theory": eta_small, "entered_all": entered,
                              "nonfinite_steps": n_nonfinite},
                    predicted={"worst_ratio": "<= 1"},
                    figure=ctx.save_figure(fig, title="worst step ratio / bound (clipped at 10)"),
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
    fig, ax = figure()
    ax.loglog(Ns, A1.mean(axis=1), "o-", label="A_1 (discrepancy)")
    ax.loglog(Ns, A2.mean(axis=1), "s-", label="A_2 (noise)")
    ax.set_xlabel("N"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"slope of A_1 in N {f1}, of A_2 {f2} (band [-0.6, -0.4]); "
                            f"over-parameterized A_1 = {over:.1e}",
                    measured={"slope_A1": f1.as_dict(), "slope_A2": f2.as_dict(),
                              "A1_overparameterized": over},
                    predicted={"slope": -0.5, "A1_overparameterized": 0.0},
                    figure=ctx.save_figure(fig, title="A_1, A_2 at the optimum vs N"),
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
    flags = {key: band_verdict(f.low, f.high, *bands[key]) for key, f in fits.items()}
    passed = all_of(*flags.values())
    fig, ax = figure(1, 2)
    ax[0].loglog(ds, A1d.mean(axis=1), "o-", label="A_1"), ax[0].loglog(ds, A2d.mean(axis=1), "s-", label="A_2")
    ax[0].set_xlabel(f"d (N = {N})"), ax[0].legend()
    ax[1].loglog(sigmas, A2s.mean(axis=1), "s-"), ax[1].set_xlabel("noise sigma"), ax[1].set_ylabel("A_2")
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"{key} slope {f}" for key, f in fits.items())
                            + " (bands [0.4, 0.6], [0.4, 0.6], [0.9, 1.1])",
                    measured={**{f"slope_{key}": f.as_dict() for key, f in fits.items()},
                              **{f"{key}_ok": v for key, v in flags.items()}},
                    predicted={"slope_A1_vs_d": 0.5, "slope_A2_vs_d": 0.5, "slope_A2_vs_sigma": 1.0},
                    figure=ctx.save_figure(fig, title="A_1, A_2 vs d (left), A_2 vs sigma (right)"),
                    notes="M = 15, k = 2, App. C spectrum for d = 10 kept fixed as d grows, N = 400 fresh "
                          "samples at the balanced optimum; 95% t-intervals over seeds decide (holds inside "
                          "the band, fails entirely outside). The sigma-sweep reuses the same samples for "
                          "every sigma, so with the truth as residual model A_2 is exactly linear in sigma: "
                          "it is a consistency check of the noise term (a misspecified residual, e.g. "
                          "against Phi_k, breaks it), the d-slopes are the lemma's content.")


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
    # identities: residuals >= 0 on a log axis against their tolerance; Lemma A.18: the signed slack,
    # which holds at <= 0 (a large negative slack is comfortably satisfied, not a violation)
    fig, ax = figure(1, 2)
    ident = {k: v for k, v in worst.items() if not k.startswith("lemmaA18")}
    ax[0].bar(range(len(ident)), [max(v, 1e-17) for v in ident.values()])
    ax[0].axhline(1e-10, color="k", ls="--", lw=0.8, label="tolerance 1e-10")
    ax[0].set_yscale("log"), ax[0].set_xticks(range(len(ident)), list(ident), rotation=90, fontsize=6)
    ax[0].set_ylabel("residual (0 drawn at 1e-17)"), ax[0].legend(fontsize=7)
    ax[0].set_title("identities, worst over seeds", fontsize=8)
    slacks = {k.removeprefix("lemmaA18_slack_"): v for k, v in worst.items() if k.startswith("lemmaA18")}
    ax[1].bar(range(len(slacks)), list(slacks.values()),
              color=["tab:red" if v > 1e-12 else "tab:green" for v in slacks.values()])
    ax[1].axhline(0.0, color="k", lw=0.8)
    ax[1].set_xticks(range(len(slacks)), [f"d x M = {k}" for k in slacks], fontsize=7)
    ax[1].set_ylabel("slack (holds when <= 0)")
    ax[1].set_title("Lemma A.18 slack, max over seeds", fontsize=8)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"identities exact to {eq:.1e}; Lemma A.18 slack max {slack:.2e} (<= 0)",
                    measured=worst, predicted={"identities": 0.0, "lemmaA18_slack": "<= 0"},
                    figure=ctx.save_figure(fig, title="identity residuals (left), Lemma A.18 slack (right)"),
                    notes="Padded cases d > M and d < M; gradients against finite differences are "
                          "unit tests (tests/test_exact_flute.py).")
