"""Extensions beyond FedRep's statements: label noise, split batches (Lemma 5's independence),
gradient steps on the head (Alg. 1's tau_h)."""
from __future__ import annotations

import math

import numpy as np

from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.problems.multitask import multitask_linear
from verify.claim import Evidence, claim, verdict_from
from verify.stats import fit_loglog_slope

from ._support import (PAPER, band, linear_phase_fit, pyplot, rngs, rounds_to, sigmas2,
                       warm_start)


# ====================================================================== C12 (extensions)
def _task_noise_floor(seed, d, k, n, m, noise, rounds, options=None, algorithm=fedrep):
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, noise=noise, seed=rp)
    smin2, smax2 = sigmas2(p.heads)
    tr = algorithm(p, rounds, 1 / (4 * smax2), init=warm_start(p.B_star, 0.75, rp), data="fresh", batch_size=m, seed=rr,
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
        passed = band(fit, 0.85, 1.15)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(sig, Y.mean(axis=1), "o-", label="floor (median of the last T/4 rounds)")
    ax.loglog(sig, pred, "k--", label="sigma sqrt(d/(nm))")
    ax.set_xlabel("noise sigma")
    ax.set_ylabel("dist(B^t, B*) floor")
    ax.legend(fontsize=7)
    path = ctx.save_figure(fig, title="floor of dist vs noise sigma")
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
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, seed=rp)
    smin2, smax2 = sigmas2(p.heads)
    tr = fedrep(p, rounds, 1 / (4 * smax2), data="fresh", batch_size=m, batch=batch, init=warm_start(p.B_star, 0.75, rp),
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
    fits = [[linear_phase_fit(dd) for dd in res] for res in out]
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
    rp, rr = rngs(seed)
    p = multitask_linear(d=d, rank=k, n_clients=n, samples_per_client=m, seed=rp)
    opts = {} if tau is None else {"head_steps": tau, "head_step_size": head_step_size}
    tr = fedrep(p, rounds, 0.5, init=warm_start(p.B_star, 0.5, rp), data="fixed", tol=eps,
                seed=rr, **opts)
    return rounds_to(tr.distance, eps) if tr.status != "diverged" else rounds + 1


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
