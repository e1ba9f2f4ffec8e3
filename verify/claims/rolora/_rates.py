"""RoLoRA claims C6-C10: population and finite-sample rates, the step-size erratum, the b-step
concentration and the expected gradient; registered by :mod:`verify.claims.rolora` (setup and
injection points there)."""
from __future__ import annotations

import numpy as np
from scipy import stats

from lowrank_fl.algorithms.rolora import grad_a_clients, rolora
from lowrank_fl.exact.rolora import (expected_gradient_a, iterations_bound, local_b_solve, rate_bound_heterogeneous,
                                     rate_bound_homogeneous, reduced_rank_regression, rolora_population_recursion,
                                     step_size_bound)
from lowrank_fl.problems.lora import (init_at_angle, random_unit, rank_one_lora)
from verify.claim import SOLVES_KEY, Evidence, claim, verdict_from
from verify.criteria import all_of
from verify.stats import fit_loglog_slope, fit_semilog_slope
from ._support import PAPER, new_figure, geometric_slopes, solve_records


# =============================================================================================
# C6  Population dynamics (Lemma A.16, Theorem A.14)
# =============================================================================================
def _task_population(seed, *, delta0, eta_factor, gamma, rounds, algorithm):
    rng = np.random.default_rng(seed)
    ss = rng.integers(2 ** 31)
    prob = rank_one_lora(d=20, n_clients=10, gamma=gamma, seed=int(ss))
    homog = rank_one_lora(d=20, n_clients=10, gamma=0.0, seed=int(ss))           # same a*, bbar*
    a0 = init_at_angle(prob.a_star, delta0, rng)
    s = prob.L_max ** 2
    eta = eta_factor / s
    tr = algorithm(prob, rounds, eta, init=a0, seed=rng)
    tr0 = algorithm(homog, rounds, eta, init=a0, seed=rng)
    exact = rolora_population_recursion(delta0, s, eta, rounds)
    dl = tr.distance
    rate = rate_bound_heterogeneous(eta, delta0, prob.L_max)
    loss_pred = gamma ** 2 + s * dl ** 2
    # Thm A.14's iteration count T(eps) = log(delta0/eps) / (c (1 - delta0^2)), c = 2 eta s: take the eps
    # whose T(eps) is the horizon, so the count is judged on every run (a fixed eps = 1e-6 needs more
    # iterations than any scale runs, which made the check vacuous)
    c = 2 * eta * s
    eps_T = delta0 * np.exp(-c * (1 - delta0 ** 2) * rounds)
    return {"delta": dl.tolist(), "monotone": bool(np.all(np.diff(dl) <= 1e-15)),
            "bound_ok": bool(np.all(dl[1:] <= dl[:-1] * rate + 1e-15)),
            "recursion_err": float(np.nanmax(np.abs(dl - exact))),
            "loss_err": float(np.nanmax(np.abs(tr.loss - loss_pred) / loss_pred)),
            "gamma_effect": float(np.nanmax(np.abs(dl - tr0.distance))),
            "T_ok": bool(dl[-1] <= eps_T * (1 + 1e-12)), "eps_T": float(eps_T),
            "T_bound": iterations_bound(min(c, 1.0), delta0, eps_T, setting="heterogeneous"),
            "rate_bound": rate, SOLVES_KEY: solve_records(rolora_heterogeneous=tr, rolora_homogeneous=tr0)}


@claim("rolora.thmA14.population_rate", paper=PAPER, reference="Lemma A.16 eq. (254), Theorem A.14",
       statement="In the heterogeneous population model with eta <= 1/(2 L_max^2) RoLoRA's angle contracts at "
                 "least by 1 - 2 eta (1 - delta_0^2)||bbar*||^2 per iteration and its loss is "
                 "gamma^2 + ||bbar*||^2 delta_t^2.", kind="rate")
