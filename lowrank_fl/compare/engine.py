"""Run the requested methods on one program and assemble the :class:`Comparison`.

:func:`compare_clair` (program (7)), :func:`compare_nuclear` (nuclear-norm multi-task least
squares) and :func:`compare_noiseless` (program (24)) validate their input, plan the methods
(:mod:`~lowrank_fl.compare.methods`), run each runnable one in its own process
(:mod:`~lowrank_fl.compare.child`, calling :mod:`~lowrank_fl.compare.runners`), certify every
returned point with the library's formula (:mod:`~lowrank_fl.compare.certify`) and compare the
points pairwise.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..clair import contrasts
from ..clair.contrasts import check_weights
from ..linalg import projector_distance
from ..validation import (as_float_array, check_choice, check_gap_tolerance, check_in_interval, check_int,
                          check_positive)
from .certify import (ClairCertifier, NoiselessCertifier, NuclearCertifier, numerical_rank,
                      top_projector)
from .child import MEMORY_MEASURES, run_in_child
from .methods import plan_methods
from .result import Comparison, MethodRow, PairRow
from .runners import RUNNERS

__all__ = ["compare_clair", "compare_nuclear", "compare_noiseless", "TAU_RULES"]

TAU_RULES = ("largest-gap", "largest-log-gap")
_HISTORY_POINTS = 500


def _check_W(W, name):
    W = as_float_array(W, name, ndim=3)
    if W.shape[0] < 2:
        raise ValueError(f"{name} must hold K >= 2 clients (shape (K, q, p)), got shape {W.shape}")
    return W


def _check_common(tol, max_iter, time_limit, memory_limit, rank, tau, alpha, memory_measure):
    check_choice(memory_measure, "memory_measure", MEMORY_MEASURES)
    tol = None if tol is None else check_gap_tolerance(tol, "tol")   # None: no iterative method
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    if time_limit is not None:
        time_limit = check_positive(time_limit, "time_limit")
    if memory_limit is not None:
        memory_limit = check_positive(memory_limit, "memory_limit")
    if rank is not None:
        rank = check_int(rank, "rank", minimum=1)
    if isinstance(tau, str):
        if tau not in TAU_RULES:
            raise ValueError(f"tau must be a number >= 0 or one of {TAU_RULES}, got {tau!r}")
    else:
        tau = check_positive(tau, "tau", strict=False)
    alpha = check_in_interval(alpha, "alpha", 0.5, 1.0, closed="left")
    return tol, max_iter, time_limit, memory_limit, rank, tau, alpha


def _thin_history(objs, seconds, iterations):
    """Per-iteration objectives → at most ``_HISTORY_POINTS`` (seconds, objective) pairs, time
    interpolated at the run's mean time per iteration."""
    n = len(objs)
    idx = np.unique(np.concatenate([np.geomspace(1, n, _HISTORY_POINTS).astype(int) - 1, [n - 1]]))
    per_it = seconds / max(iterations, n, 1)
    return {"seconds": [float((i + 1) * per_it) for i in idx],
            "objective": [float(objs[i]) for i in idx]}


def _check_rank_fits(rank, sizes):
    if rank is not None:
        check_int(rank, "rank", minimum=1, maximum=min(sizes["rows"], sizes["cols"]))


def _run_all(problem, data, certifier, plans, options, time_limit, memory_measure):
    """Run every plan; returns (rows as dicts, points by name)."""
    rows, points = [], {}
    for plan in plans:
        row = {"name": plan.name, "kind": plan.kind, "estimated_memory_bytes": plan.estimated_bytes}
        if not plan.runnable:
            rows.append({**row, "outcome": "not_run", "reason": plan.reason})
            continue
        measure = memory_measure if plan.kind == "iterative" else "rss_growth"
        opts = dict(options, method=plan.name)
        out = run_in_child(RUNNERS[problem], (data, plan.kind, plan.solver, plan.nuclear, opts),
                           time_limit=time_limit, measure=measure)
        if out["outcome"] == "time_limit":
            rows.append({**row, "outcome": "time_limit", "seconds": out["wall_seconds"],
                         "reason": f"stopped at the time limit of {time_limit:g} s"})
            continue
        if out["outcome"] != "ok":
            rows.append({**row, "outcome": out["outcome"], "reason": out["error"],
                         "seconds": out["wall_seconds"]})
            continue
        res = out["result"]
        cert = certifier.certify(res["point"])
        hist = None
        if res["history"] is not None:
            hist = _thin_history(res["history"], out["seconds"], res["iterations"])
        rows.append({**row, "outcome": "ok", "status": res["status"],
                     "iterations": res["iterations"], "seconds": out["seconds"],
                     "peak_memory_bytes": out["peak_bytes"], "memory_measure": measure,
                     "message": res["message"], "history": hist, **cert})
        points[plan.name] = res["point"]
    return rows, points


