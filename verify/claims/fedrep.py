"""FedRep claims (Collins et al., ICML 2021): notes/001 §5 C1-C12 and the exact references of §6.

Every experiment uses the multi-task linear model with Assumption 3 heads (``||w_i*|| = sqrt(k)``),
x ~ N(0, I_d), noiseless unless stated. Injection points (keyword options) let tests feed broken
variants: ``options`` (extra keyword arguments of :func:`~lowrank_fl.algorithms.fedrep.fedrep`,
e.g. ``{"head_steps": 1}`` or ``{"orthonormalize": False}``), ``algorithm`` (a drop-in replacement of
``fedrep``) or a claim-specific option.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats
from scipy.linalg import subspace_angles

from lowrank_fl.algorithms.fedrep import fedrep, fedrep_round, n_participants
from lowrank_fl.algorithms.fedrep_baselines import fedsgd, local_only
from lowrank_fl.exact.multitask import (altmin, fedavg_population_error, fit_heads,
                                        lemma1_decomposition, method_of_moments, ols_then_svd,
                                        population_moment_matrix, population_optimum)
from lowrank_fl.exact.nuclear import solve_nuclear_prox
from lowrank_fl.linalg import subspace_distance, truncated_svd
from lowrank_fl.problems.multitask import haar_orthonormal, multitask_linear
from verify.claim import Evidence, claim, omit, verdict_from
from verify.criteria import all_of, fit_band, relaxation, rounds_to
from verify.conditions.fedrep import guaranteed_rate
from verify.stats import fit_loglog_slope, interval_verdict, mean_ci

PAPER = "fedrep"


# ====================================================================== helpers
def _rngs(seed, count=2):
    """Independent generators for the instance and the run, from one task seed."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def _sigmas2(W):
    """``(sigma_min^2, sigma_max^2)`` of ``W / sqrt(n)`` (exact sigma-bar for r = 1)."""
    s = np.linalg.svd(W / math.sqrt(W.shape[0]), compute_uv=False)
    return float(s[-1] ** 2), float(s[0] ** 2)


def _linear_phase_fit(dist, *, floor=1e-12, start=3):
    """Semilog fit of ``dist_t`` over ``start..T1`` (``T1`` the last round above ``floor``).

    Returns ``(rho_hat, r2, monotone_fraction, T1)``; ``rho_hat = exp(slope)``."""
    d = np.asarray(dist, dtype=float)
    ok = np.nonzero(np.isfinite(d) & (d > floor))[0]
    T1 = int(ok[-1]) if ok.size else 0
    if T1 - start < 3:
        return float("nan"), float("nan"), float("nan"), T1
    t = np.arange(start, T1 + 1)
    y = np.log(d[start:T1 + 1])
    res = stats.linregress(t, y)
    mono = float(np.mean(np.diff(np.log(d[:T1 + 1])) < 0))
    return float(np.exp(res.slope)), float(res.rvalue ** 2), mono, T1


def _warm_start(B_star, E0, rng):
    """``B0 = sqrt(E0) B* + sqrt(1-E0) G_perp`` (orthonormal, ``1 - dist^2(B0, B*) = E0`` exactly)."""
    d, k = B_star.shape
    G = rng.standard_normal((d, k))
    G -= B_star @ (B_star.T @ G)
    G = np.linalg.qr(G)[0]
    return math.sqrt(E0) * B_star + math.sqrt(1 - E0) * G


def _skewed_heads(n, k, skew, rng):
    """Assumption 3 heads (norm sqrt(k)) from Gaussians scaled by ``diag(1, skew, ..., skew)``:
    ``skew < 1`` lowers sigma_min* (raises kappa)."""
    scale = np.full(k, float(skew))
    scale[0] = 1.0
    G = rng.standard_normal((n, k)) * scale
    return math.sqrt(k) * G / np.linalg.norm(G, axis=1, keepdims=True)


def _figure():
    import matplotlib.pyplot as plt                     # the report code chooses the backend

    return plt


# ====================================================================== C1
def _task_population_optima(seed, d, k, n, rounds, fedrep_options, shared_model=fedsgd):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    s = shared_model(p, rounds, 0.5, seed=rr)       # no dataset: population gradients
    smin2, smax2 = _sigmas2(p.heads)
    B0 = _warm_start(p.B_star, 0.5, rr)
    opts = {"step_size": 1 / (4 * smax2), **(fedrep_options or {})}
    r = fedrep(p, rounds, opts.pop("step_size"), init=B0, seed=rr, **opts)
    # errors evaluated here on the full problem (independent of the traces' loss conventions):
    # the shared model (B, w) for every client; FedRep's B with its optimal heads theta_i B
    Bq = np.linalg.qr(r.B)[0]
    return {"fedsgd_error": p.population_loss(s.B, np.tile(s.extra["w"], (n, 1)), excess=True),
            "formula": fedavg_population_error(p.heads),
            "fedsgd_dist": s.final_distance,
            "fedrep_error": p.population_loss(Bq, p.theta @ Bq, excess=True)
            if r.status != "diverged" else float("inf")}


