"""FedRep's initialization: Theorem 2's method-of-moments bound (erratum, eq. (94)) and random
initialization (Sec. 5, App. A.1)."""
from __future__ import annotations


import numpy as np
from scipy import stats

from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.exact.multitask import method_of_moments
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.multitask import multitask_linear
from verify.claim import Evidence, claim, verdict_from
from verify.convergence import expected_non_convergence
from verify.stats import fit_loglog_slope

from ._support import PAPER, pyplot, rngs


# ====================================================================== C9 (erratum)
def _task_mom(seed, d, k, n, ms, estimator=method_of_moments):
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    return np.array([subspace_distance(p.B_star, estimator(*p.sample(m, rr), k)) for m in ms])


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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(N, Y.mean(axis=1), "o-", label=f"MoM, slope {fit}")
    ax.loglog(N, Y.mean(axis=1)[0] * (N / N[0]) ** -0.5, "--", label="(nm)^-1/2 (Davis-Kahan)")
    ax.loglog(N, Y.mean(axis=1)[0] * (N / N[0]) ** -1.0, ":", label="(nm)^-1 (eq. (94) as printed)")
    ax.set_xlabel("N = nm")
    ax.set_ylabel("dist(B0, B*)")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig, title="MoM dist(B0, B*) vs nm")
    return Evidence(
        verdict=verdict_from(confirmed, erratum=True),
        summary=f"slope of dist(B0) vs nm = {fit} (printed bound: -1; Davis-Kahan: -0.5)",
        measured={**fit.as_dict(), "E0_at_largest_N": float(np.mean(1 - Y[-1] ** 2))},
        predicted={"printed": -1.0, "corrected": -0.5},
        figure=path,
        notes="d = 50, k = 2, n = 100, Assumption 3 heads. Erratum confirmed when the mean slope is in "
              "[-0.6, -0.4] with its 95% CI inside [-0.7, -0.3] (so it excludes -1) and E0 > 0.5 at the largest N. Pilot runs: dist ~ 3.2 sqrt(d/(nm)).")


def _task_random_init(seed, d, k, n, m, rounds, eps, fedrep_options):
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, noise=1e-3, seed=rp)
    opts = {"step_size": 0.5, **(fedrep_options or {})}
    # a run that misses eps within the rounds is an outcome the claim counts (the fraction of
    # runs that reach it), not a solve the verdict rests on
    with expected_non_convergence():
        tr = fedrep(p, rounds, opts.pop("step_size"), init="random", data="fixed", tol=eps, seed=rr, **opts)
    return bool(tr.status != "diverged" and np.nanmin(tr.distance) <= eps)


@claim("fedrep.fig3.random_init", paper=PAPER, reference="Sec. 5 / App. A.1 remark (random initialization)",
       statement="FedRep from a random (data-independent) initialization still converges in at least 90% "
                 "of runs.",
       kind="bound")
def _c6b(ctx, *, fedrep_options=None):
    # 36 and 40 runs: enough for an all-success run's exact lower bound to reach 0.9 (0.025^(1/n) >= 0.9)
    reps = ctx.pick(36, 40, 100)
    out = ctx.map(_task_random_init, [{"d": 10, "k": 2, "n": 100, "m": 5, "rounds": ctx.pick(150, 200, 300),
                                       "eps": 1e-2, "fedrep_options": fedrep_options}], replicates=reps)[0]
    succ = int(np.sum(out))
    ci = stats.binomtest(succ, reps).proportion_ci(confidence_level=0.95, method="exact")
    frac = succ / reps
    # decided on the interval (the report's rule): holds when the exact 95% lower bound reaches 0.9,
    # fails when the upper bound is below it, else inconclusive (changed after a new user's trial:
    # it held on the observed fraction alone, 10/10 at smoke with the interval [0.69, 1.00])
    passed = True if ci.low >= 0.9 else (False if ci.high < 0.9 else None)
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"{succ}/{reps} random-init runs reach dist <= 1e-2 (95% CI [{ci.low:.2f}, {ci.high:.2f}]; "
                f"want >= 0.9)",
        measured={"successes": succ, "runs": reps, "fraction": frac, "ci": [ci.low, ci.high],
                  "fraction_ok": passed},
        predicted={"fraction": ">= 0.9"},
        notes="Fig. 3/7 setting: d = 10, k = 2, n = 100, m = 5 fixed samples, noise sd 1e-3, eta = 0.5, "
              "Haar-random B0; success = dist <= 1e-2 within T rounds. Holds when the exact (Clopper-Pearson) "
              "95% lower bound on the success probability is at least 0.9, fails when the upper bound is below "
              "0.9, else inconclusive.")
