"""Which methods a comparison runs, which of them can run here, and their memory estimates.

A method name is ``"fista"``, ``"proxgrad"`` (program (7)), ``"prox"`` (nuclear-norm least
squares) or ``"cvxpy:<SOLVER>"`` / ``"cvxpy:<SOLVER>:normNuc"`` for a conic solve (``<SOLVER>`` a
name CVXPY knows; ``normNuc`` uses ``cp.normNuc`` on the tall matrix instead of the block-Schur
form). A name of neither shape is a ``ValueError``; a well-formed name that cannot run here
(solver not installed, no semidefinite cones, beyond the memory budget) becomes a row with the
reason (:class:`Plan`), never a silent omission.

Memory estimates are the dominant term of each method, stated in :func:`estimate_memory`:
interior-point conic solvers keep a dense scaling block of ``m^2`` doubles per semidefinite cone
of ``m = n(n+1)/2`` entries (``n`` the cone size), so ``cp.normNuc`` on a (Gq, p) matrix (one cone
of size Gq + p) needs about ``8 ((Gq+p)^2 / 2)^2`` bytes: 26.6 TB at K = 20, q = p = 10.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import cvxpy as cp

__all__ = ["PROBLEMS", "ITERATIVE", "SDP_SOLVERS", "FIRST_ORDER_SOLVERS", "Plan",
           "default_methods", "parse_method", "plan_methods", "estimate_memory",
           "default_memory_limit"]

PROBLEMS = ("clair", "nuclear", "noiseless")
#: Iterative methods of each problem (the noiseless program (24) has none in the library).
ITERATIVE = {"clair": ("fista", "proxgrad"), "nuclear": ("prox",), "noiseless": ()}
#: CVXPY solvers that accept semidefinite cones (the nuclear norm needs them).
SDP_SOLVERS = ("CLARABEL", "SCS", "MOSEK", "CVXOPT", "SDPA", "COPT", "COSMO", "CUCLARABEL")
#: First-order conic solvers (memory linear in the cone entries, not quadratic).
FIRST_ORDER_SOLVERS = ("SCS", "COSMO")
# the conic solvers lowrank_fl's programs accept (checked at run time against the library)
_LIBRARY_SOLVERS = {"clair": ("lowrank_fl.clair.programs", "SOLVERS"),
                    "noiseless": ("lowrank_fl.clair.programs", "SOLVERS"),
                    "nuclear": (None, ("CLARABEL", "SCS"))}


@dataclass(frozen=True)
class Plan:
    """One requested method: its kind, whether it runs, and why not.

    Attributes
    ----------
    name : str
    kind : {"iterative", "conic"}
    solver : str or None
        CVXPY solver name (conic methods).
    nuclear : {"schur", "normNuc"} or None
        Nuclear-norm formulation (conic methods of (7) and (24)).
    estimated_bytes : float
        Dominant-term memory estimate (:func:`estimate_memory`).
    reason : str or None
        Why the method cannot run (``None``: it runs).
    """

    name: str
    kind: str
    solver: str | None
    nuclear: str | None
    estimated_bytes: float
    reason: str | None = None

    @property
    def runnable(self) -> bool:
        return self.reason is None


def _installed() -> list[str]:
    return list(cp.installed_solvers())


def _library_solvers(problem: str) -> tuple[str, ...]:
    module, attr = _LIBRARY_SOLVERS[problem]
    if module is None:
        return tuple(attr)
    import importlib

    return tuple(getattr(importlib.import_module(module), attr))


def default_methods(problem: str) -> list[str]:
    """Every iterative method of ``problem``, a block-Schur CVXPY solve with each installed
    semidefinite-capable solver, and (programs (7) and (24)) ``cvxpy:CLARABEL:normNuc`` so the
    tall-matrix formulation is shown (refused by its memory estimate when too large)."""
    installed = _installed()
    names = list(ITERATIVE[problem])
    names += [f"cvxpy:{s}" for s in SDP_SOLVERS if s in installed]
    if problem != "nuclear" and "CLARABEL" in installed:
        names.append("cvxpy:CLARABEL:normNuc")
    return names


def parse_method(name: str, problem: str) -> tuple[str, str | None, str | None]:
    """``(kind, solver, nuclear)`` of a method name; ``ValueError`` naming it if unknown."""
    if name in ITERATIVE[problem]:
        return "iterative", None, None
    parts = name.split(":")
    known = sorted(set(cp.settings.SOLVERS) | set(_installed()))
    ok_tail = len(parts) == 2 or (len(parts) == 3 and parts[2] == "normNuc"
                                  and problem != "nuclear")
    if parts[0] == "cvxpy" and ok_tail and parts[1].upper() in known:
        return "conic", parts[1].upper(), (parts[2] if len(parts) == 3 else
                                           (None if problem == "nuclear" else "schur"))
    iterative = ", ".join(ITERATIVE[problem])
    tail = "" if problem == "nuclear" else "[:normNuc]"
    which = f"one of {iterative} (iterative) or " if iterative else "(no iterative method for this problem) "
    raise ValueError(f"unknown method {name!r} for compare {problem}: expected {which}"
                     f"cvxpy:<SOLVER>{tail} with <SOLVER> a CVXPY "
                     f"solver name (installed: {', '.join(_installed())})")


def default_memory_limit() -> float:
    """Half the physical memory (bytes), or 8 GiB where the OS does not say."""
    try:
        return 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2 ** 30


def _svec(n: int) -> float:
    return n * (n + 1) / 2


def estimate_memory(problem: str, kind: str, solver: str | None, nuclear: str | None,
                    sizes: dict) -> float:
    """Dominant-term memory estimate (bytes) of one method.

    ``sizes``: ``rows`` and ``cols`` of the matrix variable (``Gq`` and ``p`` for (7)/(24),
    ``n`` and ``d`` for the nuclear problem), ``blocks`` (``G``) and ``block_rows`` (``q``);
    optional ``data_bytes``, added to every method (e.g. the nuclear problem's samples and
    per-client Gram matrices).

    * iterative: 16 arrays of the variable's size (FISTA's buffer pool, D, L, S and temporaries);
    * conic, interior point: ``8 m^2`` per semidefinite cone (the dense scaling block Clarabel
      allocates), ``m = n(n+1)/2`` the cone's entries (measured: Clarabel on ``cp.normNuc`` at
      K = 20, q = p = 10 aborts allocating 26 TB, this term's value);
    * conic, first order: ``8 n^2`` per cone of size ``n`` (its eigendecomposition), times 4;
    plus, for every conic method, 4 kB per scalar variable (CVXPY's canonicalisation and the
    solver's sparse data; measured RSS growth at K = 20, q = p = 10: Clarabel 0.53 GB, SCS
    0.20 GB, against estimates of 0.39 and 0.32 GB).
    """
    rows, cols = int(sizes["rows"]), int(sizes["cols"])
    var = 8.0 * rows * cols
    data = float(sizes.get("data_bytes", 0.0))
    if kind == "iterative":
        return 16 * var + data
    if problem == "nuclear" or nuclear == "normNuc":
        cones = [(rows + cols, 1)]
    else:
        cones = [(int(sizes["block_rows"]) + cols, int(sizes["blocks"]))]
    if solver in FIRST_ORDER_SOLVERS:
        cone_bytes = sum(4 * 8.0 * n * n * count for n, count in cones)
    else:
        cone_bytes = sum(8.0 * _svec(n) ** 2 * count for n, count in cones)
    scalars = 2 * rows * cols + sum(_svec(n) * count for n, count in cones)
    return cone_bytes + 4096.0 * scalars + data


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB"


def plan_methods(problem: str, names, sizes: dict, *, memory_limit: float | None = None
                 ) -> list[Plan]:
    """Plans for ``names`` (``None``: :func:`default_methods`), in order, duplicates removed.

    Raises
    ------
    ValueError
        A name that is not a method of ``problem`` (:func:`parse_method`).
    """
    if problem not in PROBLEMS:
        raise ValueError(f"problem must be one of {PROBLEMS}, got {problem!r}")
    names = default_methods(problem) if names is None else list(dict.fromkeys(names))
    if not names:
        raise ValueError("methods must name at least one method, got an empty list")
    limit = default_memory_limit() if memory_limit is None else float(memory_limit)
    installed = _installed()
    plans = []
    for name in names:
        kind, solver, nuclear = parse_method(name, problem)
        est = estimate_memory(problem, kind, solver, nuclear, sizes)
        reason = None
        if kind == "conic":
            lib = _library_solvers(problem)
            if solver not in installed:
                reason = f"solver {solver} is not installed (CVXPY finds: {', '.join(installed)})"
            elif solver not in SDP_SOLVERS:
                reason = f"{solver} does not handle semidefinite cones, which the nuclear norm needs"
            elif solver not in lib:
                reason = (f"lowrank_fl's {problem} program accepts solver in {', '.join(lib)}, "
                          f"not {solver}")
        if reason is None and est > limit:
            reason = (f"estimated memory {_gb(est)} exceeds the limit {_gb(limit)} "
                      "(see lowrank_fl.compare.methods.estimate_memory)")
        plans.append(Plan(name=name, kind=kind, solver=solver, nuclear=nuclear,
                          estimated_bytes=est, reason=reason))
    return plans