def _c6(ctx, *, algorithm=rolora):
    rounds = ctx.pick(25, 40, 60)
    grid = [{"delta0": d0, "eta_factor": ef, "gamma": 0.7, "rounds": rounds, "algorithm": algorithm}
            for d0 in (0.9, 0.99) for ef in (0.5, 0.25)]
    out = ctx.map(_task_population, grid, replicates=ctx.pick(2, 5, 20))
    flat = [o for row in out for o in row]
    checks = {
        "monotone": all(o["monotone"] for o in flat),
        "bound": all(o["bound_ok"] for o in flat),
        # 1e-12: the recursion is exact; the measured angle is a residual norm accurate to ~1e-16.
        "recursion": max(o["recursion_err"] for o in flat) <= 1e-12,
        # 1e-9 relative: loss is a difference of O(1) inner products (cancellation down to gamma^2).
        "loss_identity": max(o["loss_err"] for o in flat) <= 1e-9,
        "gamma_free": max(o["gamma_effect"] for o in flat) <= 1e-12,
        # T of Thm A.14 suffices: delta_T <= eps_T where T(eps_T) is the horizon (a corollary of the
        # per-iteration bound, since 1 - x <= exp(-x); judged on its own as the theorem states it)
        "T_bound": all(o["T_ok"] for o in flat),
    }
    fits = {}
    for g, row in zip(grid, out):
        D = np.array([o["delta"] for o in row])
        sl = geometric_slopes(D)
        fits[f"delta0={g['delta0']},eta={g['eta_factor']}/s"] = {
            "measured_rate": float(np.exp(sl.mean())), "bound_rate": row[0]["rate_bound"]}
    passed = all(checks.values())
    fig, ax = new_figure()
    for g, row in zip(grid, out):
        ax.semilogy(np.maximum(row[0]["delta"], 1e-17), label=f"d0={g['delta0']}, eta={g['eta_factor']}/s")
    ax.set_xlabel("iteration t"), ax.set_ylabel("delta_t"), ax.legend(fontsize=7)
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"{k}={'ok' if v else 'FAIL'}" for k, v in checks.items()),
                    measured={"checks": checks, "max_recursion_err": max(o["recursion_err"] for o in flat),
                              "rates": fits},
                    predicted={"rate": "1 - 2 eta (1-delta0^2)||bbar*||^2", "loss": "gamma^2 + s delta_t^2",
                               "T_bound": "delta_T <= eps_T, the eps whose Thm A.14 count T(eps) is the horizon"},
                    figure=ctx.save_figure(fig),
                    notes="Six judged checks (measured['checks']); the tests break each one with its own variant. "
                          "The iteration-count check uses eps_T = delta0 exp(-c(1-delta0^2) T) so that it is "
                          "decided at every scale (with a fixed eps = 1e-6 the theorem's T exceeded every horizon).")


# =============================================================================================
# C7  Finite-sample geometric decay (Lemma 5.3 / Theorem 5.4)
# =============================================================================================
def _task_finite(seed, *, d, n, m, delta0, eta_factor, mode, rounds, algorithm):
    rng = np.random.default_rng(seed)
    prob = rank_one_lora(d=d, n_clients=n, samples_per_client=m, seed=rng)
    a0 = init_at_angle(prob.a_star, delta0, rng)
    s = prob.L_max ** 2
    eta = eta_factor / s
    tr = algorithm(prob, rounds, eta, init=a0, data=mode, seed=rng)
    dl = tr.distance
    rho = rate_bound_homogeneous(eta, delta0, prob.L_max)
    bound = delta0 * rho ** np.arange(rounds + 1)
    eps_prime = float(np.nanmax(tr.extra["b_deviation"][dl > 1e-12])) if np.any(dl > 1e-12) else 0.0
    err_T = tr.extra["model_error"][-1]
    W_rrr = reduced_rank_regression(prob.X, prob.Y, 1)
    W = np.outer(tr.a, tr.b)
    return {"delta": dl.tolist(), "bound_ok": bool(np.all(dl <= bound + 1e-14)),
            "err_ok": bool(err_T <= (1 + eps_prime) * dl[-1] + 1e-12), "eps_prime": eps_prime,
            "rrr_gap": float(np.linalg.norm(W - W_rrr) / np.linalg.norm(W_rrr)),
            "rrr_allowed": float((1 + eps_prime) * dl[-1] + 1e-10), "rho": rho, SOLVES_KEY: solve_records(rolora=tr)}


@claim("rolora.thm5_4.finite_sample_rate", paper=PAPER, reference="Lemma 5.3 eq. (9), Theorem 5.4",
       statement="Homogeneous finite-sample RoLoRA with eta = 1/(2||b*||^2) decays delta_t geometrically, below "
                 "delta_0 (1 - eta(1-delta_0^2)||b*||^2)^{t/2}, with final model error <= (1+eps')delta_T.",
       kind="rate")
