"""The CLAIR pipeline after the convex program: subspace, detection (8), refinement (9).
(The stages themselves are in :mod:`lowrank_fl.clair.stages`; this module chains them.)

``fit`` runs Algorithm 1's whole procedure (§3.1, §4): contrasts (5)–(6) → penalized program (7)
→ ``P_Â`` from ``L̂`` → canonical components ``Ŝ_{A⊥} = D̂ P_{Â⊥}`` → collaborative set (8) →
refined estimates (9). Also here: the closed form (S4.3) of (9), the "largest-gap" threshold
(never defined by the paper; our reading is documented in :func:`largest_gap_threshold`), a
λ-path scan for choosing ``λ_S/λ_L``, the §7 baselines (local, FedAvg, oracle FedAvg) and the
Table 2 detection counts.

The output depends on (7) only through ``P_Â``: ``Ŝ`` is never used
downstream, although the paper says "we use Ŝ for active-set identification" — (8) uses
``D̂ P_{Â⊥}``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..validation import (as_float_array, check_choice, check_in_interval, check_int,
                           check_positive)
from .. import linalg
from ..results import ConvergenceWarning, SolverError, freeze_arrays
from .contrasts import as_blocks, check_weights, contrasts
from ..conic import safe_scale
from .penalized import DEFAULT, solve_penalized
from .stages import (MIN_GAP_RATIO, GapSplit, Subspace, Votes, check_benign, check_w_hat,
                     collaborative_set, largest_gap_split, largest_gap_threshold, majority_pairs,
                     numerical_rank, refine, refine_closed_form, subspace_projector)

__all__ = [
    "ClairFit",
    "LambdaPath",
    "DetectionCounts",
    "TAU_RULES",
    "fit",
    "longest_run",
    "subspace_projector",
    "numerical_rank",
    "collaborative_set",
    "largest_gap_threshold",
    "largest_gap_split",
    "GapSplit",
    "Subspace",
    "Votes",
    "MIN_GAP_RATIO",
    "majority_pairs",
    "refine",
    "refine_closed_form",
    "lambda_path",
    "local",
    "fedavg",
    "oracle_fedavg",
    "detection_counts",
]

#: Data-adaptive rules accepted by ``tau`` (besides a number ``tau >= 0``).
TAU_RULES = ("largest-gap", "largest-log-gap")
RANK_MODES = ("top", "numerical")
REFINEMENTS = ("eq9", "closed-form")


# ---------------------------------------------------------------------------------------------
# validation helpers

def _check_rank(rank, q: int, p: int) -> int:
    rank = check_int(rank, "rank", minimum=1)
    if rank >= min(p, q):
        raise ValueError(f"rank must satisfy 1 <= rank < min(p, q) = {min(p, q)}, got {rank}")
    return rank



def _check_tau(tau):
    if isinstance(tau, str):
        return check_choice(tau, "tau", TAU_RULES)
    return check_positive(tau, "tau", strict=False)


# ---------------------------------------------------------------------------------------------
# results
@dataclass(frozen=True, eq=False)
class ClairFit:
    """Output of :func:`fit`.

    Attributes
    ----------
    projector : ndarray, shape (p, p)
        ``P_Â`` from the right singular subspace of ``L̂``.
    benign : ndarray of bool, shape (K,)
        Estimated collaborative set ``Ĉ_α`` (8).
    refined : ndarray, shape (K, q, p)
        Refined estimates ``W̃^(k)`` (9) for ``k in Ĉ``; excluded clients keep ``Ŵ^(k)``.
    solution : PenalizedResult
        The solve of (7) (``.L``, ``.S``, ``.objective``, ``.gap``, ``.status``, ...), on the
        data divided by :attr:`scale` (1 unless the data are extreme; see :func:`fit`).
    tau : float
        Block-norm threshold ``τ_n`` used (the number given, or the rule's value).
    block_norms : ndarray, shape (G,)
        ``||Ŝ_{A⊥}^{(j,k)}||_F`` with ``Ŝ_{A⊥} = D̂ P_{Â⊥}``, pairs in eq. (6) order.
    votes : ndarray, shape (K,)
        Fraction of the other ``K - 1`` clients whose pair block is ``<= τ`` (the average in (8)).
    rank : int
        Dimension of ``P_Â`` (``rank`` in ``"top"`` mode, the numerical rank in ``"numerical"``).
    numerical_rank : int
        ``#{i : σ_i(L̂) > rank_threshold ||D̂||_op}``.
    singular_values : ndarray
        Singular values of ``L̂``.
    alpha : float
        Majority fraction of (8).
    tau_rule : str
        ``"fixed"`` or the data-adaptive rule's name.
    status : str
        Status of the solve of (7) (``solution.status``): ``"optimal"``, ``"completed"``
        (``tol=None``), ``"max_iter"``, ``"stalled"`` or ``"inaccurate"`` (each with a
        :class:`~lowrank_fl.results.ConvergenceWarning`); a ``"diverged"`` solve raises instead.
    separated : bool
        False when the ``τ`` rule found no admissible separation of the block norms (then
        ``τ`` is the largest norm and every client is kept); True for a fixed ``τ``.
    scale : float
        The normalisation ``c`` applied at the entry (1 for data within ``1e-100..1e100``).
    """

    projector: np.ndarray
    benign: np.ndarray
    refined: np.ndarray
    solution: Any
    tau: float
    block_norms: np.ndarray
    votes: np.ndarray
    rank: int
    numerical_rank: int
    singular_values: np.ndarray
    alpha: float
    tau_rule: str = "fixed"
    status: str = "optimal"
    separated: bool = True
    scale: float = 1.0

    def __post_init__(self):
        freeze_arrays(self)                      # read-only arrays, as every result of the library


@dataclass(frozen=True, eq=False)
class LambdaPath:
    """Output of :func:`lambda_path`. Arrays are indexed ``[i, j]`` = (``lam_L[i]``,
    ``ratios[j]``).

    Attributes
    ----------
    lam_L : ndarray, shape (n_L,)
    ratios : ndarray, shape (n_R,)
        ``λ_S / λ_L``, strictly increasing.
    lam_S : ndarray, shape (n_L, n_R)
    numerical_rank : ndarray of int, shape (n_L, n_R)
        rank(L̂) with threshold relative to ``||D̂||_op`` (not to ``σ_1(L̂)``).
    projector_error : ndarray, shape (n_L, n_R)
        ``||P_Â - P_A||_op`` for the top-``rank`` subspace when ``truth_projector`` was given,
        else NaN.
    objective, gap : ndarray, shape (n_L, n_R)
    iterations : ndarray of int, shape (n_L, n_R)
    status : ndarray of str, shape (n_L, n_R)
        Solver status per point; a :class:`~lowrank_fl.results.ConvergenceWarning` is issued
        once when any is not ``"optimal"``/``"completed"``.
    rank : int
        Target rank ``r``.
    bands : tuple of ((float, float) or None), length n_L
        Per ``λ_L``, the longest contiguous run of ratios with rank(L̂) = ``r`` as
        (lowest ratio, highest ratio), or None if no ratio gives rank ``r``.
    """

    lam_L: np.ndarray
    ratios: np.ndarray
    lam_S: np.ndarray
    numerical_rank: np.ndarray
    projector_error: np.ndarray
    objective: np.ndarray
    gap: np.ndarray
    iterations: np.ndarray
    status: np.ndarray
    rank: int
    bands: tuple = field(default_factory=tuple)

    @property
    def band(self):
        """The band of the first (usually the only) ``λ_L``: (low, high) ratio, or None."""
        return self.bands[0]


@dataclass(frozen=True)
class DetectionCounts:
    """Table 2 counts; benign is the positive class.

    ``tp`` benign kept, ``tn`` contaminated excluded, ``fp`` contaminated kept, ``fn`` benign
    excluded. ``accuracy = (tp + tn) / K``; ``contaminated_recall = tn / |C^c|`` (the paper's
    "recall", NaN without contaminated clients); ``benign_recall = tp / |C|``;
    ``false_exclusion_rate = 1 - benign_recall``; ``exact``: ``Ĉ = C``.
    """

    tp: int
    tn: int
    fp: int
    fn: int
    accuracy: float
    contaminated_recall: float
    benign_recall: float
    false_exclusion_rate: float
    exact: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# ---------------------------------------------------------------------------------------------
# the pipeline
def _solve(D, q, lam_L, lam_S, weights, method, options):
    """Solve (7); the solver's ConvergenceWarnings are held back so the caller can warn at the
    user's line (returns the result and the held-back messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        sol = solve_penalized(D, q, lam_L, lam_S, weights=weights, method=method, **options)
    held = []
    for wrn in caught:
        if issubclass(wrn.category, ConvergenceWarning):
            held.append(str(wrn.message))
        else:  # anything else passes through unchanged
            warnings.warn_explicit(wrn.message, wrn.category, wrn.filename, wrn.lineno)
    return sol, held


def _check_common(W_hat, rank, weights, rank_threshold):
    """Validation shared by :func:`fit` and :func:`lambda_path`."""
    W = check_w_hat(W_hat)
    K, q, p = W.shape
    G = K * (K - 1) // 2
    return (W, K, q, p, G, _check_rank(rank, q, p), check_weights(weights, G),
            check_positive(rank_threshold, "rank_threshold"))


def _projector(Vt, dim: int) -> np.ndarray:
    V = Vt[:dim].T
    return V @ V.T


def _scaled_init(init, c):
    if init is None or c == 1.0:
        return init
    if not (isinstance(init, (tuple, list)) and len(init) == 2):
        raise TypeError(f"init must be a pair (L0, S0) of arrays, got {type(init).__name__}")
    return (as_float_array(init[0], "init[0] (L0)") / c,
            as_float_array(init[1], "init[1] (S0)") / c)


def fit(W_hat, lam_L: float, lam_S: float, *, rank: int, alpha: float = 0.5,
        tau="largest-gap", weights=None, method: str = "fista", solver: str | None = None,
        solver_options: Mapping | None = None, tol=DEFAULT, max_iter: int = 10000,
        step_size: float | None = None, init=None, check_every: int = 5, svd: str = "auto",
        nuclear: str = "schur", on_inaccurate: str = "warn", verbose: bool = False,
        rank_mode: str = "top", rank_threshold: float = 1e-6,
        refinement: str = "eq9", stall_window=DEFAULT) -> ClairFit:
    """Run CLAIR (Algorithm 1 and §3.1) on local estimates.

    Steps: contrasts ``D̂`` (5)–(6); solve (7) with
    :func:`lowrank_fl.clair.penalized.solve_penalized`; ``P_Â`` from the right singular vectors
    of ``L̂``; ``Ŝ_{A⊥} = D̂ P_{Â⊥}`` and its block norms; collaborative set (8); refined
    estimates (9).

    The result depends on the program (7) **only through** ``P_Â`` (with ``τ`` and ``α``):
    ``Ŝ`` is never used downstream — the paper says "we use Ŝ for active-set identification",
    but (8) is written with ``D̂ P_{Â⊥}``. Clients outside ``Ĉ`` keep their local estimate in
    ``.refined`` ((9) leaves them undefined; the paper's Table 1 averages over all K clients and
    is consistent with this choice).

    Units: data whose largest contrast entry lies outside ``1e-100..1e100`` (where squares leave
    float64) are normalised once at the entry (``W_hat / c``, ``λ / c`` and a numeric ``τ / c``,
    ``c`` a power of two near ``max |D̂|``), so the fit is the same at any data scale
    representable in float64 (tested from 1e-200 to 1e200). ``projector``, ``benign``,
    ``refined``, ``tau``, ``block_norms`` and ``singular_values`` are in the data's units;
    ``solution`` is the solve of the normalised program (its objective, in the data's units,
    scales by ``c^2`` and would leave float64); ``scale`` is ``c`` (1 for ordinary data).

    Parameters
    ----------
    W_hat : array_like, shape (K, q, p)
        Local estimates, ``K >= 2``, finite.
    lam_L, lam_S : float
        Penalties of (7), > 0.
    rank : int
        ``r``, ``1 <= rank < min(p, q)``.
    alpha : float in [0.5, 1)
        Majority fraction of (8).
    tau : float >= 0 or {"largest-gap", "largest-log-gap"}
        Threshold ``τ_n`` of (8), or a rule applied to the block norms (see
        :func:`largest_gap_split`; §7 uses a "largest-gap" rule it does not define). A rule
        that finds no admissible separation keeps every client (``.separated`` is False).
    weights : None or array_like, shape (G,)
        Pair weights ``w_g > 0``; None means ``1/K`` (§7).
    method : {"fista", "proxgrad", "cvxpy"}
        The algorithm for (7) (see :func:`~lowrank_fl.clair.penalized.solve_penalized`).
    solver : {"CLARABEL", "SCS"} or None
        CVXPY backend (``method="cvxpy"`` only).
    solver_options : mapping, optional
        Keyword arguments for ``cvxpy.Problem.solve`` (``method="cvxpy"`` only).
    tol, max_iter, step_size, init, check_every, svd, nuclear, on_inaccurate, verbose, stall_window
        As in :func:`~lowrank_fl.clair.penalized.solve_penalized` (``init`` in the data's
        units; ``stall_window``: the stall rule of :mod:`lowrank_fl.stall`).
    rank_mode : {"top", "numerical"}
        ``"top"``: ``P_Â`` spans the top-``rank`` right singular vectors (Thm 2). A warning is
        issued if ``L̂`` has numerical rank below ``rank`` (the subspace is then partly
        arbitrary). ``"numerical"``: the compact SVD of §3.1/Alg. 1, i.e. all singular values
        ``> rank_threshold * ||D̂||_op`` — relative to ``D̂``, not to ``L̂`` (with ``L̂ ≈ 0`` a
        threshold relative to ``σ_1(L̂)`` would call noise full rank).
    rank_threshold : float > 0
    refinement : {"eq9", "closed-form"}
        Evaluate (9) literally (:func:`refine`) or by (S4.3) (:func:`refine_closed_form`); equal
        up to rounding.

    Returns
    -------
    ClairFit

    Warns
    -----
    RuntimeWarning
        The estimated collaborative set has fewer than 2 clients (nothing is shared), or the
        rank of ``L̂`` makes ``P_Â`` arbitrary or trivial.
    ConvergenceWarning
        The solve of (7) did not reach its tolerance (the fit goes on, on that solution).

    Raises
    ------
    SolverError
        The solve of (7) diverged (status ``"diverged"``): no subspace to use.
    """
    W, K, q, p, G, rank, w, rank_threshold = _check_common(W_hat, rank, weights, rank_threshold)
    lam_L = check_positive(lam_L, "lam_L")
    lam_S = check_positive(lam_S, "lam_S")
    alpha = check_in_interval(alpha, "alpha", 0.5, 1.0, closed="left")
    tau = _check_tau(tau)
    rank_mode = check_choice(rank_mode, "rank_mode", RANK_MODES)
    refinement = check_choice(refinement, "refinement", REFINEMENTS)

    D = contrasts(W)
    c = safe_scale(D)
    Dn = D / c if c != 1.0 else D
    options = dict(solver=solver, solver_options=solver_options, tol=tol, max_iter=max_iter,
                   step_size=step_size, init=_scaled_init(init, c), check_every=check_every,
                   svd=svd, nuclear=nuclear, on_inaccurate=on_inaccurate, verbose=verbose,
                   stall_window=stall_window)
    sol, held = _solve(Dn, q, lam_L / c, lam_S / c, w, method, options)
    if sol.status == "diverged":
        raise SolverError(f"the solve of (7) diverged at iteration {sol.diverged_at} "
                          f"(method={method!r}); CLAIR has no subspace to use", status="diverged")
    for msg in held:  # max_iter / stalled / inaccurate: the fit goes on, on a less exact P_Â
        warnings.warn(f"CLAIR fit: {msg}; the collaborative set and refinement use this "
                      "inexact solution", ConvergenceWarning, stacklevel=2)
    s, Vt = sol.singular_values, sol.Vt
    nrank = numerical_rank(s, float(sol.data_norm), rank_threshold)
    if rank_mode == "top":
        dim = rank
        if nrank < rank and not float(sol.data_norm) > 0:
            warnings.warn("every contrast is zero (the clients' estimates are all equal): there "
                          "is nothing to detect; every client is kept and (9) returns the "
                          "estimates unchanged", RuntimeWarning, stacklevel=2)
        elif nrank < rank:
            # an unfinished solve's L_hat is not (7)'s: blame the solve, not the lambdas
            why = (f"the solve ended {sol.status!r} before its tolerance, so L_hat is not yet (7)'s "
                   "solution (see the solve's warning)" if held else "lam_S/lam_L is probably too small")
            warnings.warn(f"L_hat has numerical rank {nrank} < rank={rank} (threshold "
                          f"{rank_threshold:g} * ||D_hat||_op): the top-{rank} subspace is partly "
                          f"arbitrary; {why}", RuntimeWarning, stacklevel=2)
    else:
        dim = nrank
        if dim == 0:
            warnings.warn("rank_mode='numerical': L_hat is numerically 0, so P_A_hat = 0: every "
                          "pair norm is ||D_g||_F and (9) is the plain mean over C_hat (FedAvg "
                          "on the kept clients); lam_S/lam_L is probably too small",
                          RuntimeWarning, stacklevel=2)
        elif dim == p:
            warnings.warn(f"rank_mode='numerical': L_hat has full rank p={p}, so P_A_hat = I: "
                          "every pair norm is 0, every client is kept and (9) returns the local "
                          "estimates; lam_S/lam_L is probably too large", RuntimeWarning,
                          stacklevel=2)
    P = _projector(Vt, dim)
    norms = linalg.block_norms(as_blocks(Dn - Dn @ P, q))       # in units of c
    if isinstance(tau, str):
        # block norms at rounding level of the contrasts are exact zeros (noiseless pairs)
        zero = 1e-9 * float(linalg.block_norms(as_blocks(Dn, q)).max())
        split = largest_gap_split(norms, log=(tau == "largest-log-gap"),
                                  min_below=majority_pairs(K, alpha), zero_level=zero)
        tau_n, separated, rule = split.threshold, split.separated, tau
    else:
        tau_n, separated, rule = tau / c, True, "fixed"
    benign, votes = collaborative_set(norms, K, tau_n, alpha)
    if benign.sum() < 2:
        warnings.warn(f"CLAIR fit: the estimated collaborative set has {int(benign.sum())} "
                      f"client(s) (tau={tau_n * c:.3g}, rule {rule!r}, alpha={alpha}): nothing is "
                      "shared and every client keeps its local estimate", RuntimeWarning,
                      stacklevel=2)
    refiner = refine if refinement == "eq9" else refine_closed_form
    refined = refiner(W, P, benign)
    return ClairFit(projector=P, benign=benign, refined=refined, solution=sol, tau=float(tau_n * c),
                    block_norms=norms * c, votes=votes, rank=dim, numerical_rank=nrank,
                    singular_values=s * c, alpha=alpha, tau_rule=rule, status=str(sol.status),
                    separated=bool(separated), scale=float(c))


def lambda_path(W_hat, lam_L, ratios, *, rank: int, weights=None, method: str = "fista",
                solver: str | None = None, solver_options: Mapping | None = None, tol=DEFAULT,
                max_iter: int = 10000, step_size: float | None = None, check_every: int = 5,
                svd: str = "auto", nuclear: str = "schur", on_inaccurate: str = "warn",
                verbose: bool = False, rank_threshold: float = 1e-6, truth_projector=None,
                warm_start: bool = False, stall_window=DEFAULT) -> LambdaPath:
    """Scan ``λ_S/λ_L`` (and ``λ_L``) and report where rank(L̂) = r.

    The paper's λ constants are unreported and recovery holds only in a band of ``λ_S/λ_L``
    (below it ``L̂ = 0``, above it the rank inflates). For every (``λ_L``, ratio) this solves (7)
    and records rank(L̂) (threshold relative to ``||D̂||_op``), the objective, duality gap and
    status, and ``||P_Â - P_A||_op`` (top-``rank`` subspace) when the truth is known. The data
    are normalised once at the entry, as in :func:`fit`.

    Parameters
    ----------
    W_hat : array_like, shape (K, q, p)
    lam_L : float or array_like, shape (n_L,)
        Positive.
    ratios : array_like, shape (n_R,)
        ``λ_S/λ_L`` values, positive and strictly increasing.
    rank : int
        Target ``r``.
    weights, method, solver, solver_options, tol, max_iter, step_size, check_every, svd, \
nuclear, on_inaccurate, verbose, stall_window
        As in :func:`fit`.
    rank_threshold : float
        Relative to ``||D̂||_op``.
    truth_projector : array_like, shape (p, p), optional
        True ``P_A``.
    warm_start : bool
        Start each solve along the ratio axis from the previous ``(L̂, Ŝ)`` (iterative methods;
        same optimum, usually fewer iterations). Off by default so every point is computed
        exactly as a stand-alone :func:`fit` would.

    Returns
    -------
    LambdaPath
    """
    W, K, q, p, G, rank, w, rank_threshold = _check_common(W_hat, rank, weights, rank_threshold)
    lam_L = as_float_array(lam_L, "lam_L", ndim=(0, 1)).reshape(-1)
    if lam_L.size == 0 or np.any(lam_L <= 0):
        raise ValueError(f"lam_L must be > 0 (a number or a non-empty 1-D array), got {lam_L}")
    ratios = as_float_array(ratios, "ratios", ndim=1)
    if ratios.size == 0 or np.any(ratios <= 0) or np.any(np.diff(ratios) <= 0):
        raise ValueError(f"ratios must be a non-empty, positive, strictly increasing 1-D array, "
                         f"got {ratios}")
    P_true = (None if truth_projector is None
              else as_float_array(truth_projector, "truth_projector", shape=(p, p)))
    if warm_start and method == "cvxpy":
        raise ValueError("warm_start=True needs an iterative method ('fista' or 'proxgrad'), "
                         "got method='cvxpy'")

    D = contrasts(W)
    c = safe_scale(D)
    Dn = D / c if c != 1.0 else D
    D_op = float(np.linalg.norm(Dn, 2))
    options = dict(solver=solver, solver_options=solver_options, tol=tol, max_iter=max_iter,
                   step_size=step_size, check_every=check_every, svd=svd, nuclear=nuclear,
                   on_inaccurate=on_inaccurate, verbose=verbose, stall_window=stall_window)
    shape = (lam_L.size, ratios.size)
    nrank = np.zeros(shape, dtype=int)
    iters = np.zeros(shape, dtype=int)
    err, obj, gap = (np.full(shape, np.nan) for _ in range(3))
    status = np.empty(shape, dtype=object)
    lam_S = lam_L[:, None] * ratios[None, :]
    for i, lL in enumerate(lam_L):
        prev = None
        for j, lS in enumerate(lam_S[i]):
            sol, _ = _solve(Dn, q, float(lL) / c, float(lS) / c, w, method,
                            dict(options, init=prev))
            if warm_start and sol.status != "diverged":
                prev = (sol.L, sol.S)
            nrank[i, j] = numerical_rank(sol.singular_values, D_op, rank_threshold)
            if P_true is not None:
                err[i, j] = np.linalg.norm(_projector(sol.Vt, rank) - P_true, 2)
            obj[i, j], gap[i, j] = sol.objective * c * c, sol.gap * c * c
            iters[i, j], status[i, j] = sol.iterations, sol.status
    bad = {str(x) for x in status.ravel()} - {"optimal", "completed"}
    if bad:
        warnings.warn(f"lambda_path: some solves of (7) ended with status {sorted(bad)} (see "
                      ".status); their ranks and errors are not exact", ConvergenceWarning,
                      stacklevel=2)
    bands = tuple(longest_run(ratios, nrank[i] == rank) for i in range(lam_L.size))
    return LambdaPath(lam_L=lam_L, ratios=ratios, lam_S=lam_S, numerical_rank=nrank,
                      projector_error=err, objective=obj, gap=gap, iterations=iters,
                      status=status.astype(str), rank=rank, bands=bands)


def longest_run(x: np.ndarray, mask: np.ndarray):
    """(x[start], x[end]) of the longest contiguous run of True in ``mask`` (first on ties)."""
    best, start, best_len = None, None, 0
    for i, m in enumerate(list(mask) + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            if i - start > best_len:
                best, best_len = (float(x[start]), float(x[i - 1])), i - start
            start = None
    return best


# ---------------------------------------------------------------------------------------------
# §7 baselines and Table 2 counts
def local(W_hat) -> np.ndarray:
    """Local baseline: every client keeps ``Ŵ^(k)``. (K, q, p) → (K, q, p) copy."""
    return check_w_hat(W_hat).copy()


def fedavg(W_hat) -> np.ndarray:
    """FedAvg over all clients: everyone receives ``mean_k Ŵ^(k)``. (K, q, p) → (K, q, p)."""
    W = check_w_hat(W_hat)
    return np.broadcast_to(W.mean(axis=0), W.shape).copy()


def oracle_fedavg(W_hat, benign) -> np.ndarray:
    """Oracle FedAvg (§7): clients in the true benign set receive the benign mean; the others
    keep their local estimate. ``benign``: bool (K,)."""
    W = check_w_hat(W_hat)
    b = check_benign(benign, W.shape[0])
    out = W.copy()
    if np.any(b):
        out[b] = W[b].mean(axis=0)
    return out


def detection_counts(estimated, truth) -> DetectionCounts:
    """Confusion counts of an estimated collaborative set (Table 2; benign = positive class).

    Parameters
    ----------
    estimated, truth : array_like of bool, shape (K,)

    Returns
    -------
    DetectionCounts
    """
    t = np.asarray(truth)
    if t.ndim != 1:
        raise ValueError(f"truth must be a 1-D boolean array (one flag per client), "
                         f"got shape {t.shape}")
    t = check_benign(t, t.shape[0], "truth")
    e = check_benign(estimated, t.shape[0], "estimated")
    tp = int(np.sum(e & t))
    tn = int(np.sum(~e & ~t))
    fp = int(np.sum(e & ~t))
    fn = int(np.sum(~e & t))
    K = t.size
    n_b, n_c = tp + fn, tn + fp
    benign_recall = tp / n_b if n_b else float("nan")
    return DetectionCounts(tp=tp, tn=tn, fp=fp, fn=fn, accuracy=(tp + tn) / K,
                           contaminated_recall=tn / n_c if n_c else float("nan"),
                           benign_recall=benign_recall,
                           false_exclusion_rate=1.0 - benign_recall,
                           exact=bool(np.array_equal(e, t)))
