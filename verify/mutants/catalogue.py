"""The mutant catalogue: realistic library bugs, one per entry, written from the code paths the
claims use.

Each :class:`~verify.mutants.harness.Mutant` names the object it replaces (``"module:name"``),
says in one sentence what a reviewer would call the bug, lists the papers whose claims exercise
that code, and builds the replacement from the original (``make(original) -> replacement``), so
the bug is a small, local change of the real code path. ``claims`` (glob patterns) restricts a
mutant to the claims that use the path, which keeps the standing check fast.

Mutants never touch the working tree: :func:`verify.mutants.harness.apply` patches the loaded
modules and restores them.
"""
from __future__ import annotations

import functools

import numpy as np

from .harness import Mutant

__all__ = ["CATALOGUE"]


# --------------------------------------------------------------------------------------------
# builders
def _force(**overrides):
    """``make`` for a bug that silently runs with other keyword values (``orthonormalize=False``)."""
    def make(original):
        @functools.wraps(original)
        def mutant(*args, **kwargs):
            return original(*args, **{**kwargs, **overrides})
        return mutant
    return make


def _post(transform):
    """``make`` for a bug that corrupts the return value: ``transform(result, *args, **kwargs)``."""
    def make(original):
        @functools.wraps(original)
        def mutant(*args, **kwargs):
            return transform(original(*args, **kwargs), *args, **kwargs)
        return mutant
    return make


def _replace(body):
    """``make`` for a bug written as a whole (buggy) function ``body(original, *args, **kwargs)``."""
    def make(original):
        @functools.wraps(original)
        def mutant(*args, **kwargs):
            return body(original, *args, **kwargs)
        return mutant
    return make


# --------------------------------------------------------------------------------------------
# linalg
def _subspace_frobenius(original, U, V, *, rank_deficient="raise"):
    """dist = ||(I - P_U) Q_V||_F (Frobenius) instead of the spectral norm."""
    if rank_deficient == "span":
        U, V = np.asarray(U, float), np.asarray(V, float)
        if not (np.all(np.isfinite(U)) and np.all(np.isfinite(V))):
            return float("nan")
        Qu = np.linalg.svd(U, full_matrices=False)[0][:, :np.linalg.matrix_rank(U)]
        Qv = np.linalg.svd(V, full_matrices=False)[0][:, :np.linalg.matrix_rank(V)]
        if Qu.shape[1] != Qv.shape[1]:
            return 1.0
        return min(float(np.linalg.norm(Qv - Qu @ (Qu.T @ Qv))), 1.0)
    Qu, Qv = np.linalg.qr(np.asarray(U, float))[0], np.linalg.qr(np.asarray(V, float))[0]
    out = np.minimum(np.linalg.norm(Qv - Qu @ (np.swapaxes(Qu, -1, -2) @ Qv), axis=(-2, -1)), 1.0)
    return float(out) if np.ndim(out) == 0 else out


def _orth_normalize_only(original, A, *, name="A"):
    """Columns scaled to unit norm, the QR (orthogonalization) step skipped."""
    A = np.asarray(A, dtype=float)
    return A / np.linalg.norm(A, axis=-2, keepdims=True)


def _truncated_svd_shifted(original, M, rank, *, name="M"):
    """Slices ``[1:rank+1]`` instead of ``[:rank]``: drops the top triplet."""
    U, s, Vt = np.linalg.svd(np.asarray(M, float), full_matrices=False)
    lo = 1 if rank < len(s) else 0
    return U[:, lo:lo + rank], s[lo:lo + rank], Vt[lo:lo + rank]


# --------------------------------------------------------------------------------------------
# participation
def _with_replacement(original, rng, n_clients, clients_per_round):
    if clients_per_round >= n_clients:
        return None
    return np.sort(rng.choice(n_clients, size=clients_per_round, replace=True))


# --------------------------------------------------------------------------------------------
# LoRA family
def _product_of_means(original, A, B, *, weights=None):
    A, B = np.asarray(A, float), np.asarray(B, float)
    w = np.full(A.shape[0], 1.0 / A.shape[0]) if weights is None else np.asarray(weights) / np.sum(weights)
    return np.tensordot(w, B, axes=1) @ np.tensordot(w, A, axes=1)


def _flexlora_rank_minus_one(original, A, B, *, rank=None, weights=None):
    """Keeps ``rank - 1`` triplets (a ``range(1, rank)`` slip), padding the factors with zeros."""
    out = original(A, B, rank=rank, weights=weights)
    A_s, B_s = np.array(out.A), np.array(out.B)
    A_s[-1] = 0.0
    B_s[:, -1] = 0.0
    return type(out)(A_s, B_s)