def _fedsgd_quarter_clients(problem, rounds, step_size, **kw):
    """Broken shared model (for tests): FedSGD trained on the first quarter of the clients only."""
    from lowrank_fl.problems.multitask import MultitaskProblem

    sub = MultitaskProblem(B_star=problem.B_star, heads=problem.heads[:max(problem.k, problem.n_clients // 4)],
                           noise=problem.noise)
    return fedsgd(sub, rounds, step_size, **kw)


@claim("fedrep.sec2_1.population_optima", paper=PAPER, reference="Sec. 2.1, problems (3)-(4)",
       statement="The optimum of FedRep's problem (3) has zero global error while the best single "
                 "shared model (4) has error (1/2n) sum_i ||w_i* - wbar*||^2 and does not identify col(B*).",
       kind="identity")
def _c1(ctx, *, fedrep_options=None, shared_model=fedsgd):
    reps = ctx.pick(2, 4, 10)
    d, k, n = ctx.pick((10, 3, 20), (20, 3, 50), (30, 4, 100))
    rounds = ctx.pick(400, 800, 1500)
    out = ctx.map(_task_population_optima, [{"d": d, "k": k, "n": n, "rounds": rounds,
                                             "fedrep_options": fedrep_options,
                                             "shared_model": shared_model}], replicates=reps)[0]
    rel = np.array([abs(o["fedsgd_error"] / o["formula"] - 1) for o in out])
    fr = np.array([o["fedrep_error"] for o in out])
    fd = np.array([o["fedsgd_dist"] for o in out])
    flags = {"fedsgd_formula_ok": bool(np.all(rel <= 0.01)), "fedrep_zero_ok": bool(np.all(fr < 1e-8)),
             "fedsgd_not_identified_ok": bool(np.all(fd > 0.5))}
    passed = all(flags.values())
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"FedSGD error / formula - 1 <= {rel.max():.1e}; FedRep error <= {fr.max():.1e}; "
                f"dist(B_FedSGD, B*) >= {fd.min():.2f}",
        measured={"fedsgd_rel_error_max": rel.max(), "fedrep_error_max": fr.max(), "fedsgd_dist_min": fd.min(),
                  **flags},
        predicted={"fedsgd_rel_error": "<= 0.01", "fedrep_error": "< 1e-8", "fedsgd_dist": "> 0.5 (k >= 2)"},
        notes="Population (m -> inf) gradients for both methods; FedRep warm-started at E0 = 0.5. Errors are "
              "excess population losses (6) evaluated on the full problem: the shared model (B, w) for "
              "every client, and FedRep's B with its optimal heads.")


# ====================================================================== C2
def _task_rate(seed, d, k, n, m, r, rounds, options, algorithm=fedrep, eta=None):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = _sigmas2(p.heads)
    eta = 1 / (4 * smax2) if eta is None else eta
    tr = algorithm(p, rounds, eta, clients_per_round=n_participants(r, n), data="fresh", batch_size=m,
                   seed=rr, **(options or {}))
    return {"distance": tr.distance, "eta": eta, "smin2": smin2, "smax2": smax2,
            "sigma_min_R": float(np.nanmin(tr.extra.get("sigma_min_R", [np.nan])))}


@claim("fedrep.thm1.linear_rate", paper=PAPER, reference="Theorem 1, eq. (10); Lemma 6",
       statement="With fresh samples, MoM init and eta = 1/(4 sigma_max*^2), dist(B^t, B*) decays "
                 "linearly with per-round factor at most sqrt(1 - eta E0 sigma_min*^2 / 2).",
       kind="rate")
def _c2(ctx, *, options=None, algorithm=fedrep):
    settings = ctx.pick([(20, 2, 50, 10, 1.0)],
                        [(30, 2, 100, 10, 1.0), (40, 2, 200, 8, 0.5)],
                        [(50, 2, 100, 10, 1.0), (50, 2, 1000, 5, 1.0), (100, 5, 200, 30, 1.0),
                         (100, 2, 1000, 10, 0.1)])
    reps = ctx.pick(2, 3, 3)
    rounds = ctx.pick(170, 220, 240)
    grid = [{"d": d, "k": k, "n": n, "m": m, "r": r, "rounds": rounds, "options": options,
             "algorithm": algorithm} for d, k, n, m, r in settings]
    out = ctx.map(_task_rate, grid, replicates=reps)
    rows, ok = [], True
    plt = _figure()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for g, res in zip(grid, out):
        fits = [_linear_phase_fit(o["distance"]) for o in res]
        rho = np.array([f[0] for f in fits])
        r2 = np.array([f[1] for f in fits])
        mono = np.array([f[2] for f in fits])
        final = np.array([o["distance"][-1] for o in res])
        th = np.array([guaranteed_rate(o["eta"], 1 - o["distance"][0] ** 2, math.sqrt(o["smin2"]))
                       for o in res])
        mean, half = mean_ci(np.log(rho)) if np.all(np.isfinite(rho)) else (np.nan, np.nan)
        upper = float(np.exp(mean + (half if np.isfinite(half) else 0.0)))
        # every seed's fitted factor must respect its own bound (stricter than a CI with few seeds)
        good = bool(np.all(np.isfinite(rho)) and np.all(r2 > 0.98) and np.all(rho <= th)
                    and np.all(mono >= 0.99) and np.all(final < 1e-10))
        ok &= good
        rows.append({"setting": f"d={g['d']} k={g['k']} n={g['n']} m={g['m']} r={g['r']}",
                     "rho_hat": float(np.exp(mean)) if np.isfinite(mean) else float("nan"),
                     "rho_hat_ci_upper": upper, "rho_hat_max": float(np.nanmax(rho)) if np.any(np.isfinite(rho)) else float("nan"),
                     "rho_theory": float(th.min()),
                     "r2_min": float(np.nanmin(r2)) if np.any(np.isfinite(r2)) else float("nan"),
                     "monotone_min": float(np.nanmin(mono)) if np.any(np.isfinite(mono)) else float("nan"),
                     "final_dist_max": float(final.max()), "holds": good})
        t = np.arange(len(res[0]["distance"]))
        line = ax.semilogy(t, res[0]["distance"], label=rows[-1]["setting"])[0]
        ax.semilogy(t, res[0]["distance"][0] * th[0] ** t, "--", color=line.get_color(), lw=0.8)
    # Theorem 1's step condition is sufficient, not necessary; eta = 1 (~4x the theorem's step
    # for Assumption 3 heads) still converges (half the rounds suffice at the faster rate)
    big = ctx.map(_task_rate, [{**grid[0], "eta": 1.0, "rounds": rounds // 2}], replicates=reps)[0]
    eta1_final = [float(o["distance"][-1]) for o in big]
    eta1_ok = bool(all(np.isfinite(f) and f < 1e-10 for f in eta1_final))
    ax.semilogy(np.arange(len(big[0]["distance"])), big[0]["distance"], "k:", label="eta = 1")
    ax.set_xlabel("round t")
    ax.set_ylabel("dist(B^t, B*)")
    ax.legend(fontsize=6)
    path = ctx.save_figure(fig)
    worst = max(rows, key=lambda r: r["rho_hat_max"] / r["rho_theory"])
    rate_ok = bool(ok)
    return Evidence(
        verdict=verdict_from(rate_ok and eta1_ok),
        summary=f"rho_hat {worst['rho_hat']:.3f} (max over seeds {worst['rho_hat_max']:.3f}) <= theory "
                f"{worst['rho_theory']:.3f}; final dist <= {max(r['final_dist_max'] for r in rows):.1e}; "
                f"eta = 1 converges (dist_T <= {max(eta1_final):.1e} < 1e-10): {eta1_ok}",
        measured={"settings": rows, "rate_ok": rate_ok, "eta1_final_dist": eta1_final,
                  "eta1_converges": eta1_ok},
        predicted={"rho_theory": [r["rho_theory"] for r in rows], "eta1_final_dist": "< 1e-10"},
        table=rows, figure=path,
        notes="Criteria (every seed): R^2 > 0.98 of the semilog fit, rho_hat <= sqrt(1 - eta E0 "
              "sigma_min^2/2), >= 99% monotone steps, dist_T < 1e-10; and, on the first setting, "
              "eta = 1 (beyond the theorem's 1/(4 sigma_max^2)) reaches dist < 1e-10 in T/2 rounds "
              "(Theorem 1 gives a sufficient condition only). For r < 1 the sigma's are the full-W values (the subset max/min is "
              "combinatorial).")


# ====================================================================== C3
def _task_pop_rate(seed, d, k, n, eta_mult, E0, skew, rounds, options):
    rp, rr = _rngs(seed)
    B_star = haar_orthonormal(d=d, rank=k, seed=rp)
    p = multitask_linear(d=d, rank=k, n_clients=n, heads=_skewed_heads(n, k, skew, rp), B_star=B_star, seed=rp)
    smin2, smax2 = _sigmas2(p.heads)
    eta = eta_mult / smax2
    tr = fedrep(p, rounds, eta, init=_warm_start(B_star, E0, rr), seed=rr, **(options or {}))
    return {"distance": tr.distance, "eta": eta, "smin2": smin2, "smax2": smax2, "E0": E0}


@claim("fedrep.thm1.rate_dependence", paper=PAPER, reference="Theorem 1, eq. (10); proof of Lemma 5",
       statement="The contraction factor never exceeds sqrt(1 - eta E0 sigma_min*^2/2) and improves with "
                 "eta sigma_min*^2; in the m -> inf limit each step contracts by at most 1 - eta (1 - dist_t^2) "
                 "sigma_min*^2.",
       kind="scaling")
def _c3(ctx, *, options=None):
    etas = ctx.pick((0.1, 0.2), (0.05, 0.1, 0.2), (0.05, 0.1, 0.2))
    E0s = ctx.pick((0.5, 0.9), (0.3, 0.9), (0.2, 0.5, 0.9))
    skews = ctx.pick((1.0,), (1.0, 0.4), (1.0, 0.5, 0.25))
    rounds = ctx.pick(150, 300, 500)
    d, k, n = ctx.pick((15, 2, 20), (30, 3, 40), (50, 3, 100))
    grid = [{"d": d, "k": k, "n": n, "eta_mult": e, "E0": E0, "skew": s, "rounds": rounds,
             "options": options} for e in etas for E0 in E0s for s in skews]
    out = ctx.map(_task_pop_rate, grid, replicates=1)
    rows = []
    for g, (o,) in zip(grid, out):
        dist = o["distance"]
        ok = np.nonzero(np.isfinite(dist) & (dist > 1e-12))[0]
        T1 = int(ok[-1]) if ok.size else 0
        lo = max(1, T1 // 2)
        rho_tail = float(np.exp(stats.linregress(np.arange(lo, T1 + 1), np.log(dist[lo:T1 + 1])).slope)) \
            if T1 - lo >= 3 else float("nan")
        ratios = dist[1:T1 + 1] / dist[:T1]
        th = guaranteed_rate(o["eta"], o["E0"], math.sqrt(o["smin2"]))
        # derived per-step bound (Alg. 2 with exact heads, proof of Theorem 1): ratio <= 1 - eta (1 - dist_t^2) sigma_min^2, as R >= I
        step_bound = 1 - o["eta"] * (1 - dist[:T1] ** 2) * o["smin2"]
        # ratios of distances below 1e-8 carry float64 relative error >~ 1e-8: checked above that level
        acc = (dist[:T1] > 1e-8) & (dist[1:T1 + 1] > 1e-8)
        rows.append({"eta_sigma_min2": o["eta"] * o["smin2"], "E0": o["E0"], "rho_tail": rho_tail,
                     "sharp": 1 - o["eta"] * o["smin2"], "fastest": 1 - o["eta"] * o["smax2"], "theory": th,
                     "max_step_ratio": float(np.max(ratios)) if ratios.size else float("nan"),
                     "step_bound_ok": bool(np.all(ratios[acc] <= step_bound[acc] + 1e-6))})
    x = np.array([r["eta_sigma_min2"] for r in rows])
    rate = -np.log(np.array([r["rho_tail"] for r in rows]))
    bound_ok = all(r["max_step_ratio"] <= r["theory"] + 1e-12 for r in rows)
    step_ok = all(r["step_bound_ok"] for r in rows)
    # reported only: the tail factor lies between 1 - eta sigma_max^2 and 1 - eta sigma_min^2 once the
    # iterates are in the asymptotic regime (not reached within T rounds for the smallest eta)
    band_ok = all(r["fastest"] - 1e-9 <= r["rho_tail"] <= r["sharp"] + 1e-9 for r in rows)
    sharp_err = max(abs(r["rho_tail"] - r["sharp"]) / (r["eta_sigma_min2"]) for r in rows)
    rho_s = stats.spearmanr(x, rate).statistic if len(set(np.round(x, 12))) > 1 else float("nan")
    passed = bool(bound_ok and step_ok and np.all(np.isfinite(rate)) and rho_s >= 0.9)
    n_band = sum(r["fastest"] - 1e-9 <= r["rho_tail"] <= r["sharp"] + 1e-9 for r in rows)
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot(x, rate, "o", label="measured -log rho (tail)")
    xs = np.linspace(0, x.max() * 1.05, 50)
    ax.plot(xs, -np.log(1 - xs), "-", label="sharp: -log(1 - eta sigma_min^2)")
    ax.set_xlabel("eta sigma_min*^2")
    ax.set_ylabel("-log rho")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"paper bound never violated: {bound_ok}; per-step 1 - eta(1-dist^2)s^2 bound: {step_ok}; "
                f"Spearman(-log rho, eta s_min^2) = {rho_s:.2f} (>= 0.9); reported: tail rate in "
                f"[1 - eta smax^2, 1 - eta smin^2] for {n_band}/{len(rows)} settings",
        measured={"rows": rows, "spearman": rho_s, "sharp_rel_error_max": sharp_err,
                  "bound_ok": bound_ok, "step_bound_ok": step_ok,
                  "tail_band_all (reported)": band_ok},
        predicted={"bound": "every step ratio <= sqrt(1 - eta E0 s^2/2)",
                   "step_bound": "ratio_t <= 1 - eta (1 - dist_t^2) sigma_min^2",
                   "tail (reported)": "in [1 - eta sigma_max^2, 1 - eta sigma_min^2]", "spearman": ">= 0.9"},
        table=rows, figure=path,
        notes="m -> inf (exact population rounds); E0 set by a controlled warm start; kappa varied by "
              "skewed heads. Every per-round ratio dist_{t+1}/dist_t is checked against the bound. The "
              "note's sharper asymptotic prediction (tail factor between 1 - eta sigma_max^2 and "
              "1 - eta sigma_min^2) is reported, not judged: it holds only once the iterates are in the "
              "asymptotic regime, which the smallest eta does not reach within T rounds.")


# ====================================================================== C4
def _task_threshold(seed, d, k, n, m_grid, eps, algorithm=fedrep):
    """Smallest m of ``m_grid`` (bisection, assuming monotone success) at which a run reaches
    dist <= eps within twice the rounds the m -> inf recursion needs from the same start
    (so that the threshold measures samples, not the conditioning of W*); inf if none."""
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = _sigmas2(p.heads)
    B0 = _warm_start(p.B_star, 0.75, rp)                 # dist(B0, B*) = 0.5, a pilot-calibrated start
    eta = 1 / (4 * smax2)
    pop = fedrep(p, 5000, eta, init=B0, tol=eps, seed=0)  # population rounds (deterministic)
    rounds = 2 * rounds_to(pop.distance, eps, censored=len(pop.distance)) + 10

    def success(m):
        tr = algorithm(p, rounds, eta, init=B0, data="fresh", batch_size=m, tol=eps, seed=rr)
        return bool(np.nanmin(tr.distance) <= eps)

    lo, hi = 0, len(m_grid) - 1
    if not success(m_grid[hi]):
        return float("inf")
    while lo < hi:
        mid = (lo + hi) // 2
        if success(m_grid[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(m_grid[lo])


@claim("fedrep.thm1.sample_complexity", paper=PAPER, reference="Theorem 1; eq. (11)",
       statement="The per-round samples needed grow linearly in d/(rn) (m ~ k^2 d/(rn) + k^3 log(rn) at fixed "
                 "kappa): the threshold m*(n) is affine in d/n with a positive slope and saturates at O(k) once "
                 "rn >~ d.",
       kind="scaling")
def _c4(ctx, *, algorithm=fedrep):
    d, k = ctx.pick((30, 2), (60, 2), (120, 2))
    ns = ctx.pick((5, 30), (4, 8, 15, 30, 60), (4, 8, 15, 30, 60, 120))
    reps = ctx.pick(1, 3, 10)
    m_grid = (3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)
    grid = [{"d": d, "k": k, "n": n, "m_grid": m_grid, "eps": 1e-6, "algorithm": algorithm} for n in ns]
    out = ctx.map(_task_threshold, grid, replicates=reps)
    M = np.array(out, dtype=float)                      # (len(ns), reps): per-seed thresholds
    mstar = np.array([np.quantile(row, 0.8, method="higher") for row in M])
    x = d / np.array(ns, dtype=float)
    rows = [{"n": n, "d_over_n": float(xi), "m_star_80pct": float(ms), "m_star_per_seed": row.tolist()}
            for n, xi, ms, row in zip(ns, x, mstar, M)]
    sat = x <= 1.0
    sat_ok = bool(np.all(mstar[sat] <= 2 * k + 2)) if np.any(sat) else None
    finite = bool(np.all(np.isfinite(mstar)))          # the threshold exists at every n
    # the relation the theorem states: m* affine in d/(rn). One least-squares line per seed over every
    # n (the saturated points are the intercept's regime, not an outlier of a log-log fit); the slope
    # is decided on its t-interval over seeds (> 0), and the pooled line must explain the 80% thresholds
    # to within the grid's resolution (25%: neighbouring grid values differ by up to a third).
    slope_ok, linear_ok, line = None, None, None
    if finite and len(ns) >= 3:
        per_seed = np.polyfit(x, M, 1)[0] if reps > 1 else np.array([np.polyfit(x, M[:, 0], 1)[0]])
        m_slope, half = mean_ci(per_seed)
        slope_ok = interval_verdict(float(m_slope - half), float(m_slope + half), 0.0, side="above")
        b1, b0 = np.polyfit(x, mstar, 1)
        resid = float(np.max(np.abs(mstar - (b0 + b1 * x)) / mstar))
        linear_ok = resid <= 0.25
        line = {"intercept": float(b0), "slope": float(b1), "max_relative_residual": resid,
                "slope_per_seed_mean": float(m_slope), "slope_ci": [float(m_slope - half), float(m_slope + half)]}
    passed = False if not finite else all_of(slope_ok, linear_ok, sat_ok)
    big = x >= 2 * k                                    # the former criterion, reported beside it
    old_ok = (fit_band(fit_loglog_slope(x[big], M[big] - k), 0.7, 1.3)
              if np.sum(big) >= 3 and np.all(np.isfinite(M[big])) else None)
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot(x, np.where(np.isfinite(mstar), mstar, np.nan), "o", label="m*(n) (80% of seeds)")
    if line:
        xs = np.linspace(0, x.max(), 50)
        ax.plot(xs, line["intercept"] + line["slope"] * xs, "--",
                label=f"{line['intercept']:.2g} + {line['slope']:.2g} d/(rn)")
    ax.set_xlabel("d / (rn)")
    ax.set_ylabel("m*")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    summary = (f"m* = {line['intercept']:.2f} + {line['slope']:.3f} d/(rn) (per-seed slope "
               f"{line['slope_per_seed_mean']:.3f} [{line['slope_ci'][0]:.3f}, {line['slope_ci'][1]:.3f}], want > 0; "
               f"max residual {line['max_relative_residual']:.0%} <= 25%)" if line else
               f"fewer than 3 n values or a missing threshold (thresholds found: {finite})")
    return Evidence(
        verdict=verdict_from(passed),
        summary=summary + f"; saturation m* <= 2k+2 at rn >= d: {sat_ok}",
        measured={"rows": rows, "affine_fit": line, "slope_ok": slope_ok, "linear_ok": linear_ok,
                  "saturation": sat_ok, "all_thresholds_found": finite},
        predicted={"relation": "m* affine in d/(rn), slope > 0 (Theorem 1's k^2 d/(rn) term)",
                   "saturation": f"m* <= {2 * k + 2} once rn >= d"},
        table=rows, figure=path,
        relaxations=[relaxation("slope of log(m* - k) against log(d/rn) inside [0.7, 1.3] over the "
                                "d/(rn) >= 2k points", old_ok,
                                relaxed="m* affine in d/(rn): per-seed slope interval above 0, pooled line "
                                        "within 25% of every threshold", relaxed_outcome=all_of(slope_ok, linear_ok),
                                reason="Theorem 1 states m ~ k^2 d/(rn) + k^3 log(rn), an affine relation in "
                                       "d/(rn); the log-log fit of m* - k is not that relation (its window "
                                       "included a saturated point, and m* - k is dominated by the intercept "
                                       "at small d/(rn)). Replaced by a derivation, not after seeing a verdict "
                                       "flip (the old criterion was inconclusive on the committed data).")],
        notes="Fresh samples, warm start at dist 0.5, eta = 1/(4 sigma_max^2); m* = smallest m of the "
              "grid at which a seed reaches dist <= 1e-6 within twice the rounds of the m -> inf "
              "recursion (which removes the effect of kappa at small n). Constants of Theorem 1 are not "
              "tested. Inconclusive with fewer than 3 values of n (smoke scale) or one seed.")


# ====================================================================== C5
def _task_identities(seed, d, k, n, m, round_options):
    rp, rr = _rngs(seed)
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
        notes="Note §2.2: the cross term the paper bounds in (80)-(81) is exactly 0, so "
              "||R^{-1}|| <= 1 deterministically (stronger than (92)). Tolerance 1e-10: float64 algebra on O(1) "
              "quantities with condition numbers ~1e2.")


def _task_lemma4(seed, d, k, n, ms, dist0, design):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    B = _warm_start(p.B_star, 1 - dist0 ** 2, rr)
    vals = []
    for m in ms:
        if design == "repeated":                         # broken: the same 5 samples, repeated
            X5, _ = p.sample(5, rr)
            X = np.tile(X5, (1, int(math.ceil(m / 5)), 1))[:, :m]
        else:
            X, _ = p.sample(m, rr)
        F = lemma1_decomposition(B, p.B_star, p.heads, X)["F"]
        vals.append(np.linalg.norm(F) / (np.linalg.norm(p.heads, 2) * dist0))
    return np.array(vals)


@claim("fedrep.lemma4.F_scaling", paper=PAPER, reference="Lemmas 2-4, eq. (48)",
       statement="||F||_F / (||W*||_2 dist(B^t, B*)) decays like m^{-1/2} (delta_k ~ k^{3/2} sqrt(log(rn)/m)).",
       kind="scaling")
def _c5b(ctx, *, design="gaussian"):
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
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(ms, Y.mean(axis=1), "o-", label=f"measured, slope {fit}")
    ax.loglog(ms, Y.mean(axis=1)[0] * (np.array(ms) / ms[0]) ** -0.5, "--", label="m^-1/2")
    ax.set_xlabel("m")
    ax.set_ylabel("||F|| / (||W*|| dist)")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    return Evidence(verdict=verdict_from(passed), summary=f"slope {fit} (want within [-0.6, -0.4])",
                    measured=fit.as_dict(), predicted={"slope": -0.5}, figure=path,
                    notes="d = 20, k = 2, n = 30, fixed B at dist 0.5. Holds: mean slope in [-0.6, -0.4] with 95% CI "
                          "inside [-0.7, -0.3]; fails: mean outside and CI excluding -0.5; else inconclusive.")


def _task_lemma5(seed, d, k, n, m, design):
    """Lemma 5's (1/rn) ||(A*A(Q)/m - Q)^T W||_2 / dist and Lemma 2's mean_i (1 - sigma_min(G^i)),
    at a fixed B (dist 0.5) with the m -> inf heads W = Theta* B, on a batch independent of W."""
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    B = _warm_start(p.B_star, 0.75, rr)                   # dist(B, B*) = 0.5
    W = p.theta @ B                                      # (n, k)
    Q = W @ B.T - p.theta                                # (n, d) rows q_i = B w_i - theta_i*
    if design == "repeated":                             # broken: 5 samples, repeated to size m
        X5, _ = p.sample(5, rr)
        X = np.tile(X5, (1, int(math.ceil(m / 5)), 1))[:, :m]
    else:
        X, _ = p.sample(m, rr)
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
def _c5c(ctx, *, design="gaussian"):
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
        flags[f"lemma5_{key}_ok"] = fit_band(fits[f"lemma5_vs_{key}"], expo[key] - 0.1, expo[key] + 0.1)
        if key == "m":
            Z = np.array([[o["lemma2"] for o in row] for row in out])
            fits["lemma2_vs_m"] = fit_loglog_slope(vals, Z)
            flags["lemma2_m_ok"] = fit_band(fits["lemma2_vs_m"], -0.6, -0.4)
            m_vals, Z_mean = vals, Z.mean(axis=1)
    passed = all_of(*flags.values())
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(m_vals, Z_mean, "o-", label="mean_i 1 - sigma_min(G^i)")
    ax.loglog(m_vals, Z_mean[0] * (np.array(m_vals) / m_vals[0]) ** -0.5, "k--", label="m^-1/2")
    ax.set_xlabel("m")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
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


def _task_random_init(seed, d, k, n, m, rounds, eps, fedrep_options):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, noise=1e-3, seed=rp)
    opts = {"step_size": 0.5, **(fedrep_options or {})}
    tr = fedrep(p, rounds, opts.pop("step_size"), init="random", data="fixed", tol=eps, seed=rr, **opts)
    return bool(tr.status != "diverged" and np.nanmin(tr.distance) <= eps)


@claim("fedrep.fig3.random_init", paper=PAPER, reference="Sec. 5 / App. A.1 remark (random initialization)",
       statement="FedRep from a random (data-independent) initialization still converges in at least 90% "
                 "of runs.",
       kind="bound")
def _c6b(ctx, *, fedrep_options=None):
    reps = ctx.pick(10, 30, 100)
    out = ctx.map(_task_random_init, [{"d": 10, "k": 2, "n": 100, "m": 5, "rounds": ctx.pick(150, 200, 300),
                                       "eps": 1e-2, "fedrep_options": fedrep_options}], replicates=reps)[0]
    succ = int(np.sum(out))
    ci = stats.binomtest(succ, reps).proportion_ci(confidence_level=0.95, method="exact")
    frac = succ / reps
    # holds: observed fraction >= 0.9 (the paper's statement); fails: the exact 95% upper bound < 0.9
    passed = True if frac >= 0.9 else (False if ci.high < 0.9 else None)
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"{succ}/{reps} random-init runs reach dist <= 1e-2 (95% CI [{ci.low:.2f}, {ci.high:.2f}]; "
                f"want >= 0.9)",
        measured={"successes": succ, "runs": reps, "fraction": frac, "ci": [ci.low, ci.high],
                  "fraction_ok": passed},
        predicted={"fraction": ">= 0.9"},
        notes="Fig. 3/7 setting: d = 10, k = 2, n = 100, m = 5 fixed samples, noise sd 1e-3, eta = 0.5, "
              "Haar-random B0; success = dist <= 1e-2 within T rounds. Fails when the exact (Clopper-Pearson) "
              "95% upper bound on the success probability is below 0.9.")


def _task_fixed_dataset(seed, d, k, n, rounds, eps, algorithm=fedrep):
    """FedRep on a fixed noiseless dataset at m just below and just above the identifiability limit
    m_id = k + k(d - k)/n (equations n m vs unknowns d k - k^2 + n k), and Local Only at m = d - 1, d."""
    rp, rr = _rngs(seed)
    lim = k + k * (d - k) / n
    out = {"limit": lim}
    for name, m in (("below", math.floor(lim) if lim > math.floor(lim) else int(lim) - 1),
                    ("above", math.ceil(lim) + 2)):
        p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, seed=rp)
        smin2, smax2 = _sigmas2(p.heads)
        tr = algorithm(p, rounds, 1 / (4 * smax2), init=_warm_start(p.B_star, 0.75, rp), data="fixed",
                       tol=eps, seed=rr)
        out[name] = {"m": m, "min_dist": float(np.nanmin(tr.distance))}
    for name, m in (("local_below", d - 1), ("local_at", d)):
        p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, seed=rp)
        theta = p.heads @ p.B_star.T
        est = local_only(p, ridge=0.0)
        out[name] = float(np.max(np.linalg.norm(est - theta, axis=1) / np.linalg.norm(theta, axis=1)))
    return out


@claim("fedrep.thm1.fixed_dataset", paper=PAPER,
       reference="App. A.1 (the experiments' fixed datasets); extension of Theorem 1 (which assumes fresh samples)",
       statement="With one fixed noiseless dataset per client, FedRep recovers col(B*) only above the "
                 "identifiability limit m >= k + k(d - k)/n (below it the subspace stays far; two samples "
                 "above it the run converges), and Local Only needs m >= d.",
       kind="phase transition")
def _c4b(ctx, *, algorithm=fedrep):
    d, k = 20, 2
    ns = ctx.pick((40,), (10, 40), (10, 20, 40))
    rounds, eps = 2000, 1e-6
    out = ctx.map(_task_fixed_dataset, [{"d": d, "k": k, "n": n, "rounds": rounds, "eps": eps,
                                         "algorithm": algorithm} for n in ns], replicates=ctx.pick(1, 3, 5))
    rows = []
    for n, row in zip(ns, out):
        rows.append({"n": n, "limit": row[0]["limit"], "m_below": row[0]["below"]["m"], "m_above": row[0]["above"]["m"],
                     "max_dist_above": max(o["above"]["min_dist"] for o in row),
                     "min_dist_below": min(o["below"]["min_dist"] for o in row),
                     "local_only_error_m=d-1": min(o["local_below"] for o in row),
                     "local_only_error_m=d": max(o["local_at"] for o in row)})
    # below the limit the system is underdetermined: the subspace stays far (> 0.05, the warm start is
    # at 0.5); two samples above it the fixed-data run reaches 1e-3 in 2000 rounds. Local Only is exact
    # least squares: error 0 (1e-8) at m = d, and > 0.1 at m = d - 1 (a (d - m)-dim null space).
    checks = {"no_recovery_below": all(r["min_dist_below"] > 0.05 for r in rows),
              "recovery_above": all(r["max_dist_above"] <= 1e-3 for r in rows),
              "local_only_needs_d": all(r["local_only_error_m=d"] <= 1e-8 and r["local_only_error_m=d-1"] > 0.1
                                        for r in rows)}
    passed = all(checks.values())
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.semilogy([r["n"] for r in rows], [r["min_dist_below"] for r in rows], "v", label="m below the limit")
    ax.semilogy([r["n"] for r in rows], [max(r["max_dist_above"], 1e-17) for r in rows], "^", label="m = limit + 2")
    ax.set_xlabel("n"), ax.set_ylabel("best dist(B^t, B*) in 2000 rounds"), ax.legend(fontsize=7)
    return Evidence(
        verdict=verdict_from(passed),
        summary="; ".join(f"n={r['n']} (limit {r['limit']:.1f}): m={r['m_below']} stays at >= {r['min_dist_below']:.1e}, "
                          f"m={r['m_above']} reaches {r['max_dist_above']:.0e}" for r in rows)
                + f"; Local Only exact at m = d: {checks['local_only_needs_d']}",
        measured={"rows": rows, "checks": checks}, table=rows, figure=ctx.save_figure(fig),
        predicted={"limit": "m_id = k + k(d - k)/n", "local_only": "exact iff m >= d"},
        notes=f"d = {d}, k = {k}, noiseless, warm start at dist 0.5, eta = 1/(4 sigma_max^2), data='fixed'. "
              "Not a statement of Theorem 1 (fresh samples): the paper's experiments use fixed datasets, and "
              "this is the limit they face. Near the limit convergence slows (m = ceil(limit) and +1 did not "
              "always reach 1e-3 in 2000 rounds in pilots), hence the two-sample margin above it.")


# ====================================================================== C6
def _task_fig3(seed, d, k, n, m, noise, method, step, rounds, eps, fedrep_options, head_step=0.25):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, noise=noise, seed=rp)
    opts = {"exact": {}, "gd": {"head_steps": 1, "head_step_size": head_step},
            "10gd": {"head_steps": 10, "head_step_size": head_step}}[method]
    if method == "exact":
        opts = {**opts, **(fedrep_options or {})}
    B0 = _warm_start(p.B_star, 0.5, rp)                  # same init for every method
    tr = fedrep(p, rounds, step, init=B0, data="fixed", tol=eps, seed=rr, **opts)
    return rounds_to(tr.distance, eps, censored=len(tr.distance)) if tr.status != "diverged" else rounds + 1


