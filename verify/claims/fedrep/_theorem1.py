"""FedRep, Theorem 1: the linear rate (10), its dependence on eta, E0 and sigma_min*, the sample
complexity (11) and partial participation."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from lowrank_fl.algorithms.fedrep import fedrep, n_participants
from lowrank_fl.algorithms.fedrep_baselines import local_only
from lowrank_fl.problems.multitask import haar_orthonormal, multitask_linear
from verify.claim import Evidence, claim, verdict_from
from verify.convergence import expected_non_convergence
from verify.conditions.fedrep import guaranteed_rate
from verify.criteria import relaxation
from verify.stats import fit_loglog_slope, interval_verdict, mean_ci

from ._support import (PAPER, all_of, band, linear_phase_fit, pyplot, rngs, rounds_to, sigmas2,
                       warm_start)


def _skewed_heads(n, k, skew, rng):
    """Assumption 3 heads (norm sqrt(k)) from Gaussians scaled by ``diag(1, skew, ..., skew)``:
    ``skew < 1`` lowers sigma_min* (raises kappa)."""
    scale = np.full(k, float(skew))
    scale[0] = 1.0
    G = rng.standard_normal((n, k)) * scale
    return math.sqrt(k) * G / np.linalg.norm(G, axis=1, keepdims=True)


# ====================================================================== C2
def _task_rate(seed, d, k, n, m, r, rounds, options, algorithm=fedrep, eta=None):
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = sigmas2(p.heads)
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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for g, res in zip(grid, out):
        fits = [linear_phase_fit(o["distance"]) for o in res]
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
    path = ctx.save_figure(fig, title="dist per round (dashed: bound)")
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
    rp, rr = rngs(seed)
    B_star = haar_orthonormal(d=d, rank=k, seed=rp)
    p = multitask_linear(d=d, rank=k, n_clients=n, heads=_skewed_heads(n, k, skew, rp), B_star=B_star, seed=rp)
    smin2, smax2 = sigmas2(p.heads)
    eta = eta_mult / smax2
    tr = fedrep(p, rounds, eta, init=warm_start(B_star, E0, rr), seed=rr, **(options or {}))
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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot(x, rate, "o", label="measured -log rho (tail)")
    xs = np.linspace(0, x.max() * 1.05, 50)
    ax.plot(xs, -np.log(1 - xs), "-", label="sharp: -log(1 - eta sigma_min^2)")
    ax.set_xlabel("eta sigma_min*^2")
    ax.set_ylabel("-log rho")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig, title="tail rate vs eta sigma_min^2")
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
              "sharper asymptotic prediction (tail factor between 1 - eta sigma_max^2 and "
              "1 - eta sigma_min^2) is reported, not judged: it holds only once the iterates are in the "
              "asymptotic regime, which the smallest eta does not reach within T rounds.")


# ====================================================================== C4
def _task_threshold(seed, d, k, n, m_grid, eps, algorithm=fedrep):
    """Smallest m of ``m_grid`` (bisection, assuming monotone success) at which a run reaches
    dist <= eps within twice the rounds the m -> inf recursion needs from the same start
    (so that the threshold measures samples, not the conditioning of W*); inf if none."""
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = sigmas2(p.heads)
    B0 = warm_start(p.B_star, 0.75, rp)                 # dist(B0, B*) = 0.5, a pilot-calibrated start
    eta = 1 / (4 * smax2)
    pop = fedrep(p, 5000, eta, init=B0, tol=eps, seed=0)  # population rounds (deterministic)
    rounds = 2 * rounds_to(pop.distance, eps, censored=len(pop.distance)) + 10

    def success(m):   # a run that misses eps is a failure the bisection counts, not a bad solve
        with expected_non_convergence():
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
    old_ok = (band(fit_loglog_slope(x[big], M[big] - k), 0.7, 1.3)
              if np.sum(big) >= 3 and np.all(np.isfinite(M[big])) else None)
    plt = pyplot()
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


# ====================================================================== C11
def _task_fixed_dataset(seed, d, k, n, rounds, eps, algorithm=fedrep):
    """FedRep on a fixed noiseless dataset at m just below and just above the identifiability limit
    m_id = k + k(d - k)/n (equations n m vs unknowns d k - k^2 + n k), and Local Only at m = d - 1, d."""
    rp, rr = rngs(seed)
    lim = k + k * (d - k) / n
    out = {"limit": lim}
    for name, m in (("below", math.floor(lim) if lim > math.floor(lim) else int(lim) - 1),
                    ("above", math.ceil(lim) + 2)):
        p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, seed=rp)
        smin2, smax2 = sigmas2(p.heads)
        # below the limit the run must not converge; above it, min_dist <= eps is the criterion
        with expected_non_convergence():
            tr = algorithm(p, rounds, 1 / (4 * smax2), init=warm_start(p.B_star, 0.75, rp), data="fixed",
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
    plt = pyplot()
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


def _task_participation(seed, d, k, n, m, r, rounds, eps, algorithm=fedrep):
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = sigmas2(p.heads)
    tr = algorithm(p, rounds, 1 / (4 * smax2), clients_per_round=n_participants(r, n), init=warm_start(p.B_star, 0.75, rp),
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
    plt = pyplot()
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
