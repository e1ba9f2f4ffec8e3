"""CLAIR claims, groups E-F (noisy part): Theorem 2's rate, Lemma 3's eps_sup, Theorem 3(ii)
detection, Theorem 5 (Minkowski bound) and Theorem 6's balanced trend.

Theorem 2's regime (it assumes n_k >~ K): K tau^2 = O(1), i.e. tau = tau0 / sqrt(K); w_g = 1/K,
lam_L = c1 K^{-1/2}, lam_S = c2 K^{-3/2} with (c1, c2) = (1, 3) (a pilot's band for p = 5,
q = 4, r = 2); 10% contaminated clients. Program (7) is solved by FISTA to a relative duality gap
of 1e-8. Rates are fitted per seed (log-log) with a 95% Student-t interval across seeds.
"""
from __future__ import annotations

import warnings

import numpy as np

from lowrank_fl.clair.pipeline import collaborative_set, largest_gap_threshold, refine
from lowrank_fl.clair.penalized import solve_penalized
from lowrank_fl.clair.simulate import generate
from lowrank_fl.linalg import block_norms

from ...claim import SOLVES_KEY, Evidence, claim, solve_record, verdict_from
from ...criteria import proportion_interval, reaches_proportion
from ...stats import fit_loglog_slope, interval_verdict
from ._support import t3

__all__: list[str] = []

_P, _Q, _R = 5, 4, 2
_TAU0 = 0.3


def _top_r(sol, r, rng):
    V = np.asarray(sol.Vt)[:r].T
    return V @ V.T


def _random_subspace(sol, r, rng):
    """Broken variant: a random r-dimensional projector in place of the top-r subspace of Lhat."""
    V = np.linalg.qr(rng.standard_normal((sol.Vt.shape[1], r)))[0]
    return V @ V.T


def _task_thm2(seed, K, scaling, c1, c2, alpha, projector_fn, c_det):
    rng = np.random.default_rng(seed)
    tau = _TAU0 / np.sqrt(K) if scaling == "theory" else _TAU0
    inst = generate(n_clients=K, p=_P, q=_Q, rank=_R, contaminated=max(1, round(0.1 * K)), noise=tau, seed=rng)
    D = np.asarray(inst.D_hat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = solve_penalized(D, _Q, c1 / np.sqrt(K), c2 / K ** 1.5, method="fista", tol=1e-8, max_iter=20000)
    P = projector_fn(sol, _R, rng)
    P_A = np.asarray(inst.projector)
    G = inst.G
    Pp, PAp = np.eye(_P) - P, np.eye(_P) - P_A
    diff = (D @ Pp - np.asarray(inst.D0) @ PAp).reshape(G, _Q, _P)
    eps_sup = float(block_norms(diff).max())
    norms = block_norms((D @ Pp).reshape(G, _Q, _P))
    out = {"P_err": float(np.linalg.norm(P - P_A, 2)), "eps_sup": eps_sup, "beta_min": float(inst.beta_min),
           SOLVES_KEY: [_record(sol)]}
    if c_det is not None:
        keep, _ = collaborative_set(norms, K, c_det * np.sqrt(np.log(K) / K), alpha)
        out["exact"] = bool(np.array_equal(keep, inst.benign))
    return out


def _thm2_runs(ctx, *, scaling="theory", projector_fn=_top_r, alpha=0.5, c1=1.0, c2=3.0):
    """Runs shared by the Theorem 2 / Lemma 3 / Theorem 3 claims (seeds of clair.thm2.rate)."""
    Ks = ctx.pick(smoke=[10, 20, 40], quick=[10, 20, 40, 80], full=[10, 20, 40, 80, 160])
    seeds = ctx.pick(smoke=3, quick=5, full=10)
    pilot_ctx = ctx.for_claim("clair.thm2.rate/pilot")
    pilot = pilot_ctx.map(_task_thm2, [{"K": Ks[0], "scaling": "theory", "c1": c1, "c2": c2, "alpha": alpha,
                                        "projector_fn": _top_r, "c_det": None}], replicates=3)[0]
    # detection constant: tau_n = c sqrt(log K / K) with c = 3 x the pilot's eps_sup / sqrt(log K / K)
    c_det = 3 * max(o["eps_sup"] for o in pilot) / np.sqrt(np.log(Ks[0]) / Ks[0])
    main = ctx.for_claim("clair.thm2.rate")
    out = main.map(_task_thm2, [{"K": K, "scaling": scaling, "c1": c1, "c2": c2, "alpha": alpha,
                                 "projector_fn": projector_fn, "c_det": c_det} for K in Ks], replicates=seeds)
    ctx.seeds_used.extend(pilot_ctx.seeds_used + main.seeds_used)
    return np.asarray(Ks), out, c_det


def _loglog_figure(ctx, Ks, Y, ylabel, ref_slope):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.5, 3))
    ax.loglog(Ks, Y, ".", color="0.7")
    ax.loglog(Ks, Y.mean(axis=1), "o-", label="mean over seeds")
    ax.loglog(Ks, Y.mean(axis=1)[0] * (Ks / Ks[0]) ** ref_slope, "--", label=f"slope {ref_slope}")
    ax.set_xlabel("K")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return ctx.save_figure(fig)