def _assemble(problem, instance, settings, certifier, rows, points, rank):
    key = certifier.low_rank_key
    done = [r for r in rows if r["outcome"] == "ok"]
    if rank is None and done:
        best = min(done, key=lambda r: r["relative_gap"])
        rank = max(1, numerical_rank(points[best["name"]][key], certifier.reference))
        settings["rank_rule"] = f"numerical rank of {best['name']}'s solution (1e-6 x data norm)"
    elif rank is not None:
        settings["rank_rule"] = "given"
    else:
        settings["rank_rule"] = "none: no method returned a point"
    settings["rank"] = rank
    projectors, sets = {}, {}
    for r in done:
        M = points[r["name"]][key]
        r["rank"] = numerical_rank(M, certifier.reference)
        if rank > min(M.shape):
            raise ValueError(f"rank must be at most {min(M.shape)}, got {rank}")
        P = top_projector(M, rank)
        projectors[r["name"]] = P
        benign, tau = certifier.collaborative(P)
        if benign is not None:
            sets[r["name"]] = benign
            r["collaborative_set"] = [int(k) for k in np.flatnonzero(benign)]
            r["tau_value"] = tau
    pairs = []
    for a, b in itertools.combinations([r for r in done], 2):
        diff = a["objective"] - b["objective"]
        agree = differ = None
        if a["name"] in sets:
            sa, sb = sets[a["name"]], sets[b["name"]]
            agree = bool(np.array_equal(sa, sb))
            differ = [int(k) for k in np.flatnonzero(sa != sb)]
        pairs.append(PairRow(a=a["name"], b=b["name"], objective_difference=diff,
                             relative_objective_difference=diff / certifier.scale,
                             projector_distance=projector_distance(projectors[a["name"]],
                                                                   projectors[b["name"]]),
                             collaborative_sets_agree=agree, clients_differing=differ))
    lower = max(done, key=lambda r: r["dual"]) if done else None
    methods = [MethodRow(**{k: v for k, v in r.items() if k != "tau_value"}) for r in rows]
    taus = {r["name"]: r["tau_value"] for r in done if "tau_value" in r}
    if taus:
        settings["tau_values"] = taus
    return Comparison(problem=problem, instance=instance, settings=settings,
                      scale=float(certifier.scale),
                      lower_bound=None if lower is None else float(lower["dual"]),
                      lower_bound_method=None if lower is None else lower["name"],
                      methods=methods, pairs=pairs)


def compare_clair(W_hat, lam_L: float, lam_S: float, *, weights=None, methods=None,
                  tol: float = 1e-8, max_iter: int = 100_000, time_limit: float | None = 300.0,
                  memory_limit: float | None = None, rank: int | None = None,
                  tau="largest-gap", alpha: float = 0.5,
                  memory_measure: str = "rss_growth") -> Comparison:
    """Compare the solvers of program (7) on local estimates ``W_hat``.

    Parameters
    ----------
    W_hat : array_like, shape (K, q, p)
        Local estimates; the program is solved on their contrasts ``D̂`` (G*q, p), eq. (6).
        Clients that are all equal (every contrast 0, e.g. an all-zero ``W_hat``) are refused
        with a ``ValueError``: (7) is then solved by ``L = S = 0`` with objective ``F(0, 0) = 0``,
        the scale of the relative gap (see :mod:`~lowrank_fl.compare.certify`).
    lam_L, lam_S : float, > 0
    weights : None or array_like, shape (G,)
        Pair weights (None: ``1/K``).
    methods : list of str, optional
        Method names (:func:`~lowrank_fl.compare.methods.default_methods` by default:
        ``fista``, ``proxgrad``, ``cvxpy:<SOLVER>`` for each installed SDP solver,
        ``cvxpy:CLARABEL:normNuc``).
    tol, max_iter : iterative methods' relative-gap tolerance and iteration cap.
    time_limit : float or None
        Seconds per method; a method still running is terminated and listed as such.
    memory_limit : float or None
        Bytes; a method whose estimate exceeds it is not run (default: half the physical memory).
    rank : int or None
        ``r`` of the top-``r`` projectors (None: the numerical rank of the best-certified
        method's ``L``).
    tau, alpha : the τ rule (a number or a rule of :data:`TAU_RULES`) and α of (8).
    memory_measure : {"rss_growth", "tracemalloc"}
        How the iterative methods' peak memory is measured (conic solves: always
        ``"rss_growth"``, their native code bypasses tracemalloc). ``"tracemalloc"`` counts
        numpy allocations exactly but slows small solves several-fold, so their ``seconds``
        are then not comparable.

    Returns
    -------
    Comparison
    """
    W = _check_W(W_hat, "W_hat")
    lam_L = check_positive(lam_L, "lam_L")
    lam_S = check_positive(lam_S, "lam_S")
    tol, max_iter, time_limit, memory_limit, rank, tau, alpha = _check_common(
        tol, max_iter, time_limit, memory_limit, rank, tau, alpha, memory_measure)
    K, q, p = W.shape
    G = K * (K - 1) // 2
    w = None if weights is None else check_weights(weights, G)
    D = contrasts(W)
    sizes = {"rows": G * q, "cols": p, "blocks": G, "block_rows": q}
    _check_rank_fits(rank, sizes)
    plans = plan_methods("clair", methods, sizes, memory_limit=memory_limit)
    certifier = ClairCertifier(D, q, K, lam_L, lam_S, w, tau=tau, alpha=alpha)
    data = {"D": D, "q": q, "lam_L": lam_L, "lam_S": lam_S, "weights": w}
    rows, points = _run_all("clair", data, certifier, plans,
                            {"tol": tol, "max_iter": max_iter}, time_limit, memory_measure)
    instance = {"K": K, "q": q, "p": p, "G": G, "lam_L": lam_L, "lam_S": lam_S,
                "weights": "1/K" if w is None else "given"}
    settings = _settings(tol, max_iter, time_limit, memory_limit, tau, alpha, memory_measure)
    return _assemble("clair", instance, settings, certifier, rows, points, rank)


