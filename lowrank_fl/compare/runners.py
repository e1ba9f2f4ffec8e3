"""Every call into a solver made by :mod:`lowrank_fl.compare` (one place to adapt when a solver's
signature changes).

Each runner takes the problem's data, a method (kind, CVXPY solver, nuclear-norm form) and the
iterative options, and returns a plain dict (picklable across the child-process boundary):
``point`` (the returned arrays, from which :mod:`~lowrank_fl.compare.certify` recomputes the
objective and gap), ``status``, ``iterations``, ``history`` (per-iteration objective of the
iterative methods, or ``None``) and ``message``. The solver's own gap is never used.
"""
from __future__ import annotations

import warnings

import numpy as np

from ..results import ConvergenceWarning

__all__ = ["RUNNERS", "run_clair", "run_nuclear", "run_noiseless", "clair_point"]


def _outcome(result, point: dict, caught) -> dict:
    history = getattr(result, "history", None) or {}
    objs = history.get("objective")
    message = (getattr(result, "message", "") or "").rstrip(".")
    # the convergence warning usually repeats the result's message: each sentence once
    notes = list(dict.fromkeys(str(w.message).rstrip(".") for w in caught
                               if issubclass(w.category, ConvergenceWarning)
                               and str(w.message).rstrip(".") != message))
    return {"point": {k: np.array(v, dtype=float) for k, v in point.items()},
            "status": str(result.status), "iterations": int(result.iterations),
            "history": None if objs is None or len(objs) == 0 else np.array(objs, dtype=float),
            "message": "; ".join(x for x in [message, *notes] if x)}


def run_clair(data: dict, kind: str, solver, nuclear, options: dict) -> dict:
    """Program (7) by :func:`lowrank_fl.clair.solve_penalized`.

    ``data``: ``D`` (G*q, p), ``q``, ``lam_L``, ``lam_S``, ``weights`` (G,) or None;
    ``options``: ``method`` (iterative name), ``tol``, ``max_iter``.
    """
    from ..clair import solve_penalized

    common = dict(weights=data["weights"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "iterative":
            res = solve_penalized(data["D"], data["q"], data["lam_L"], data["lam_S"],
                                  method=options["method"], tol=options["tol"],
                                  max_iter=options["max_iter"], **common)
        else:
            res = solve_penalized(data["D"], data["q"], data["lam_L"], data["lam_S"],
                                  method="cvxpy", solver=solver, nuclear=nuclear,
                                  on_inaccurate="warn", **common)
    return _outcome(res, {"L": res.L, "S": res.S}, caught)


def run_nuclear(data: dict, kind: str, solver, nuclear, options: dict) -> dict:
    """Nuclear-norm multi-task least squares by :mod:`lowrank_fl.exact.nuclear`.

    ``data``: ``X`` (n, m, d), ``y`` (n, m), ``mu``; ``options``: ``tol``, ``max_iter``.
    """
    from ..exact.nuclear import solve_nuclear_cvxpy, solve_nuclear_prox

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "iterative":
            res = solve_nuclear_prox(data["X"], data["y"], data["mu"], tol=options["tol"],
                                     max_iter=options["max_iter"])
        else:
            res = solve_nuclear_cvxpy(data["X"], data["y"], data["mu"], solver=solver,
                                      on_inaccurate="warn")
    return _outcome(res, {"Theta": res.Theta}, caught)


def run_noiseless(data: dict, kind: str, solver, nuclear, options: dict) -> dict:
    """Program (24) by :func:`lowrank_fl.clair.solve_noiseless` (conic only).

    ``data``: ``D`` (G*q, p), ``q``, ``lam_L``, ``lam_S``. The returned point includes the
    equality dual ``Q`` (the certificate rescales it to exact feasibility).
    """
    from ..clair import solve_noiseless

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve_noiseless(data["D"], data["q"], data["lam_L"], data["lam_S"], solver=solver,
                              nuclear=nuclear, on_inaccurate="warn")
    return _outcome(res, {"L": res.L, "S": res.S, "Q": res.Q}, caught)


RUNNERS = {"clair": run_clair, "nuclear": run_nuclear, "noiseless": run_noiseless}


def clair_point(D, q, lam_L, lam_S, *, weights=None, method: str = "fista",
                n_iter: int | None = None, solver: str | None = None):
    """``(L, S)`` (G*q, p) of program (7) for the benchopt solvers: an iterative ``method``
    run for exactly ``n_iter`` iterations (``n_iter = 0``: the start ``L = S = 0``), or
    ``method="cvxpy"`` with ``solver`` (an inaccurate answer is kept (with a warning); the benchmark's
    objective certifies the point itself)."""
    from ..clair import solve_penalized

    if method != "cvxpy" and not n_iter:
        Z = np.zeros_like(np.asarray(D, dtype=float))
        return Z, Z.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)   # a fixed budget is not an error
        if method == "cvxpy":
            res = solve_penalized(D, q, lam_L, lam_S, weights=weights, method="cvxpy",
                                  solver=solver, on_inaccurate="warn")
        else:
            res = solve_penalized(D, q, lam_L, lam_S, weights=weights, method=method, tol=None,
                                  max_iter=int(n_iter))
    return np.array(res.L), np.array(res.S)
