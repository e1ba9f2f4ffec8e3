"""FLUTE's regularization gamma: the closed-form limit of eq. (4), the divergence boundary of App. C
(erratum) and the small-N ablation of Fig. 4."""
from __future__ import annotations

import numpy as np

from lowrank_fl.algorithms.flute import flute, flute_init
from lowrank_fl.exact import flute as ex
from lowrank_fl.problems.underparameterized import underparameterized
from verify.claim import Evidence, claim, verdict_from
from verify.convergence import expected_non_convergence
from verify.criteria import proportion_interval, reaches_proportion
from verify.stats import mean_ci

from ._support import ETA, NOISE, PAPER, figure


# =============================================================================================
# C12  gamma: closed-form limit, divergence boundary (erratum), small-N ablation (Fig. 4)
# =============================================================================================
GAMMAS = [(0.25, 0.125, "appendix"), (0.125, 0.125, "appendix"), (1 / 12, 0.125, "appendix"),
          (0.3, 0.125, "appendix"), (0.5, 0.125, "appendix"), (0.25, 0.125, "main"),
          (0.125, 0.125, "main")]


def _task_limit(seed, *, g1, g2, normalization, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng)
    tr = algorithm(p, 1500, ETA, gamma1=g1, gamma2=g2, normalization=normalization,
                   record_every=1500, seed=rng)
    Z = ex.regularized_minimizer(p.Phi, 2, gamma1=g1, gamma2=g2, normalization=normalization)
    if tr.status == "diverged":
        return {"err": np.inf, "scale": np.nan}
    BW = tr.B @ tr.heads.T
    return {"err": float(np.linalg.norm(BW - Z) / np.linalg.norm(Z)),
            "scale": float(np.sum(BW * p.target) / np.sum(p.target ** 2))}


@claim("flute.eq4.regularized_limit", paper=PAPER, reference="eq. (4) (population minimizer a/(a + 2 g2 - g1) Phi_k)",
       statement="Population FLUTE converges to Phi_k / (1 + 2(2 gamma2 - gamma1)) (appendix; "
                 "Phi_k / (1 + 2 gamma2 - gamma1) main) whenever the objective is bounded below.",
       kind="identity")
def _c12a(ctx, *, algorithm=flute):
    gam = ctx.pick(GAMMAS[:2] + GAMMAS[3:4], GAMMAS, GAMMAS)
    out = ctx.map(_task_limit, [{"g1": a, "g2": b, "normalization": n, "algorithm": algorithm}
                                for a, b, n in gam], replicates=ctx.pick(1, 3, 5))
    rows = [{"gamma1": a, "gamma2": b, "normalization": n,
             "predicted_scale": ex.data_weight(n) / (ex.data_weight(n) + 2 * b - a),
             "measured_scale": float(np.mean([o["scale"] for o in row])),
             "max_rel_error": max(o["err"] for o in row)} for (a, b, n), row in zip(gam, out)]
    worst = max(r["max_rel_error"] for r in rows)
    passed = worst < 1e-8                                  # 1e-8: closed form vs iteration
    fig, ax = figure()
    ax.plot([r["predicted_scale"] for r in rows], [r["measured_scale"] for r in rows], "o")
    ax.plot([0.7, 2.1], [0.7, 2.1], "k:")
    ax.set_xlabel("predicted scale a/(a + 2 g2 - g1)"), ax.set_ylabel("measured <BW, Phi_k>/||Phi_k||^2")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"limit equals the scaled Phi_k to {worst:.1e} relative (< 1e-8)",
                    measured={"rows": rows}, predicted={"rel_error": 0.0}, table=rows,
                    figure=ctx.save_figure(fig, title="limit scale: measured vs predicted"))


def _task_boundary(seed, *, g1, normalization, eta, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=15, rank=2, seed=rng)
    with expected_non_convergence():   # divergence is an outcome the claim reports
        tr = algorithm(p, 1500, eta, gamma1=g1, gamma2=0.125, normalization=normalization,
                       record_every=1500, seed=rng)
    if tr.status == "diverged":
        return {"diverged": True, "err": np.nan}
    if ex.is_unbounded(g1, 0.125, normalization=normalization):
        return {"diverged": False, "err": np.inf}        # no minimizer to converge to
    Z = ex.regularized_minimizer(p.Phi, 2, gamma1=g1, gamma2=0.125, normalization=normalization)
    return {"diverged": False, "err": float(np.linalg.norm(tr.B @ tr.heads.T - Z) / np.linalg.norm(Z))}