@claim("fedrep.fig3.exact_head_value", paper=PAPER, reference="Fig. 3, Fig. 7 (App. A.1)",
       statement="With the exact head step FedRep reaches a given subspace accuracy in fewer rounds than "
                 "10GD-GD, which beats GD-GD, and FedRep's rounds do not grow with n.",
       kind="comparison")
def _c6(ctx, *, fedrep_options=None):
    ns = ctx.pick((100, 1000), (10, 100, 1000), (10, 100, 1000))
    # representation step tuned on a grid per (n, method); the head GD step of GD-GD / 10GD-GD is
    # fixed at 0.25, safe for the clients' head Hessians B^T Pi_i B at m = 5 (a head step equal to
    # the B step diverges on ill-conditioned clients)
    grid_steps = ctx.pick((0.25, 0.5, 1.0), (0.25, 0.5, 1.0), (0.1, 0.25, 0.5, 1.0, 2.0))
    steps = {"exact": grid_steps, "gd": grid_steps}
    reps = ctx.pick(1, 3, 10)
    rounds = ctx.pick(150, 300, 300)
    methods = ("exact", "10gd", "gd")
    grid = [{"d": 10, "k": 2, "n": n, "m": 5, "noise": 1e-3, "method": meth, "step": s,
             "rounds": rounds, "eps": 1e-2, "fedrep_options": fedrep_options}
            for n in ns for meth in methods for s in steps["exact" if meth == "exact" else "gd"]]
    out = ctx.map(_task_fig3, grid, replicates=reps)
    best = {}
    for g, res in zip(grid, out):
        key = (g["n"], g["method"])
        val = float(np.median(res))                        # robust to a censored (T+1) seed
        best[key] = min(best.get(key, np.inf), val)
    rows = [{"n": n, **{meth: best[(n, meth)] for meth in methods}} for n in ns]
    # ties within 10% (+1 round) count as ordered: at n = 10 ten head steps are nearly exact and the
    # medians differ by less than the seed spread; FedRep must still beat GD-GD strictly
    order = all(r["exact"] <= 1.1 * r["10gd"] + 1 and r["10gd"] <= 1.1 * r["gd"] + 1
                and r["exact"] < r["gd"] for r in rows)
    fr = [r["exact"] for r in rows]
    nonincr = all(a >= b for a, b in zip(fr, fr[1:]))
    ratio = [r["gd"] / r["exact"] for r in rows]
    ratio_ok = all(b >= a * 0.95 for a, b in zip(ratio, ratio[1:]))
    censored = any(r["exact"] > rounds for r in rows)
    passed = bool(order and nonincr and not censored)
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    for meth in methods:
        ax.semilogx(ns, [best[(n, meth)] for n in ns], "o-", label=meth)
    ax.set_xlabel("n")
    ax.set_ylabel("rounds to dist <= 1e-2 (best step)")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"order exact <~ 10GD-GD <~ GD-GD (10% ties; exact < GD-GD): {order}; FedRep rounds non-increasing in n: {nonincr}; "
                f"GD-GD/FedRep ratio {', '.join(f'{x:.1f}' for x in ratio)} (reported)",
        measured={"rows": rows, "ratio_gd_over_fedrep": ratio, "ratio_non_decreasing": ratio_ok},
        predicted={"order": "exact <= 1.1 10gd + 1, 10gd <= 1.1 gd + 1, exact < gd", "fedrep_rounds": "non-increasing in n",
                   "ratio (Fig. 7, reported only)": "non-decreasing in n"}, table=rows,
        figure=path,
        notes="d = 10, k = 2, m = 5 fixed samples, noise sd 1e-3, r = 1 (Fig. 7), steps tuned on a grid per "
              "(n, method) on the median over seeds, head GD step 0.25, same warm start (dist 0.71) for all methods; target 1e-2 rather than 1e-3 because "
              "the fixed-sample noise floor at n = 10 is near 1e-3. Rounds > T mean 'not reached'. Fig. 7's "
              "'FedRep's advantage over GD-GD grows with n' is reported, not tested: it depends on how GD-GD's "
              "head step is tuned (with the head step tied to the B step, as in the official notebook, GD-GD "
              "diverges at large n and the ratio grows; with a fixed safe head step it shrinks).")


