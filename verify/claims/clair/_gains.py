"""CLAIR claims, group F (oracle part): the oracle gain identity of Theorem 4 and the OLS error law
(Theorem 4 and its OLS instance).

These need no optimisation: the true projector P_A and collaborative set C are plugged into the
refinement (9), and Monte Carlo over the estimation errors Xi_k checks the exact identities
within Monte Carlo error. Bands are 3 standard errors, Bonferroni-adjusted over the cells of a
claim so that the family-wise false-alarm rate is that of a single 3-s.e. test (0.27%).
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from lowrank_fl.clair.simulate import generate, simulate

from ...claim import Evidence, claim, verdict_from

__all__: list[str] = []


def _library_refine_closed(W_hat, P, keep):
    """The library's closed form (S4.3) of the refinement (9) (cheap: O(K q p^2); its equality with
    the literal (9) is the claim ``clair.eqS43.closed_form``)."""
    from lowrank_fl.clair.pipeline import refine_closed_form

    return np.asarray(refine_closed_form(W_hat, P, keep))


def _n_se(cells: int, single: float = 3.0) -> float:
    """Bonferroni-adjusted number of standard errors with the family-wise level of one 3-s.e. test."""
    alpha = 2 * stats.norm.sf(single)
    return float(stats.norm.isf(alpha / (2 * cells)))


def _true_projector(inst, rng):
    return np.asarray(inst.projector)


def _wrong_projector(inst, rng):
    """Broken variant: a random projector of the right rank instead of P_A."""
    V = np.linalg.qr(rng.standard_normal((inst.p, inst.rank)))[0]
    return V @ V.T


def _refine_batch(refine_fn, W_hat, P, keep, chunk=100):
    """Apply a (K, q, p) refinement to a batch (n, K, q, p) of replicates.

    (9) acts on each of the q rows separately (right multiplication by P_Ahat and averages over
    clients), so replicates can be stacked along the row axis: one call per ``chunk`` replicates.
    """
    n, K, q, p = W_hat.shape
    out = np.empty_like(W_hat)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        stacked = np.swapaxes(W_hat[a:b], 0, 1).reshape(K, (b - a) * q, p)
        res = np.asarray(refine_fn(stacked, P, keep)).reshape(K, b - a, q, p)
        out[a:b] = np.swapaxes(res, 0, 1)
    return out


def _task_oracle_gain(seed, m, r, p, q, tau, n_mc, refine_fn, projector_fn):
    """Benign MSE ratio E||Wtilde - W||^2 / E||What - W||^2 per replicate (mean over the |C| clients).

    All K = |C| clients are benign (the refinement of a benign client depends only on C); the
    denominator q p tau^2 is exact for Xi_k ~ N(0, tau^2 I).
    """
    rng = np.random.default_rng(seed)
    inst = generate(n_clients=m, p=p, q=q, rank=r, contaminated=0, seed=rng)
    P = projector_fn(inst, rng)
    W = np.asarray(inst.W)
    W_hat = W + tau * rng.standard_normal((n_mc,) + W.shape)
    Wt = _refine_batch(refine_fn, W_hat, P, np.ones(m, dtype=bool))
    return np.mean(np.sum((Wt - W) ** 2, axis=(2, 3)), axis=1) / (q * p * tau ** 2)


@claim("clair.thm4.oracle_gain", paper="clair", reference="Theorem 4, eq. (32) (iid, evenly distributed case)",
       statement="With P_Ahat = P_A and Chat = C, iid isotropic errors give E||Wtilde - W||^2 = "
                 "[1 - (|C|-1)(p-r)/(|C|p)] E||What - W||^2 (1/|C| law; lower r, larger gain).",
       kind="identity")
def _oracle_gain(ctx, *, refine_fn=_library_refine_closed, projector_fn=_true_projector):
    p, tau = 16, 0.5
    Cs = ctx.pick(smoke=[2, 5], quick=[2, 3, 5, 10], full=[2, 3, 5, 10, 20])
    rs = ctx.pick(smoke=[2], quick=[1, 4], full=[1, 2, 4, 8])
    n_mc = ctx.pick(smoke=1000, quick=4000, full=5000)
    grid = [{"m": m, "r": r, "p": p, "q": r + 1, "tau": tau, "n_mc": n_mc, "refine_fn": refine_fn,
             "projector_fn": projector_fn} for r in rs for m in Cs]
    out = ctx.map(_task_oracle_gain, grid, replicates=ctx.pick(1, 2, 4))
    n_se = _n_se(len(grid))
    rows, ok = [], []
    for g, reps in zip(grid, out):
        x = np.concatenate(reps)
        mean, se = float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size))
        pred = 1 - (g["m"] - 1) * (p - g["r"]) / (g["m"] * p)
        good = abs(mean - pred) <= n_se * se
        ok.append(good)
        rows.append({"|C|": g["m"], "r": g["r"], "measured": mean, "s.e.": se, "predicted": pred,
                     "z": (mean - pred) / se, "within band": bool(good)})
    passed = all(ok)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for r in rs:
        sel = [row for row in rows if row["r"] == r]
        ms = [row["|C|"] for row in sel]
        ax.errorbar(ms, [row["measured"] for row in sel], yerr=[3 * row["s.e."] for row in sel], fmt="o",
                    label=f"r={r}")
        mm = np.linspace(min(Cs), max(Cs), 100)
        ax.plot(mm, 1 - (mm - 1) * (p - r) / (mm * p), "-", color=ax.lines[-1].get_color() if ax.lines else None)
    ax.set_xlabel("|C|")
    ax.set_ylabel("MSE(Wtilde)/MSE(What)")
    ax.legend()
    fig_path = ctx.save_figure(fig)
    zmax = max(abs(row["z"]) for row in rows)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"{sum(ok)}/{len(ok)} cells within {n_se:.2f} s.e. of 1-(|C|-1)(p-r)/(|C|p) "
                            f"(max |z| = {zmax:.2f})",
                    measured={"ratio": [row["measured"] for row in rows]},
                    predicted={"ratio": [row["predicted"] for row in rows]}, table=rows, figure=fig_path,
                    notes=f"p={p}, q=r+1, tau={tau}; band = {n_se:.2f} s.e. (3 s.e. Bonferroni-adjusted over "
                          f"{len(grid)} cells).")


def _task_heterogeneous(seed, taus, r, p, q, n_mc, refine_fn, projector_fn):
    rng = np.random.default_rng(seed)
    taus = np.asarray(taus, float)
    m = taus.size
    inst = generate(n_clients=m, p=p, q=q, rank=r, contaminated=0, seed=rng)
    P = projector_fn(inst, rng)
    W = np.asarray(inst.W)
    Xi = taus[:, None, None] * rng.standard_normal((n_mc,) + W.shape)
    Wt = _refine_batch(refine_fn, W + Xi, P, np.ones(m, dtype=bool))
    return {"tilde": np.sum((Wt - W) ** 2, axis=(2, 3)), "local": np.sum(Xi ** 2, axis=(2, 3))}


@claim("clair.thm4.heterogeneous", paper="clair", reference="Theorem 4, eqs. (29)-(32), (S4.5)",
       statement="With heterogeneous error levels, MSE(Wtilde_k) = E_A^(k) + |C|^-2 sum_j E_Aperp^(j) = "
                 "(1 - phi_k theta_k) E^(k); phi_k < 0 for a low-noise client (negative transfer).",
       kind="identity")
def _heterogeneous(ctx, *, refine_fn=_library_refine_closed, projector_fn=_true_projector):
    p, q, r = 8, 3, 2
    taus = np.array([0.1, 1.0, 1.0, 1.0, 1.0])
    n_mc = ctx.pick(smoke=400, quick=3000, full=20000)
    out = ctx.map(_task_heterogeneous, [{"taus": taus.tolist(), "r": r, "p": p, "q": q, "n_mc": n_mc,
                                         "refine_fn": refine_fn, "projector_fn": projector_fn}],
                  replicates=ctx.pick(1, 2, 2))[0]
    tilde = np.concatenate([o["tilde"] for o in out])
    local = np.concatenate([o["local"] for o in out])
    m = taus.size
    E = q * p * taus ** 2
    EA, Eperp = q * r * taus ** 2, q * (p - r) * taus ** 2
    pred = EA + Eperp.sum() / m ** 2
    theta = Eperp / E
    phi = (Eperp - Eperp.sum() / m ** 2) / Eperp
    n_se = _n_se(m + 1)
    mean = tilde.mean(axis=0)
    se = tilde.std(axis=0, ddof=1) / np.sqrt(tilde.shape[0])
    ident_ok = np.abs(mean - pred) <= n_se * se
    # negative transfer for client 0: E||Wtilde_0 - W_0||^2 - E||What_0 - W_0||^2 > 0, significantly
    diff = tilde[:, 0] - local[:, 0]
    d_mean, d_se = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))
    neg = d_mean > n_se * d_se and phi[0] < 0
    passed = bool(np.all(ident_ok) and neg)
    rows = [{"client": k, "tau_k": float(taus[k]), "measured": float(mean[k]), "s.e.": float(se[k]),
             "predicted": float(pred[k]), "(1-phi theta) E": float((1 - phi[k] * theta[k]) * E[k]),
             "phi_k": float(phi[k]), "ratio to local": float(mean[k] / E[k])} for k in range(m)]
    return Evidence(verdict=verdict_from(passed),
                    summary=f"identity within {n_se:.2f} s.e. for {int(ident_ok.sum())}/{m} clients; low-noise "
                            f"client: phi = {phi[0]:.1f}, MSE ratio {mean[0] / E[0]:.2f} > 1 (negative transfer: {neg})",
                    measured={"mse_tilde": mean.tolist(), "excess_client0": d_mean},
                    predicted={"mse_tilde": pred.tolist(), "phi": phi.tolist()}, table=rows)


# --------------------------------------------------------------------------------------------
# Item 27: OLS local error q p / (n - p - 1) and theta = (p - r)/p
# --------------------------------------------------------------------------------------------
def _ols(inst):
    return np.asarray(inst.W_hat)


def _shrunk_ols(inst):
    """Broken variant: a biased (shrunken) local estimator."""
    return 0.9 * np.asarray(inst.W_hat)


def _task_ols(seed, p, q, n, K, r, estimator):
    inst = simulate(p=p, q=q, n_clients=K, samples_per_client=n, rank=r, seed=seed)
    Xi = estimator(inst) - np.asarray(inst.W)
    Pp = np.eye(p) - np.asarray(inst.projector)
    total = np.sum(Xi ** 2, axis=(1, 2))
    perp = np.sum((Xi @ Pp) ** 2, axis=(1, 2))
    return {"total": float(total.mean()), "perp_minus": float((perp - (p - r) / p * total).mean())}


@claim("clair.sec6.ols_error", paper="clair", reference="§6 (error decomposition (29)-(30)); §7 Local column",
       statement="For OLS with X ~ N(0,1), n > p+1 and noise covariance of trace q, E||What - W||_F^2 = "
                 "qp/(n-p-1) and theta = E||Xi P_Aperp||^2 / E||Xi||^2 = (p-r)/p.", kind="identity")
def _ols_error(ctx, *, estimator=_ols):
    configs = ctx.pick(smoke=[(10, 10, 100)], quick=[(10, 10, 100), (20, 20, 150)],
                       full=[(10, 10, 100), (20, 20, 150), (50, 50, 300)])
    reps = ctx.pick(smoke=20, quick=100, full=400)
    grid = [{"p": p, "q": q, "n": n, "K": 5, "r": 2, "estimator": estimator} for p, q, n in configs]
    out = ctx.map(_task_ols, grid, replicates=reps)
    n_se = _n_se(2 * len(grid))
    rows, ok = [], []
    for g, row in zip(grid, out):
        tot = np.array([o["total"] for o in row])
        pm = np.array([o["perp_minus"] for o in row])
        pred = g["q"] * g["p"] / (g["n"] - g["p"] - 1)
        m1, s1 = tot.mean(), tot.std(ddof=1) / np.sqrt(tot.size)
        m2, s2 = pm.mean(), pm.std(ddof=1) / np.sqrt(pm.size)
        good = abs(m1 - pred) <= n_se * s1 and abs(m2) <= n_se * s2
        ok.append(good)
        rows.append({"(p,q,n)": f"({g['p']},{g['q']},{g['n']})", "local MSE": float(m1), "s.e.": float(s1),
                     "qp/(n-p-1)": pred, "rel. diff": float(m1 / pred - 1),
                     "theta": float(m2 / m1 + (g["p"] - 2) / g["p"]), "(p-r)/p": (g["p"] - 2) / g["p"],
                     "within band": bool(good)})
    return Evidence(verdict=verdict_from(all(ok)),
                    summary="; ".join(f"{row['(p,q,n)']}: {row['local MSE']:.3f} vs {row['qp/(n-p-1)']:.3f}"
                                      for row in rows) + f" (band {n_se:.2f} s.e.)",
                    measured={"local": [row["local MSE"] for row in rows], "theta": [row["theta"] for row in rows]},
                    predicted={"local": [row["qp/(n-p-1)"] for row in rows],
                               "theta": [row["(p-r)/p"] for row in rows]}, table=rows)
