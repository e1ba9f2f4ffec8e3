"""FLUTE against other estimators: averaging local optima (Example 1), FedRep (Figs. 1 and 3) and
the empirical rank-k ERM."""
from __future__ import annotations

import numpy as np

from lowrank_fl.algorithms.fedrep import fedrep
from lowrank_fl.algorithms.flute import flute
from lowrank_fl.exact import flute as ex
from lowrank_fl.problems.multitask import haar_orthonormal
from lowrank_fl.problems.underparameterized import UnderparameterizedProblem, underparameterized
from verify.claim import Evidence, claim, verdict_from

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
def _task_vs_fedrep(seed, *, k, rounds, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=k, samples_per_client=20, noise=NOISE, seed=rng)
    fl = algorithm(p, rounds, ETA, data="fixed", seed=rng).extra["error_truth"]
    fr = fedrep(p, rounds, 0.1, init="moments", seed=rng).extra["error_truth"]
    ri = fedrep(p, rounds, 0.1, init="random", seed=rng).extra["error_truth"]
    plateau_fl, plateau_fr = float(fl[-1]), float(fr[-1])
    level = 1.05 * min(plateau_fl, float(ri[-1]))
    return {"plateau_flute": plateau_fl, "plateau_fedrep": plateau_fr,
            "plateau_fedrep_ri": float(ri[-1]), "early_flute": float(fl[10]),
            "early_fedrep": float(fr[10]), "rounds_flute": rounds_to(fl, level),
            "rounds_fedrep_ri": rounds_to(ri, level),
            "curves": [fl[::10], fr[::10], ri[::10]]}


@claim("flute.fig1.vs_fedrep", paper=PAPER, reference="Figures 1 and 3 (App. C)",
       statement="FedRep (moment init) has lower error early on, but FLUTE eventually reaches a lower "
                 "or equal error than FedRep.", kind="comparison")
def _c11(ctx, *, algorithm=flute):
    ks = ctx.pick([2], [2, 4], [2, 4, 6, 8])
    rounds = ctx.pick(300, 800, 1500)
    out = ctx.map(_task_vs_fedrep, [{"k": k, "rounds": rounds, "algorithm": algorithm} for k in ks],
                  replicates=ctx.pick(1, 3, 4))
    rows = []
    passed = True
    for k, row in zip(ks, out):
        pf = np.mean([o["plateau_flute"] for o in row])
        pr = np.mean([o["plateau_fedrep"] for o in row])
        ef = np.mean([o["early_flute"] for o in row])
        er = np.mean([o["early_fedrep"] for o in row])
        late = bool(pf <= 1.01 * pr)                        # 1%: criterion (i), Figs. 1 and 3
        early = bool(er < ef)
        passed &= late and early
        rows.append({"k": k, "late_ok": late, "early_ok": early,
                     "plateau_flute": pf, "plateau_fedrep": pr,
                     "plateau_fedrep_ri": float(np.mean([o["plateau_fedrep_ri"] for o in row])),
                     "error_round10_flute": ef, "error_round10_fedrep": er,
                     "rounds_to_1.05plateau_flute": float(np.mean([o["rounds_flute"] for o in row])),
                     "rounds_to_1.05plateau_fedrep_ri": float(np.mean([o["rounds_fedrep_ri"] for o in row]))})
        r = rows[-1]
        # (ii), (iii), reported only (see the claim's notes)
        r["ii_flute_fewer_rounds_than_ri"] = bool(r["rounds_to_1.05plateau_flute"]
                                                  < r["rounds_to_1.05plateau_fedrep_ri"])
        r["iii_plateau_gap_fedrep_minus_flute"] = float(pr - pf)
    gaps = [r["iii_plateau_gap_fedrep_minus_flute"] for r in rows]
    # one panel per k (the verdict needs every k): mean curves over seeds, as the criteria use means
    ncols = min(len(ks), 2)
    nrows = -(-len(ks) // ncols)
    fig, axes = figure(nrows, ncols, squeeze=False)
    for ax, r, row in zip(axes.ravel(), rows, out):
        mean = [np.mean([o["curves"][j] for o in row], axis=0) for j in range(3)]
        t = 10 * np.arange(len(mean[0]))
        for curve, name in zip(mean, ("FLUTE", "FedRep", "FedRep(RI)")):
            line, = ax.plot(t, curve, label=name)
            if name != "FedRep(RI)":                        # the early check compares round 10
                ax.plot(t[1], curve[1], "o", color=line.get_color(), ms=4)
        ax.axhline(1.01 * r["plateau_fedrep"], color="k", ls="--", lw=0.8, label="1.01 x FedRep plateau")
        ax.set_title(f"k = {r['k']}: late {'ok' if r['late_ok'] else 'FAILS'}, "
                     f"early {'ok' if r['early_ok'] else 'FAILS'} ({len(row)} seeds)", fontsize=8)
        ax.set_xlabel("round"), ax.set_ylabel("(1/M) sum ||B w_i - phi_i||")
    for ax in axes.ravel()[len(ks):]:
        ax.set_visible(False)
    axes[0, 0].legend(fontsize=7)
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"k={r['k']}: plateau FLUTE {r['plateau_flute']:.3f} vs FedRep "
                                      f"{r['plateau_fedrep']:.3f}, round-10 error {r['error_round10_flute']:.2f}"
                                      f" vs {r['error_round10_fedrep']:.2f}" for r in rows),
                    measured={"rows": rows, "late_ok": all(r["late_ok"] for r in rows),
                              "early_ok": all(r["early_ok"] for r in rows),
                              "iii_gap_decreasing_in_k (reported)": bool(np.all(np.diff(gaps) <= 0))
                              if len(gaps) > 1 else None},
                    table=rows,
                    predicted={"plateau": "FLUTE <= FedRep (+1%)", "early": "FedRep < FLUTE",
                               "(ii) rounds FLUTE < FedRep(RI), reported": True,
                               "(iii) gap decreasing in k, reported": True},
                    figure=ctx.save_figure(fig, title="error to the truth per k (dots: round 10)"),
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
def _task_erm(seed, *, k, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=k, samples_per_client=20, noise=NOISE, seed=rng)
    tr = algorithm(p, 2000, ETA, data="fixed", record_every=2000, seed=rng)
    erm = ex.altmin_erm(p.X, p.y, k, seed=rng)
    Zn, _ = ex.nuclear_relaxation_estimate(p.X, p.y, k, 0.3)
    if tr.status == "diverged":
        return {"rel": np.inf, "obj_gap": np.inf, "nuc_dist": np.nan, "erm_status": erm.status}
    BW = tr.B @ tr.heads.T
    f = ex.flute_objective(tr.B, tr.heads, p.X, p.y, gamma1=0.0, gamma2=0.0)
    return {"rel": float(np.linalg.norm(BW - erm.Z) / np.linalg.norm(erm.Z)),
            "obj_gap": float(f - erm.objective), "erm_status": erm.status,
            "flute_dist": float(tr.distance[-1]),
            "nuc_dist": float(np.linalg.norm(Zn - BW) / np.linalg.norm(BW))}