def _eckart_tail_from_r(original, M, rank):
    """Tail summed from sigma_r (1-based) instead of sigma_{r+1}."""
    s = np.linalg.svd(np.asarray(M, float), compute_uv=False)
    return float(np.sqrt(np.sum(s[rank - 1:] ** 2)))


def _half_gradient(result, *args, **kwargs):
    return 0.5 * result


def _b_solve_population_norm(original, X, Y, a, *, check_input=True):
    """Divides by m ||a||^2 (the population normaliser) instead of ||X_i a||^2."""
    X, Y, a = np.asarray(X, float), np.asarray(Y, float), np.asarray(a, float)
    Xa = X @ a
    return np.einsum("nmd,nm->nd", Y, Xa) / (X.shape[1] * (a @ a))


def _c_tilde_sign(original, n_clients, m):
    return (n_clients * (4 - m) + 2) / (n_clients ** 2 * m * (m - 2))


def _rate_without_delta(original, step_size, delta0, b_bar_norm):
    """Drops the (1 - delta_0^2) factor of eq. (254)."""
    return float(1.0 - 2.0 * step_size * b_bar_norm ** 2)


def _step_bound_no_half(original, L_max, *, setting="homogeneous", variant="paper"):
    """The corrected (and heterogeneous) bound forgets its factor 1/2."""
    return 1.0 / L_max ** 2


def _init_at_cosine(original, a_star, delta0, seed=None):
    """Treats delta0 as the cosine of the angle instead of its sine."""
    return original(a_star, float(np.sqrt(max(0.0, 1.0 - delta0 ** 2))), seed)


# --------------------------------------------------------------------------------------------
# multitask (FedRep, FedAvg-FT)
def _heads_without_gram(original, XB, y, *, ridge=0.0):
    """Heads ``A^T y / m``: the (A^T A)^{-1} solve replaced by its population value m I."""
    XB, y = np.asarray(XB, float), np.asarray(y, float)
    return (y[:, None, :] @ XB)[:, 0, :] / XB.shape[1]


def _mom_bottom(original, X, y, k):
    """eigh's ascending order not reversed: the k smallest eigenvectors."""
    M = original.__globals__["moment_matrix"](X, y)
    return np.linalg.eigh(M)[1][:, :k].copy()


def _fedavg_head_not_averaged(original, B, w, *args, **kwargs):
    out = original(B, w, *args, **kwargs)
    return (out[0], np.array(w, copy=True), *out[2:])


def _fedavg_one_local_step(original, B, w, tau, *args, **kwargs):
    return original(B, w, 1, *args, **kwargs)


# --------------------------------------------------------------------------------------------
# FLUTE
def _reg_gradient_gamma1_sign(original, B, W, gamma1, gamma2):
    """The -2 gamma1 (B W^T W, W B^T B) terms enter with a + sign."""
    return original(B, W, -gamma1, gamma2)


def _data_weight_doubled(result, *args, **kwargs):
    return 2.0 * result


# --------------------------------------------------------------------------------------------
# CLAIR
def _gap_sign_flipped(original, D, q, R, w, lam_L, lam_S, F, it, tol, scale, gaps, gap_its):
    """The stopping rule tests dual - primal <= tol (sign flipped): it stops at the first check."""
    g = original.__globals__
    dual_fn = g.get("dual_from_residual") or g.get("_dual_from_residual")
    _, dual = dual_fn(D, q, R, w, lam_L, lam_S)
    gaps.append(dual - F)
    gap_its.append(it)
    return tol is not None and dual - F <= tol * scale


def _svt_half_threshold(original, M, tau, mode, out=None):
    return original(M, 0.5 * tau, mode, out=out)


def _bst_skipped(original, M, q, tau, inplace=False):
    B = M.reshape(-1, q, M.shape[1])
    return (M if inplace else M.copy()), np.sqrt(np.einsum("gij,gij->g", B, B))


def _refine_all_benign(original, W_hat, projector, benign):
    return original(W_hat, projector, np.ones_like(np.asarray(benign, dtype=bool)))


def _contrasts_reversed(original, W_hat):
    return -original(W_hat)


def _projector_rank_plus_one(original, Vt, dim):
    """``P_A`` from ``dim + 1`` right singular vectors (an off-by-one slice ``Vt[:dim + 1]``)."""
    return original(Vt, min(dim + 1, np.shape(Vt)[0]))


def _votes_over_k(original, block_norms, K, tau, alpha=0.5):
    benign, votes = original(block_norms, K, tau, alpha)
    votes = votes * (K - 1) / K
    return votes >= alpha, votes


