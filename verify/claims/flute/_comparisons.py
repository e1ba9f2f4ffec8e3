"""FLUTE against other estimators: averaging local optima (Example 1), FedRep (Figs. 1 and 3) and
the empirical rank-k ERM."""
from __future__ import annotations

import numpy as np

from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.algorithms.flute import flute
from lowrank_fl.exact import flute as ex
from lowrank_fl.problems.multitask import haar_orthonormal
from lowrank_fl.problems.underparameterized import UnderparameterizedProblem, underparameterized
from verify.claim import SOLVES_KEY, Evidence, claim, solve_record, verdict_from
from verify.convergence import expected_non_convergence
from verify.criteria import all_of, baseline_check, relaxation
from verify.stats import interval_verdict, mean_ci

from ._support import ETA, NOISE, PAPER, figure, rounds_to


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
    fig, ax = figure()
    ax.bar(["avg (w=lambda)", "avg (w=sqrt)", "FLUTE"],
           [np.mean([o["plain"] for o in flat]), np.mean([o["weighted"] for o in flat]),
            np.mean([np.sqrt(1 - o["flute_dist"] ** 2) for o in flat])])
    ax.set_ylabel("|cos angle to u_1|")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"averaging identities to {id_err:.1e}; FLUTE sin-angle to u_1 {dist:.1e} (< 1e-6)",
                    measured={"identity_error": id_err, "flute_max_sin_angle": dist,
                              "mean_cos_plain_avg": float(np.mean([o["plain"] for o in flat]))},
                    predicted={"cos_plain_avg": "1/sqrt(M)", "flute_sin_angle": 0.0},
                    figure=ctx.save_figure(fig, title="|cos| to u_1: averages vs FLUTE"),
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
    fig, ax = figure()
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
    with expected_non_convergence():   # where FLUTE ends (or diverges) is what the claim classifies
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
        with expected_non_convergence():
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
    fig, ax = figure()
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
