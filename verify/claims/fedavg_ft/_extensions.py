"""FedAvg-FT claims C8-C13 (rates, hypotheses along a run, diversity, participation, and two
extensions beyond the paper): registered by :mod:`verify.claims.fedavg_ft`; :mod:`._representation` documents the setup
and the injection points."""
from __future__ import annotations

import contextlib

import numpy as np

from lowrank_fl.algorithms.fedavg import fedavg, fedavg_round
from lowrank_fl.exact.fedavg_ft import (head_statistics)
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.fedavg_ft import paper_instance
from lowrank_fl.problems.multitask import MultitaskProblem
from verify.claim import Evidence, claim, verdict_from
from verify.convergence import expected_non_convergence
from verify.stats import fit_loglog_slope

from ._support import ALPHA, P, fedavg_alg, curves_figure, fit_rate, sizes


# ----------------------------------------------------------------------------- C8: rate scaling
def _task_rates(seed, d, k, M, combos, rounds, algorithm):
    inst = paper_instance(d=d, rank=k, n_clients=M, step_size=ALPHA, seed=seed)
    Q = inst.B0 * np.sqrt(ALPHA)             # same orthonormal start, rescaled per alpha
    rates, curves = [], []
    for a, t in combos:
        tr = algorithm(inst.problem, rounds, t, a, init=(Q / np.sqrt(a), inst.w0), seed=seed)
        rates.append(-fit_rate(tr.distance)[0])
        curves.append(tr.distance)
    return {"rates": rates, "curves": curves, "mu": inst.stats.mu, "delta0": inst.delta0,
            "second_moment_min": inst.stats.second_moment_min}


@claim("fedavg_ft.thm1.rate_scaling", paper=P, reference="Theorem 1, rate alpha^2 tau mu^2 E0 (eq. (6))",
       statement="The per-round contraction rate of dist grows with tau at fixed alpha and with alpha at "
                 "fixed tau, and is at least 0.04 alpha^2 tau mu^2 E0.",
       kind="scaling")
def _c8_rate_scaling(ctx, *, algorithm=fedavg_alg):
    d, k, M = ctx.pick(smoke=(10, 2, 10), quick=(30, 3, 20), full=(60, 4, 40))
    rounds = ctx.pick(smoke=400, quick=1500, full=2000)
    combos = ((0.2, 2), (0.2, 4), (0.4, 2))
    out = ctx.map(_task_rates, [{"d": d, "k": k, "M": M, "combos": combos, "rounds": rounds,
                                 "algorithm": algorithm}], replicates=ctx.pick(2, 4, 5))[0]
    rates, rows = {}, []
    for j, (a, t) in enumerate(combos):
        r = np.array([x["rates"][j] for x in out])
        thm = np.array([0.04 * a**2 * t * x["mu"]**2 * (1 - x["delta0"]**2) for x in out])
        heur = np.array([a**2 * (t - 1) * x["second_moment_min"] for x in out])
        rates[(a, t)] = r
        rows.append({"alpha": a, "tau": t, "rate": float(np.nanmean(r)), "theorem_rate": float(thm.mean()),
                     "rate/heuristic": float(np.nanmean(r / heur))})
    if any(np.any(np.isnan(v)) for v in rates.values()):
        passed = None
    else:
        # paired on each instance: every replicate must show both orderings
        mono = bool(np.all(rates[(0.2, 4)] > rates[(0.2, 2)]) and np.all(rates[(0.4, 2)] > rates[(0.2, 2)]))
        above = all(r["rate"] >= r["theorem_rate"] for r in rows)
        passed = bool(mono and above)
    fig = curves_figure(out[0]["curves"], [f"alpha={a}, tau={t}" for a, t in combos],
                  title=f"rate scaling (one instance), d={d}, k={k}, M={M}")
    return Evidence(
        verdict=verdict_from(passed),
        summary="rates " + ", ".join(f"(alpha={r['alpha']}, tau={r['tau']}): {r['rate']:.3g}" for r in rows),
        measured={"rows": rows}, table=rows, figure=ctx.save_figure(fig),
        predicted={"order": "rate(0.2,4) > rate(0.2,2) < rate(0.4,2)", "lower": "0.04 alpha^2 tau mu^2 E0"},
        notes="Rate = -slope of log dist on [1e-10, 1e-2]; 'heuristic' alpha^2 (tau-1) lambda_min of the "
              "uncentered head moment is not in the paper. All (alpha, tau) run on the same "
              "instance per replicate, so the orderings are paired.")