def _gap_upper_end(original, norms, **kwargs):
    """The threshold placed at the gap's upper end (the smallest norm above it) instead of its
    midpoint: the closest contaminated pair then counts as collaborative."""
    split = original(norms, **kwargs)
    x = np.asarray(norms, float)
    above = x[x > split.threshold]
    if not split.separated or above.size == 0:
        return split
    return split._replace(threshold=float(above.min()))


_M = [
    # ---------------------------------------------------------------- linalg
    Mutant("linalg.subspace_frobenius", "lowrank_fl.linalg:subspace_distance",
           "Subspace distance measured in the Frobenius norm instead of the spectral norm (sine of the "
           "largest principal angle).", ("fedrep", "flute", "fedavg_ft"), _replace(_subspace_frobenius)),
    Mutant("linalg.orth_without_qr", "lowrank_fl.linalg:orth",
           "orth() normalizes the columns but skips the QR orthogonalization.",
           ("clair", "fedavg_ft", "fedrep"), _replace(_orth_normalize_only)),
    Mutant("linalg.truncated_svd_off_by_one", "lowrank_fl.linalg:truncated_svd",
           "Truncated SVD slices [1:rank+1] instead of [:rank] (drops the leading triplet).",
           ("rolora", "flute"), _replace(_truncated_svd_shifted)),
    Mutant("linalg.block_norms_squared", "lowrank_fl.linalg:block_norms",
           "Block norms returned squared (the square root forgotten).", ("clair",),
           _post(lambda r, *a, **k: r ** 2)),
    # ---------------------------------------------------------------- participation
    Mutant("common.clients_with_replacement", "lowrank_fl.algorithms.common:choose_clients",
           "Each round's participants are sampled with replacement (the papers: without).",
           ("fedrep", "fedavg_ft", "rolora"), _replace(_with_replacement)),
    # ---------------------------------------------------------------- LoRA family
    Mutant("lora.product_of_means", "lowrank_fl.algorithms.lora_aggregation:mean_product",
           "The exact aggregate computed as the product of the mean factors instead of the mean of "
           "the products.", ("rolora",), _replace(_product_of_means)),
    Mutant("lora.cross_covariance_sum", "lowrank_fl.algorithms.lora_aggregation:cross_covariance",
           "Cross-covariance summed over clients instead of averaged (weights not normalised).",
           ("rolora",), _post(lambda r, A, B, **k: r * np.shape(A)[0])),
    Mutant("lora.flexlora_rank_minus_one", "lowrank_fl.algorithms.lora_aggregation:flexlora_aggregate",
           "FlexLoRA keeps rank - 1 singular triplets instead of rank.", ("rolora",),
           _replace(_flexlora_rank_minus_one)),
    Mutant("lora.eckart_tail_off_by_one", "lowrank_fl.algorithms.lora_aggregation:eckart_young_tail",
           "Eckart-Young tail summed from sigma_r instead of sigma_{r+1}.", ("rolora",),
           _replace(_eckart_tail_from_r)),
    Mutant("rolora.gradient_missing_factor_2", "lowrank_fl.algorithms.rolora:_grad_a",
           "The a-gradient drops the factor 2 of d/da ||Y - X a b^T||^2.", ("rolora",), _post(_half_gradient)),
    Mutant("rolora.no_normalization", "lowrank_fl.algorithms.rolora:rolora",
           "RoLoRA skips line 11's normalisation a = a+/||a+||.", ("rolora",), _force(normalize=False)),
    Mutant("rolora.b_solve_population_normalizer", "lowrank_fl.exact.rolora:local_b_solve",
           "The local b least squares divides by m ||a||^2 instead of ||X_i a||^2.", ("rolora",),
           _replace(_b_solve_population_norm)),
    Mutant("rolora.c_tilde_sign", "lowrank_fl.exact.rolora:c_tilde",
           "c~ = (N(4-m) + 2)/(N^2 m (m-2)): the sign of the constant term flipped.", ("rolora",),
           _replace(_c_tilde_sign)),
    Mutant("rolora.rate_bound_without_delta0", "lowrank_fl.exact.rolora:rate_bound_heterogeneous",
           "Eq. (254)'s rate drops its (1 - delta_0^2) factor.", ("rolora",), _replace(_rate_without_delta)),
    Mutant("rolora.step_bound_off_by_2", "lowrank_fl.exact.rolora:step_size_bound",
           "The corrected step-size bound forgets its factor 1/2 (1/L^2 instead of 1/(2 L^2)).",
           ("rolora",), _replace(_step_bound_no_half)),
    Mutant("lora.init_angle_as_cosine", "lowrank_fl.problems.lora:init_at_angle",
           "init_at_angle treats delta0 as the cosine of the angle instead of its sine.", ("rolora",),
           _replace(_init_at_cosine)),
    # ---------------------------------------------------------------- multitask
    Mutant("fedrep.heads_ignore_gram", "lowrank_fl.exact.multitask:least_squares_heads",
           "The head solve ignores the Gram matrix: w = (XB)^T y / m instead of the least squares.",
           ("fedrep", "flute", "fedavg_ft"), _replace(_heads_without_gram)),
    Mutant("fedrep.no_qr", "lowrank_fl.algorithms.fedrep:fedrep",
           "FedRep skips the server's QR orthonormalisation of the averaged representation.",
           ("fedrep", "flute"), _force(orthonormalize=False)),
    Mutant("fedrep.moments_smallest_eigenvectors", "lowrank_fl.exact.multitask:method_of_moments",
           "Method of moments keeps the k smallest eigenvectors (eigh's ascending order not reversed).",
           ("fedrep", "flute"), _replace(_mom_bottom)),
    Mutant("fedavg.heads_not_aggregated", "lowrank_fl.algorithms.fedavg:_round",
           "FedAvg's server averages the clients' B but keeps the old head w (the head update dropped).",
           ("fedavg_ft",), _replace(_fedavg_head_not_averaged)),
    Mutant("fedavg.local_steps_ignored", "lowrank_fl.algorithms.fedavg:_round",
           "FedAvg runs one local step whatever local_steps says.", ("fedavg_ft",),
           _replace(_fedavg_one_local_step)),
    # ---------------------------------------------------------------- FLUTE
    Mutant("flute.regularizer_gradient_sign", "lowrank_fl.exact.flute:regularizer_gradients_unchecked",
           "The gamma1 term of the regularizer gradient has the wrong sign.", ("flute",),
           _replace(_reg_gradient_gamma1_sign)),
    Mutant("flute.data_weight_doubled", "lowrank_fl.exact.flute:data_weight",
           "The data-term normalisation factor is doubled (a = 1 for the appendix's 1/2).", ("flute",),
           _post(_data_weight_doubled)),
    # ---------------------------------------------------------------- CLAIR
    Mutant("clair.gap_sign_flipped", "lowrank_fl.clair.penalized:_converged",
           "FISTA's stopping rule uses dual - primal (duality gap sign flipped): it stops at the first "
           "check and reports 'optimal'.", ("clair",), _replace(_gap_sign_flipped),
           claims=("clair.thm*", "clair.lemma3.*", "clair.alg1.*", "clair.sec7.*")),
    Mutant("clair.svt_half_threshold", "lowrank_fl.clair.penalized:_svt",
           "The L-update's singular value threshold is t lam_L / 2 instead of t lam_L.", ("clair",),
           _replace(_svt_half_threshold), claims=("clair.alg1.*",)),   # elsewhere: 20000-iteration runs
    Mutant("clair.block_soft_threshold_skipped", "lowrank_fl.clair.penalized:_bst",
           "The S-update's block soft threshold is not applied (S takes the whole gradient step).",
           ("clair",), _replace(_bst_skipped), claims=("clair.alg1.*",)),
    Mutant("clair.refine_ignores_benign", "lowrank_fl.clair.stages:refine",
           "Refinement (9) averages over every client instead of the collaborative set.", ("clair",),
           _replace(_refine_all_benign)),
    Mutant("clair.contrasts_reversed", "lowrank_fl.clair.contrasts:contrasts",
           "Pair contrasts in the wrong order (W^(k) - W^(j) for j < k), against the incidence's signs.",
           ("clair",), _replace(_contrasts_reversed)),
    Mutant("clair.projector_rank_plus_one", "lowrank_fl.clair.pipeline:_projector",
           "P_A built from rank + 1 right singular vectors instead of rank.", ("clair",),
           _replace(_projector_rank_plus_one)),
    Mutant("clair.votes_over_K", "lowrank_fl.clair.stages:collaborative_set",
           "Majority vote (8) divides by K instead of K - 1.", ("clair",), _replace(_votes_over_k)),
    Mutant("clair.largest_gap_upper_end", "lowrank_fl.clair.stages:largest_gap_split",
           "The largest-gap threshold is the gap's upper end instead of its midpoint.", ("clair",),
           _replace(_gap_upper_end)),
]

CATALOGUE: dict[str, Mutant] = {m.id: m for m in _M}
if len(CATALOGUE) != len(_M):
    raise ValueError("mutant ids must be unique")