# ====================================================================== C7
def _task_fig1(seed, d, k, n, m, noise, rounds, fedrep_options, algorithm=fedrep):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, noise=noise, seed=rp)
    opts = {"step_size": 0.5, **(fedrep_options or {})}
    tr = algorithm(p, rounds, opts.pop("step_size"), init="random", data="fixed", seed=rr, **opts)
    def excess(theta_hat):
        return float(np.mean(np.sum((theta_hat - p.theta) ** 2, axis=1)))
    rep = excess(fit_heads(tr.B, p.X, p.y) @ tr.B.T) if tr.status != "diverged" else float("inf")
    loc = excess(local_only(p))
    s = fedsgd(p, 2 * rounds, 0.1, seed=rr)
    sgd = excess(s.heads @ s.B.T) if s.heads is not None else float("inf")
    return {"fedrep": rep, "local": loc, "fedsgd": sgd}


@claim("fedrep.fig1.collaboration", paper=PAPER, reference="Fig. 1",
       statement="FedRep's test error is far below Local Only's when m < d and below FedSGD-plus-head's at every m.",
       kind="comparison")
def _c7(ctx, *, fedrep_options=None, algorithm=fedrep):
    ms = ctx.pick((5, 20), (5, 10, 20), (5, 10, 20))
    reps = ctx.pick(1, 2, 10)
    rounds = ctx.pick(150, 200, 400)
    grid = [{"d": 20, "k": 2, "n": 100, "m": m, "noise": 1e-3, "rounds": rounds,
             "fedrep_options": fedrep_options, "algorithm": algorithm} for m in ms]
    out = ctx.map(_task_fig1, grid, replicates=reps)
    rows = []
    for m, res in zip(ms, out):
        rows.append({"m": m, **{key: float(np.median([o[key] for o in res])) for key in ("fedrep", "local", "fedsgd")}})
    ok_local = all(r["local"] >= 10 * r["fedrep"] for r in rows if r["m"] < 20)
    ok_sgd = all(r["fedsgd"] >= 10 * r["fedrep"] for r in rows)
    floor = all(r["fedrep"] <= 1e-3 for r in rows)
    passed = bool(ok_local and ok_sgd and floor)
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    w = 0.25
    for j, key in enumerate(("local", "fedsgd", "fedrep")):
        ax.bar(np.arange(len(ms)) + (j - 1) * w, [r[key] for r in rows], w, label=key, log=True)
    ax.set_xticks(np.arange(len(ms)), [str(m) for m in ms])
    ax.set_xlabel("m (training samples per client)")
    ax.set_ylabel("excess test MSE")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    return Evidence(
        verdict=verdict_from(passed),
        summary="; ".join(f"m={r['m']}: FedRep {r['fedrep']:.1e}, Local {r['local']:.1e}, FedSGD {r['fedsgd']:.1e}"
                          for r in rows),
        measured={"rows": rows, "beats_local_ok": ok_local, "beats_fedsgd_ok": ok_sgd, "floor_ok": floor},
        predicted={"local/fedrep": ">= 10 for m < d", "fedsgd/fedrep": ">= 10",
                                            "fedrep": "<= 1e-3 (near the noise floor)"},
        table=rows, figure=path,
        notes="d = 20, k = 2, n = 100, noise sd 1e-3, fixed samples, random init; excess MSE = mean_i "
              "||theta_hat_i - theta_i*||^2 (exact for x ~ N(0, I)); medians over seeds.")