# ----------------------------------------------------------------------------- C9: hypotheses
def _task_hypotheses(seed, d, k, M, tau, alpha, rounds, init_scale, round_fn=fedavg_round):
    inst = paper_instance(d=d, rank=k, n_clients=M, step_size=alpha, seed=seed)
    p = inst.problem
    st = inst.stats
    L = st.L_max
    B, w = inst.B0 * init_scale, inst.w0
    E0 = 1 - subspace_distance(p.B_star, B) ** 2
    target = p.B_star @ st.mean
    worst = {"w_local/bound": 0.0, "w_global/bound": 0.0, "A1/bound": 0.0, "local_dist/dist": 0.0,
             "sigma_min_drop": 0.0, "sigma_min_low/bound": np.inf, "delta/(a2 tau L2 k2)": 0.0}
    prev = None
    for t in range(rounds + 1):
        Delta = np.eye(k) - alpha * B.T @ B
        sig2 = np.linalg.svd(B.T @ p.B_star, compute_uv=False)[-1] ** 2
        worst["sigma_min_low/bound"] = min(worst["sigma_min_low/bound"], sig2 / (0.1 * E0 / alpha))
        if prev is not None:
            worst["sigma_min_drop"] = max(worst["sigma_min_drop"], (prev - sig2) / prev)
        prev = sig2
        worst["w_global/bound"] = max(worst["w_global/bound"], np.linalg.norm(w) / (2 * np.sqrt(alpha) * L))
        worst["delta/(a2 tau L2 k2)"] = max(worst["delta/(a2 tau L2 k2)"], np.linalg.norm(Delta, 2) /
                                            (alpha**2 * tau * L**2 * st.kappa_max**2))
        if t >= 1:
            a1 = np.linalg.norm(w - alpha * (np.eye(k) + Delta) @ B.T @ target)
            worst["A1/bound"] = max(worst["A1/bound"], a1 / (91 * alpha**2.5 * tau * L**3))
        if t == rounds:
            worst["alpha_sigma_min2_final"] = alpha * sig2
            worst["dist_final/dist0"] = subspace_distance(p.B_star, B) / max(np.sqrt(1 - E0), 1e-300)
            break
        Bn, wn, path = round_fn(B, w, alpha, local_steps=tau, targets=p.theta, return_path=True)
        worst["w_local/bound"] = max(worst["w_local/bound"], float(np.max(np.linalg.norm(
            path["w"], axis=-1))) / (2 * np.sqrt(alpha) * L))
        dist = subspace_distance(p.B_star, B)
        if dist > 1e-8:
            loc = subspace_distance(p.B_star, path["B"].reshape(-1, d, k))
            worst["local_dist/dist"] = max(worst["local_dist/dist"], float(np.max(loc)) / dist)
        B, w = Bn, wn
    return worst


@claim("fedavg_ft.thm2.hypotheses_along_run", paper=P,
       reference="Theorem 2 inductive hypotheses A1-A5, A_{1..4,t,i}; Lemmas 3, 5, 6, 8",
       statement="From B_0 = Q/sqrt(alpha), w_0 = 0 at small alpha, the local and global heads stay below "
                 "2 sqrt(alpha) L_max, A1 holds, sigma_min^2(B_t^T B*) >= 0.1 E0/alpha, and local iterates "
                 "stay within 1.1 dist_t of B*.",
       kind="bound")