@claim("clair.thm2.rate", paper="clair", reference="Theorem 2, eq. (28); Corollary S1",
       statement="With K tau^2 = O(1), lam_L ~ K^{-1/2}, lam_S ~ K^{-3/2}, w ~ 1/K: ||P_Ahat - P_A||_op = "
                 "O_P(K^{-1/2}) (fitted log-log slope <= -0.5 + 0.1).", kind="rate")
def _thm2_rate(ctx, *, projector_fn=_top_r):
    Ks, out, _ = _thm2_runs(ctx, projector_fn=projector_fn)
    Y = np.array([[o["P_err"] for o in row] for row in out])
    fit = fit_loglog_slope(Ks, Y)
    passed = interval_verdict(fit.low, fit.high, -0.4, side="below")
    control = None
    if ctx.scale != "smoke":   # n fixed (tau constant): documents the K tau^2 = O(1) requirement
        sub = ctx.for_claim("clair.thm2.rate/control")
        cout = sub.map(_task_thm2, [{"K": int(K), "scaling": "fixed", "c1": 1.0, "c2": 3.0, "alpha": 0.5,
                                     "projector_fn": projector_fn, "c_det": None} for K in Ks[:4]],
                       replicates=ctx.pick(2, 3, 4))
        ctx.seeds_used.extend(sub.seeds_used)
        control = fit_loglog_slope(Ks[:4], np.array([[o["P_err"] for o in row] for row in cout]))
    fig_path = _loglog_figure(ctx, Ks, Y, "||P_Ahat - P_A||_op", -0.5)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"slope {fit} (95% CI over {Y.shape[1]} seeds) vs <= -0.4"
                            + (f"; control with tau fixed: slope {control}" if control else ""),
                    measured={"slope": fit.as_dict(), "mean_error": Y.mean(axis=1).tolist(), "K": Ks.tolist(),
                              "control_slope": control.as_dict() if control else None},
                    predicted={"slope": "<= -0.5 (upper bound)"}, figure=fig_path,
                    notes="tau = 0.3/sqrt(K), 10% contaminated, p=5, q=4, r=2, (c1, c2) = (1, 3). Theorem 2 is "
                          "an upper bound; the observed rate is faster (a pilot: about K^-1.1). The window (27) "
                          "is empty at these K (clair.thm1.window_vacuous): the theorem's hypotheses fail, "
                          "the rate holds anyway.")


@claim("clair.lemma3.eps_sup", paper="clair", reference="Lemma 3, (S3.1)",
       statement="eps_sup = max_g ||(Dhat P_Ahat_perp - D0 P_A_perp)^(g)||_F = O_P(sqrt(log K / K)): the ratio "
                 "eps_sup / sqrt(log K/K) stays bounded (fitted log-log slope in K <= 0.1).", kind="rate")
def _eps_sup(ctx, *, projector_fn=_top_r):
    Ks, out, _ = _thm2_runs(ctx, projector_fn=projector_fn)
    Y = np.array([[o["eps_sup"] for o in row] for row in out]) / np.sqrt(np.log(Ks) / Ks)[:, None]
    fit = fit_loglog_slope(Ks, Y)
    passed = interval_verdict(fit.low, fit.high, 0.1, side="below")
    fig_path = _loglog_figure(ctx, Ks, Y, "eps_sup / sqrt(log K / K)", 0.0)
    return Evidence(verdict=verdict_from(passed), figure=fig_path,
                    summary=f"eps_sup/sqrt(log K/K) = {np.round(Y.mean(axis=1), 2).tolist()} over K = {Ks.tolist()}; "
                            f"slope {fit} (<= 0.1 wanted)",
                    measured={"ratio": Y.mean(axis=1).tolist(), "slope": fit.as_dict()},
                    predicted={"ratio": "bounded"})