@claim("flute.alg1.empirical_erm", paper=PAPER,
       reference="Remark 4.1 applied to the empirical eq. (4) (gamma1 = 2 gamma2)",
       statement="With a fixed dataset reused every round and gamma1 = 2 gamma2, FLUTE from a small "
                 "random init converges to the empirical rank-k ERM (computed independently by "
                 "alternating least squares with restarts).",
       kind="comparison")
def _c_erm(ctx, *, algorithm=flute):
    ks = ctx.pick([2], [2, 4], [2, 4, 6])
    out = ctx.map(_task_erm, [{"k": k, "algorithm": algorithm} for k in ks],
                  replicates=ctx.pick(2, 4, 10))
    flat = [o for row in out for o in row]
    rel = max(o["rel"] for o in flat)
    ogap = max(abs(o["obj_gap"]) for o in flat)
    # 1e-6: both iterations converge linearly to ~1e-12; 1e-6 leaves margin for slow instances.
    passed = bool(rel < 1e-6 and ogap < 1e-8 and all(o["erm_status"] == "optimal" for o in flat))
    n_match = sum(o["rel"] < 1e-6 for o in flat)
    fig, ax = figure()
    ax.bar(["FLUTE vs AltMin", "FLUTE vs nuclear-norm (mu=0.3)"],
           [max(rel, 1e-17), float(np.nanmean([o["nuc_dist"] for o in flat]))])
    ax.set_yscale("log"), ax.set_ylabel("relative distance of BW")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"FLUTE's BW equals the AltMin ERM in {n_match}/{len(flat)} instances; worst "
                            f"rel. distance {rel:.1e}, worst objective gap {ogap:.1e}",
                    measured={"max_rel_distance": rel, "max_objective_gap": ogap, "n_match": n_match,
                              "objective_gaps": [o["obj_gap"] for o in flat],
                              "nuclear_relaxation_rel_distance": [o["nuc_dist"] for o in flat]},
                    predicted={"rel_distance": 0.0},
                    figure=ctx.save_figure(fig, title="FLUTE's BW vs AltMin and nuclear"),
                    notes="d = 10, M = 15, N = 20, noise variance 0.3, 2000 rounds at eta = 0.03. The "
                          "nuclear-norm relaxation (truncated to rank k) is a different estimator; its "
                          "distance is reported, not judged. The empirical objective is non-convex: in "
                          "pilots at full scale FLUTE ended at spurious local minima in about 1/3 of the "
                          "k = 4, 6 instances (and one k = 2 instance: objective 34.29 vs ERM 29.28, stable "
                          "under perturbation), so the paper's small-init global convergence (Remark 4.1) "
                          "does not carry over to a reused finite dataset.")