def _c9_hypotheses(ctx, *, init_scale=1.0, round_fn=fedavg_round):
    d, k, M = sizes(ctx)
    rounds = ctx.pick(smoke=40, quick=150, full=400)
    grid = [{"d": d, "k": k, "M": M, "tau": t, "alpha": 0.05, "rounds": rounds, "init_scale": init_scale,
             "round_fn": round_fn} for t in (2, 4)]
    out = ctx.map(_task_hypotheses, grid, replicates=ctx.pick(1, 3, 5))
    lower = ("sigma_min_low/bound", "alpha_sigma_min2_final", "dist_final/dist0")
    worst = {key: (min if key in lower else max)(r[key] for row in out for r in row) for key in out[0][0]}
    worst["dist_final/dist0"] = max(r["dist_final/dist0"] for row in out for r in row)
    checks = {"w_local": worst["w_local/bound"] <= 1, "w_global": worst["w_global/bound"] <= 1,
              "A1": worst["A1/bound"] <= 1, "sigma_min_lower": worst["sigma_min_low/bound"] >= 1,
              "local_dist": worst["local_dist/dist"] <= 1.1,
              # Lemma 8's monotonicity, up to rounding of an SVD of O(1/alpha) entries
              "sigma_min_nondecreasing": worst["sigma_min_drop"] <= 1e-10}
    checks = {key: bool(v) for key, v in checks.items()}
    passed = all(checks.values())
    return Evidence(
        verdict=verdict_from(bool(passed)),
        summary=", ".join(f"{key} {v:.3g}" for key, v in worst.items()),
        measured={**worst, "checks": checks},
        predicted={"w_local/bound": "<= 1", "w_global/bound": "<= 1", "A1/bound": "<= 1",
                   "sigma_min_low/bound": ">= 1", "local_dist/dist": "<= 1.1",
                   "sigma_min_drop": "<= 1e-10 (sigma_min^2(B_t^T B*) non-decreasing)",
                   "alpha_sigma_min2_final": "-> 1 eventually (reported only)"},
        notes="alpha = 0.05 (still far above the theorem's ~1e-9 bound, so these are 'hypotheses hold along "
              "the run' checks). Judged: the five bounds and that sigma_min^2(B_t^T B*) never "
              "decreases (relative drop between rounds <= 1e-10). Reported only: "
              "||Delta_t||/(alpha^2 tau L^2 kappa^2) (the theorem gives no constant to compare with) and "
              "'sigma_min^2 eventually near 1/alpha' (alpha_sigma_min2_final): at alpha = 0.05 the runs "
              "are far from converged within the budget (dist_final/dist0 close to 1), and at convergence "
              "alpha sigma_min^2 = 1 - lambda_max(Delta_T) is algebra, not a further test.")


# ----------------------------------------------------------------------------- C10: diversity
def _identical_plus_spread(rng, M, k, spread):
    """Heads ``wbar + spread * eps_i`` (spread 0: all identical, mu = 0)."""
    return rng.standard_normal(k)[None, :] + spread * rng.standard_normal((M, k))


def _task_diversity(seed, d, k, M, tau, spread, rounds, make_heads):
    rng = np.random.default_rng(seed)
    heads = make_heads(rng, M, k, spread)
    inst = paper_instance(d=d, rank=k, n_clients=M, step_size=ALPHA, heads=heads, seed=rng)
    tr = fedavg(inst.problem, rounds, ALPHA, local_steps=tau, init=inst.init)
    return {"final": float(tr.distance[-1]), "rate": -fit_rate(tr.distance, lo=1e-12, hi=0.5)[0],
            "mu": head_statistics(heads).mu, "distance": tr.distance}


@claim("fedavg_ft.asm2.diversity_necessary", paper=P, reference="Assumption 2; Theorem 1 (rate in mu)",
       statement="With identical heads (mu = 0) FedAvg does not learn col(B*) for any tau; with spread s the "
                 "rate grows with s.",
       kind="comparison")
def _c10_diversity(ctx, *, make_heads=_identical_plus_spread):
    d, k, M = sizes(ctx)
    rounds = ctx.pick(smoke=120, quick=300, full=400)
    taus = (1, 2, 8)
    spreads = (0.5, 1.0)
    grid = [{"d": d, "k": k, "M": M, "tau": t, "spread": 0.0, "rounds": rounds, "make_heads": make_heads}
            for t in taus] + \
           [{"d": d, "k": k, "M": M, "tau": 2, "spread": s, "rounds": rounds, "make_heads": make_heads}
            for s in spreads]
    out = ctx.map(_task_diversity, grid, replicates=ctx.pick(2, 3, 5))
    stall = [min(r["final"] for r in row) for row in out[:3]]
    # progress at spread s: mean log10 of the final distance (lower = faster learning)
    rates = [float(np.mean([np.log10(max(r["final"], 1e-16)) for r in row])) for row in out[3:]]
    passed = min(stall) > 0.5 and rates[1] < rates[0]
    fig = curves_figure([row[0]["distance"] for row in out],
                  [f"identical heads, tau={t}" for t in taus] + [f"spread {s_}, tau=2" for s_ in spreads],
                  title=f"head diversity, d={d}, k={k}, M={M}, alpha={ALPHA}")
    return Evidence(
        verdict=verdict_from(bool(passed)),
        summary=f"identical heads: min final dist {min(stall):.3f} over tau in {taus}; mean log10 final "
                f"dist at spread {spreads}: {[round(r, 2) for r in rates]}",
        measured={"identical_heads_final_dist": dict(zip(map(str, taus), stall)),
                  "log10_final_dist_by_spread": dict(zip(map(str, spreads), rates))},
        predicted={"identical_heads_final_dist": "> 0.5 (no learning; 0.999 at d = 100)",
                   "log10_final_dist": "decreasing in spread"},
        figure=ctx.save_figure(fig),
        notes="Spread sweep: heads wbar + s eps_i, tau = 2, same number of rounds.")