@claim("clair.thm3.detection", paper="clair", reference="Theorem 3(ii), Remark 3",
       statement="With tau_n = c sqrt(log K/K), alpha in Remark 3's range, eta > 1/2 and beta_min fixed, "
                 "P(Chat = C) is non-decreasing in K and tends to 1.", kind="scaling")
def _detection(ctx, *, alpha=0.5):
    Ks, out, c_det = _thm2_runs(ctx, alpha=alpha)
    rate = np.array([np.mean([o["exact"] for o in row]) for row in out])
    n = len(out[0])
    se = np.sqrt(np.maximum(rate * (1 - rate), 0.25 / n) / n)   # floor: no zero s.e. at rate 0 or 1
    drops_ok = all(rate[i + 1] >= rate[i] - 2 * np.hypot(se[i], se[i + 1]) for i in range(len(rate) - 1))
    # the level: P(Chat = C) >= 0.9 at the largest K, decided on a Clopper-Pearson 95% interval over
    # 40 seeds at that K: the shared ones plus more (36 successes out of 36 is the smallest sample
    # whose interval can clear 0.9: 0.025^(1/n) >= 0.9 needs n >= 36; smoke stays below, inconclusive)
    sub = ctx.for_claim("clair.thm3.detection/last")
    extra = sub.map(_task_thm2, [{"K": int(Ks[-1]), "scaling": "theory", "c1": 1.0, "c2": 3.0, "alpha": alpha,
                                  "projector_fn": _top_r, "c_det": c_det}],
                    replicates=ctx.pick(smoke=3, quick=40 - n, full=40 - n))[0]
    ctx.seeds_used.extend(sub.seeds_used)
    last = list(out[-1]) + list(extra)
    hits = int(sum(bool(o["exact"]) for o in last))
    low, high = proportion_interval(hits, len(last))
    reach = reaches_proportion(hits, len(last), 0.9)
    passed = None if reach is None and drops_ok else bool(drops_ok and reach)
    beta = float(np.mean([o["beta_min"] for row in out for o in row]))
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.5, 3))
    ax.errorbar(Ks, rate, yerr=2 * se, fmt="o-", capsize=3, label="P(Chat = C) ± 2 s.e.")
    ax.errorbar([Ks[-1] * 1.08], [hits / len(last)], yerr=[[hits / len(last) - low], [high - hits / len(last)]],
                fmt="s", color="C3", capsize=3, label=f"largest K, {len(last)} seeds, 95% CP interval")
    ax.axhline(0.9, ls="--", color="0.5", label="0.9 (largest K must reach)")
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("K")
    ax.set_ylabel("P(Chat = C)")
    ax.legend(fontsize=7)
    fig_path = ctx.save_figure(fig)
    return Evidence(verdict=verdict_from(passed), figure=fig_path,
                    summary=f"P(Chat = C) = {np.round(rate, 2).tolist()} at K = {Ks.tolist()} (c = {c_det:.2f}, "
                            f"alpha = {alpha}); non-decreasing within MC error: {drops_ok}; at K = {Ks[-1]}: "
                            f"{hits}/{len(last)} exact, 95% interval [{low:.3f}, {high:.3f}] vs >= 0.9",
                    measured={"P_exact": rate.tolist(), "c": c_det, "mean beta_min": beta,
                              "last_K": {"K": int(Ks[-1]), "exact": hits, "n": len(last),
                                         "interval": [low, high]}},
                    predicted={"P_exact": "-> 1; >= 0.9 at the largest K"},
                    notes="c = 3 x eps_sup/sqrt(log K/K) on a pilot at the smallest K (separate seeds). "
                          "Holds when no point drops by more than 2 s.e. below its predecessor and the "
                          "Clopper-Pearson interval at the largest K lies above 0.9; fails when either is "
                          "violated; inconclusive when that interval contains 0.9.")