def _task_boundary_finite(seed, *, g1, N, rounds, algorithm):
    """App. C's own setting (the Fig. 4 instance): fixed data, d = 10, k = 6, M = 10, N samples."""
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=10, rank=6, samples_per_client=N, noise=NOISE, seed=rng)
    init = flute_init(d=10, rank=6, n_clients=10, init_scale=0.01, seed=rng)
    with expected_non_convergence():   # the divergence is the finding the criterion counts
        tr = algorithm(p, rounds, ETA, gamma1=g1, gamma2=0.125, data="fixed", init=init,
                       record_every=rounds)
    return {"diverged": tr.status == "diverged"}


@claim("flute.appC.gamma_boundary", paper=PAPER, reference="App. C (Fig. 4 discussion), eq. (4)",
       statement="App. C: 'We do not set gamma1 > 2 gamma2 because ... ||BW||_F usually diverges'. In App. C's "
                 "finite-sample runs (fixed data, the Fig. 4 instance) FLUTE with 2 gamma2 < gamma1 < 2 gamma2 + a "
                 "diverges in most runs. (Reported beside it: the population objective is bounded there and "
                 "FLUTE converges to an inflated Phi_k; it diverges only for gamma1 >= 2 gamma2 + a.)",
       kind="phase transition")
def _c12b(ctx, *, algorithm=flute):
    # judged: the setting the remark is about (finite samples, N <= d as in Fig. 4)
    fin_cases = [(0.3, 8), (0.5, 8), (0.3, 10), (0.5, 10)]
    rounds = ctx.pick(500, 1500, 2500)
    fin = ctx.map(_task_boundary_finite, [{"g1": g, "N": N, "rounds": rounds, "algorithm": algorithm}
                                          for g, N in fin_cases], replicates=ctx.pick(2, 5, 10))
    n_div = sum(o["diverged"] for row in fin for o in row)
    n_fin = sum(len(row) for row in fin)
    low, high = proportion_interval(n_div, n_fin)
    passed = reaches_proportion(n_div, n_fin, 0.5)         # "usually": more than half of the runs
    fin_rows = [{"gamma1": g, "N": N, "diverged": sum(o["diverged"] for o in row), "runs": len(row)}
                for (g, N), row in zip(fin_cases, fin)]
    # reported (extension): the population boundary is 2 gamma2 + a, not 2 gamma2
    cases = [(0.3, "appendix", ETA), (0.5, "appendix", ETA), (0.8, "appendix", ETA),
             (1.0, "appendix", ETA)]
    if ctx.scale != "smoke":
        cases += [(0.5, "main", 0.01), (1.0, "main", 0.005), (1.5, "main", 0.005)]
    out = ctx.map(_task_boundary, [{"g1": g, "normalization": n, "eta": e, "algorithm": algorithm}
                                   for g, n, e in cases], replicates=ctx.pick(1, 2, 5))
    rows = []
    for (g, n, e), row in zip(cases, out):
        rows.append({"gamma1": g, "normalization": n,
                     "paper_says_diverges": g > ex.divergence_boundary(0.125, statement="paper"),
                     "correct_boundary_says_diverges": ex.is_unbounded(g, 0.125, normalization=n),
                     "diverged": all(o["diverged"] for o in row),
                     "converged_to_closed_form": all((not o["diverged"]) and o["err"] < 1e-6 for o in row)})
    counter = [r for r in rows if r["paper_says_diverges"] and not r["correct_boundary_says_diverges"]]
    fig, ax = figure()
    ax.scatter([r["gamma1"] for r in rows], [r["normalization"] == "main" for r in rows],
               c=["red" if r["diverged"] else "green" for r in rows], label="population")
    ax.scatter([r["gamma1"] for r in fin_rows], [-1] * len(fin_rows),
               c=["red" if r["diverged"] > r["runs"] / 2 else "green" for r in fin_rows], marker="s")
    ax.axvline(0.25, color="k", ls=":", label="paper: 2 gamma2")
    ax.axvline(0.75, color="b", ls="--", label="population, appendix: 2 gamma2 + 1/2")
    ax.set_xlabel("gamma1 (gamma2 = 1/8); red: diverged"), ax.legend(fontsize=7)
    ax.set_yticks([-1, 0, 1], ["finite (App. C)", "population", "population (main)"])
    return Evidence(verdict=verdict_from(passed),
                    summary=f"App. C's finite-sample setting: {n_div}/{n_fin} runs with 2 gamma2 < gamma1 < "
                            f"2 gamma2 + a diverge (95% interval [{low:.2f}, {high:.2f}], 'usually' = > 1/2); "
                            f"population (reported): {sum(r['converged_to_closed_form'] for r in counter)}/"
                            f"{len(counter)} such settings converge to the inflated closed form",
                    measured={"finite_rows": fin_rows, "diverged_fraction_ci": [low, high],
                              "population_rows": rows}, table=fin_rows + rows,
                    predicted={"finite": "most runs diverge (App. C)", "population_boundary_appendix": 0.75,
                               "population_boundary_main": 1.25},
                    figure=ctx.save_figure(fig),
                    notes="The remark is about App. C's finite-sample runs, where it holds; no erratum. "
                          "Population runs (gamma2 = 1/8; main normalization at smaller eta) show that the "
                          "objective itself is bounded up to gamma1 < 2 gamma2 + a: the divergence in the "
                          "finite-sample runs comes from the data term (N <= d), an extension finding that "
                          "is reported, not judged.")