# ====================================================================== C8
def _task_fig4(seed, d, k, n, m, noise, rounds, m_new, n_new, fedrep_options, head_ridge=1e-5):
    rp, rr, rn = _rngs(seed, 3)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, noise=noise, seed=rp)
    opts = {"step_size": 0.5, **(fedrep_options or {})}
    tr = fedrep(p, rounds, opts.pop("step_size"), data="fixed", seed=rr, **opts)
    s = fedsgd(p, 2 * rounds, 0.1, seed=rr)
    new = multitask_linear(d=d, rank=k, n_clients=n_new, noise=noise, B_star=p.B_star, seed=rn)
    res = {"fedrep": [], "fedsgd": [], "local": [], "pred": []}
    Q = np.linalg.qr(tr.B)[0]
    bias = float(np.mean(np.sum((new.theta - new.theta @ Q @ Q.T) ** 2, axis=1)))
    for mm in m_new:
        X, y = new.sample(mm, rn)
        for key, B in (("fedrep", tr.B), ("fedsgd", s.B)):
            W = fit_heads(B, X, y, ridge=head_ridge)
            res[key].append(float(np.mean(np.sum((W @ B.T - new.theta) ** 2, axis=1))))
        T = np.einsum("nde,ne->nd", np.linalg.pinv(X), y)
        res["local"].append(float(np.mean(np.sum((T - new.theta) ** 2, axis=1))))
        # Gaussian-design OLS in k dims with effective noise sigma^2 + bias (bias acts as noise)
        res["pred"].append(bias + (noise ** 2 + bias) * k / (mm - k - 1) if mm >= k + 2 else float("nan"))
    return {key: np.array(v) for key, v in res.items()}