# --------------------------------------------------------------------------------------------
# Theorems 5 and 6
# --------------------------------------------------------------------------------------------
def _library_refine(W_hat, P, keep):
    return np.asarray(refine(W_hat, P, keep))


def _refine_without_own_component(W_hat, P, keep):
    """Broken variant: kept clients receive the benign mean (own P_A component dropped)."""
    W_hat = np.asarray(W_hat, float)
    return np.where(np.asarray(keep)[:, None, None], W_hat[keep].mean(axis=0), W_hat)


def _record(sol):
    """Solve record of a FISTA solve of (7) at tol = 1e-8 (checked at 1e-7: the certificate is
    recomputed at the returned point, a rounding's worth from the loop's last gap)."""
    return solve_record(sol, tol=1e-7, what="program (7), FISTA")


def _clair_run(rng, K, p, q, r, n_contam, tau, delta):
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=n_contam, noise=tau, delta=delta, seed=rng)
    D = np.asarray(inst.D_hat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = solve_penalized(D, q, 1 / np.sqrt(K), 3 / K ** 1.5, method="fista", tol=1e-8, max_iter=20000)
    V = np.asarray(sol.Vt)[:r].T
    P = V @ V.T
    norms = block_norms((D - D @ P).reshape(inst.G, q, p))
    # tau_n: the largest (log-scale) gap of the block norms, the §7 data-adaptive rule
    keep, _ = collaborative_set(norms, K, largest_gap_threshold(norms, log=True), 0.5)
    return inst, P, keep, _record(sol)


def _task_thm5(seed, K, p, q, r, n_contam, tau, delta, refine_fn):
    rng = np.random.default_rng(seed)
    inst, P, keep, rec = _clair_run(rng, K, p, q, r, n_contam, tau, delta)
    C = np.asarray(inst.benign)
    W, W_hat, Xi = np.asarray(inst.W), np.asarray(inst.W_hat), np.asarray(inst.errors)
    if not np.array_equal(keep, C):
        return {"event": False, SOLVES_KEY: [rec]}
    Wt = refine_fn(W_hat, P, keep)
    P_A = np.asarray(inst.projector)
    PAp = np.eye(p) - P_A
    B, A, Ak = np.asarray(inst.B), np.asarray(inst.A), np.asarray(inst.A_clients)
    dev = B @ (Ak - A)
    Ebar0 = (dev[:, None] - dev[None, C]).mean(axis=1)
    Wbar = W_hat[C].mean(axis=0)
    T = Xi @ P_A + Xi[C].mean(axis=0) @ PAp
    Rk = -Ebar0 @ PAp + (W_hat - Wbar) @ (P - P_A)
    sq = lambda X: np.sum(X[C] ** 2, axis=(1, 2))  # noqa: E731
    return {"event": True, "mse": sq(Wt - W), "T": sq(T), "R": sq(Rk), "local": sq(Xi), SOLVES_KEY: [rec]}




def _mean_half(x) -> tuple[float, float]:
    """Mean and t * s.e. half-width (3-s.e. level) of per-replicate values."""
    x = np.asarray(x, dtype=float)
    if x.size < 2:
        return float(x.mean()), float("inf")
    return float(x.mean()), t3(x.size) * float(x.std(ddof=1)) / np.sqrt(x.size)


@claim("clair.thm5.minkowski", paper="clair", reference="Theorem 5, eqs. (33)-(35); Prop. S3",
       statement="Consistency check of Theorem 5 on {Chat = C}: E||Wtilde - W||^2 <= (sqrt(1 - phi theta) + "
                 "sqrt(varphi))^2 E||What - W||^2 with varphi estimated on independent runs, and (35) holds "
                 "with a zeta fixed from those runs whenever (34) holds.", kind="bound")
def _thm5(ctx, *, refine_fn=_library_refine):
    K, p, q, r, nc = 10, 8, 3, 2, 2
    tau, delta = 0.1, 0.02
    reps = ctx.pick(smoke=8, quick=60, full=300)
    point = {"K": K, "p": p, "q": q, "r": r, "n_contam": nc, "tau": tau, "delta": delta, "refine_fn": refine_fn}
    # two independent samples (grid points 0 and 1 get distinct seeds): calibration estimates varphi
    # and zeta, the test sample measures the MSE, so the bound is not the (S4.1) identity of one sample
    calib, test = ctx.map(_task_thm5, [point, point], replicates=reps)
    ev_a, ev_b = [o for o in calib if o["event"]], [o for o in test if o["event"]]
    if len(ev_a) < 3 or len(ev_b) < 3:
        return Evidence(verdict="inconclusive", summary=f"only {len(ev_a)}/{len(ev_b)} replicates with Chat = C",
                        measured={"P(Chat=C)": (len(ev_a) + len(ev_b)) / (2 * reps)})
    m = K - nc
    E = q * p * tau ** 2                                      # calE for Xi ~ N(0, tau^2 I)
    one_minus = (q * r * tau ** 2 + q * (p - r) * tau ** 2 / m) / E   # 1 - phi theta (iid, Thm 4)
    theta, phi = (p - r) / p, (m - 1) / m
    # replicates are the independent units: average the |C| benign clients within each replicate
    varphi, vh = _mean_half([o["R"].mean() / E for o in ev_a])
    v_lo, v_hi = max(varphi - vh, 0.0), varphi + vh
    bound = lambda v: (np.sqrt(one_minus) + np.sqrt(v)) ** 2 * E   # noqa: E731
    mse, mh = _mean_half([o["mse"].mean() for o in ev_b])
    # Minkowski: holds if the MSE interval lies below the smallest plausible bound, fails if above the largest
    minkowski_ok = True if mse + mh <= bound(v_lo) else (False if mse - mh > bound(v_hi) else None)
    # (34): some zeta in (0, phi) exists iff zeta* = (1 - (sqrt(1 - phi theta) + sqrt(varphi))^2)/theta > 0
    zeta = lambda v: (1 - (np.sqrt(one_minus) + np.sqrt(v)) ** 2) / theta   # noqa: E731
    zeta_lo, zeta_hi = zeta(v_hi), zeta(v_lo)
    holds34 = True if zeta_lo > 0 else (False if zeta_hi <= 0 else None)
    eq35_ok = None
    if holds34:   # (35) with zeta = zeta_lo (fixed from the calibration sample, admissible in (34))
        rhs35 = (1 - zeta_lo * theta) * E
        eq35_ok = True if mse + mh <= rhs35 else (False if mse - mh > rhs35 else None)
    judged = [minkowski_ok] + ([eq35_ok] if holds34 else [])
    passed = False if False in judged else (None if None in judged else True)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"test-sample MSE {mse:.4f} ± {mh:.4f} vs bound {bound(v_lo):.4f}-{bound(v_hi):.4f} "
                            f"(varphi = {varphi:.3g} ± {vh:.2g} from the calibration sample): {minkowski_ok}; "
                            f"(34) holds: {holds34}"
                            + (f"; (35) with zeta = {zeta_lo:.3f}: {eq35_ok}" if holds34 else ""),
                    measured={"minkowski_ok": minkowski_ok, "holds34": holds34, "eq35_ok": eq35_ok,
                              "mse": mse, "mse_half_width": mh, "varphi": varphi, "varphi_half_width": vh,
                              "zeta_lo": float(zeta_lo), "P(Chat=C)": (len(ev_a) + len(ev_b)) / (2 * reps),
                              "local": float(np.concatenate([o["local"] for o in ev_b]).mean())},
                    predicted={"bound": [float(bound(v_lo)), float(bound(v_hi))], "1 - phi theta": float(one_minus),
                               "phi": phi, "theta": theta, "(35) rhs": None if not holds34 else
                               float((1 - zeta_lo * theta) * E)},
                    notes="A consistency check: Theorem 5 is Minkowski's inequality applied to (S4.1), so on one "
                          "sample it reduces to that identity; here varphi (and zeta) come from a calibration "
                          "sample and the MSE from an independent test sample (3-s.e. t-intervals). With the "
                          "largest admissible zeta, (35)'s right side equals the Minkowski bound; zeta <= phi "
                          "holds by construction. phi, theta from the iid Gaussian design (Theorem 4's identity); "
                          "expectations are on {Chat = C} (the complement event is ignored by Theorems 5-6).")


