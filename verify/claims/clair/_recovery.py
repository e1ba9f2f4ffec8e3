"""CLAIR claims, groups B-D: noiseless exact recovery (Theorem 1), oracle and dual certificates
(Lemmas S1, S3, S7, Prop. S1), and Algorithm 1 / FISTA against CVXPY on program (7),
plus the "vacuous window" erratum (window (25) of Theorem 1 is empty for the model-induced L0).

Exact references: CVXPY with Clarabel (interior point, ~1e-8 accuracy) on small instances and, inside
Theorem 1's window (K = 40, q = 39), on the exactly block-reduced program (:func:`block_reduce`); the
smooth reduced oracle (L-BFGS-B, Lemma S3 residual ~1e-8) for the certificate at K = 40.
"""
from __future__ import annotations

import warnings

import numpy as np

from lowrank_fl.clair.certificate import build_certificate, lemma_s3_residual, rho_prime
from lowrank_fl.clair.contrasts import contrasts
from lowrank_fl.clair.oracle import solve_oracle_smooth
from lowrank_fl.clair.pipeline import collaborative_set
from lowrank_fl.clair.programs import solve_noiseless, solve_oracle
from lowrank_fl.clair.penalized import solve_penalized
from lowrank_fl.clair.simulate import generate
from lowrank_fl.linalg import block_norms

from ...claim import Evidence, claim, verdict_from
from ...criteria import all_judged
from ...conditions.clair import equal_leverage_instance, evaluate
from ...conditions.clair import generate as generate_condition_instance

__all__: list[str] = []

_SUCCESS_TOL = 1e-5      # ||P_Ahat - P_A||_op for "exact" with Clarabel (~1e-8 accuracy)
_RANK_REL = 1e-6         # numerical rank: sigma_i > 1e-6 ||D0||_op (never relative to sigma_1(Lhat))


def _proj(Vt, r):
    V = np.asarray(Vt)[:r].T
    return V @ V.T


def _cond(conds, name_start):
    return next(c for c in conds if c.name.startswith(name_start))