def _task_ablation(seed, *, N, ratios, rounds, algorithm):
    rng = np.random.default_rng(seed)
    p = underparameterized(d=10, n_clients=10, rank=6, samples_per_client=N, noise=NOISE, seed=rng)
    init = flute_init(d=10, rank=6, n_clients=10, init_scale=0.01, seed=rng)
    res = []
    for r in ratios:
        tr = algorithm(p, rounds, ETA, gamma1=r * 0.125, gamma2=0.125, data="fixed",
                       init=init, record_every=rounds)
        res.append(float(tr.extra["error_truth"][-1]) if tr.status != "diverged" else np.inf)
    return res


@claim("flute.fig4.gamma_ablation", paper=PAPER, reference="Figure 4 (App. C)",
       statement="For N in {8, 9, 10} (d = 10, k = 6, M = 10), gamma1 = gamma2 gives a lower final "
                 "error than gamma1 = 2 gamma2 and gamma1 = (2/3) gamma2.", kind="comparison")
def _c12c(ctx, *, algorithm=flute):
    Ns = ctx.pick([8], [8, 10], [8, 9, 10])
    ratios = (2.0, 1.0, 2 / 3)
    rounds = ctx.pick(500, 1500, 2500)
    out = ctx.map(_task_ablation, [{"N": N, "ratios": ratios, "rounds": rounds, "algorithm": algorithm}
                                   for N in Ns], replicates=ctx.pick(3, 10, 20))
    rows, verdicts = [], []
    for N, row in zip(Ns, out):
        E = np.array(row)                                    # (reps, 3)
        d_hi = E[:, 0] - E[:, 1]                             # 2 g2 minus g2 (> 0: g2 better)
        d_lo = E[:, 2] - E[:, 1]
        m_hi, h_hi = mean_ci(d_hi)
        m_lo, h_lo = mean_ci(d_lo)
        if m_hi - h_hi > 0 and m_lo - h_lo > 0:
            verdicts.append(True)
        elif m_hi + h_hi < 0 or m_lo + h_lo < 0:
            verdicts.append(False)
        else:
            verdicts.append(None)
        rows.append({"N": N, "err_g1=2g2": float(E[:, 0].mean()), "err_g1=g2": float(E[:, 1].mean()),
                     "err_g1=2g2/3": float(E[:, 2].mean()), "diff_2g2_minus_g2": [float(m_hi), float(h_hi)],
                     "diff_2g2/3_minus_g2": [float(m_lo), float(h_lo)]})
    passed = False if False in verdicts else (None if None in verdicts else True)
    fig, ax = figure()
    for j, lab in enumerate(("g1=2g2", "g1=g2", "g1=2g2/3")):
        ax.plot(Ns, [np.mean(np.array(row)[:, j]) for row in out], "o-", label=lab)
    ax.set_xlabel("N"), ax.set_ylabel("final (1/M) sum ||B w_i - phi_i||"), ax.legend()
    return Evidence(verdict=verdict_from(passed),
                    summary="; ".join(f"N={r['N']}: {r['err_g1=2g2']:.2f} / {r['err_g1=g2']:.2f} / "
                                      f"{r['err_g1=2g2/3']:.2f} (2g2 / g2 / 2g2/3)" for r in rows),
                    measured={"rows": rows}, table=rows,
                    predicted={"best": "gamma1 = gamma2"},
                    figure=ctx.save_figure(fig, title="final error vs N per gamma1/gamma2"),
                    notes="gamma2 = 1/8 (absolute values not given by the paper), fixed dataset, "
                          f"{rounds} rounds at eta = 0.03, same init for the three gammas; paired "
                          "differences with 95% t-intervals decide (inconclusive when they straddle 0). "
                          "With N < d and gamma1 = 2 gamma2 the error keeps growing slowly (over-fitting "
                          "towards the empirical ERM), so the ranking only sharpens with more rounds.")