@claim("fedrep.fig4.new_client", paper=PAPER, reference="Fig. 4; Sec. 4 remark (new clients need Theta(k) samples)",
       statement="With FedRep's representation frozen, a new client's head fitted on m_new >= k + 2 samples has "
                 "excess error close to sigma^2 k/(m_new - k - 1), while Local Only needs m_new ~ d and "
                 "FedSGD's representation stays wrong.",
       kind="comparison")
def _c8(ctx, *, fedrep_options=None, head_ridge=1e-5):
    m_new = ctx.pick((2, 5, 10, 40), (1, 2, 3, 5, 10, 20, 40), (1, 2, 3, 5, 10, 20, 40))
    reps = ctx.pick(1, 3, 10)
    rounds = ctx.pick(150, 300, 400)
    d, k, noise = 20, 2, 0.1
    out = ctx.map(_task_fig4, [{"d": d, "k": k, "n": 100, "m": 10, "noise": noise, "rounds": rounds,
                                "m_new": m_new, "n_new": 100, "fedrep_options": fedrep_options,
                                "head_ridge": head_ridge}],
                  replicates=reps)[0]
    agg = {key: np.mean([o[key] for o in out], axis=0) for key in ("fedrep", "fedsgd", "local", "pred")}
    mn = np.array(m_new)
    sel = mn >= k + 2
    ratio = agg["fedrep"][sel] / agg["pred"][sel]
    ok_pred = bool(np.all((ratio >= 0.5) & (ratio <= 2.0)))
    ok_sgd = bool(np.all(agg["fedsgd"][sel] >= 10 * agg["fedrep"][sel]))
    small = mn < d // 2
    ok_local = bool(np.all(agg["local"][small & sel] >= 10 * agg["fedrep"][small & sel]))
    ok_abs = bool(np.all(agg["fedrep"][sel] <= 0.1 * k))   # accurate as soon as m_new >= k + 2
    passed = ok_pred and ok_sgd and ok_local and ok_abs
    rows = [{"m_new": int(a), "fedrep": float(b), "prediction": float(c), "fedsgd": float(e), "local": float(f)}
            for a, b, c, e, f in zip(mn, agg["fedrep"], agg["pred"], agg["fedsgd"], agg["local"])]
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    for key in ("fedrep", "fedsgd", "local"):
        ax.loglog(mn, agg[key], "o-", label=key)
    ax.loglog(mn[sel], agg["pred"][sel], "k--", label="k-dim OLS prediction")
    ax.set_xlabel("m_new")
    ax.set_ylabel("excess MSE on new clients")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"FedRep / prediction in [{ratio.min():.2f}, {ratio.max():.2f}] (want [0.5, 2]); "
                f"FedSGD >= 10x: {ok_sgd}; Local >= 10x for m_new < d/2: {ok_local}",
        measured={"rows": rows, "prediction_ok": ok_pred, "beats_fedsgd_ok": ok_sgd,
                  "beats_local_ok": ok_local, "accurate_ok": ok_abs},
        predicted={"fedrep": "bias + (s^2 + bias) k/(m_new - k - 1)"},
        table=rows, figure=path,
        notes="Trained on n = 100, (d, k) = (20, 2), m = 10 fixed samples; noise sd 0.1 (larger than the "
              "paper's 1e-3 so that the k/(m_new - k - 1) variance term is measurable); 100 new clients; "
              "bias = mean ||(I - P_B) theta||^2 over the new clients.")


# ====================================================================== C9 (erratum)
def _task_mom(seed, d, k, n, ms, estimator=method_of_moments):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    return np.array([subspace_distance(p.B_star, estimator(*p.sample(m, rr), k)) for m in ms])


def _mom_first_batch(X, y, k):
    """A broken estimator for tests: uses only the first 10 samples of every client."""
    return method_of_moments(X[:, :10], y[:, :10], k)


@claim("fedrep.thm2.mom_exponent", paper=PAPER, reference="Theorem 2, eq. (94)", erratum=True,
       statement="Eq. (94) bounds dist(B^0, B*) by O(kd/(mn)) (exponent -1 in nm); the method of moments "
                 "actually achieves dist ~ sqrt(d/(nm)) (exponent -1/2), so (94) lacks a square root.",
       kind="erratum")
