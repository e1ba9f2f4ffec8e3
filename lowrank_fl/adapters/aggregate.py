"""Aggregators on loaded adapters, one module at a time, in reduced coordinates.

Methods (all give PEFT factors with ``B A = `` the aggregated ``ΔW``, scaling folded into B):

* ``"clair"`` — personalized. Reduce (:mod:`.reduce`), choose λ (:mod:`.tuning`), solve (7)
  on the pair-factored contrasts with :func:`lowrank_fl.clair.solve_penalized_factored`
  (``contrasts="dense"``: :func:`lowrank_fl.clair.solve_penalized` on the formed (G h × p′)
  stack, the former path), ``P′`` from the top-``rank`` right singular
  vectors of ``L̂″``, detection (8) on ``||D″_g (I - P′)||_F`` with the largest-gap ``τ``
  (:func:`lowrank_fl.clair.largest_gap_threshold`, :func:`lowrank_fl.clair.collaborative_set`),
  refinement (9) in its closed form (S4.3)
  ``ΔW̃_k = U (M_k P′ + M̄_Ĉ (I - P′)) V^T`` — exactly what :func:`lowrank_fl.clair.fit` does on
  the full matrices (proof in :mod:`.reduce`). Excluded clients keep their adapter. With
  ``P′ = Z Z^T`` the output is written without any out × in product as
  ``B = [U, U (M_k - M̄) Z]``, ``A = [M̄ V^T; (V Z)^T]``.
* ``"fedavg"`` — the exact mean ``ΔW̄ = U M̄ V^T``, re-factorized by an SVD of ``M̄``.
* ``"fedavg-factors"`` — ``mean(s_k B_k) · mean(A_k)``, what naive federated LoRA computes
  (equal ranks required).
* ``"ffa"`` — FFA-LoRA: ``B`` averaged with the frozen common ``A`` (refused unless every client's
  ``A`` is the same).
* ``"flexlora"`` — FlexLoRA: the SVD of ``ΔW̄`` truncated to the clients' rank, computed on the
  reduced factors (exact: ``U``, ``V`` are isometries).
* ``"krum"``, ``"multikrum"``, ``"median"``, ``"trimmed-mean"``, ``"geomed"`` — robust-FL
  baselines on the whole clients' updates (:mod:`.robust`): each module keeps its reduced
  coordinates, and :func:`apply_robust` combines all modules at once.

Client-level decisions (``client_rule``, :func:`client_decision`): ``"per-module"`` (8) as the
paper writes it; ``"majority"``, ``"any"`` over the modules' sets; ``"pooled"``, our extension
pooling every module's block norms (:mod:`.detect`); ``"updates"`` (the default, :mod:`.detect_updates`);
``"raw"``, the pooled scores of the raw distances ``||ΔW_j - ΔW_k||_F`` against ``c_K`` alone
(:func:`lowrank_fl.adapters.detect.raw_evidence`: size counts as much as direction there).

The library's LoRA aggregation kernels (:mod:`lowrank_fl.algorithms.lora_aggregation`, PEFT
letters: A (K, r, in), B (K, out, r)) are reused for fedavg / fedavg-factors / flexlora.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from .. import clair
from ..algorithms import lora_aggregation as lora
from ..linalg import compact_factors
from ..validation import check_in_interval
from . import detect, detect_updates, guard, robust
from .io import AdapterError, ModuleFactors
from .feature_profile import feature_norms
from .init_reversal import InitCosines, init_cosines, reversed_init_flags
from ..clair.factored import PairContrasts
from ..stall import INACCURATE
from .reduce import ReducedModule, pair_blocks, pair_factors, reduce_module
from .tuning import auto_lambdas, solve_module
from .degenerate import IDENTICAL_RULE, identical_module, zero_pairs
from .options import (BYZANTINE_METHODS, CLIENT_RULES, CLIP, CONTRASTS, DEFAULT_CLIENT_RULE, METHODS,
                      OUTPUT_DTYPES, ModuleOptions, check_rank)
from .updates import outside_shares, raw_distances, untrained_clients, update_gram, update_sq_norms

__all__ = ["METHODS", "CLIENT_RULES", "ModuleResult", "aggregate_module", "client_decision",
           "ModuleOptions", "check_rank", "apply_robust", "refit_without", "IDENTICAL_RULE",
           "BYZANTINE_METHODS", "OUTPUT_DTYPES"]

_SV_RTOL = 1e-12
#: with ``contrasts="auto"``, a factored solve of (7) that ends "inaccurate" or "stalled" is solved
#: again on the dense contrasts when they take at most this many bytes (G h p′ float64 numbers)
DENSE_FALLBACK_BYTES = 2 ** 28
#: ... and solved there from the start where two clients' updates are closer than this (relative
#: distance, the pairs the same to rounding aside): the factored form holds a contrast of relative
#: size e to about 1e-16 / e^2, too coarse for (7)'s certificate below 1e-4
NEAR_RELATIVE = 1e-4


@dataclass
class ModuleResult:
    """One module's aggregation. ``outputs(k)`` builds output adapter ``k``'s factors.

    Attributes (summary fields): ``name``, ``shape`` (out, in), ``ranks`` (per client),
    ``benign`` (bool per client, CLAIR's per-module set (8), None otherwise), ``lam_L``,
    ``lam_S``, ``lam_rule``, ``weights`` (per pair for CLAIR), ``rank`` (dimension of
    ``P_Â``), ``numerical_rank`` (of ``L̂``, relative to ``||D̂||_op``), ``reduced_dims`` ([q′, p′];
    [0, 0] where every update is zero), ``pair_height`` (h), ``status``, ``relative_gap``,
    ``iterations``, ``discarded`` (relative energy of a truncated reduction), ``tau``, ``votes``,
    ``block_norms``, ``contrasts`` (CLAIR: the form (7) was solved on, ``"factored"`` or
    ``"dense"``; under ``contrasts="auto"`` the dense form (at most :data:`DENSE_FALLBACK_BYTES`)
    where clients are within :data:`NEAR_RELATIVE` of each other, or where a factored solve ended
    inaccurate, stalled or at max_iter (``"dense (factored: <status>)"``); None where nothing was
    solved), ``seconds``.
    """

    name: str
    method: str
    shape: tuple
    ranks: list
    reduced_dims: tuple
    discarded: float
    seconds: float = 0.0
    benign: list | None = None
    lam_L: float | None = None
    lam_S: float | None = None
    lam_rule: str | None = None
    weights: list | None = None
    rank: int | None = None
    numerical_rank: int | None = None
    pair_height: int | None = None
    contrasts: str | None = None
    status: str = "exact"
    relative_gap: float = 0.0
    iterations: int = 0
    tau: float | None = None
    separated: bool | None = None
    votes: list | None = None
    block_norms: list | None = None
    #: clients whose update of this module is exactly zero (lora_B or lora_A all zeros)
    zero_updates: list = field(default_factory=list)
    #: ``||D″_g||_F`` per pair (before the projection of (8)), and the gap of the largest-gap
    #: split in standard deviations of the norms below it (admissible from ``MIN_GAP_RATIO``)
    contrast_norms: list | None = None
    gap_ratio: float | None = None
    #: CLAIR: the Gram matrix (K, K) of the clients' updates ``<ΔW_j, ΔW_k>_F`` (the update rule's
    #: evidence, :mod:`.updates`; not in the summary: K^2 numbers per module)
    gram: np.ndarray | None = field(default=None, repr=False)
    #: CLAIR: per client the share of its update outside the shared row space,
    #: ``||ΔW_k (I - P_Â)||_F / ||ΔW_k||_F`` (0 for a zero update): the fit of CLAIR's model (3)-(4)
    #: per client, scale-free (the update rule's row-space evidence)
    outside: list | None = None
    #: CLAIR: the norms of every client's update's rows (K, out) and columns (K, in) (the update
    #: rule's feature-profile evidence, :mod:`.feature_profile`; not in the summary)
    features: tuple | None = field(default=None, repr=False)
    #: CLAIR: whether each client's ``A`` is the common initialization reversed
    #: (:class:`.init_reversal.InitCosines`: per client, NaN where not tested), or None for the module
    init_cosines: InitCosines | None = field(default=None, repr=False)
    #: CLAIR: the Gram (K, K) of the updates' parts outside the shared row space,
    #: ``<ΔW_j (I - P_Â), ΔW_k (I - P_Â)>_F`` (how far (9) moves each client, :mod:`.noharm`)
    gram_outside: np.ndarray | None = field(default=None, repr=False)
    #: clients whose update the solve of (7) saw clipped (``ModuleOptions.clip``)
    clipped: list = field(default_factory=list)
    #: the second solve of (7) without the flagged clients (:func:`refit_without`), or None
    refit: dict | None = None
    # state for the outputs (float64 coordinates; bases in float32 only for writing)
    state: dict = field(default_factory=dict, repr=False)

    def summary(self) -> dict:
        keys = ("shape", "ranks", "benign", "lam_L", "lam_S", "lam_rule", "weights", "rank",
                "numerical_rank", "reduced_dims", "pair_height", "contrasts", "status", "relative_gap",
                "iterations",
                "discarded", "tau", "separated", "votes", "block_norms", "contrast_norms",
                "gap_ratio", "zero_updates", "outside", "clipped", "refit", "seconds")
        return {k: _jsonable(getattr(self, k)) for k in keys}

    def release(self) -> None:
        """Drop the output state (bases, coordinates) once the outputs are written; the summary
        fields stay. :meth:`outputs` then raises."""
        self.state = {"released": True}

    @property
    def n_outputs(self) -> int:
        return len(self.ranks) if self.method == "clair" else 1

    def outputs(self, k: int, benign=None, rank_out: int | None = None, weight: float = 1.0):
        """Factors ``(B (out, rho), A (rho, in), relative truncation error)`` of output ``k``.

        ``benign``: the client set to refine with (CLAIR; default the module's own set (8)).
        ``rank_out``: truncate by SVD to this rank (the relative Frobenius error is returned).
        ``weight``: ``a_k`` in [0, 1], how much of the refinement a collaborative client takes:
        ``ΔW̃_k = ΔW_k (I - a_k (I - P_Â)) + a_k ΔW̄_Ĉ (I - P_Â)``, i.e.
        ``U (M_k - a_k (M_k - M̄) (I - P′)) V^T``; 1 is (9), 0 the client's own adapter.
        """
        st = self.state
        if st.get("released"):
            raise RuntimeError(f"module {self.name!r}: its outputs were written and released "
                               "(aggregate_to_dir); aggregate again to build them")
        if st.get("split_only"):
            raise RuntimeError(f"module {self.name!r}: only the split layout's state was kept "
                               "(lowrank_fl.adapters.split.keep_split_state)")
        if self.method != "clair":
            return _truncate(st["B"], st["A"], rank_out, st.get("core"))
        a = check_in_interval(weight, "weight", 0.0, 1.0)
        b = np.asarray(self.benign if benign is None else benign, bool)
        key = tuple(b.tolist())
        U, V, Y, X, Z = st["U"], st["V"], st["Y"], st["X"], st["Z"]
        Mk = Y[k] @ X[k]                                # M_k = U^T ΔW_k V (q′, p′)
        if not b[k] or a == 0:                          # excluded: keeps its own update
            if rank_out is None and k in st["own"]:
                return st["own"][k][0], st["own"][k][1], 0.0
            return _factorize(U, Mk, V, rank_out)       # U M_k V^T = ΔW_k (exact reduction)
        mcache = st.setdefault("mbar_cache", {})
        if key not in mcache:                           # M̄ over the set, never all M_k at once
            mcache.clear()
            Yb, Xb = Y[b], X[b]                         # one GEMM over (client, rank)
            mcache[key] = (Yb.transpose(1, 0, 2).reshape(Yb.shape[1], -1)
                           @ Xb.reshape(-1, Xb.shape[2])) / int(b.sum())
        Mbar = mcache[key]
        if rank_out is not None:
            Mt = Mk @ (Z @ Z.T) + Mbar - Mbar @ (Z @ Z.T)
            if a != 1:
                Mt = (1 - a) * Mk + a * Mt
            return _factorize(U, Mt, V, rank_out)
        if a != 1:       # B = [U, a U (M_k - M̄) Z], A = [(M_k - a (M_k - M̄)) V^T; (V Z)^T]
            Dk = Mk - Mbar
            Bk = np.hstack([U, U @ (a * (Dk @ Z)).astype(U.dtype)])
            Ak = np.vstack([((Mk - a * Dk) @ V.T).astype(V.dtype), st["VZt"]])
            return (*compact_factors(Bk, Ak), 0.0)
        cache = st.setdefault("mean_cache", {})
        if key not in cache:                            # shared by every benign client
            cache.clear()
            cache[key] = (Mbar @ V.T).astype(V.dtype)    # (q′, in)
        MbarVt = cache[key]
        Bk = np.hstack([U, U @ ((Mk - Mbar) @ Z).astype(U.dtype)])
        Ak = np.vstack([MbarVt, st["VZt"]])
        return (*compact_factors(Bk, Ak), 0.0)


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    if isinstance(v, tuple):
        return list(v)
    return v


def _factorize(U, C, V, rank_out):
    """``U C V^T`` as PEFT factors by an SVD of the small ``C``; numerical rank or ``rank_out``."""
    X, s, Yt = np.linalg.svd(np.asarray(C, float), full_matrices=False)
    rho = max(int(np.count_nonzero(s > _SV_RTOL * s[0])) if s.size and s[0] > 0 else 0, 1)
    err = 0.0
    if rank_out is not None and rank_out < rho:
        tot = float(s @ s)
        err = float(np.sqrt(s[rank_out:rho] @ s[rank_out:rho] / tot)) if tot > 0 else 0.0
        rho = rank_out
    root = np.sqrt(s[:rho])
    dt = U.dtype
    B = U @ (X[:, :rho] * root).astype(dt)
    A = (root[:, None] * Yt[:rho]).astype(dt) @ V.T
    return B, A, err


def _truncate(B, A, rank_out, core):
    """Single-output methods: ``core = (U, C, V)`` when the output is ``U C V^T``."""
    if rank_out is None or rank_out >= B.shape[1]:
        return B, A, 0.0
    return _factorize(*core, rank_out)


# --------------------------------------------------------------------------------------------
def _mode(values):
    vals, counts = np.unique(np.asarray(values), return_counts=True)
    return int(vals[np.argmax(counts)])


def aggregate_module(f: ModuleFactors, options: ModuleOptions) -> ModuleResult:
    """Aggregate one module's client factors with ``options.method`` (module docstring)."""
    t0 = time.perf_counter()
    K = len(f.A)
    if K < 2:
        raise AdapterError(f"module {f.name!r}: need at least 2 clients, got {K}")
    check_rank(options, {f.name: f.shape})
    red = reduce_module(f, energy=options.energy)
    zero = [k for k in range(K) if not (f.B[k].any() and f.A[k].any())]
    # nobody trained it: the reduction's 1-D zero placeholder spans nothing (as `adapters inspect` says)
    res = ModuleResult(name=f.name, method=options.method, shape=tuple(f.shape), ranks=list(f.ranks),
                       reduced_dims=(0, 0) if len(zero) == K else red.dims, discarded=red.discarded,
                       zero_updates=zero)
    dt = np.dtype(options.output_dtype)
    U32, V32 = red.U.astype(dt), red.V.astype(dt)
    m = options.method
    if m == "clair":
        res.gram = update_gram(red.Y, red.X)
        res.features = feature_norms(f.A, f.B, f.scaling)
        res.init_cosines = init_cosines(f.A, f.B)
        _clair(f, red, options, res)
        # the original factors of the clients this module excludes (written back unchanged)
        own = {k: ((f.scaling[k] * f.B[k]).astype(dt), f.A[k].astype(dt))
               for k in range(K) if not res.benign[k]}
        res.state.update(U=U32, V=V32, Y=red.Y, X=red.X, own=own)
        res.state["VZt"] = (V32 @ res.state["Z"].astype(dt)).T.copy()
        res.state["XZ"] = np.matmul(red.X, res.state["Z"])      # A_k V Z, for the split layout
    elif m == "fedavg":
        Mbar = lora.mean_product(red.X, red.Y)                 # (q′, p′), reduced exact mean
        B, A, _ = _factorize(U32, Mbar, V32, None)
        res.state.update(B=B, A=A, core=(U32, Mbar, V32))
    elif m in robust.ROBUST_METHODS:       # combined over all modules later (apply_robust)
        res.state.update(U=U32, V=V32, M=red.M)
    elif m == "flexlora":
        rank = options.rank or _mode(f.ranks)
        rank = min(rank, *red.dims)
        Ap, Bp = lora.flexlora_aggregate(red.X, red.Y, rank=rank)   # (r, p′), (q′, r)
        res.state.update(B=U32 @ Bp.astype(dt), A=Ap.astype(dt) @ V32.T,
                         core=(U32, Bp @ Ap, V32))
        res.rank = rank
    else:
        if len(set(f.ranks)) != 1:
            raise AdapterError(f"module {f.name!r}: method {m!r} averages factors and needs "
                               f"equal ranks, got {f.ranks}")
        A = np.stack(f.A)
        B = np.stack([s * b for s, b in zip(f.scaling, f.B)])
        if m == "ffa":      # FFA-LoRA: A frozen and shared, so mean(B) A = mean ΔW exactly
            dev = float(np.abs(A - A[:1]).max())
            if dev > 1e-6 * max(float(np.abs(A).max()), np.finfo(float).tiny):
                raise AdapterError(f"module {f.name!r}: method 'ffa' needs the same (frozen) A "
                                   f"on every client; max |A_k - A_1| = {dev:.3g}")
        Abar, Bbar = lora.fedavg_factors(A, B)
        core = (U32, np.einsum("kqr->qr", red.Y) @ np.einsum("krp->rp", red.X) / K**2, V32)
        res.state.update(B=Bbar.astype(dt), A=Abar.astype(dt), core=core)
    res.seconds = time.perf_counter() - t0
    return res


def _clipped(red: ReducedModule, clip: float | None):
    """``red`` with each update scaled down to at most ``clip`` times the median update norm
    (the contrasts (7) is solved on), and the clients that were."""
    if clip is None or red.Y.shape[0] < 3:
        return red, []
    n = np.sqrt(np.maximum(update_sq_norms(red.Y, red.X), 0.0))
    cap = float(clip) * float(np.median(n))
    over = (n > cap) & (cap > 0)
    if not over.any():
        return red, []
    c = np.where(over, cap / np.where(over, n, 1.0), 1.0)
    return (ReducedModule(U=red.U, V=red.V, Y=red.Y * c[:, None, None], X=red.X, discarded=red.discarded),
            np.flatnonzero(over).tolist())


def _clair(f, red: ReducedModule, o: ModuleOptions, res: ModuleResult) -> None:
    K = len(f.A)
    qp, pp = red.dims
    gram = update_gram(red.Y, red.X) if res.gram is None else res.gram
    dist = raw_distances(gram)                 # ||ΔW_j - ΔW_k|| per pair, 0 where the same to rounding
    same = dist == 0
    if same.all():
        return identical_module(red, o, res, min(o.rank or _mode(f.ranks), pp))
    solve_red, res.clipped = _clipped(red, o.clip)
    G = K * (K - 1) // 2
    # clients within NEAR_RELATIVE of each other: the factored form's Grams would cancel (its
    # certificate breaks or crawls), so "auto" forms the dense contrasts where they fit
    near = o.contrasts == "auto" and G * 2 * red.Y.shape[2] * pp * 8 <= DENSE_FALLBACK_BYTES \
        and _nearest(gram, dist) < NEAR_RELATIVE
    if o.contrasts == "dense" or near:
        D, h = pair_blocks(solve_red)
        res.contrasts = "dense (clients within 1e-4 of each other)" if near else None
    else:
        D = pair_factors(solve_red)
        h = D.q
    D = zero_pairs(D, h, same)
    rank = o.rank or _mode(f.ranks)
    rank = min(rank, pp)
    w = np.full(G, 1.0 / K)
    warm = None
    if o.lam_L is None:
        lams = auto_lambdas(D, h, K, rank, weights=w)
        lam_L, lam_S, rule, warm = lams.lam_L, lams.lam_S, lams.rule, lams.warm
    else:
        lam_L, lam_S, rule = float(o.lam_L), float(o.lam_S), "given"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # explicit λ: a cold start, exactly clair.fit's iterates (reduce.py) on dense contrasts;
        # automatic λ: warm start from the tuning path's nearest solve (same optimum, fewer
        # iterations)
        sol = solve_module(D, h, lam_L, lam_S, weights=w, tol=o.tol, max_iter=o.max_iter,
                           init=warm)
        if (o.contrasts == "auto" and isinstance(D, PairContrasts)
                and sol.status in (INACCURATE, "stalled", "max_iter") and G * D.q * pp * 8 <= DENSE_FALLBACK_BYTES):
            # the factored form's Grams cancel where clients are within ~1e-5 of each other (its
            # certificate then breaks); the dense contrasts, formed by subtraction, keep the digits
            D, h = pair_blocks(solve_red)
            D = zero_pairs(D, h, same)
            first = sol.status
            sol = solve_module(D, h, lam_L, lam_S, weights=w, tol=o.tol, max_iter=o.max_iter)
            res.contrasts = f"dense (factored: {first})"
    if sol.status == "diverged":
        raise AdapterError(f"module {f.name!r}: the solve of (7) diverged")
    # a C-contiguous copy: a transposed view is pickled as a contiguous array, and products with
    # the two layouts round differently, so worker and in-process results would differ in the
    # last bit
    Z = np.ascontiguousarray(sol.Vt[:rank].T)                   # (p′, rank), P′ = Z Z^T
    # detection (8) and the pooled rule read the raw contrasts: a clipped update keeps its size
    Dd, hd = D, h
    if res.clipped:
        Dd, hd = pair_blocks(red) if not isinstance(D, PairContrasts) else (pair_factors(red), None)
        hd = Dd.q if hd is None else hd
        Dd = zero_pairs(Dd, hd, same)
    norms, zero = _detection_norms(Dd, hd, Z)
    split = clair.largest_gap_split(norms, min_below=clair.majority_pairs(K, o.alpha),
                                    zero_level=zero)
    # without a split every pair is collaborative: τ covers the norms counted as exact zeros too
    # (when all are, the split's threshold is 0 and rounding-level norms would exclude everyone)
    tau = split.threshold if split.separated else max(split.threshold, zero)
    benign, votes = clair.collaborative_set(norms, K, tau, alpha=o.alpha)
    benign = guard.guard_set(benign)   # not a strict majority: undecided, everyone keeps their own
    res.separated = bool(split.separated)
    res.benign = [bool(x) for x in benign]
    res.lam_L, res.lam_S, res.lam_rule = lam_L, lam_S, rule
    res.weights = w.tolist()
    res.rank = rank
    # rank(L̂) relative to ||D̂||_op (clair.fit's rule); below ``rank`` the top-rank subspace is
    # partly arbitrary, which the CLI reports
    d_op = getattr(sol, "data_norm", None)
    d_op = float(np.linalg.norm(_dense(D), 2)) if d_op is None else float(d_op)
    res.numerical_rank = int(np.count_nonzero(sol.singular_values > 1e-6 * d_op))
    res.pair_height = h
    res.contrasts = res.contrasts or ("factored" if isinstance(D, PairContrasts) else "dense")
    res.status = str(sol.status)
    res.relative_gap = float(sol.relative_gap)
    res.iterations = int(sol.iterations)
    res.tau = float(tau)
    res.votes = votes.tolist()
    res.block_norms = norms.tolist()
    res.contrast_norms = _contrast_norms(Dd, hd).tolist()
    res.outside = outside_shares(red.Y, red.X, Z).tolist()
    res.gram_outside = update_gram(red.Y, red.X - (red.X @ Z) @ Z.T)
    res.gap_ratio = float(split.gap_ratio)
    # contiguous: a strided view here and its pickled (contiguous) copy from a worker give
    # products that differ in the last bit, and every backend must write the same numbers
    res.state.update(Z=np.ascontiguousarray(Z), objective=float(sol.objective),
                     singular_values=sol.singular_values,
                     warnings=[str(c.message) for c in caught])


def _nearest(gram, dist) -> float:
    """The smallest relative distance ``||ΔW_j - ΔW_k|| / sqrt(||ΔW_j||^2 + ||ΔW_k||^2)`` over the
    pairs whose distance ``dist`` (:func:`~.updates.raw_distances`) is not 0; inf where none is."""
    d = np.diagonal(gram)
    P = clair.pairs(len(d))
    both = d[P[:, 0]] + d[P[:, 1]]
    live = dist > 0                           # a positive distance has a positive norm sum
    return float((dist[live] / np.sqrt(both[live])).min()) if live.any() else float("inf")


def refit_without(results, decided, options: ModuleOptions, factors=None) -> None:
    """Re-solve (7) of every CLAIR module on the contrasts of the clients ``decided`` keeps
    (bool (K,); None: nothing to do) and give the module that ``P_Â`` for refinement (9), so that a
    flagged client does not steer what the others receive: the output is then that of a run
    without the flagged clients (same reduced coordinates, which contain theirs). Each module's
    detection evidence (sets (8), block norms, Gram) stays that of all clients; ``refit`` records
    the second solve (status, gap, iterations, λ). ``factors``: ``module -> ModuleFactors``, to
    reduce a module again whose state keeps no coordinates (the split layout's)."""
    if decided is None:
        return
    keep = np.asarray(decided, bool)
    if keep.all() or keep.sum() < 2:
        return
    for res in results:
        st = res.state
        if res.method != "clair" or st.get("released"):
            continue
        if "Y" in st:
            red = ReducedModule(U=st["U"], V=st["V"], Y=st["Y"], X=st["X"], discarded=res.discarded)
        elif factors is not None:
            red = reduce_module(factors(res.name), energy=options.energy)
        else:
            raise ValueError(f"module {res.name!r}: its state keeps no coordinates; pass factors= "
                             "to re-read it")
        sub = ReducedModule(U=red.U, V=red.V, Y=red.Y[keep], X=red.X[keep], discarded=res.discarded)
        # what _clair reads of the module's factors: the name, the client count and ranks
        stub = SimpleNamespace(name=res.name, A=[None] * int(keep.sum()),
                               ranks=[r for r, k in zip(res.ranks, keep) if k])
        tmp = ModuleResult(name=res.name, method="clair", shape=res.shape, ranks=stub.ranks,
                           reduced_dims=res.reduced_dims, discarded=res.discarded)
        _clair(stub, sub, options, tmp)
        Z = tmp.state["Z"]
        dt = np.dtype(options.output_dtype)
        st["Z"] = Z
        st["VZt"] = (np.asarray(red.V, dt) @ Z.astype(dt)).T.copy()
        st["XZ"] = np.matmul(red.X, Z)
        res.gram_outside = update_gram(red.Y, red.X - (red.X @ Z) @ Z.T)
        st.pop("mean_cache", None)
        st.pop("mbar_cache", None)
        res.refit = {"excluded": [k for k in range(len(keep)) if not keep[k]], "status": tmp.status,
                     "relative_gap": tmp.relative_gap, "iterations": tmp.iterations,
                     "lam_L": tmp.lam_L, "lam_S": tmp.lam_S}


def _dense(D):
    return D.dense() if isinstance(D, PairContrasts) else D


def _contrast_norms(D, h) -> np.ndarray:
    """``||D″_g||_F`` (G,), before the projection of (8), for dense or factored contrasts."""
    if isinstance(D, PairContrasts):
        return np.sqrt(D.block_sq_norms)
    G, pp = D.shape[0] // h, D.shape[1]
    return np.sqrt(np.einsum("gij,gij->g", *(2 * [D.reshape(G, h, pp)])))


def _detection_norms(D, h, Z):
    """``||D″_g (I - Z Z^T)||_F`` (G,) for detection (8), and the level below which a block
    norm is an exact zero (1e-9 of the largest ``||D″_g||_F``). Factored contrasts: the
    projection is applied to the clients' coordinates ``X_k (I - Z Z^T)`` (no cancellation)."""
    if isinstance(D, PairContrasts):
        X = D.X - np.matmul(np.matmul(D.X, Z), Z.T)
        norms = np.sqrt(PairContrasts(T=D.T, X=X).block_sq_norms)
    else:
        G, pp = D.shape[0] // h, D.shape[1]
        B = (D - (D @ Z) @ Z.T).reshape(G, h, pp)
        norms = np.sqrt(np.einsum("gij,gij->g", B, B))
    return norms, 1e-9 * float(_contrast_norms(D, h).max())


def client_decision(results, rule: str):
    """Per-client benign flags from the per-module sets (8).

    ``"per-module"``: each module uses its own set (returns None); ``"majority"``: a client is
    benign everywhere iff it is benign in at least half of the modules; ``"any"``: a client
    flagged in any module is excluded everywhere; ``"pooled"`` (our extension, :mod:`.detect`):
    a client is excluded everywhere iff its pooled score over all modules' block norms exceeds
    :func:`lowrank_fl.adapters.detect.pooled_threshold` of ``K`` and its distance ratio is at least
    :data:`lowrank_fl.adapters.detect.POOLED_MIN_RATIO`; ``"updates"`` (the default, ours,
    :mod:`.detect_updates`): a client is excluded everywhere iff its update stands out in
    direction, row-space share or size over all modules, or its ``A`` is the common LoRA
    initialization reversed (:mod:`.init_reversal`), and it abstains (undecided) where more than half of
    the clients sent no update (:func:`.updates.untrained_clients`); ``"raw"``: a client is excluded everywhere iff
    the pooled modified z-score of its raw distances ``||ΔW_j - ΔW_k||_F`` (:func:`.detect.raw_flags`) exceeds
    ``c_K``. Every set passes
    :func:`lowrank_fl.adapters.guard.guard_set`: one that is not a strict majority is the
    undecided set (all False, everyone keeps their own); undecided modules abstain.
    """
    if rule not in CLIENT_RULES:
        raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {rule!r}")
    flags = guard.abstain([r.benign for r in results])          # (modules, K); undecided abstain
    if rule == "per-module":
        return None
    if rule == "majority":
        return guard.guard_set(flags.mean(axis=0) >= 0.5)
    if rule == "pooled":
        return guard.guard_set(~detect.pooled_flags(np.array([r.block_norms for r in results], float),
                                                     flags.shape[1]))
    if rule == "updates":       # ... or its A factor the common initialization reversed
        grams = np.array([r.gram for r in results], float)
        if 2 * untrained_clients(grams).sum() > flags.shape[1]:        # most sent nothing: it abstains
            return np.zeros(flags.shape[1], bool)
        reversed_ = reversed_init_flags([r.init_cosines for r in results], flags.shape[1])
        return guard.guard_set(~(detect_updates.update_flags(grams, np.array([r.outside for r in results], float))
                                 | reversed_))
    if rule == "raw":
        return guard.guard_set(~detect.raw_flags(np.array([r.gram for r in results], float)))
    return guard.guard_set(flags.all(axis=0))


def apply_robust(results, options: ModuleOptions) -> robust.RobustResult:
    """Combine every module's reduced coordinates with ``options.method`` (a robust method) on
    the clients' whole updates, and store each module's output factors (``U Z_m V^T`` by an SVD
    of the small ``Z_m``). Returns the combination (selected clients, weights)."""
    if options.method not in robust.ROBUST_METHODS:
        raise ValueError(f"apply_robust needs a robust method {list(robust.ROBUST_METHODS)}, "
                         f"got {options.method!r}")
    Ms = [r.state["M"] for r in results]
    X = np.hstack([M.reshape(M.shape[0], -1) for M in Ms])          # (K, N), an isometry
    out = robust.robust_combine(X, options.method, options.byzantine)
    start = 0
    for r, M in zip(results, Ms):
        n = M.shape[1] * M.shape[2]
        Z = out.aggregate[start:start + n].reshape(M.shape[1:])
        start += n
        U, V = r.state["U"], r.state["V"]
        B, A, _ = _factorize(U, Z, V, None)
        r.state.update(B=B, A=A, core=(U, Z, V))
    return out