def _c7(ctx, *, algorithm=rolora):
    reps = ctx.pick(3, 8, 15)
    rounds = ctx.pick(20, 30, 40)
    d, n, m = ctx.pick((20, 5, 100), (30, 10, 150), (50, 10, 200))
    grid = [{"d": d, "n": n, "m": m, "delta0": 0.5, "eta_factor": ef, "mode": mode, "rounds": rounds,
             "algorithm": algorithm} for ef in (0.5, 0.25) for mode in ("fixed", "fresh")]
    out = ctx.map(_task_finite, grid, replicates=reps)
    measured, ok = {}, True
    for g, row in zip(grid, out):
        D = np.array([o["delta"] for o in row])
        fit = fit_semilog_slope(np.arange(D.shape[1], dtype=float)[:8], np.maximum(D[:, :8].T, 1e-300))
        frac = np.mean([o["bound_ok"] and o["err_ok"] for o in row])
        key = f"eta={g['eta_factor']}/s,{g['mode']}"
        geometric = np.isfinite(fit.high) and fit.high < np.log(row[0]["rho"]) if reps > 1 else fit.slope < 0
        measured[key] = {"slope_fit": fit.as_dict(), "fraction_bound_and_error_ok": float(frac),
                         "rate_per_iter": float(np.exp(fit.slope)), "bound_rate": row[0]["rho"],
                         "max_eps_prime": max(o["eps_prime"] for o in row)}
        if g["mode"] == "fixed":
            # exact reference: reduced-rank regression (noiseless: a* b*^T); the final model must be within
            # the theorem's (1 + eps') delta_T of it (+1e-10 for the S^{-1/2} route's rounding)
            measured[key]["max_rrr_gap"] = max(o["rrr_gap"] for o in row)
            ok = all_of(ok, all(o["rrr_gap"] <= o["rrr_allowed"] for o in row))
        # theorem is w.h.p.: allow one seed in ten to miss
        ok = all_of(ok, bool(geometric), frac >= 0.9)
    # vary m -- the w.h.p. statement needs m large; failures must sit at small m. Same
    # setting as the (eta = 1/(2s), reuse) row, at m in {d/4, d/2, d} beside the main m.
    ms = (max(3, d // 4), d // 2, d)
    sweep = ctx.map(_task_finite, [{"d": d, "n": n, "m": mm, "delta0": 0.5, "eta_factor": 0.5, "mode": "fixed",
                                    "rounds": rounds, "algorithm": algorithm} for mm in ms], replicates=reps)
    main_row = out[[i for i, g in enumerate(grid) if g["eta_factor"] == 0.5 and g["mode"] == "fixed"][0]]
    m_all = list(ms) + [m]
    frac_m = [float(np.mean([o["bound_ok"] and o["err_ok"] for o in row])) for row in list(sweep) + [main_row]]
    # success fraction non-decreasing in m (one seed of slack), and strictly more failures at the
    # smallest m than at the main m; no failure anywhere leaves nothing to locate (undecided)
    nondecreasing = all(a <= b + 1.0 / reps for a, b in zip(frac_m, frac_m[1:]))
    if frac_m[0] == frac_m[-1] == 1.0:
        concentrated = None
    else:
        concentrated = bool(nondecreasing and frac_m[0] < frac_m[-1])
    measured["m_sweep"] = {"m": m_all, "fraction_bound_and_error_ok": frac_m,
                           "failures_concentrate_at_small_m": concentrated}
    ok = bool(ok)
    passed = False if (not ok or concentrated is False) else (None if concentrated is None else True)
    fig, ax = new_figure()
    for g, row in zip(grid, out):
        ax.semilogy(np.maximum(row[0]["delta"], 1e-17), label=f"eta={g['eta_factor']}/s {g['mode']}")
    r0 = out[0][0]["rho"]
    ax.semilogy(0.5 * r0 ** np.arange(rounds + 1), "k--", label="bound (9), eta=1/(2s)")
    ax.set_xlabel("iteration t"), ax.set_ylabel("delta_t"), ax.legend(fontsize=7)
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"{k}: rate {v['rate_per_iter']:.2g} (bound {v['bound_rate']:.2g}), "
                                      f"{v['fraction_bound_and_error_ok']:.0%} ok" for k, v in measured.items()
                                      if k != "m_sweep")
                            + f"; ok fraction by m {dict(zip(m_all, frac_m))}",
                    measured=measured, predicted={"rate": "sqrt(1 - eta (1-delta0^2)||b*||^2)",
                                                  "m_sweep": "ok fraction non-decreasing in m, failures at small m"},
                    figure=ctx.save_figure(fig),
                    notes="Rate fitted on the first 8 iterations (before machine precision); criterion: the "
                          "upper end of the 95% CI of the per-iteration log-rate lies below log of the bound; "
                          "fixed-data mode is also compared with the reduced-rank-regression optimum (gap <= (1+eps')delta_T). "
                          "m sweep: m in {d/4, d/2, d} and the main m at eta = 1/(2s), reuse; judged: "
                          "the fraction of seeds meeting bound and error is non-decreasing in m (one seed of "
                          "slack) and lower at the smallest m than at the main m.")