def compare_noiseless(W, lam_L: float, lam_S: float, *, methods=None,
                      time_limit: float | None = 300.0, memory_limit: float | None = None,
                      rank: int | None = None, tau="largest-gap", alpha: float = 0.5
                      ) -> Comparison:
    """Compare the CVXPY solvers of the noiseless program (24) on ``D0 = contrasts(W)``.

    ``W`` (K, q, p) holds the (noiseless) local models; other parameters as in
    :func:`compare_clair` (no iterative method exists for (24)); equal clients (``D0 = 0``) are
    refused like there.
    """
    W = _check_W(W, "W")
    lam_L = check_positive(lam_L, "lam_L")
    lam_S = check_positive(lam_S, "lam_S")
    _, _, time_limit, memory_limit, rank, tau, alpha = _check_common(
        None, 1, time_limit, memory_limit, rank, tau, alpha, "rss_growth")
    K, q, p = W.shape
    G = K * (K - 1) // 2
    D = contrasts(W)
    sizes = {"rows": G * q, "cols": p, "blocks": G, "block_rows": q}
    _check_rank_fits(rank, sizes)
    plans = plan_methods("noiseless", methods, sizes, memory_limit=memory_limit)
    certifier = NoiselessCertifier(D, q, K, lam_L, lam_S, tau=tau, alpha=alpha)
    data = {"D": D, "q": q, "lam_L": lam_L, "lam_S": lam_S}
    rows, points = _run_all("noiseless", data, certifier, plans, {}, time_limit, "rss_growth")
    instance = {"K": K, "q": q, "p": p, "G": G, "lam_L": lam_L, "lam_S": lam_S}
    settings = _settings(None, None, time_limit, memory_limit, tau, alpha, "rss_growth")
    return _assemble("noiseless", instance, settings, certifier, rows, points, rank)


def compare_nuclear(X, y, mu: float, *, methods=None, tol: float = 1e-8,
                    max_iter: int = 100_000, time_limit: float | None = 300.0,
                    memory_limit: float | None = None, rank: int | None = None,
                    memory_measure: str = "rss_growth") -> Comparison:
    """Compare proximal gradient and CVXPY on nuclear-norm multi-task least squares.

    ``X`` (n, m, d), ``y`` (n, m), ``mu > 0``; the projectors are the top-``rank`` right
    singular subspaces of ``Theta`` (n, d). Other parameters as in :func:`compare_clair`;
    ``y = 0`` (optimum ``Theta = 0``, ``P(0) = 0``) is refused like equal clients there.
    """
    X = as_float_array(X, "X", ndim=3)
    y = as_float_array(y, "y", shape=X.shape[:2])
    mu = check_positive(mu, "mu")
    tol, max_iter, time_limit, memory_limit, rank, _, _ = _check_common(
        tol, max_iter, time_limit, memory_limit, rank, "largest-gap", 0.5, memory_measure)
    n, m, d = X.shape
    sizes = {"rows": n, "cols": d, "data_bytes": 8.0 * n * d * (m + d)}   # X and the Grams
    _check_rank_fits(rank, sizes)
    plans = plan_methods("nuclear", methods, sizes, memory_limit=memory_limit)
    certifier = NuclearCertifier(X, y, mu)
    data = {"X": X, "y": y, "mu": mu}
    rows, points = _run_all("nuclear", data, certifier, plans,
                            {"tol": tol, "max_iter": max_iter}, time_limit, memory_measure)
    instance = {"n": n, "m": m, "d": d, "mu": mu}
    settings = _settings(tol, max_iter, time_limit, memory_limit, None, None, memory_measure)
    return _assemble("nuclear", instance, settings, certifier, rows, points, rank)


def _settings(tol, max_iter, time_limit, memory_limit, tau, alpha, memory_measure):
    from .methods import default_memory_limit

    return {"tol": tol, "max_iter": max_iter, "time_limit": time_limit,
            "memory_limit_bytes": float(default_memory_limit() if memory_limit is None
                                        else memory_limit),
            "tau": tau, "alpha": alpha, "memory_measure": memory_measure}