# ----------------------------------------------------------------------------- C11: participation
def _task_participation(seed, d, k, M, ms, rounds, algorithm):
    inst = paper_instance(d=d, rank=k, n_clients=M, step_size=ALPHA, seed=seed)
    final, curves = [], []
    for m in ms:
        # m >= M/2 are judged (their warnings reach the verdict); smaller m are reported only: with
        # large alpha they may diverge (the claim's statement)
        with contextlib.nullcontext() if m >= M // 2 else expected_non_convergence():
            tr = algorithm(inst.problem, rounds, 2, ALPHA, clients_per_round=m, init=inst.init, seed=seed)
        final.append(float(tr.distance[-1]) if tr.status == "completed" else np.inf)
        curves.append(tr.distance)
    return {"final": final, "curves": curves}


@claim("fedavg_ft.thm1.partial_participation", paper=P, reference="Theorem 1 (m condition); Lemma 1",
       statement="FedAvg with m of M clients per round (uniform without replacement) still learns col(B*) "
                 "when m is a sizeable fraction of M; very small m with large alpha is unstable.",
       kind="comparison")
def _c11_participation(ctx, *, algorithm=fedavg_alg):
    d, k, M = sizes(ctx)
    rounds = ctx.pick(smoke=200, quick=600, full=1000)
    ms = (M, M // 2, M // 4, 2)
    out = ctx.map(_task_participation, [{"d": d, "k": k, "M": M, "ms": ms, "rounds": rounds,
                                         "algorithm": algorithm}], replicates=ctx.pick(1, 3, 5))[0]
    finals = {m: [r["final"][j] for r in out] for j, m in enumerate(ms)}
    # on each instance, m = M/2 learns as m = M does: both far below the start (dist < 1e-4)
    full = finals[ms[0]]
    half = finals[ms[1]]
    full_learns, half_learns = bool(max(full) < 1e-4), bool(max(half) < 1e-4)
    passed = full_learns and half_learns
    fig = curves_figure(out[0]["curves"], [f"m={m}" for m in ms],
                  title=f"partial participation, M={M}, tau=2, alpha={ALPHA}")
    return Evidence(
        verdict=verdict_from(passed),
        summary="final dist by m: " + "; ".join(f"m={m}: max {max(v):.1e}" for m, v in finals.items()),
        measured={**{str(m): v for m, v in finals.items()}, "full_participation_learns": full_learns,
                  "half_participation_learns": half_learns},
        predicted={"m >= M/2": "< 1e-4 (same instance as m = M)",
                   "small m": "reported (instability expected at alpha=0.4)"},
        figure=ctx.save_figure(fig),
        notes="Only m in {M, M/2} is tested; smaller m is reported (the theorem needs small alpha with "
              "large m).")


# ----------------------------------------------------------------------------- C12: centered diversity
def _task_centered(seed, d, k, rounds, fedavg_algorithm):
    heads = 3.0 * np.eye(k)
    inst = paper_instance(d=d, rank=k, n_clients=k, step_size=ALPHA, heads=heads, seed=seed)
    fa = fedavg_algorithm(inst.problem, rounds, 2, ALPHA, init=inst.init, seed=seed)
    dg = fedavg(inst.problem, rounds, ALPHA, local_steps=1, init=inst.init)
    return {"fedavg": float(fa.distance[-1]), "dgd": float(dg.distance[-1]),
            "mu": inst.stats.mu, "second_moment_min": inst.stats.second_moment_min}


@claim("fedavg_ft.ext.centered_diversity", paper=P, reference="Assumption 2 vs Lemma 10 (beyond the paper)",
       statement="Heads w_i* = 3 e_i (M = k) have singular centered covariance (mu = 0) yet FedAvg tau=2 "
                 "learns col(B*) while D-GD does not: centered diversity is sufficient, not necessary.",
       kind="comparison")
def _c12_centered(ctx, *, fedavg_algorithm=fedavg_alg):
    d, k = ctx.pick(smoke=(20, 3), quick=(50, 4), full=(100, 5))
    rounds = ctx.pick(smoke=300, quick=1200, full=1500)
    out = ctx.map(_task_centered, [{"d": d, "k": k, "rounds": rounds, "fedavg_algorithm": fedavg_algorithm}],
                  replicates=ctx.pick(2, 3, 5))[0]
    fa = max(r["fedavg"] for r in out)
    dg = min(r["dgd"] for r in out)
    passed = fa < 1e-8 and dg > 0.5
    return Evidence(
        verdict=verdict_from(bool(passed)),
        summary=f"mu = {out[0]['mu']:.1e}, lambda_min(uncentered) = {out[0]['second_moment_min']:.2f}; "
                f"FedAvg dist {fa:.1e}, D-GD dist {dg:.3f}",
        measured={"fedavg_final_max": fa, "dgd_final_min": dg, "mu": out[0]["mu"]},
        predicted={"fedavg": "< 1e-8", "dgd": "> 0.5 (0.999 at d = 100)"},
        notes="Exploratory: only the uncentered second moment drives the contraction of Lemma 10.")


# ----------------------------------------------------------------------------- C13: finite samples
def _task_empirical(seed, d, k, M, ns, noise, rounds, algorithm):
    """One instance (B*, heads) and warm start, fresh datasets of each size n: paired floors."""
    alpha = 0.2
    rng = np.random.default_rng(seed)
    base = paper_instance(d=d, rank=k, n_clients=M, step_size=alpha, seed=rng)
    # warm start at a moderate distance: the claim is about the statistical floor, not the
    # escape from a random (nearly orthogonal) initialization
    Q = np.linalg.qr(base.problem.B_star + 0.3 * rng.standard_normal((d, k)) / np.sqrt(d))[0]
    init = (Q / np.sqrt(alpha), np.zeros(k))
    floors = []
    for n in ns:
        X, y = base.problem.sample(n, rng)
        prob = MultitaskProblem(B_star=base.problem.B_star, heads=base.problem.heads, noise=noise,
                                X=X, y=y if noise == 0 else y + noise * rng.standard_normal(y.shape))
        tr = algorithm(prob, rounds, 2, alpha, init=init, seed=seed)
        tail = tr.distance[-max(10, rounds // 10):]
        floors.append(float(np.median(tail)) if tr.status == "completed" else np.nan)
    return floors


def _empirical_alg(problem, rounds, local_steps, step_size, *, init, seed=None):
    return fedavg(problem, rounds, step_size, local_steps=local_steps, init=init, data="fixed", seed=seed)


@claim("fedavg_ft.ext.empirical_floor", paper=P, reference="Eq. (5) (finite samples; beyond Theorem 1)",
       statement="With n noisy samples per client, empirical FedAvg plateaus at a distance floor that "
                 "decreases with the total sample size N = Mn.",
       kind="scaling")
def _c13_empirical(ctx, *, algorithm=_empirical_alg):
    d, k, M = ctx.pick(smoke=(10, 2, 10), quick=(20, 2, 20), full=(40, 3, 40))
    ns = ctx.pick(smoke=(20, 80, 320), quick=(10, 40, 160, 640), full=(20, 80, 320, 1280))
    rounds = ctx.pick(smoke=80, quick=300, full=400)
    out = ctx.map(_task_empirical, [{"d": d, "k": k, "M": M, "ns": ns, "noise": 0.5, "rounds": rounds,
                                     "algorithm": algorithm}], replicates=ctx.pick(3, 5, 5))[0]
    Y = np.array(out, dtype=float).T                       # (len(ns), seeds), paired per seed
    if not np.all(np.isfinite(Y)) or np.any(Y <= 0):
        return Evidence(verdict="fails", summary="a finite-sample FedAvg run diverged or hit 0",
                        measured={"floors": Y.tolist()})
    fit = fit_loglog_slope(np.array(ns, dtype=float) * M, Y)
    passed = None if not np.isfinite(fit.high) else bool(fit.high < 0)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.loglog(np.array(ns) * M, Y.mean(axis=1), marker="o")
    ax.set_xlabel("N = M n")
    ax.set_ylabel("dist floor")
    return Evidence(
        verdict=verdict_from(passed),
        summary=f"log-log slope of the floor vs N: {fit} (< 0 required)",
        measured={"slope": fit.as_dict(), "floors": Y.mean(axis=1).tolist(), "N": [n * M for n in ns]},
        predicted={"slope": "< 0 (not quantified in the paper; a parametric N^{-1/2} would give -0.5)"},
        figure=ctx.save_figure(fig),
        notes="Full-batch local GD on (5), alpha = 0.2, noise std 0.5; floor = median dist over the last "
              "10% of rounds; per seed one instance and warm start, datasets of each size (paired fits).")
