"""Claims of RoLoRA (Chen et al., "Robust federated finetuning of LLMs via alternating optimization
of LoRA"): fifteen checkable claims C1–C15 of its §3–§5 and Appendix A (C15, MNIST, omitted).

LoRA factors are in PEFT's letters (``DeltaW = B A``, A r × in, B out × r); the rank-one toy keeps
the paper's ``a`` (A side) and ``b`` (B side).

Every experiment has keyword-only injection points (the algorithm, an estimator, a step variant)
through which the tests feed a deliberately broken variant and check that the verdict turns to
"fails".
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from lowrank_fl.algorithms.lora_aggregation import (cross_covariance, eckart_young_tail, fedavg_factors,
                                                    federated_lora_matrix, flexlora_aggregate, interference,
                                                    mean_product)
from lowrank_fl.algorithms.rolora import fedavg_lora, ffa_lora, grad_a_clients, rolora
from lowrank_fl.exact.rolora import (angle_loss, c_tilde, expected_gradient_a, ffa_expected_loss, ffa_lstsq_loss,
                                     ffa_population_loss, iterations_bound, local_b_solve, rate_bound_heterogeneous,
                                     rate_bound_homogeneous, reduced_rank_regression, rolora_population_recursion,
                                     step_size_bound)
from lowrank_fl.problems.lora import (init_at_angle, lora_matrix_problem, random_unit, rank_one_lora)
from verify.claim import Evidence, claim, verdict_from
from verify.stats import fit_loglog_slope, fit_semilog_slope, within_mc_error

PAPER = "rolora"


def _fig(nrows=1, ncols=1, **kw):
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), **kw)


def _geometric_slopes(deltas, floor=1e-12):
    """Per-seed semilog slope of delta_t over the part above ``floor`` (>= 3 points)."""
    slopes = []
    for row in deltas:
        row = np.asarray(row)
        keep = np.flatnonzero(row > floor)
        keep = keep[: max(3, len(keep))] if len(keep) >= 3 else np.arange(min(3, len(row)))
        slopes.append(fit_semilog_slope(keep.astype(float), np.maximum(row[keep], 1e-300)[:, None]).slope)
    return np.asarray(slopes)


# =============================================================================================
# C1  FedAvg-LoRA interference identity (eqs. (1)-(2))
# =============================================================================================
def _task_interference(seed, *, n, d, r, cross_cov):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, r, d))            # PEFT letters: A (clients, r, in), B (clients, out, r)
    B = rng.standard_normal((n, d, r))
    direct = interference(A, B)
    scale = np.linalg.norm(mean_product(A, B))
    rel = float(np.linalg.norm(direct - cross_cov(A, B)) / scale)
    A_eq = np.broadcast_to(A[0], A.shape)
    B_eq = np.broadcast_to(B[0], B.shape)
    zero_A = float(np.linalg.norm(interference(A_eq, B)) / np.linalg.norm(mean_product(A_eq, B)))
    zero_B = float(np.linalg.norm(interference(A, B_eq)) / np.linalg.norm(mean_product(A, B_eq)))
    return {"rel_identity": rel, "zero_equal_A": zero_A, "zero_equal_B": zero_B}


def _task_toy_interference(seed, *, K, gamma, rounds):
    rng = np.random.default_rng(seed)
    prob = rank_one_lora(d=10, n_clients=6, gamma=gamma, b_norm=1.0, seed=rng)
    tr = fedavg_lora(prob, rounds, 0.1, local_steps=K, seed=rng)
    return float(np.nanmax(tr.extra["interference"]))


@claim("rolora.eq1_2.interference_identity", paper=PAPER, reference="§3.2, eqs. (1)-(2)",
       statement="FedAvg of LoRA factors misses the exact aggregate by the factor cross-covariance "
                 "(1/N) sum (B_i - Bbar)(A_i - Abar) (PEFT letters, DeltaW = B A), which vanishes when all A_i or all B_i are equal.",
       kind="identity")
def _c1(ctx, *, cross_cov=cross_covariance):
    reps = ctx.pick(5, 20, 100)
    out = ctx.map(_task_interference, [{"n": 6, "d": 12, "r": 3, "cross_cov": cross_cov}], replicates=reps)[0]
    rel = max(o["rel_identity"] for o in out)
    zero = max(max(o["zero_equal_A"], o["zero_equal_B"]) for o in out)
    # 1e-12 relative: both sides are sums of N products of O(1) entries; rounding is ~1e-15.
    passed = rel <= 1e-12 and zero <= 1e-12
    Ks = ctx.pick([1, 5], [1, 5, 20], [1, 5, 20])
    grid = [{"K": K, "gamma": g, "rounds": ctx.pick(5, 20, 40)} for g in (0.0, 1.0) for K in Ks]
    toy = ctx.map(_task_toy_interference, grid, replicates=ctx.pick(2, 4, 10))
    toy_mean = [float(np.mean(v)) for v in toy]
    fig, ax = _fig()
    for gi, g in enumerate((0.0, 1.0)):
        ax.plot(Ks, toy_mean[gi * len(Ks):(gi + 1) * len(Ks)], "o-", label=f"gamma={g}")
    ax.set_xscale("log"), ax.set_yscale("symlog", linthresh=1e-8)
    ax.set_xlabel("local steps K"), ax.set_ylabel("max ||mean b_i a_i^T - bbar abar^T||"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"identity rel. error {rel:.1e}; equal-factor interference {zero:.1e} (<= 1e-12)",
                    measured={"max_rel_identity_error": rel, "max_equal_factor_interference": zero,
                              "toy_interference": {f"K={g['K']},gamma={g['gamma']}": v for g, v in zip(grid, toy_mean)}},
                    predicted={"identity_error": 0.0, "equal_factor_interference": 0.0},
                    figure=ctx.save_figure(fig),
                    notes="Toy FedAvg-LoRA interference (reported, not asserted) grows with K and heterogeneity.")


# =============================================================================================
# C2  RoLoRA aggregation exactness (eqs. (3)-(4))
# =============================================================================================
def _task_aggregation(seed, *, method, rounds, local_steps):
    rng = np.random.default_rng(seed)
    prob = lora_matrix_problem(d=10, n_clients=5, rank=2, gamma=0.8, seed=rng)
    tr = federated_lora_matrix(prob, rounds, 0.05, method=method, local_steps=local_steps, seed=rng)
    return {"rel_err": float(np.nanmax(tr.extra["relative_aggregation_error"][1:])),
            "trace": tr.extra["relative_aggregation_error"][1:].tolist()}


@claim("rolora.eq3_4.aggregation_exact", paper=PAPER, reference="§4, eqs. (3)-(4)",
       statement="In every RoLoRA round the average of the client products equals the server's product A B "
                 "exactly (mean_i B_i A_i = B A), because the frozen factor is shared.", kind="identity")
def _c2(ctx, *, method="rolora"):
    rounds = ctx.pick(10, 30, 60)
    grid = [{"method": method, "rounds": rounds, "local_steps": 5},
            {"method": "fedavg", "rounds": rounds, "local_steps": 5}]
    out = ctx.map(_task_aggregation, grid, replicates=ctx.pick(2, 5, 20))
    err = max(o["rel_err"] for o in out[0])
    fed = float(np.median([o["rel_err"] for o in out[1]]))
    # 1e-12: the only error is rounding in a mean of N (d x d) products (~1e-15 relative).
    passed = err <= 1e-12
    fig, ax = _fig()
    ax.semilogy(np.maximum(out[0][0]["trace"], 1e-17), label=method)
    ax.semilogy(np.maximum(out[1][0]["trace"], 1e-17), label="fedavg (reference)")
    ax.set_xlabel("communication round"), ax.set_ylabel("relative aggregation error"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max relative aggregation error {err:.1e} (<= 1e-12); FedAvg-LoRA {fed:.1e}",
                    measured={"max_relative_aggregation_error": err, "fedavg_median": fed},
                    predicted={"relative_aggregation_error": 0.0}, figure=ctx.save_figure(fig))


# =============================================================================================
# C3  Eckart-Young bound for FedAvg-of-factors; FlexLoRA attains it
# =============================================================================================
def _task_eckart(seed, *, n, d, r, server):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, r, d))            # PEFT letters: A (clients, r, in), B (clients, out, r)
    B = rng.standard_normal((n, d, r))
    M = mean_product(A, B)
    tail = eckart_young_tail(M, r)
    Abar, Bbar = fedavg_factors(A, B)
    As, Bs = server(A, B)
    return {"tail": tail, "fedavg": float(np.linalg.norm(M - Bbar @ Abar)),
            "server": float(np.linalg.norm(M - Bs @ As)), "scale": float(np.linalg.norm(M))}


@claim("rolora.sec3_2.eckart_young", paper=PAPER, reference="§3.2 (FlexLoRA server step)",
       statement="FedAvg-of-factors errs by at least the Eckart-Young tail sqrt(sum_{k>r} sigma_k^2) of the "
                 "mean client product; its truncated SVD (FlexLoRA) attains that tail.", kind="bound")
def _c3(ctx, *, server=flexlora_aggregate):
    out = ctx.map(_task_eckart, [{"n": 5, "d": 10, "r": 2, "server": server}], replicates=ctx.pick(5, 20, 100))[0]
    # 1e-10 relative: truncated SVD is backward stable (~1e-15); margin for the norm subtraction.
    lower_ok = all(o["fedavg"] >= o["tail"] * (1 - 1e-12) for o in out)
    attain = max(abs(o["server"] - o["tail"]) / o["scale"] for o in out)
    passed = lower_ok and attain <= 1e-10
    fig, ax = _fig()
    ax.scatter([o["tail"] for o in out], [o["fedavg"] for o in out], label="FedAvg of factors")
    ax.scatter([o["tail"] for o in out], [o["server"] for o in out], marker="x", label="server under test")
    lim = max(o["fedavg"] for o in out)
    ax.plot([0, lim], [0, lim], "k--", lw=0.8)
    ax.set_xlabel("Eckart-Young tail"), ax.set_ylabel("||M - B A||_F"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"FedAvg >= tail in all draws: {lower_ok}; SVD server gap {attain:.1e} (<= 1e-10)",
                    measured={"fedavg_above_tail": lower_ok, "max_server_gap_relative": attain,
                              "mean_fedavg_over_tail": float(np.mean([o['fedavg'] / o['tail'] for o in out]))},
                    predicted={"server_gap": 0.0}, figure=ctx.save_figure(fig))


# =============================================================================================
# C4  FFA-LoRA floor, heterogeneous population (Prop. A.17)
# =============================================================================================
def _task_ffa_floor(seed, *, delta0, gamma, rounds, algorithm):
    rng = np.random.default_rng(seed)
    prob = rank_one_lora(d=10, n_clients=8, gamma=gamma, seed=rng)
    a0 = init_at_angle(prob.a_star, delta0, rng)
    tr = algorithm(prob, rounds, init=a0, seed=rng)
    gd = algorithm(prob, rounds, 0.25, init=a0, local="gd", local_steps=200, seed=rng)
    floor = ffa_population_loss(gamma, prob.L_max, delta0)
    _, lstsq = ffa_lstsq_loss(prob.a_star, prob.b_star, a0)
    return {"argmin_rel": float(np.max(np.abs(tr.loss[1:] - floor)) / floor),
            "gd_rel": float(abs(gd.loss[-1] - floor) / floor),
            "lstsq_rel": float(abs(lstsq - floor) / floor),
            "min_loss_over_floor": float(np.min(tr.loss[1:]) / floor), "loss": tr.loss.tolist(), "floor": floor}


@claim("rolora.propA17.ffa_floor", paper=PAPER, reference="Proposition A.17, eq. (274)",
       statement="FFA-LoRA's global population loss is exactly gamma^2 + ||bbar*||^2 delta_0^2 after one round "
                 "and never decreases further; it is the least-squares optimum over b with a = a0.",
       kind="identity")
def _c4(ctx, *, algorithm=ffa_lora):
    grid = [{"delta0": dl, "gamma": g, "rounds": ctx.pick(5, 20, 50), "algorithm": algorithm}
            for dl, g in ((0.6, 0.5), (0.9, 1.0))]
    out = ctx.map(_task_ffa_floor, grid, replicates=ctx.pick(2, 5, 20))
    flat = [o for row in out for o in row]
    arg = max(o["argmin_rel"] for o in flat)
    gd = max(o["gd_rel"] for o in flat)
    ls = max(o["lstsq_rel"] for o in flat)
    # 1e-10 (argmin, closed form), 1e-6 (200 local GD steps at a contraction <= 0.5 per step), 1e-9
    # (lstsq on a d^2 N x d system, condition number 1).
    passed = arg <= 1e-10 and gd <= 1e-6 and ls <= 1e-9
    fig, ax = _fig()
    ax.plot(np.asarray(out[0][0]["loss"]), "o-", label="FFA-LoRA loss")
    ax.axhline(out[0][0]["floor"], ls="--", c="k", label="gamma^2 + ||bbar*||^2 delta0^2")
    ax.set_xlabel("round"), ax.set_ylabel("global population loss"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"argmin rel. dev. {arg:.1e} (<=1e-10), GD {gd:.1e} (<=1e-6), lstsq {ls:.1e} (<=1e-9)",
                    measured={"argmin_rel_dev": arg, "gd_rel_dev": gd, "lstsq_rel_dev": ls,
                              "min_loss_over_floor": min(o["min_loss_over_floor"] for o in flat)},
                    predicted={"loss": "gamma^2 + ||bbar*||^2 delta0^2"}, figure=ctx.save_figure(fig))


# =============================================================================================
# C5  FFA-LoRA exact finite-sample expected loss (Prop. 5.5, eq. (242))
# =============================================================================================
def _ffa_average(X, Y, a0):
    """FFA's b: average of the clients' local LS solutions (eq. (183)); X (R, N, m, d) -> (R, d)."""
    R, n, m, d = X.shape
    return local_b_solve(X.reshape(R * n, m, d), Y.reshape(R * n, m, d), a0).reshape(R, n, d).mean(axis=1)


def _task_ffa_mc(seed, *, n, m, d, draws, delta0, estimator):
    rng = np.random.default_rng(seed)
    a_star = random_unit(d, rng)
    b_star = rng.standard_normal(d)
    b_star /= np.linalg.norm(b_star)
    a0 = init_at_angle(a_star, delta0, rng)
    losses = []
    chunk = max(1, 2_000_000 // (n * m * d))          # bounded memory (~16 MB per array)
    for start in range(0, draws, chunk):
        R = min(chunk, draws - start)
        X = rng.standard_normal((R, n, m, d))
        Xa = X @ a_star
        Y = Xa[..., None] * b_star
        b = estimator(X, Y, a0)                                       # (R, d)
        resid = Y - (X @ a0)[..., None] * b[:, None, None, :]
        losses.append(np.einsum("rnmd,rnmd->r", resid, resid) / (n * m))
    return np.concatenate(losses)


@claim("rolora.prop5_5.ffa_expected_loss", paper=PAPER, reference="Proposition 5.5, eqs. (11), (242)-(244)",
       statement="With a frozen a0, FFA-LoRA's expected training loss is (1 + c~)||b*||^2 delta_0^2 with "
                 "c~ = (N(4-m)-2)/(N^2 m (m-2)).", kind="identity")
def _c5(ctx, *, estimator=_ffa_average):
    draws = ctx.pick(20000, 100000, 300000)
    configs = [(3, 6, 4), (2, 4, 5)] + ctx.pick([], [(5, 10, 6)], [(5, 10, 6), (10, 20, 8)])
    delta0 = 0.6
    grid = [{"n": n, "m": m, "d": d, "draws": draws, "delta0": delta0, "estimator": estimator}
            for n, m, d in configs]
    out = ctx.map(_task_ffa_mc, grid, replicates=1)
    rows, ok = [], True
    for (n, m, d), res in zip(configs, out):
        pred = ffa_expected_loss(delta0, 1.0, n, m)
        inside, mean, se = within_mc_error(res[0], pred, n_se=3.5)
        naive_z = abs(mean - delta0 ** 2) / se
        ok &= inside
        rows.append({"N": n, "m": m, "d": d, "mc_mean": mean, "se": se, "predicted": pred,
                     "c_tilde": c_tilde(n, m), "z": (mean - pred) / se, "naive_z": naive_z})
    fig, ax = _fig()
    ax.errorbar(range(len(rows)), [r["mc_mean"] for r in rows], yerr=[3 * r["se"] for r in rows], fmt="o", label="MC")
    ax.plot(range(len(rows)), [r["predicted"] for r in rows], "x", ms=9, label="(1+c~)||b*||^2 delta0^2")
    ax.axhline(delta0 ** 2, ls=":", c="k", label="naive ||b*||^2 delta0^2")
    ax.set_xticks(range(len(rows)), [f"N={r['N']},m={r['m']}" for r in rows]), ax.legend()
    return Evidence(verdict=verdict_from(bool(ok)),
                    summary="MC within 3.5 s.e. of (1+c~)||b*||^2 delta0^2: "
                            + ", ".join(f"z={r['z']:+.1f}" for r in rows),
                    measured={"rows": rows}, predicted={"formula": "(1+c~)||b*||^2 delta0^2"}, table=rows,
                    figure=ctx.save_figure(fig),
                    notes="3.5 s.e.: several configurations are tested at once (Bonferroni-like margin). "
                          "naive_z is the distance of the MC mean from the naive ||b*||^2 delta0^2.")


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
            "rate_bound": rate}


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
        sl = _geometric_slopes(D)
        fits[f"delta0={g['delta0']},eta={g['eta_factor']}/s"] = {
            "measured_rate": float(np.exp(sl.mean())), "bound_rate": row[0]["rate_bound"]}
    passed = all(checks.values())
    fig, ax = _fig()
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
            "rrr_allowed": float((1 + eps_prime) * dl[-1] + 1e-10), "rho": rho}


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
            ok &= all(o["rrr_gap"] <= o["rrr_allowed"] for o in row)
        # theorem is w.h.p.: allow one seed in ten to miss
        ok &= bool(geometric) and frac >= 0.9
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
    fig, ax = _fig()
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
    fig, ax = _fig()
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
    fig, ax = _fig()
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
    fig, ax = _fig()
    ax.loglog(np.array(ms) * 4, devs.mean(axis=1), "o-", label="E||grad - E grad||")
    ax.loglog(np.array(ms) * 4, devs.mean(axis=1)[0] * (np.array(ms) / ms[0]) ** -0.5, "k--", label="slope -1/2")
    ax.set_xlabel("N m"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max |z| of mean gradient {zmax:.2f} (<= {z_crit:.2f}); deviation slope {fit} (~ -0.5)",
                    measured={"max_z": zmax, "deviation_slope": fit.as_dict()},
                    predicted={"z_critical": z_crit, "slope": -0.5}, figure=ctx.save_figure(fig))


# =============================================================================================
# C11  RoLoRA beats FFA-LoRA from the same init
# =============================================================================================
def _task_compare(seed, *, setting, rounds, algorithm):
    rng = np.random.default_rng(seed)
    if setting == "population":
        prob = rank_one_lora(d=20, n_clients=10, gamma=0.5, seed=rng)
    else:
        prob = rank_one_lora(d=20, n_clients=5, samples_per_client=100, seed=rng)
    a0 = random_unit(prob.d, rng)
    ro = algorithm(prob, rounds, "corrected", init=a0, seed=rng)
    ffa = ffa_lora(prob, 1, init=a0, seed=rng)
    dT = ro.distance[-1]
    return {"rolora": float(ro.loss[-1]), "ffa": float(ffa.loss[-1]), "delta0": float(ffa.distance[0]),
            "deltaT": float(dT), "angle_loss": angle_loss(prob.gamma, prob.L_max, dT)}


@claim("rolora.prop5_5.rolora_beats_ffa", paper=PAPER, reference="Proposition 5.5 / A.17 and the remarks after them",
       statement="From the same a0, RoLoRA's loss gamma^2 + ||bbar*||^2 delta_T^2 falls strictly below FFA-LoRA's "
                 "gamma^2 + ||bbar*||^2 delta_0^2.", kind="comparison")
def _c11(ctx, *, algorithm=rolora):
    rounds = ctx.pick(40, 80, 150)
    grid = [{"setting": s, "rounds": rounds, "algorithm": algorithm} for s in ("population", "finite")]
    out = ctx.map(_task_compare, grid, replicates=ctx.pick(3, 10, 30))
    flat = [o for row in out for o in row]
    strict = all(o["rolora"] < o["ffa"] * (1 - 1e-6) for o in flat if o["deltaT"] < o["delta0"])
    moved = all(o["deltaT"] < o["delta0"] for o in flat)
    # population: the RoLoRA loss is the angle loss up to rounding (1e-9 relative)
    pop_identity = all(abs(o["rolora"] - o["angle_loss"]) <= 1e-9 * o["angle_loss"] for o in out[0])
    passed = strict and moved and pop_identity
    fig, ax = _fig()
    for gi, (g, row) in enumerate(zip(grid, out)):
        ax.scatter([o["ffa"] for o in row], [o["rolora"] for o in row], label=g["setting"])
    lim = max(o["ffa"] for o in flat)
    ax.plot([0, lim], [0, lim], "k--", lw=0.8), ax.set_xlabel("FFA-LoRA loss"), ax.set_ylabel("RoLoRA loss")
    ax.legend()
    ratio = float(np.median([o["rolora"] / o["ffa"] for o in flat]))
    return Evidence(verdict=verdict_from(passed),
                    summary=f"RoLoRA < FFA in all {len(flat)} runs: {strict and moved}; median loss ratio {ratio:.2g}",
                    measured={"strictly_better": strict, "angle_decreased": moved, "population_identity": pop_identity,
                              "median_ratio": ratio},
                    predicted={"rolora": "gamma^2 + s delta_T^2", "ffa": "gamma^2 + s delta_0^2"},
                    figure=ctx.save_figure(fig))


# =============================================================================================
# C12  FedAvg-LoRA toy behaviour [NOT IN PAPER, exploratory]
# =============================================================================================
def _centralized_gd(prob, a, b, eta, rounds):
    """GD on the global population loss with the closed-form gradient (independent of client code)."""
    bs = prob.b_bar
    for _ in range(rounds):
        ga = 2 * (a * (b @ b) - prob.a_star * (bs @ b))
        gb = 2 * (b * (a @ a) - bs * (prob.a_star @ a))
        a, b = a - eta * ga, b - eta * gb
    return a, b


def _task_fedavg(seed, *, K, rounds, algorithm):
    rng = np.random.default_rng(seed)
    prob = rank_one_lora(d=10, n_clients=6, gamma=1.0, b_norm=1.0, seed=rng)
    a0 = random_unit(prob.d, rng)
    eta = 0.1
    tr = algorithm(prob, rounds, eta, local_steps=K, init=a0, seed=rng)
    out = {"loss": float(tr.loss[-1]), "interference": float(np.nanmax(tr.extra["interference"])),
           "optimum": prob.gamma ** 2}
    if K == 1:
        a, b = _centralized_gd(prob, a0, np.zeros(prob.d), eta, rounds)
        out["k1_gap"] = float(np.linalg.norm(np.outer(a, b) - np.outer(tr.a, tr.b)))
    ro = rolora(prob, rounds, "corrected", init=a0, seed=rng)
    out["rolora_loss"] = float(ro.loss[-1])
    return out


@claim("rolora.sec3_2.fedavg_lora_toy", paper=PAPER, reference="§3.2 (FedAvg-LoRA; toy version NOT IN PAPER)",
       statement="In the toy, FedAvg-LoRA with one local step is exactly centralized GD; with more local steps "
                 "and heterogeneity the factor interference grows (reported, exploratory).", kind="comparison")
def _c12(ctx, *, algorithm=fedavg_lora):
    Ks = ctx.pick([1, 5], [1, 5, 20], [1, 5, 20])
    rounds = ctx.pick(30, 100, 300)
    out = ctx.map(_task_fedavg, [{"K": K, "rounds": rounds, "algorithm": algorithm} for K in Ks],
                  replicates=ctx.pick(2, 5, 20))
    gap = max(o["k1_gap"] for o in out[0])
    # 1e-10: same arithmetic up to reassociation of client sums over `rounds` iterations.
    passed = gap <= 1e-10
    table = [{"K": K, "loss": float(np.mean([o["loss"] for o in row])),
              "rolora_loss": float(np.mean([o["rolora_loss"] for o in row])),
              "max_interference": float(np.mean([o["interference"] for o in row])),
              "optimum_gamma2": row[0]["optimum"]} for K, row in zip(Ks, out)]
    fig, ax = _fig()
    ax.plot(Ks, [r["max_interference"] for r in table], "o-")
    ax.set_xscale("log"), ax.set_xlabel("local steps K"), ax.set_ylabel("max interference norm")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"K=1 FedAvg-LoRA vs centralized GD: max gap {gap:.1e} (<= 1e-10); "
                            + ", ".join(f"K={r['K']}: loss {r['loss']:.3g}" for r in table),
                    measured={"k1_gap": gap, "table": table}, table=table,
                    predicted={"k1_gap": 0.0}, figure=ctx.save_figure(fig),
                    notes="Only the K = 1 identity is asserted; losses and interference are reported.")


# =============================================================================================
# C13  Symmetry / invariance
# =============================================================================================
def _task_invariance(seed, *, rounds, algorithm):
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    prob = rank_one_lora(d=10, n_clients=4, samples_per_client=40, seed=rng)
    a0 = random_unit(prob.d, rng)
    Q, _ = np.linalg.qr(rng.standard_normal((prob.d, prob.d)))
    rot = replace(prob, a_star=Q.T @ prob.a_star, X=prob.X @ Q)
    eta = 0.5 / prob.L_max ** 2
    t0 = algorithm(prob, rounds, eta, init=a0, seed=1)
    t1 = algorithm(rot, rounds, eta, init=Q.T @ a0, seed=1)
    t2 = algorithm(prob, rounds, eta, init=-a0, seed=1)
    return {"rot_delta": float(np.max(np.abs(t0.distance - t1.distance))),
            "rot_a": float(np.linalg.norm(Q.T @ t0.a - t1.a)), "rot_b": float(np.linalg.norm(t0.b - t1.b)),
            "sign_delta": float(np.max(np.abs(t0.distance - t2.distance))),
            "sign_model": float(np.linalg.norm(np.outer(t0.a, t0.b) - np.outer(t2.a, t2.b)))}


@claim("rolora.sec5.invariance", paper=PAPER, reference="§5.1 model (5)-(7), Def. 5.2",
       statement="RoLoRA is rotation-equivariant (X -> XQ, a -> Q^T a leaves delta_t and b unchanged) and "
                 "sign-invariant ((a, b) -> (-a, -b) leaves the model unchanged).", kind="identity")
def _c13(ctx, *, algorithm=rolora):
    out = ctx.map(_task_invariance, [{"rounds": ctx.pick(10, 30, 60), "algorithm": algorithm}],
                  replicates=ctx.pick(2, 5, 20))[0]
    worst = {k: max(o[k] for o in out) for k in out[0]}
    # 1e-10: rotations change the rounding of every inner product (~1e-15 per step, T steps).
    passed = all(v <= 1e-10 for v in worst.values())
    return Evidence(verdict=verdict_from(passed),
                    summary="max deviations " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()) + " (<= 1e-10)",
                    measured=worst, predicted={k: 0.0 for k in worst})


# =============================================================================================
# C14  Random-init FFA is nearly useless in high d [NOT IN PAPER]
# =============================================================================================
def _task_random_ffa(seed, *, d, draws, init):
    rng = np.random.default_rng(seed)
    prob = rank_one_lora(d=d, n_clients=5, gamma=0.3, seed=rng)
    s = prob.L_max ** 2
    ex = np.empty(draws)
    for k in range(draws):
        tr = ffa_lora(prob, 1, init=init(prob, rng), seed=rng)
        ex[k] = (tr.loss[-1] - prob.gamma ** 2) / s
    return ex


def _uniform_init(prob, rng):
    return random_unit(prob.d, rng)


@claim("rolora.sec3_7.random_init_ffa", paper=PAPER, reference="§3.7 remark (NOT IN PAPER: E[cos^2] = 1/d)",
       statement="With a uniformly random a0, FFA-LoRA's expected excess loss is (1 - 1/d)||bbar*||^2: it "
                 "removes only a 1/d fraction of the excess.", kind="scaling")
def _c14(ctx, *, init=_uniform_init):
    draws = ctx.pick(400, 3000, 20000)
    ds = [5, 20]
    out = ctx.map(_task_random_ffa, [{"d": d, "draws": draws, "init": init} for d in ds], replicates=1)
    rows, ok = [], True
    for d, res in zip(ds, out):
        inside, mean, se = within_mc_error(res[0], 1 - 1 / d, n_se=3.5)
        ok &= inside
        rows.append({"d": d, "mean_excess": mean, "se": se, "predicted": 1 - 1 / d})
    fig, ax = _fig()
    ax.errorbar(ds, [r["mean_excess"] for r in rows], yerr=[3 * r["se"] for r in rows], fmt="o", label="MC")
    ax.plot(ds, [1 - 1 / d for d in ds], "x", ms=9, label="1 - 1/d"), ax.legend()
    ax.set_xlabel("d"), ax.set_ylabel("excess / ||bbar*||^2")
    return Evidence(verdict=verdict_from(bool(ok)),
                    summary=", ".join(f"d={r['d']}: {r['mean_excess']:.3f}±{r['se']:.3f} vs {r['predicted']:.3f}"
                                      for r in rows),
                    measured={"rows": rows}, predicted={"excess": "1 - 1/d"}, table=rows,
                    figure=ctx.save_figure(fig))