# =============================================================================================
# C8  Step-size erratum (Lemma 5.3 / Theorem 5.4: eta <= 1/L_max^2 is too large)
# =============================================================================================
def _task_step(seed, *, variant, rounds, delta0, m):
    rng = np.random.default_rng(seed)
    prob = rank_one_lora(d=20, n_clients=5, b_norm=1.0, seed=rng)
    a0 = init_at_angle(prob.a_star, delta0, rng)
    eta = step_size_bound(prob.L_max, setting="homogeneous", variant=variant)
    pop = rolora(prob, rounds, eta, init=a0, seed=rng).distance
    fin = rolora(prob.sample(m, rng), rounds, eta, init=a0, seed=rng).distance
    bound = delta0 * rate_bound_homogeneous(eta, delta0, prob.L_max) ** np.arange(rounds + 1)
    return {"pop": pop.tolist(), "fin": fin.tolist(), "bound": bound.tolist(),
            "pop_violations": int(np.sum(pop > bound + 1e-14)), "fin_final": float(fin[-1])}


@claim("rolora.lemma5_3.step_size_bound", paper=PAPER, reference="Lemma 5.3 eq. (9), Theorem 5.4 (step condition)",
       statement="RoLoRA's step-size bound: with eta = 1/L_max^2 (allowed by the paper) the contraction (9) "
                 "fails even in population, while eta = 1/(2 L_max^2) satisfies it.", kind="erratum",
       erratum=True)
def _c8(ctx, *, step_variant="paper"):
    rounds = ctx.pick(40, 100, 200)
    grid = [{"variant": step_variant, "rounds": rounds, "delta0": 0.5, "m": ctx.pick(100, 150, 200)},
            {"variant": "corrected", "rounds": rounds, "delta0": 0.5, "m": ctx.pick(100, 150, 200)}]
    out = ctx.map(_task_step, grid, replicates=ctx.pick(2, 5, 10))
    viol_paper = min(o["pop_violations"] for o in out[0])
    viol_fixed = max(o["pop_violations"] for o in out[1])
    fin_paper = float(np.median([o["fin_final"] for o in out[0]]))
    fin_fixed = float(np.median([o["fin_final"] for o in out[1]]))
    # with samples the paper's step stalls (final delta far from 0) while the corrected
    # step reaches machine precision; judged beside the population violation count
    stall = bool(fin_paper > 1e-3 and fin_fixed < 1e-8)
    reproduced = viol_paper > 0 and viol_fixed == 0 and stall
    fig, ax = new_figure()
    ax.semilogy(out[0][0]["pop"], label=f"{step_variant} step, population")
    ax.semilogy(np.maximum(out[0][0]["fin"], 1e-17), label=f"{step_variant} step, m samples")
    ax.semilogy(np.maximum(out[0][0]["bound"], 1e-17), "k--", label="bound (9)")
    ax.semilogy(np.maximum(out[1][0]["pop"], 1e-17), ":", label="corrected step, population")
    ax.set_ylim(1e-17, 1), ax.set_xlabel("iteration t"), ax.set_ylabel("delta_t"), ax.legend(fontsize=7)
    return Evidence(verdict=verdict_from(reproduced, erratum=True),
                    summary=f"eta={step_variant}: (9) violated at {viol_paper}/{rounds} iterations (final delta "
                            f"{fin_paper:.2g} with samples); eta=1/(2L^2): {viol_fixed} violations ({fin_fixed:.1g})",
                    measured={"violations_paper_step": viol_paper, "violations_corrected_step": viol_fixed,
                              "final_delta_samples_paper": fin_paper, "final_delta_samples_corrected": fin_fixed,
                              "final_delta_population_paper": float(np.median([o["pop"][-1] for o in out[0]])),
                              "finite_sample_stall": stall},
                    predicted={"paper": "delta_t <= delta0 (1-eta(1-delta0^2)||b*||^2)^{t/2} for eta <= 1/L^2",
                               "erratum": "violations at eta = 1/L^2, none at 1/(2L^2); with samples median final "
                                          "delta > 1e-3 at 1/L^2 and < 1e-8 at 1/(2L^2)"},
                    figure=ctx.save_figure(fig),
                    notes="Proof step (101) bounds |1 - 2 eta ||bbar||^2| using only a lower bound on ||bbar||^2, "
                          "valid only when 2 eta ||bbar||^2 <= 1; at eta = 1/||b*||^2 the factor tends to 1 "
                          "(sublinear). Corrected condition: eta <= 1/(2 L_max^2), as in Theorem A.14.")