def _c9(ctx, *, estimator=method_of_moments):
    ms = ctx.pick((40, 80, 160), (20, 40, 80, 160, 320), (20, 40, 80, 160, 320, 640))
    reps = ctx.pick(6, 8, 20)
    d, k, n = 50, 2, 100
    out = ctx.map(_task_mom, [{"d": d, "k": k, "n": n, "ms": ms, "estimator": estimator}], replicates=reps)[0]
    Y = np.array(out).T
    N = n * np.array(ms)
    fit = fit_loglog_slope(N, Y)
    E0_ok = bool(np.all(1 - Y[-1] ** 2 > 0.5))
    # confirmed: mean slope in [-0.6, -0.4], CI inside [-0.7, -0.3] (so it excludes the printed -1)
    # and E0 bounded away from 0; refuted ("fails"): the CI contains -1 or the mean is outside.
    if -0.6 <= fit.slope <= -0.4 and -0.7 <= fit.low and fit.high <= -0.3 and E0_ok:
        confirmed = True
    elif fit.low <= -1 <= fit.high or not (-0.6 <= fit.slope <= -0.4):
        confirmed = False
    else:
        confirmed = None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(N, Y.mean(axis=1), "o-", label=f"MoM, slope {fit}")
    ax.loglog(N, Y.mean(axis=1)[0] * (N / N[0]) ** -0.5, "--", label="(nm)^-1/2 (Davis-Kahan)")
    ax.loglog(N, Y.mean(axis=1)[0] * (N / N[0]) ** -1.0, ":", label="(nm)^-1 (eq. (94) as printed)")
    ax.set_xlabel("N = nm")
    ax.set_ylabel("dist(B0, B*)")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    return Evidence(
        verdict=verdict_from(confirmed, erratum=True),
        summary=f"slope of dist(B0) vs nm = {fit} (printed bound: -1; Davis-Kahan: -0.5)",
        measured={**fit.as_dict(), "E0_at_largest_N": float(np.mean(1 - Y[-1] ** 2))},
        predicted={"printed": -1.0, "corrected": -0.5},
        figure=path,
        notes="d = 50, k = 2, n = 100, Assumption 3 heads. Erratum confirmed when the mean slope is in "
              "[-0.6, -0.4] with its 95% CI inside [-0.7, -0.3] (so it excludes -1) and E0 > 0.5 at the largest N. Note §3.5 pilot: dist ~ 3.2 sqrt(d/(nm)).")


# ====================================================================== C10
def _task_rip(seed, d, m, n, k, design_scale):
    rng = _rngs(seed, 1)[0]
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


# ====================================================================== C11
def _task_participation(seed, d, k, n, m, r, rounds, eps, algorithm=fedrep):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = _sigmas2(p.heads)
    tr = algorithm(p, rounds, 1 / (4 * smax2), clients_per_round=n_participants(r, n), init=_warm_start(p.B_star, 0.75, rp),
                   data="fresh", batch_size=m, tol=eps, seed=rr)
    # Algorithm 1 samples the rn participants uniformly without replacement: every round's set distinct
    ran = np.isfinite(tr.distance[1:])           # rows of rounds not run (stopped at tol) are padding
    P = np.sort(np.asarray(tr.extra["participants"])[ran], axis=1)
    distinct = bool(np.all(P[:, 1:] != P[:, :-1])) if P.size else True
    return {"rounds": rounds_to(tr.distance, eps, censored=len(tr.distance)), "distinct": distinct}


@claim("fedrep.thm1.participation", paper=PAPER, reference="Theorem 1 (d/(rn) term), Sec. 4",
       statement="Lower participation r acts like fewer clients per round: rounds to reach a given accuracy "
                 "do not decrease as r decreases.",
       kind="scaling")
def _c11(ctx, *, algorithm=fedrep):
    rs = ctx.pick((0.1, 1.0), (0.1, 0.2, 0.5, 1.0), (0.1, 0.2, 0.5, 1.0))
    reps = ctx.pick(2, 3, 10)
    d, n, m = 60, 100, 6
    rounds = 400
    grid = [{"d": d, "k": 2, "n": n, "m": m, "r": r, "rounds": rounds, "eps": 1e-6, "algorithm": algorithm}
            for r in rs]
    out = ctx.map(_task_participation, grid, replicates=reps)
    distinct = all(o["distinct"] for row in out for o in row)
    med = np.array([float(np.median([o["rounds"] for o in row])) for row in out])
    mono = bool(np.all(med[1:] <= 1.05 * med[:-1]))       # 5% slack between neighbouring r
    gain = float(med[0] / med[-1])
    passed = bool(mono and gain >= 1.15 and med[0] <= rounds and distinct)
    rows = [{"r": r, "rounds_median": float(x), "client_participations": float(x * r * n)}
            for r, x in zip(rs, med)]
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.semilogx(rs, med, "o-")
    ax.set_xlabel("participation r")
    ax.set_ylabel("rounds to dist <= 1e-6 (median)")
    path = ctx.save_figure(fig)
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"rounds {', '.join(f'r={r}: {x:.0f}' for r, x in zip(rs, med))}; smallest/largest r ratio {gain:.2f}"
                + ("" if distinct else "; a round sampled a client twice"),
        measured={"rows": rows, "participants_distinct": distinct},
        predicted={"trend": "non-increasing in r (5% slack), smallest/largest r ratio >= 1.15",
                   "participants": "rn distinct clients every round (sampled without replacement)"}, table=rows,
        figure=path, notes=f"d = {d}, k = 2, n = {n}, m = {m} fresh samples, warm start at dist 0.5.")