# --------------------------------------------------------------------------------------------
# Erratum: the window (25) is empty on the §7 design
# --------------------------------------------------------------------------------------------
def _task_window(seed, design, K, p, q, r):
    inst = generate_condition_instance(seed, design=design, n_clients=K, p=p, q=q, rank=r)
    conds = evaluate(inst)
    return {"x": float(_cond(conds, "x =").value), "mu": float(_cond(conds, "mu").value),
            "mu_floor_ok": bool(_cond(conds, "mu").holds), "window": _cond(conds, "window").value,
            "s": int(_cond(conds, "s =").value), "G": K * (K - 1) // 2}


@claim("clair.thm1.window_vacuous", paper="clair", reference="Theorem 1 window (25), Theorem 2 (27), §7 "
       "(Block-IC forces mu >= G/(G-s))",
       statement="Because Block-IC forces mu >= G/(G-s), the window (25) needs r s/(G-s) < 1/16: it is empty on "
                 "every §7 configuration (40% contaminated), so Theorems 1-2 say nothing about the paper's "
                 "own simulation (a scope remark: the paper never claims that §7 satisfies the theorem).",
       kind="remark")
def _window_vacuous(ctx, *, design="sec7"):
    configs = ctx.pick(smoke=[(10, 10, 5)], quick=[(10, 10, K) for K in (5, 10, 20)] + [(20, 20, 10)],
                       full=[(p, p, K) for p in (10, 20, 50) for K in (5, 10, 20)])
    if design == "equal-leverage":     # a hand-built instance inside the window (used to show the check can fail)
        configs = [(4, 39, 40)]
    reps = ctx.pick(smoke=1, quick=3, full=5)
    out = ctx.map(_task_window, [{"design": design, "K": K, "p": p, "q": q, "r": 1 if design == "equal-leverage"
                                  else 2} for p, q, K in configs], replicates=reps)
    rows = []
    for (p, q, K), row in zip(configs, out):
        G, s = row[0]["G"], row[0]["s"]
        r = 1 if design == "equal-leverage" else 2
        rows.append({"(p,q)": f"({p},{q})", "K": K, "s/G": s / G, "mu (min over reps)": min(o["mu"] for o in row),
                     "G/(G-s)": G / (G - s), "x (min)": min(o["x"] for o in row),
                     "x lower bound sqrt(r s/(G-s))": float(np.sqrt(r * s / (G - s))),
                     "window empty in all reps": all(o["window"] is None for o in row),
                     "mu >= G/(G-s) in all": all(o["mu_floor_ok"] for o in row)})
    confirmed = all(r["window empty in all reps"] and r["mu >= G/(G-s) in all"] for r in rows)
    xmin = min(r["x (min)"] for r in rows)
    return Evidence(verdict=verdict_from(confirmed),
                    summary="scope remark, not an erratum (the paper never claims §7 lies in the window): "
                            f"window (25) empty in {sum(r['window empty in all reps'] for r in rows)}/{len(rows)} "
                            f"configurations; smallest x = {xmin:.2f} vs ab/(1+a)^2 = 0.2475 (a = b = 0.99)",
                    measured={"x_min": xmin}, predicted={"x needed": "< 0.2475"}, table=rows,
                    notes="Nonempty windows need about one contaminated client and K >= 35 (r = 1, perfectly "
                          "spread leverage; see verify.conditions.clair.equal_leverage_instance).")


# --------------------------------------------------------------------------------------------
# Theorem 1: exact recovery (CVXPY grid outside the window; certificate inside it)
# --------------------------------------------------------------------------------------------
def _oracle_smooth(D0, q, A, I, lam_L, lam_S):
    return solve_oracle_smooth(D0, q, A, I, lam_L, lam_S)


def _oracle_early_stop(D0, q, A, I, lam_L, lam_S):
    """Broken variant: an oracle solve stopped after 2 iterations."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return solve_oracle_smooth(D0, q, A, I, lam_L, lam_S, max_iter=2)


def _oracle_unoptimized(D0, q, A, I, lam_L, lam_S):
    """Broken variant: the feasible but unoptimized point L = D0 P_A of (23) (its I-blocks keep the
    whole row(A) part of the contamination)."""
    from types import SimpleNamespace

    A = np.linalg.qr(np.asarray(A).T)[0].T
    L = D0 @ A.T @ A
    S = D0 - L
    S.reshape(-1, q, D0.shape[1])[~I] = 0.0
    _, sv, Vt = np.linalg.svd(L, full_matrices=False)
    return SimpleNamespace(L=L, S=S, singular_values=sv, Vt=Vt, objective=float("nan"))


def _detect_exact(D_hat, P, benign, K, q, p, tau_n) -> bool:
    """Theorem 3(i) with P_Ahat = P: vote (8) at alpha = 1/2 and threshold tau_n recovers C exactly?"""
    G = K * (K - 1) // 2
    norms = block_norms((np.asarray(D_hat) @ (np.eye(p) - P)).reshape(G, q, p))
    keep, _ = collaborative_set(norms, K, tau_n, 0.5)
    return bool(np.array_equal(keep, benign))


def _task_recovery_cell(seed, K, n_contam, r, q, p, ratios, tau_rel):
    """Outside-window grid: solve (24) with CVXPY at lam_S sqrt(s)/lam_L = c for each c in ratios."""
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=n_contam, seed=seed)
    D0 = np.asarray(inst.D0)
    P_A = np.asarray(inst.projector)
    s = inst.s
    scale = float(np.linalg.norm(D0, 2))
    res = []
    for c in ratios:                                   # c = lam_S sqrt(s) / lam_L, lam_L = 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sol = solve_noiseless(D0, q, 1.0, c / np.sqrt(s))
        rank = int(np.sum(sol.singular_values > _RANK_REL * scale))
        err = float(np.linalg.norm(_proj(sol.Vt, r) - P_A, 2))
        ok = rank == r and err < _SUCCESS_TOL
        # Theorem 3(i): any 0 <= tau_n < beta_min; numerically tau_n = 1e-4 ||D0||_op sits above the
        # solver's subspace error (< 1e-5, so benign blocks are < 1e-5 ||D0||) and far below beta_min
        detect = _detect_exact(inst.D_hat, _proj(sol.Vt, r), inst.benign, K, q, p, tau_rel * scale) if ok else None
        res.append({"ratio": c, "rank": rank, "err": err, "ok": ok, "detect": detect})
    conds = evaluate({"W_hat": np.asarray(inst.W_hat), "W": np.asarray(inst.W), "A": np.asarray(inst.A),
                      "benign": np.asarray(inst.benign), "r": r})
    return {"runs": res, "window": _cond(conds, "window").value, "s": s}


def block_reduce(D0, q: int) -> tuple[np.ndarray, int]:
    """Exact size reduction of program (24) by blockwise left rotations.

    With the thin SVD ``D0^(g) = U_g Sigma_g V_g^T`` (``U_g`` q x k, k = min(q, p)), (24) on
    ``D0' = blockdiag(U_g^T) D0`` has the same optimal value, and ``blockdiag(U_g) L'`` maps its
    optimizers to optimizers of (24) with the same row space: block-diagonal orthogonal maps keep
    both norms, and projecting any feasible (L, S) onto ``range(blockdiag(U_g))`` keeps it
    feasible without increasing either norm (a projection is a contraction for ||.||_* and for
    each ||.||_F). So P_Ahat of the reduced program is P_Ahat of (24).

    Parameters
    ----------
    D0 : ndarray, shape (G*q, p)
    q : int

    Returns
    -------
    D0_reduced : ndarray, shape (G*k, p)
    k : int
    """
    D0 = np.asarray(D0, dtype=float)
    p = D0.shape[1]
    blocks = D0.reshape(-1, q, p)
    U = np.linalg.svd(blocks, full_matrices=False)[0]           # (G, q, k)
    red = np.swapaxes(U, 1, 2) @ blocks                          # (G, k, p)
    return red.reshape(-1, p), red.shape[1]


def _noiseless_clarabel(D0, q, lam_L, lam_S):
    return solve_noiseless(D0, q, lam_L, lam_S, solver="CLARABEL")


def _noiseless_no_sparse(D0, q, lam_L, lam_S):
    """Broken variant: the feasible point L = D0, S = 0 of (24) returned without optimising."""
    from types import SimpleNamespace

    _, sv, Vt = np.linalg.svd(np.asarray(D0, dtype=float), full_matrices=False)
    return SimpleNamespace(L=np.asarray(D0, dtype=float), singular_values=sv, Vt=Vt)


def _task_in_window_cvxpy(seed, K, p, position, noiseless_fn, tau_rel):
    """Inside the window: solve (24) on the equal-leverage K = 40 instance (block-reduced, q 39 -> 4)."""
    inst = equal_leverage_instance(K, p, seed=seed)
    W, A, benign = inst["W"], inst["A"], inst["benign"]
    window = _cond(evaluate(inst), "window").value
    if window is None:
        return {"window": None}
    ratio = float(np.exp((1 - position) * np.log(window[0]) + position * np.log(window[1])))
    q = W.shape[1]
    D0 = np.asarray(contrasts(W))
    red, k = block_reduce(D0, q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = noiseless_fn(red, k, 1.0, ratio)
    scale = float(np.linalg.norm(D0, 2))
    a = A[0] / np.linalg.norm(A[0])
    P = _proj(sol.Vt, 1)
    rank = int(np.sum(np.asarray(sol.singular_values) > _RANK_REL * scale))
    err = float(np.linalg.norm(P - np.outer(a, a), 2))
    ok = rank == 1 and err < _SUCCESS_TOL
    detect = _detect_exact(D0, P, benign, K, q, W.shape[2], tau_rel * scale) if ok else None
    return {"window": window, "ratio": ratio, "rank": rank, "err": err, "ok": ok, "detect": detect}


def _task_certificate(seed, K, p, position, oracle_fn):
    inst = equal_leverage_instance(K, p, seed=seed)
    W, A, benign = inst["W"], inst["A"], inst["benign"]
    conds = evaluate(inst)
    window = _cond(conds, "window").value
    if window is None:
        return {"window": None}
    ratio = float(np.exp((1 - position) * np.log(window[0]) + position * np.log(window[1])))
    q = W.shape[1]
    j, k = np.triu_indices(K, 1)
    I = ~(benign[j] & benign[k])
    D0 = contrasts(W)
    lam_L = 1.0
    ora = oracle_fn(D0, q, A, I, lam_L, ratio * lam_L)
    cert = build_certificate(ora.L, ora.S, I, q, 1, lam_L, ratio * lam_L)
    return {"window": window, "ratio": ratio, "a_hat": cert.a_hat, "b_hat": cert.b_hat,
            "rho_prime": cert.rho_prime, "tangent": cert.tangent_residual, "support": cert.support_residual,
            "valid": cert.valid(0.99, 0.99, rtol=1e-6)}


@claim("clair.thm1.exact_recovery", paper="clair", reference="Theorem 1, eq. (26); Prop. S1 / Lemmas S4-S5; "
       "Theorem 3(i)",
       statement="With delta = 0 and lam_S/lam_L in window (25), every optimizer of (24) has P_Ahat = P_A "
                 "(rank r); then tau_n below beta_min recovers C exactly.", kind="phase transition")
def _exact_recovery(ctx, *, oracle_fn=_oracle_smooth, noiseless_fn=_noiseless_clarabel, tau_rel=1e-4,
                    in_window_cvxpy=None):
    """Sub-criteria: (a) a valid Prop. S1 certificate inside the window (proves (26)); (b) CVXPY's
    optimizer of (24) inside the window has P_Ahat = P_A (quick/full: one solve takes ~5 s, over the
    smoke budget; ``in_window_cvxpy=True`` forces it); (c) Theorem 3(i) detection is exact wherever
    P_Ahat = P_A. The CVXPY grid outside the (empty) windows is reported, not judged."""
    in_window_cvxpy = ctx.pick(False, True, True) if in_window_cvxpy is None else in_window_cvxpy
    # (a) inside the window: the hand-built K = 40 instance; a valid (S1.3) certificate proves (26)
    positions = ctx.pick(smoke=[0.5], quick=[0.25, 0.5, 0.75], full=[0.1, 0.3, 0.5, 0.7, 0.9])
    cert = ctx.map(_task_certificate, [{"K": 40, "p": 4, "position": t, "oracle_fn": oracle_fn}
                                       for t in positions], replicates=ctx.pick(1, 2, 3))
    certs = [o for row in cert for o in row]
    certificates_valid = all(o["valid"] for o in certs)
    # (b) inside the window with CVXPY (block-reduced (24), see block_reduce)
    cvx_in = []
    if in_window_cvxpy:
        cvx_positions = ctx.pick(smoke=[0.5], quick=[0.5], full=[0.2, 0.8])
        cvx_out = ctx.map(_task_in_window_cvxpy, [{"K": 40, "p": 4, "position": t, "noiseless_fn": noiseless_fn,
                                                   "tau_rel": tau_rel} for t in cvx_positions], replicates=1)
        cvx_in = [o for row in cvx_out for o in row if o["window"] is not None]
    cvxpy_in_window_ok = all_judged([o["ok"] for o in cvx_in]) if in_window_cvxpy else None
    # outside the windows: CVXPY phase-transition grid (reported)
    cells = ctx.pick(smoke=[(8, 1, 1)], quick=[(8, 1, 1), (8, 3, 1)],
                     full=[(8, 1, 1), (8, 3, 1), (12, 1, 2), (12, 4, 2)])
    ratios = ctx.pick(smoke=[0.5, 0.8, 1.5], quick=list(np.geomspace(0.3, 3, 6)),
                      full=list(np.geomspace(0.2, 4, 9)))
    grid = [{"K": K, "n_contam": m, "r": r, "q": 3, "p": 6 if r > 1 else 4, "ratios": ratios, "tau_rel": tau_rel}
            for K, m, r in cells]
    out = ctx.map(_task_recovery_cell, grid, replicates=ctx.pick(1, 2, 2))
    rows, detections = [], [o["detect"] for o in cvx_in]
    for g, reps in zip(grid, out):
        rate = np.mean([[run["ok"] for run in o["runs"]] for o in reps], axis=0)
        detections += [run["detect"] for o in reps for run in o["runs"]]
        band = [round(float(c), 3) for c, x in zip(ratios, rate) if x == 1.0]
        rows.append({"K": g["K"], "contaminated": g["n_contam"], "r": g["r"],
                     "window (25) non-empty": any(o["window"] is not None for o in reps),
                     "success rate per lam_S sqrt(s)/lam_L": dict(zip([round(c, 3) for c in ratios],
                                                                      rate.tolist())),
                     "always-successful ratios": band})
    # (c) Theorem 3(i) on every run where P_Ahat = P_A
    detection_exact = all_judged(detections)
    flags = {"certificates_valid": certificates_valid, "cvxpy_in_window_ok": cvxpy_in_window_ok,
             "detection_exact": detection_exact}
    if False in flags.values():
        passed = False
    elif certificates_valid and detection_exact is not None:
        passed = True        # (b) is judged wherever it runs (quick/full)
    else:
        passed = None
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3))
    for row in rows:
        d = row["success rate per lam_S sqrt(s)/lam_L"]
        ax.semilogx(list(d), list(d.values()), "o-", label=f"K={row['K']}, m_c={row['contaminated']}, r={row['r']}")
    for o in cvx_in:
        ax.semilogx([o["ratio"] * np.sqrt(39)], [float(o["ok"])], "k*", ms=10)
    if cvx_in:
        ax.plot([], [], "k*", label="K=40 inside window (25)")
    ax.set_xlabel("lam_S sqrt(s) / lam_L")
    ax.set_ylabel("P(P_Ahat = P_A)")
    ax.legend(fontsize=7)
    fig_path = ctx.save_figure(fig)
    amax = max(o["a_hat"] for o in certs)
    bmax = max(o["b_hat"] for o in certs)
    cvx_txt = (f"CVXPY inside the window: P_Ahat = P_A in {sum(o['ok'] for o in cvx_in)}/{len(cvx_in)} "
               f"(max error {max(o['err'] for o in cvx_in):.1e})" if cvx_in else
               "CVXPY inside the window: not run at this scale")
    return Evidence(verdict=verdict_from(passed),
                    summary=f"inside window (K=40, 1 contaminated): certificate valid in "
                            f"{sum(o['valid'] for o in certs)}/{len(certs)} (max a_hat {amax:.2f}, b_hat {bmax:.2f} "
                            f"< 0.99); {cvx_txt}; Thm 3(i) detection exact: {detection_exact}; reported: outside "
                            f"the (empty) windows CVXPY recovers P_A at lam_S sqrt(s)/lam_L in "
                            f"{[r['always-successful ratios'] for r in rows]}",
                    measured={**flags, "certificates": certs, "cvxpy_in_window": cvx_in},
                    predicted={"a_hat": "< 0.99", "b_hat": "< 0.99", "||P_Ahat - P_A||_op (in window)": 0.0,
                               "rank(Lhat)": 1, "detection": "exact"},
                    table=rows, figure=fig_path,
                    notes="(a) Prop. S1's certificate proves (26) via Lemmas S4, S5 and S8. (b) CVXPY (Clarabel) "
                          "solves (24) at K = 40 (q = 39) after an exact blockwise rotation to 4-row blocks "
                          "(block_reduce; ~5 s per solve, so quick/full only). (c) Theorem 3(i) with tau_n = "
                          "1e-4 ||D0||_op. The grid outside the windows (which are empty there) is reported "
                          "only: Theorem 1 says nothing about it.")


@claim("clair.propS1.certificate", paper="clair", reference="Proposition S1, (S1.3)-(S1.5); Lemma S4",
       statement="For lam_S/lam_L in window (25), Q = lam_L U'V'^T + P_{T⊥}(Z), Z = (I - P_I P_U' P_I)^{-1} R, "
                 "satisfies (S1.3) with a_hat < a and b_hat < b.", kind="bound")
def _prop_s1(ctx, *, oracle_fn=_oracle_smooth):
    positions = ctx.pick(smoke=[0.3, 0.7], quick=list(np.linspace(0.05, 0.95, 5)), full=list(np.linspace(0.02, 0.98, 9)))
    out = ctx.map(_task_certificate, [{"K": 40, "p": 4, "position": t, "oracle_fn": oracle_fn} for t in positions],
                  replicates=ctx.pick(1, 2, 4))
    flat = [o for row in out for o in row]
    valid = [o["valid"] for o in flat]
    res = max(max(o["tangent"], o["support"]) for o in flat)
    return Evidence(verdict=verdict_from(all(valid)),
                    summary=f"certificate valid (a_hat, b_hat < 0.99; identities to {res:.1e}) at {sum(valid)}/"
                            f"{len(valid)} ratios across the window",
                    measured={"a_hat": [o["a_hat"] for o in flat], "b_hat": [o["b_hat"] for o in flat],
                              "max_identity_residual": res},
                    predicted={"a_hat": "< a = 0.99", "b_hat": "< b = 0.99"},
                    table=[{k: v for k, v in o.items() if k != "window"} for o in flat])


# --------------------------------------------------------------------------------------------
# Lemma S1 (oracle), Lemma S3, Lemma S7/S8 on small instances (smooth oracle vs CVXPY)
# --------------------------------------------------------------------------------------------
def _task_oracle(seed, K, n_contam, r, q, p, ratios, oracle_fn):
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=n_contam, seed=seed)
    D0, A, I = np.asarray(inst.D0), np.asarray(inst.A), np.asarray(inst.I)
    L0 = np.asarray(inst.L0)
    P_A = np.asarray(inst.projector)
    s = inst.s
    out = []
    for c in ratios:
        lam_S = c / np.sqrt(s)
        ora = oracle_fn(D0, q, A, I, 1.0, lam_S)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = solve_oracle(D0, q, A, I, 1.0, lam_S)
        U = np.linalg.svd(ora.L, full_matrices=False)[0][:, :r]
        Lb = ora.L.reshape(inst.G, q, p)
        out.append({
            "ratio": c, "r": r, "bound": float(lam_S * np.sqrt(s)),
            "rank": int(np.sum(ora.singular_values > 1e-8 * ora.singular_values[0])),
            "row_err": float(np.linalg.norm(_proj(ora.Vt, r) - P_A, 2)),
            "benign_err": float(np.linalg.norm(Lb[~I] - L0.reshape(inst.G, q, p)[~I]) / np.linalg.norm(L0)),
            "shift": float(np.linalg.norm(ora.L - L0) / np.linalg.norm(L0)),
            "obj_gap": float((ora.objective - ref.objective) / abs(ref.objective)),
            "s3": lemma_s3_residual(ora.L, ora.S, I, q, r, 1.0, lam_S),
            "rho_prime": rho_prime(U, I, q)})
    return out


def _oracle_runs(ctx, oracle_fn):
    ratios = ctx.pick(smoke=[0.5, 1.5], quick=[0.3, 0.7, 1.5, 3.0], full=list(np.geomspace(0.2, 4, 7)))
    cells = ctx.pick(smoke=[(8, 2, 1)], quick=[(8, 2, 1), (10, 4, 2)], full=[(8, 2, 1), (10, 4, 2), (12, 3, 2)])
    sub = ctx.for_claim("clair.lemmaS1.oracle")
    out = sub.map(_task_oracle, [{"K": K, "n_contam": m, "r": r, "q": 3, "p": 5, "ratios": ratios,
                                  "oracle_fn": oracle_fn} for K, m, r in cells], replicates=ctx.pick(1, 2, 3))
    ctx.seeds_used.extend(sub.seeds_used)
    return [run for row in out for rep in row for run in rep]


@claim("clair.lemmaS1.oracle", paper="clair", reference="Lemma S1, Lemma S2; (23)",
       statement="Every oracle optimizer L' of (23) has rank r, row(L') = row(A) and P_{I^c} L' = L0, yet "
                 "L' != L0 generically (the shift subspace is non-trivial).", kind="identity")
def _lemma_s1(ctx, *, oracle_fn=_oracle_smooth):
    runs = _oracle_runs(ctx, oracle_fn)
    ok = all(o["rank"] == o["r"] for o in runs)
    row_err = max(o["row_err"] for o in runs)
    ben = max(o["benign_err"] for o in runs)
    obj = max(abs(o["obj_gap"]) for o in runs)
    shifted = sum(o["shift"] > 1e-3 for o in runs)
    # tolerances: Clarabel's objective accuracy ~1e-8 relative; the smooth solve is tighter
    passed = ok and row_err < 1e-8 and ben < 1e-10 and obj < 1e-6 and shifted == len(runs)
    return Evidence(verdict=verdict_from(passed),
                    summary=f"row(L') = row(A) to {row_err:.1e}, P_Ic L' = L0 to {ben:.1e}, smooth vs CVXPY "
                            f"objective {obj:.1e}; L' != L0 in {shifted}/{len(runs)}",
                    measured={"row_err": row_err, "benign_err": ben, "objective_rel_diff": obj,
                              "shift_norms": [o["shift"] for o in runs]},
                    predicted={"row_err": 0.0, "benign_err": 0.0})


@claim("clair.lemmaS3.identity", paper="clair", reference="Lemma S3",
       statement="At an oracle optimizer, lam_L P_I U'V'^T = lam_S P_I(H P_V') with H_g = S'_g/||S'_g||_F on I.",
       kind="identity")
def _lemma_s3(ctx, *, oracle_fn=_oracle_smooth):
    runs = _oracle_runs(ctx, oracle_fn)
    worst = max(o["s3"] for o in runs)
    passed = worst < 1e-6   # smooth reduced solve reaches ~1e-8 (measured); CVXPY would give ~1e-4
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max relative Lemma S3 residual {worst:.1e} (< 1e-6) over {len(runs)} solves",
                    measured={"residuals": [o["s3"] for o in runs]}, predicted={"residual": 0.0})


@claim("clair.lemmaS7.rho_prime", paper="clair", reference="Lemmas S7, S8",
       statement="rho' = ||P_I P_U' P_I||_op <= (lam_S/lam_L) sqrt(s), and rho' < 1 always.", kind="bound")
def _lemma_s7(ctx, *, oracle_fn=_oracle_smooth):
    runs = _oracle_runs(ctx, oracle_fn)
    ratio = max(o["rho_prime"] / o["bound"] for o in runs)
    rmax = max(o["rho_prime"] for o in runs)
    passed = ratio <= 1 + 1e-6 and rmax < 1
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max rho'/((lam_S/lam_L) sqrt(s)) = {ratio:.3f} (<= 1), max rho' = {rmax:.3f} (< 1)",
                    measured={"rho_prime": [o["rho_prime"] for o in runs], "bound": [o["bound"] for o in runs],
                              "max_ratio_to_bound": ratio, "max_rho_prime": rmax},
                    predicted={"rho' / ((lam_S/lam_L) sqrt(s))": "<= 1 (Lemma S7)", "rho'": "< 1 (Lemma S8)",
                               "bound (lam_S/lam_L) sqrt(s)": [o["bound"] for o in runs]})


# --------------------------------------------------------------------------------------------
# Solver dual of (24) and uniqueness of P_Ahat across solvers
# --------------------------------------------------------------------------------------------
def _clarabel(D0, q, lam_L, lam_S):
    return solve_noiseless(D0, q, lam_L, lam_S, solver="CLARABEL")


def _scs(D0, q, lam_L, lam_S):
    return solve_noiseless(D0, q, lam_L, lam_S, solver="SCS")


def _scs_sloppy(D0, q, lam_L, lam_S):
    """Broken variant: SCS stopped early (first-order solver at eps = 1e-2, 50 iterations)."""
    return solve_noiseless(D0, q, lam_L, lam_S, solver="SCS",
                           solver_options={"eps_abs": 1e-2, "eps_rel": 1e-2, "max_iters": 50})


def _task_two_solvers(seed, K, n_contam, r, q, p, ratio, first, second):
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=n_contam, seed=seed)
    D0 = np.asarray(inst.D0)
    lam_S = ratio / np.sqrt(inst.s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = first(D0, q, 1.0, lam_S)
        b = a if second is None else second(D0, q, 1.0, lam_S)
    P_A = np.asarray(inst.projector)
    out = {}
    for name, sol in (("first", a), ("second", b)):
        Qb = sol.Q.reshape(inst.G, q, p)
        out[name] = {"op": float(np.linalg.norm(sol.Q, 2)), "blk": float(block_norms(Qb).max()) / lam_S,
                     "dual_gap": float(abs(sol.objective - np.vdot(sol.Q, D0)) / abs(sol.objective)),
                     "err": float(np.linalg.norm(_proj(sol.Vt, r) - P_A, 2))}
    out["P_diff"] = float(np.linalg.norm(_proj(a.Vt, r) - _proj(b.Vt, r), 2))
    out["L_diff"] = float(np.linalg.norm(a.L - b.L) / np.linalg.norm(a.L))
    return out


def _two_solver_runs(ctx, first, second):
    """The (24) solves shared by clair.thm1.uniqueness and clair.propS1.solver_dual: run under the
    uniqueness claim's seeds (so both claims see the same instances), recorded in ``ctx``."""
    sub = ctx.for_claim("clair.thm1.uniqueness")
    cells = ctx.pick(smoke=[(8, 1, 1, 0.7)], quick=[(8, 1, 1, 0.7), (10, 2, 1, 0.8)],
                     full=[(8, 1, 1, 0.7), (10, 2, 1, 0.8), (10, 4, 2, 1.9)])
    out = sub.map(_task_two_solvers, [{"K": K, "n_contam": m, "r": r, "q": 3 if r == 1 else 10,
                                       "p": 4 if r == 1 else 10, "ratio": c, "first": first, "second": second}
                                      for K, m, r, c in cells], replicates=ctx.pick(1, 2, 3))
    ctx.seeds_used.extend(sub.seeds_used)
    return [o for row in out for o in row]


@claim("clair.thm1.uniqueness", paper="clair", reference="Theorem 1 ('for any optimal (Lhat, Shat)'); Def. 1",
       statement="P_Ahat is the same for every optimizer of (24) (two solvers agree on P_Ahat = P_A) although "
                 "Lhat itself may differ along the shift subspace.", kind="identity")
def _uniqueness(ctx, *, second=_scs):
    runs = _two_solver_runs(ctx, _clarabel, second)
    pdiff = max(o["P_diff"] for o in runs)
    err = max(max(o["first"]["err"], o["second"]["err"]) for o in runs)
    passed = pdiff < 1e-4 and err < 1e-4   # SCS at eps 1e-9 resolves subspaces to ~1e-6; margin 100x
    return Evidence(verdict=verdict_from(passed),
                    summary=f"Clarabel vs SCS: max ||P_Ahat1 - P_Ahat2|| = {pdiff:.1e}, max ||P_Ahat - P_A|| = "
                            f"{err:.1e}; relative ||L1 - L2|| up to {max(o['L_diff'] for o in runs):.1e}",
                    measured={"P_diff": [o["P_diff"] for o in runs], "L_diff": [o["L_diff"] for o in runs]},
                    predicted={"P_diff": 0.0})


@claim("clair.propS1.solver_dual", paper="clair", reference="Lemma S4, (S1.3); Proposition S1",
       statement="The solver's dual Q of L + S = D0 in (24) is dual feasible (||Q||_op <= lam_L, max_g ||Q_g||_F "
                 "<= lam_S) with zero duality gap.", kind="bound")
def _solver_dual(ctx, *, first=_clarabel):
    runs = [o["first"] for o in _two_solver_runs(ctx, first, None)]
    op, blk, gap = (max(o[k] for o in runs) for k in ("op", "blk", "dual_gap"))
    passed = op <= 1 + 1e-6 and blk <= 1 + 1e-6 and gap <= 1e-6
    return Evidence(verdict=verdict_from(passed),
                    summary=f"max ||Q||_op/lam_L = {op:.6f}, max_g ||Q_g||/lam_S = {blk:.6f}, relative gap {gap:.1e}",
                    measured={"op": op, "blk": blk, "gap": gap}, predicted={"op": "<= 1", "blk": "<= 1", "gap": 0.0})


# --------------------------------------------------------------------------------------------
# Algorithm 1 and FISTA vs CVXPY on (7) (items 19-20)
# --------------------------------------------------------------------------------------------
_EXACT = {"tol": 1e-11, "max_iter": 200_000}


def _task_vs_cvxpy(seed, K, n_contam, r, q, p, weighted, iterative):
    inst = generate(n_clients=K, p=p, q=q, rank=r, contaminated=n_contam, noise=0.1, seed=seed)
    D = np.asarray(inst.D_hat)
    G = inst.G
    rng = np.random.default_rng(seed + 11)
    w = rng.uniform(0.5, 2.0, G) / K if weighted else np.full(G, 1.0 / K)
    lam_L, lam_S = K ** -0.5, 3 * K ** -1.5
    ref = solve_penalized(D, q, lam_L, lam_S, weights=w, method="cvxpy")
    P_ref = _proj(ref.Vt, r)
    out = {"cvxpy": ref.objective}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, opts in iterative.items():
            sol = solve_penalized(D, q, lam_L, lam_S, weights=w, **opts)
            objs = np.asarray(sol.history["objective"])
            out[name] = {"rel_obj": float((sol.objective - ref.objective) / abs(ref.objective)),
                         "rel_gap": float(sol.relative_gap),
                         "P_diff": float(np.linalg.norm(_proj(sol.Vt, r) - P_ref, 2)),
                         "monotone": bool(np.all(np.diff(objs) <= 1e-12 * np.abs(objs[:-1]).max())),
                         "iterations": int(sol.iterations), "status": sol.status}
        big = solve_penalized(D, q, lam_L, lam_S, weights=w, method="proxgrad", tol=None, max_iter=300,
                              step_size=1.5 / (2 * w.max()))
        objs = np.asarray(big.history["objective"])
        out["step1.5_monotone"] = bool(np.all(np.diff(objs) <= 1e-12 * np.abs(objs[:-1]).max()))
    return out


_DEFAULT_ITERATIVE = {"algorithm1": {"method": "proxgrad", **_EXACT}, "fista": {"method": "fista", **_EXACT}}


@claim("clair.alg1.vs_cvxpy", paper="clair", reference="Algorithm 1, eqs. (19)-(21); program (7) and its Fenchel dual",
       statement="Algorithm 1 (proximal gradient, t = 1/(2 max w)) and FISTA reach the CVXPY optimum of (7): "
                 "objective to 1e-6 relative, the same P_Ahat, duality gap <= 1e-8, monotone descent; with "
                 "uniform and non-uniform weights.", kind="comparison")
def _vs_cvxpy(ctx, *, iterative=None):
    iterative = _DEFAULT_ITERATIVE if iterative is None else iterative
    cells = ctx.pick(smoke=[(6, 1, 1, False)], quick=[(6, 1, 1, False), (8, 2, 1, True)],
                     full=[(6, 1, 1, False), (8, 2, 1, True), (10, 2, 2, False), (10, 2, 2, True)])
    out = ctx.map(_task_vs_cvxpy, [{"K": K, "n_contam": m, "r": r, "q": 3, "p": 4 if r == 1 else 5,
                                    "weighted": wt, "iterative": iterative} for K, m, r, wt in cells],
                  replicates=ctx.pick(1, 2, 3))
    runs = [o for row in out for o in row]
    rows, ok = [], True
    for name in iterative:
        obj = max(abs(o[name]["rel_obj"]) for o in runs)
        gap = max(o[name]["rel_gap"] for o in runs)
        pd = max(o[name]["P_diff"] for o in runs)
        mono = all(o[name]["monotone"] for o in runs)
        # tolerances: Clarabel ~1e-8 relative objective accuracy; P_Ahat from an interior-point L ~1e-6
        good = obj < 1e-6 and gap < 1e-8 and pd < 1e-4 and mono
        ok = ok and good
        rows.append({"solver": name, "max rel. objective diff": obj, "max rel. gap": gap,
                     "max ||P_Ahat - P_Ahat(cvxpy)||": pd, "monotone": mono,
                     "iterations (max)": max(o[name]["iterations"] for o in runs), "passes": good})
    non_mono = sum(not o["step1.5_monotone"] for o in runs)
    return Evidence(verdict=verdict_from(ok),
                    summary="; ".join(f"{r['solver']}: obj {r['max rel. objective diff']:.1e}, gap "
                                      f"{r['max rel. gap']:.1e}, P {r['max ||P_Ahat - P_Ahat(cvxpy)||']:.1e}"
                                      for r in rows),
                    table=rows, measured={"step_1.5_non_monotone_runs": non_mono,
                                          "passes": {r["solver"]: r["passes"] for r in rows}},
                    predicted={"relative objective difference": "0 (< 1e-6)", "relative duality gap": "<= 1e-8",
                               "||P_Ahat - P_Ahat(cvxpy)||_op": "0 (< 1e-4)", "objective": "monotone (t = 1/(2 max w))"},
                    notes=f"Step t = 1.5/(2 max w) was non-monotone in {non_mono}/{len(runs)} runs "
                          "(the paper's bound t <= 1/(2 max w) is sufficient, not necessary).")