# =============================================================================================
# C9  b-step concentration (Lemma A.9)
# =============================================================================================
def _task_bstep(seed, *, d, n, m, delta, draws, b_step):
    rng = np.random.default_rng(seed)
    a_star = random_unit(d, rng)
    b_star = rng.standard_normal(d)
    a = init_at_angle(a_star, delta, rng)
    X = rng.standard_normal((draws * n, m, d))
    Y = (X @ a_star)[..., None] * b_star
    b_bar = b_step(X, Y, a).reshape(draws, n, d).mean(axis=1)
    g = b_star * (a_star @ a)
    return np.linalg.norm(b_bar - g, axis=1) / (delta * np.linalg.norm(b_star))


def _rho_prediction(n, m, rng, draws=200000):
    """E[rho] = sqrt(2/pi) E[sqrt(sum_i 1/chi2_m,i)]/N (derived: mean kappa | X a is Gaussian)."""
    chi = rng.chisquare(m, size=(draws, n))
    v = np.sqrt(2 / np.pi) * np.sqrt(np.sum(1.0 / chi, axis=1)) / n
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(draws))


@claim("rolora.lemmaA9.b_step_concentration", paper=PAPER, reference="Lemma A.9, eq. (13)",
       statement="The averaged b-step deviates from g = b*(a*^T a) by eps' delta ||b*||; measured eps' ~ "
                 "sqrt(2/pi)/sqrt(Nm), with no dependence on d.", kind="scaling")
def _c9(ctx, *, b_step=local_b_solve):
    draws = ctx.pick(300, 2000, 10000)
    n, m, delta = 5, 40, 0.6
    grid = [{"d": d, "n": n, "m": m, "delta": delta, "draws": draws, "b_step": b_step} for d in (8, 32)]
    out = ctx.map(_task_bstep, grid, replicates=1)
    pred, pse = _rho_prediction(n, m, np.random.default_rng(ctx.seed(99, 0)))
    rows, ok = [], True
    for g, res in zip(grid, out):
        rho = res[0]
        mean, se = float(rho.mean()), float(rho.std(ddof=1) / np.sqrt(len(rho)))
        z = (mean - pred) / np.hypot(se, pse)
        ok &= abs(z) <= 3.5
        rows.append({"d": g["d"], "mean_rho": mean, "se": se, "predicted": pred, "z": z,
                     "mean_rho_sqrt_Nm": mean * np.sqrt(n * m)})
    dz = (rows[0]["mean_rho"] - rows[1]["mean_rho"]) / np.hypot(rows[0]["se"], rows[1]["se"])
    ok &= abs(dz) <= 3.5
    fig, ax = new_figure()
    for g, res in zip(grid, out):
        ax.hist(res[0] * np.sqrt(n * m), bins=40, histtype="step", density=True, label=f"d={g['d']}")
    ax.axvline(pred * np.sqrt(n * m), c="k", ls="--", label="predicted mean")
    ax.set_xlabel("rho sqrt(Nm)"), ax.legend()
    return Evidence(verdict=verdict_from(bool(ok)),
                    summary=f"E[rho] sqrt(Nm) = {rows[0]['mean_rho_sqrt_Nm']:.3f} (d=8), "
                            f"{rows[1]['mean_rho_sqrt_Nm']:.3f} (d=32); predicted {pred * np.sqrt(n * m):.3f}",
                    measured={"rows": rows, "d_difference_z": dz}, table=rows,
                    predicted={"E_rho": pred, "asymptotic": float(np.sqrt(2 / np.pi) / np.sqrt(n * m))},
                    figure=ctx.save_figure(fig),
                    notes="The paper's eps-net route needs m = Omega(d log(2/eps0)/eps2^2); the deviation is "
                          "in fact dimension-free ([derived]: given X_i a the mean deviation is Gaussian).")