# ====================================================================== C12 (extensions)
def _task_noise_floor(seed, d, k, n, m, noise, rounds, options=None, algorithm=fedrep):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, noise=noise, seed=rp)
    smin2, smax2 = _sigmas2(p.heads)
    tr = algorithm(p, rounds, 1 / (4 * smax2), init=_warm_start(p.B_star, 0.75, rp), data="fresh", batch_size=m, seed=rr,
                   **(options or {}))
    return float(np.median(tr.distance[-rounds // 4:]))


@claim("fedrep.ext.noise_floor", paper=PAPER, reference="extension (label noise; the theory is noiseless)",
       statement="With label noise sigma and fresh samples, dist(B^t, B*) decays linearly to a floor "
                 "proportional to sigma (about sigma sqrt(d/(rnm))).",
       kind="scaling")
def _c12a(ctx, *, options=None, algorithm=fedrep):
    sig = ctx.pick((1e-4, 1e-3, 1e-2), (1e-4, 1e-3, 1e-2), (1e-5, 1e-4, 1e-3, 1e-2))
    reps = ctx.pick(2, 3, 8)
    d, n, m = 30, 100, 10
    out = ctx.map(_task_noise_floor, [{"d": d, "k": 2, "n": n, "m": m, "noise": s,
                                       "rounds": ctx.pick(120, 150, 200), "options": options,
                                       "algorithm": algorithm} for s in sig], replicates=reps)
    Y = np.array(out)
    pred = np.array(sig) * math.sqrt(d / (n * m))
    if not (np.all(np.isfinite(Y)) and np.all(Y > 0)):
        fit, passed, ratio = None, False, np.full(len(sig), np.nan)
    else:
        fit = fit_loglog_slope(sig, Y)
        ratio = Y.mean(axis=1) / pred
        passed = fit_band(fit, 0.85, 1.15)
    plt = _figure()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(sig, Y.mean(axis=1), "o-", label="floor (median of the last T/4 rounds)")
    ax.loglog(sig, pred, "k--", label="sigma sqrt(d/(nm))")
    ax.set_xlabel("noise sigma")
    ax.set_ylabel("dist(B^t, B*) floor")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig)
    fit_txt = f"{fit.slope:.2f} [{fit.low:.2f}, {fit.high:.2f}]" if fit else "undefined (non-finite floor)"
    return Evidence(verdict=verdict_from(passed),
                    summary=f"floor ~ sigma^{fit_txt}; floor / (sigma sqrt(d/(nm))) = "
                            f"{', '.join(f'{x:.2f}' for x in ratio)}",
                    measured={**(fit.as_dict() if fit else {}), "slope_ok": passed,
                              "floor_over_prediction": ratio.tolist()},
                    predicted={"slope": 1.0, "floor": "sigma sqrt(d/(nm)) (order of magnitude)"},
                    figure=path,
                    notes="Extension, not a paper claim. Holds when the 95% interval of the slope lies in "
                          "[0.85, 1.15], fails when it lies entirely outside; the prefactor is reported.")


def _task_split(seed, d, k, n, m, rounds, batch, options):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = _sigmas2(p.heads)
    tr = fedrep(p, rounds, 1 / (4 * smax2), data="fresh", batch_size=m, batch=batch, init=_warm_start(p.B_star, 0.75, rp),
                seed=rr, **(options or {}))
    return tr.distance


@claim("fedrep.ext.split_batch", paper=PAPER, reference="Lemma 5 caveat (head and gradient on the same batch)",
       statement="Using the same batch for the head and the representation gradient (Alg. 2) or independent "
                 "halves (the independence Lemma 5's proof assumes) both converge linearly to exact recovery.",
       kind="comparison")
def _c12b(ctx, *, options=None):
    reps = ctx.pick(2, 3, 8)
    rounds = ctx.pick(150, 200, 300)
    grid = [{"d": 30, "k": 2, "n": 100, "m": 12, "rounds": rounds, "batch": b, "options": options}
            for b in ("same", "split")]
    out = ctx.map(_task_split, grid, replicates=reps)
    fits = [[_linear_phase_fit(dd) for dd in res] for res in out]
    finals = [max(dd[-1] for dd in res) for res in out]
    rhos = [float(np.median([f[0] for f in fs])) for fs in fits]
    passed = bool(all(f < 1e-10 for f in finals))
    return Evidence(verdict=verdict_from(passed),
                    summary=f"same batch: rho {rhos[0]:.3f}, final {finals[0]:.1e}; split: rho {rhos[1]:.3f}, "
                            f"final {finals[1]:.1e}",
                    measured={"rho_same": rhos[0], "rho_split": rhos[1], "final_same": finals[0],
                              "final_split": finals[1]},
                    predicted={"final": "< 1e-10 for both"},
                    notes="Extension. The split variant uses m/2 samples per step, so it is expected to be slower.")


def _task_head_steps(seed, d, k, n, m, tau, rounds, eps, head_step_size):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, seed=rp)
    opts = {} if tau is None else {"head_steps": tau, "head_step_size": head_step_size}
    tr = fedrep(p, rounds, 0.5, init=_warm_start(p.B_star, 0.5, rp), data="fixed", tol=eps,
                seed=rr, **opts)
    return rounds_to(tr.distance, eps, censored=len(tr.distance)) if tr.status != "diverged" else rounds + 1


@claim("fedrep.ext.head_steps", paper=PAPER, reference="Alg. 1 (tau_h), Fig. 3/5 trend",
       statement="With tau_h gradient steps on the head instead of the exact minimizer, the rounds needed "
                 "decrease with tau_h towards FedRep's.",
       kind="comparison")
def _c12c(ctx, *, head_step_size=0.5):
    taus = ctx.pick((1, 10, None), (1, 3, 10, 30, None), (1, 3, 10, 30, None))
    reps = ctx.pick(2, 5, 10)
    rounds = 300
    grid = [{"d": 10, "k": 2, "n": 100, "m": 12, "tau": t, "rounds": rounds, "eps": 1e-6,
             "head_step_size": head_step_size} for t in taus]
    out = ctx.map(_task_head_steps, grid, replicates=reps)
    med = [float(np.median(o)) for o in out]
    mono = all(b <= 1.05 * a + 1 for a, b in zip(med, med[1:]))   # 5% + 1 round slack
    close = med[-2] <= 1.25 * med[-1] + 1
    passed = bool(mono and close and med[-1] <= rounds)
    rows = [{"tau_h": "exact" if t is None else t, "rounds_median": x} for t, x in zip(taus, med)]
    return Evidence(verdict=verdict_from(passed),
                    summary=", ".join(f"tau={r['tau_h']}: {r['rounds_median']:.0f}" for r in rows),
                    measured={"rows": rows}, predicted={"trend": "non-increasing in tau (5% + 1 round slack), largest tau within 25% (+1 round) of exact"},
                    table=rows, notes="Extension; fixed noiseless data d = 10, k = 2, n = 100, m = 12, eta = 0.5, head "
                                      "GD step 0.5 with warm-started heads, same warm start (dist 0.71). With fresh "
                                      "samples instead, warm-started GD heads average over rounds and can beat exact heads.")


# ====================================================================== exact references
def _task_exact(seed, d, k, n, m, rounds, fedrep_options, nuclear_mu=1e-6):
    rp, rr = _rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, seed=rp)
    opts = {"step_size": 0.5, **(fedrep_options or {})}
    tr = fedrep(p, rounds, opts.pop("step_size"), data="fixed", seed=rr, **opts)
    am = altmin(p.X, p.y, k, max_iter=500, tol=1e-15)
    ols = ols_then_svd(p.X, p.y, k)
    nuc = solve_nuclear_prox(p.X, p.y, nuclear_mu, tol=1e-12, max_iter=20000)
    Vn = truncated_svd(nuc.Theta, k)[2].T
    vals, vecs = np.linalg.eigh(population_moment_matrix(p.theta))
    # the library's method of moments on the data against an independent re-derivation: top-k
    # eigenvectors of (1/(nm)) sum_ij y_ij^2 x_ij x_ij^T formed here (SVD of the weighted samples)
    Z = (p.X * np.abs(p.y)[..., None]).reshape(-1, d)
    mom_ref = np.linalg.svd(Z, full_matrices=False)[2][:k].T
    # the metric every claim reads: dist = sin of the largest principal angle (scipy's angles)
    B_rand = haar_orthonormal(d=d, rank=k, seed=rr)
    metric = abs(subspace_distance(p.B_star, B_rand) - float(np.sin(np.max(subspace_angles(p.B_star, B_rand)))))
    return {"mom_library_vs_rederived": subspace_distance(mom_ref, method_of_moments(p.X, p.y, k)),
            "distance_vs_principal_angle": metric,
            "altmin_status_ok": 0.0 if am.status in ("optimal", "completed") else 1.0,"fedrep": tr.final_distance, "altmin": subspace_distance(p.B_star, am.B),
            "fedrep_vs_altmin": subspace_distance(am.B, tr.B), "ols_svd": subspace_distance(p.B_star, ols),
            "nuclear": subspace_distance(p.B_star, Vn),
            "population_svd": subspace_distance(p.B_star, population_optimum(p.theta, k)),
            "population_mom": subspace_distance(p.B_star, vecs[:, -k:])}


@claim("fedrep.sec6.exact_references", paper=PAPER, reference="Algorithm 2 vs exact solutions (AltMin, OLS+SVD, nuclear norm)",
       statement="On noiseless identifiable data FedRep's representation agrees with the exact references: "
                 "AltMin, per-client OLS then SVD, nuclear-norm least squares (small mu), and the population "
                 "optima (truncated SVD, method of moments).",
       kind="comparison")
def _c_exact(ctx, *, fedrep_options=None, nuclear_mu=1e-6):
    reps = ctx.pick(1, 3, 10)
    out = ctx.map(_task_exact, [{"d": 8, "k": 2, "n": 30, "m": 12, "rounds": ctx.pick(150, 200, 300),
                                 "fedrep_options": fedrep_options, "nuclear_mu": nuclear_mu}],
                  replicates=reps)[0]
    worst = {key: max(o[key] for o in out) for key in out[0]}
    tol = {"fedrep": 1e-8, "altmin": 1e-8, "fedrep_vs_altmin": 1e-8, "ols_svd": 1e-8, "nuclear": 1e-3,
           "population_svd": 1e-12, "population_mom": 1e-12, "mom_library_vs_rederived": 1e-8,
           "altmin_status_ok": 0.0, "distance_vs_principal_angle": 1e-12}
    failed = [key for key in tol if not worst[key] <= tol[key]]
    passed = not failed
    return Evidence(verdict=verdict_from(passed),
                    summary=", ".join(f"{key} {v:.1e}" for key, v in worst.items()),
                    measured={**worst, "failed_checks": failed},
                    predicted={key: f"<= {v:g}" for key, v in tol.items()},
                    notes="d = 8, k = 2, n = 30, m = 12 > d fixed noiseless samples. The population optima are "
                          "reported as checks of the library's closed forms; the library's method of moments on "
                          "the data is compared with an independent SVD of the weighted samples (1e-8), and "
                          "AltMin must report a converged status. Nuclear norm with mu = 1e-6 is "
                          "biased by O(mu), hence the 1e-3 tolerance on its top-k subspace; the others are exact.")


# ====================================================================== omitted
omit("fedrep.table1.real_data", paper=PAPER, reference="Table 1, Sec. 5 (CIFAR, FEMNIST, Sent140)",
     statement="FedRep outperforms the personalized and global baselines on real data sets.",
     reason="Needs neural networks and the real data sets; the toolkit covers the linear model only.")
omit("fedrep.thm1.probability", paper=PAPER, reference="Theorem 1 probability 1 - T exp(-100 min(k^2 log rn, d))",
     statement="The rate holds with probability at least 1 - T e^{-100 min(k^2 log(rn), d)}.",
     reason="The failure probability is astronomically small and the absolute constant c in the sample "
            "condition is unspecified, so no finite experiment can test it; C2/C4 test the rate and scaling.")