def _task_thm6(seed, K, p, q, r, tau0, refine_fn):
    rng = np.random.default_rng(seed)
    tau = tau0 / np.sqrt(K)
    inst, P, keep, rec = _clair_run(rng, K, p, q, r, max(1, round(0.1 * K)), tau, 0.0)
    C = np.asarray(inst.benign)
    W, W_hat = np.asarray(inst.W), np.asarray(inst.W_hat)
    Wt = refine_fn(W_hat, P, keep)
    return {"ratio": float(np.mean(np.sum((Wt - W)[C] ** 2, axis=(1, 2))) / (q * p * tau ** 2)), SOLVES_KEY: [rec]}


def _refine_identity(W_hat, P, keep):
    """Broken variant: no refinement at all (returns the local estimates)."""
    return np.asarray(W_hat, float).copy()


@claim("clair.thm6.balanced_trend", paper="clair", reference="Theorem 6, eq. (36)",
       statement="In the balanced case the benign MSE ratio behaves like c0/(eta K) + c1 r/(p-r): fitted c0, c1 > 0, "
                 "high R^2, decreasing in K and increasing in r.", kind="scaling")
def _thm6(ctx, *, refine_fn=_library_refine):
    p, q = 16, 5
    Ks = ctx.pick(smoke=[10, 20], quick=[10, 20, 40], full=[10, 20, 40, 80])
    rs = ctx.pick(smoke=[1, 4], quick=[1, 2, 4], full=[1, 2, 4])
    grid = [{"K": K, "p": p, "q": q, "r": r, "tau0": 0.3, "refine_fn": refine_fn} for r in rs for K in Ks]
    out = [[o["ratio"] for o in row] for row in ctx.map(_task_thm6, grid, replicates=ctx.pick(2, 4, 10))]
    y = np.array([np.mean(o) for o in out])
    se = np.array([np.std(o, ddof=1) / np.sqrt(len(o)) for o in out])
    eta = np.array([(g["K"] - max(1, round(0.1 * g["K"]))) / g["K"] for g in grid])
    X = np.column_stack([1 / (eta * np.array([g["K"] for g in grid])),
                         np.array([g["r"] / (p - g["r"]) for g in grid])])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    r2 = 1 - np.sum((y - X @ coef) ** 2) / np.sum((y - y.mean()) ** 2)
    Y = y.reshape(len(rs), len(Ks))
    S = se.reshape(len(rs), len(Ks))
    dec_K = all(Y[i, j + 1] <= Y[i, j] + 2 * np.hypot(S[i, j], S[i, j + 1])
                for i in range(len(rs)) for j in range(len(Ks) - 1))
    inc_r = all(Y[i + 1, j] >= Y[i, j] - 2 * np.hypot(S[i, j], S[i + 1, j])
                for i in range(len(rs) - 1) for j in range(len(Ks)))
    passed = bool(coef[0] > 0 and coef[1] > 0 and r2 >= 0.9 and dec_K and inc_r)
    rows = [{"K": g["K"], "r": g["r"], "r/(p-r)": g["r"] / (p - g["r"]), "MSE ratio": float(m), "s.e.": float(s),
             "fit": float(f)} for g, m, s, f in zip(grid, y, se, X @ coef)]
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.5, 3))
    F = (X @ coef).reshape(len(rs), len(Ks))
    for i, r in enumerate(rs):
        line = ax.errorbar(Ks, Y[i], yerr=2 * S[i], fmt="o", capsize=3, label=f"r = {r}")
        ax.plot(Ks, F[i], "--", color=line[0].get_color())
    ax.set_xscale("log")
    ax.set_xlabel("K")
    ax.set_ylabel("benign MSE / local MSE")
    ax.set_title("dashed: c0/(eta K) + c1 r/(p-r)", fontsize=8)
    ax.legend(fontsize=7)
    fig_path = ctx.save_figure(fig)
    return Evidence(verdict=verdict_from(passed), figure=fig_path,
                    summary=f"fit c0 = {coef[0]:.3f}, c1 = {coef[1]:.3f}, R^2 = {r2:.3f}; decreasing in K: {dec_K}, "
                            f"increasing in r: {inc_r}",
                    measured={"c0": float(coef[0]), "c1": float(coef[1]), "R2": float(r2)},
                    predicted={"c0": "> 0", "c1": "> 0"}, table=rows,
                    notes="p = 16, q = 5, tau = 0.3/sqrt(K), 10% contaminated; all benign clients, unconditional.")