# =============================================================================================
# C10  Expected gradient (eq. (49)) and deviation scaling (Lemma A.10)
# =============================================================================================
def _grad_full(prob, a, b, X, Y):
    return grad_a_clients(prob, a, b, X, Y).mean(axis=0)


def _task_gradient(seed, *, d, n, m, draws, gradient, truth_seed):
    rng = np.random.default_rng(seed)
    # one truth and one a shared by every grid point and replicate (only the data vary): both drawn
    # from truth_seed, which the claim takes from ctx.seed (recorded, follows --seed)
    truth_rng = np.random.default_rng(truth_seed)
    prob = rank_one_lora(d=d, n_clients=n, b_norm=1.0, seed=truth_rng)
    a = init_at_angle(prob.a_star, 0.6, truth_rng)
    b_bar = prob.b_bar * 0.8 + 0.1                                             # fixed, independent of X
    G = np.empty((draws, d))
    for k in range(draws):
        q = prob.sample(m, rng)
        G[k] = gradient(q, a, b_bar, q.X, q.Y)
    expected = expected_gradient_a(a, b_bar, prob.a_star, prob.b_bar)
    dev = np.linalg.norm(G - expected, axis=1)
    return {"mean": G.mean(axis=0).tolist(), "se": (G.std(axis=0, ddof=1) / np.sqrt(draws)).tolist(),
            "expected": expected.tolist(), "mean_dev": float(dev.mean())}


@claim("rolora.eq49.expected_gradient", paper=PAPER, reference="eqs. (48)-(49), Lemma A.10",
       statement="For bbar independent of X, E[grad_a l(a, bbar)] = 2(a bbar^T - a* b*^T) bbar, and the "
                 "deviation shrinks like (Nm)^{-1/2}.", kind="scaling")
def _c10(ctx, *, gradient=_grad_full):
    draws = ctx.pick(300, 1500, 6000)
    ms = [10, 40, 160]
    truth_seed = ctx.seed(99, 0)          # beyond the grid: not shared with any task's data seed
    grid = [{"d": 6, "n": 4, "m": mm, "draws": draws, "gradient": gradient, "truth_seed": truth_seed}
            for mm in ms]
    out = ctx.map(_task_gradient, grid, replicates=ctx.pick(2, 3, 5))
    zmax = 0.0
    for row in out:
        for o in row:
            z = np.abs(np.array(o["mean"]) - o["expected"]) / np.array(o["se"])
            zmax = max(zmax, float(z.max()))
    n_tests = sum(len(row) for row in out) * 6
    z_crit = float(stats.norm.ppf(1 - 0.01 / (2 * n_tests)))          # Bonferroni, family level 1%
    devs = np.array([[o["mean_dev"] for o in row] for row in out])   # (len(ms), reps)
    fit = fit_loglog_slope(np.array(ms, dtype=float) * 4, devs)
    slope_ok = abs(fit.slope + 0.5) <= 0.1
    passed = zmax <= z_crit and slope_ok
    fig, ax = new_figure()
    ax.loglog(np.array(ms) * 4, devs.mean(axis=1), "o-", label="E||grad - E grad||")
    ax.loglog(np.array(ms) * 4, devs.mean(axis=1)[0] * (np.array(ms) / ms[0]) ** -0.5, "k--", label="slope -1/2")
    ax.set_xlabel("N m"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max |z| of mean gradient {zmax:.2f} (<= {z_crit:.2f}); deviation slope {fit} (~ -0.5)",
                    measured={"max_z": zmax, "deviation_slope": fit.as_dict()},
                    predicted={"z_critical": z_crit, "slope": -0.5}, figure=ctx.save_figure(fig))
