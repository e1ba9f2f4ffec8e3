r"""How far each collaborating client moves toward the others: the do-no-harm refinement.

The paper's (9) replaces client ``k``'s update outside the shared row space by the collaborative
mean, ``ΔW̃_k = ΔW_k P_Â + ΔW̄_Ĉ (I - P_Â)``. On adapters trained the way federated LoRA is run,
one-shot averaging often does not pay: where the clients' tasks differ, the move replaces what a
client learned by what the others learned and leaves it worse than its own adapter; where they
share a task, it averages their noise away. The server cannot tell a client's own task from its
noise with one update per client in general, so each client moves only as far as the evidence of
a *shared* signal goes (``refine="agreement"``):

    ``ΔW̃_k = (1 - a_k) ΔW_k + a_k ΔW̄_Ĉ``,  ``a_k = max(0, cos(ΔW_k, ΔW̄_{Ĉ∖k}))``,

the cosine (over the whole adapter: every module's update stacked) between the client's update
and the mean of the *other* collaborating clients' updates (:func:`agreement`). ``a_k = 1`` is
the plain mean of the collaborative set, ``a_k = 0`` the client's own adapter. Why this weight:

* where the others' updates share nothing with client ``k`` (different tasks, or noise alone),
  ``a_k ≈ 0`` and the client keeps its adapter;
* where the clients share a task ``t`` and each adds independent noise of energy ``σ²``, the
  squared error ``||ΔW̃_k - t||²`` falls from ``σ²`` to ``(1 - 2ca + ca²) σ²`` (``c = 1 - 1/|Ĉ|``;
  the plain mean's ``σ²/|Ĉ|`` at ``a = 1``): the share ``2a - a²`` of the mean's reduction, three
  quarters at a typical ``a = 0.5``;
* where they do not, moving a fraction ``a`` of the way costs about ``a²`` of what the full move
  costs (second order around the client's own optimum), so a client the others half agree with
  risks a quarter of the plain mean's harm.

**The default, ``refine="exchangeable"``**, adds the one thing the server *can* test about noise:
where the collaborating clients differ by noise alone they are exchangeable, and which of them
resemble each other does not repeat from module to module
(:func:`lowrank_fl.adapters.exchangeable.exchangeability`, a permutation test at 1 %). Where the
pattern does not repeat significantly, every collaborating client moves at least
:data:`EXCHANGEABLE_WEIGHT` ``= 1 - 1/sqrt(2) ≈ 0.293`` of the way,
``a_k = max(cos(ΔW_k, ΔW̄_{Ĉ∖k}), 1 - 1/sqrt(2))``; where it repeats (clients with tasks,
variants or contamination of their own), the agreement alone. Why that weight: with ``n``
exchangeable clients and independent noise, ``(1 - w) ΔW_k + w ΔW̄_Ĉ`` leaves
``1 - 2cw + cw²`` of a client's noise energy (``c = 1 - 1/n``; the mean leaves ``1/n``, i.e.
``1 - c``), so it keeps the share ``2w - w²`` of the mean's reduction, whatever ``n``: ``w = 1 -
1/sqrt(2)`` is the least move that keeps half of it, and costs about ``w² ≈ 0.086`` of the full
move's harm where the set only *looks* exchangeable (clients whose tasks all differ and are
unrelated to each other: no pair agrees more than another, which the test cannot see). Adopted by
a rule fixed before seeds 1600-1603 of the trained families were evaluated (every set's benign
mean at least own - 0.01, at most 5 % of the benign clients losing more than 0.03, a median of half
of the benign FedAvg's gain kept where it exceeds 0.05, and half in every ``*-collab`` set): worst
set -0.006, 1 of 292 clients losing more than 0.03, 0.64 of the gain kept (least 0.58 in a
``*-collab`` set) — against the agreement's 0.08 and ``shrink``'s 0.49 on the same sets.

``refine="shrink"`` moves every collaborating client at least :data:`SHRINK_WEIGHT` = 0.2 of
the way, ``a_k = max(0.2, cos(ΔW_k, ΔW̄_{Ĉ∖k}))``, for federations where one update per client is
mostly noise (few noisy examples on a task the base already solves: every pair of updates nearly
orthogonal, so the agreement is near 0 although averaging pays). Why a fixed floor can pay there
and cost little elsewhere: averaging removes independent noise to *first* order in ``a`` (the
noise energy left is ``1 - 2ca + ca²`` with ``c = 1 - 1/|Ĉ|``, 0.68 at ``a = 0.2``, ``|Ĉ| = 10``),
while a client whose own adapter is near its own optimum loses to *second* order (about ``a²``,
0.04 of the full move's loss). 0.2 is a stated choice, not an estimate: on the design sets (seeds 1000-1001 of the
trained families, the benign clients' accuracy at ``a`` = 0.1, 0.2, 0.3, 0.5) it kept 43-58 % of
the benign FedAvg's gain where averaging pays and cost at most 0.004 on average (0.020 for the
worst client) where it hurts; at 0.3 the worst set lost 0.020 on average. It is not the default:
the rule for making it one (every set's benign mean within 0.01 of the clients' own adapters, at
most 5 % of them losing more than 0.03, half of the benign FedAvg's gain kept) was fixed before
seeds 1100-1103 were evaluated, and there it kept 0.49 of the gain (worst set -0.009; on seeds
1200-1203 0.47 and -0.021): where a client's own task differs from the others', its adapter is
diluted by 0.2 whatever the evidence. The cap below applies to it as to the agreement.

The weight is capped so that the output moves at most ``a_k`` of the client's own update,
``||ΔW̃_k - ΔW_k|| <= a_k ||ΔW_k||`` (``a_k ← a_k · min(1, ||ΔW_k|| / ||ΔW̄_Ĉ - ΔW_k||)``): where
the collaborative mean is far larger than the client's update (clients inside the set that
trained much harder or diverged), the cosine alone would still move a client by several times
its own size (found on rsLoRA clients at rank 16 with 3× the learning rate: a weight of 0.06
moved a benign client 16 % and cost it 0.16 accuracy). It is a stated heuristic, not an
estimator of the optimal weight. In the split layout the shared
part is ``ΔW̄_Ĉ`` (weight ``a_k``) and each client's part ``(1 - a_k) ΔW_k``: this is (9)'s
formula with ``P_Â = 0``. ``refine="paper"`` applies (9) exactly (``a_k = 1`` with the solve's
``P_Â``), ``refine="own"`` returns every client's adapter. Clients outside the collaborative set
keep their adapter.

Everything is computed from Gram matrices (:mod:`.updates`): ``G`` of the updates and, for (9),
``G⊥`` of their parts outside ``P_Â``, per module.
"""
from __future__ import annotations

import numpy as np

from .exchangeable import exchangeability
from .updates import module_grams, zero_updates

__all__ = ["REFINE", "DEFAULT_REFINE", "SHRINK_WEIGHT", "EXCHANGEABLE_WEIGHT", "agreement", "uncapped_weights",
           "floor_weight", "refine_weights", "move_norms", "relative_changes"]

#: how a collaborating client is refined: "agreement" (toward the collaborative mean by its
#: agreement, module docstring), "exchangeable" (at least EXCHANGEABLE_WEIGHT of the way where the
#: collaborating clients look exchangeable, the agreement elsewhere), "shrink" (at least
#: SHRINK_WEIGHT of the way), "paper" ((9) itself), "own" (every client keeps its adapter)
REFINE = ("agreement", "exchangeable", "shrink", "paper", "own")
DEFAULT_REFINE = "exchangeable"
#: the least weight of ``refine="shrink"`` (module docstring: a stated choice)
SHRINK_WEIGHT = 0.2
#: the least weight of ``refine="exchangeable"`` in an exchangeable set: ``1 - 1/sqrt(2)``, the
#: least move that keeps half of the mean's reduction of independent noise (module docstring)
EXCHANGEABLE_WEIGHT = 1.0 - 1.0 / np.sqrt(2.0)


def _members(benign, K):
    b = np.asarray(benign, bool).reshape(-1)
    if b.shape != (K,):
        raise ValueError(f"benign must be a bool array of length K = {K}, got shape {b.shape}")
    return b


def agreement(grams, benign) -> np.ndarray:
    """``cos(ΔW_k, ΔW̄_{Ĉ∖k})`` (K,) over the whole adapter (modules stacked) from per-module Grams
    (modules, K, K); NaN for clients outside ``benign`` and where either side is zero (a
    collaborative set of one client has no "others")."""
    G = module_grams(grams, "grams").sum(axis=0)                      # whole-adapter Gram (K, K)
    K = G.shape[0]
    b = _members(benign, K).astype(float)
    n = b.sum()
    own = np.diag(G)
    live = ~zero_updates(module_grams(grams, "grams"))                # a rounding-level update is zero
    cross = G @ b - own * b                                     # sum_{j in C, j != k} <u_k, u_j>
    tot = b @ G @ b
    rowsum = G @ b
    others_sq = tot - 2 * rowsum * b + own * b                  # ||sum_{j in C, j != k} u_j||^2
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = cross / np.sqrt(np.maximum(own, 0) * np.maximum(others_sq, 0))
    cos = np.where((b > 0) & live & (others_sq > 0) & (n >= 2), cos, np.nan)
    return np.clip(cos, -1.0, 1.0)


def floor_weight(grams, benign, refine: str = DEFAULT_REFINE) -> float:
    """The least weight of a collaborating client under ``refine``: :data:`SHRINK_WEIGHT`
    ("shrink"), :data:`EXCHANGEABLE_WEIGHT` ("exchangeable", where
    :func:`lowrank_fl.adapters.exchangeable.exchangeability` calls the set exchangeable), else 0."""
    if refine == "shrink":
        return SHRINK_WEIGHT
    if refine == "exchangeable":
        return EXCHANGEABLE_WEIGHT if exchangeability(grams, benign).exchangeable else 0.0
    return 0.0


def uncapped_weights(grams, benign, refine: str = DEFAULT_REFINE) -> np.ndarray:
    """``a_k`` (K,) before the cap of :func:`refine_weights`: 0 outside ``benign``; inside, the
    agreement clipped to [0, 1] ("agreement"), floored at :func:`floor_weight` ("shrink",
    "exchangeable"), 1 ("paper") or 0 ("own")."""
    if refine not in REFINE:
        raise ValueError(f"refine must be one of {list(REFINE)}, got {refine!r}")
    G = module_grams(grams, "grams")
    b = _members(benign, G.shape[-1])
    if refine in ("own", "paper"):
        return b.astype(float) if refine == "paper" else np.zeros(b.shape)
    a = np.clip(np.nan_to_num(agreement(G, b), nan=0.0), 0.0, 1.0)
    floor = floor_weight(G, b, refine) if b.sum() >= 2 else 0.0    # a set of one has no "others"
    if floor > 0:
        # a zero update keeps its (zero) adapter: no move is "a_k of its own update"
        a = np.where(~zero_updates(G), np.maximum(a, floor), a)
    return np.where(b, a, 0.0)


def refine_weights(grams, benign, refine: str = DEFAULT_REFINE) -> np.ndarray:
    """``a_k`` (K,): 0 outside ``benign``; inside, per ``refine`` (module docstring):
    :func:`uncapped_weights` with the cap."""
    a = uncapped_weights(grams, benign, refine)
    if refine in ("own", "paper"):
        return a
    G = module_grams(grams, "grams")
    b = _members(benign, G.shape[-1])
    # the move is at most a_k of the client's own update: a collaborative mean far larger than
    # the client's update (clients trained much harder, or diverged, inside the set) would move
    # it by more than its own size at any a_k > 0
    _, full = relative_changes(G, G, b, np.ones(b.shape))
    return np.where(full > 1.0, a / np.where(full > 1.0, full, 1.0), a)


def move_norms(grams, grams_outside, benign) -> tuple[np.ndarray, np.ndarray]:
    """``(||t_k||_F, ||ΔW_k||_F)`` (modules, K) each: the move ``t_k = (ΔW̄_Ĉ - ΔW_k) Q`` and the
    update, per module, where ``grams_outside`` is the Gram of the updates times ``Q`` (the Gram
    itself for the move to the mean, ``Q = I``; of the parts outside ``P_Â`` for (9)); ``t_k``
    is reported for every client (what the full move would do to it)."""
    G = module_grams(grams, "grams")
    Go = module_grams(grams_outside, "grams_outside")
    if Go.shape != G.shape:
        raise ValueError(f"grams_outside must have the shape of grams {G.shape}, got {Go.shape}")
    K = G.shape[-1]
    b = _members(benign, K).astype(float)
    w = b / max(b.sum(), 1.0)
    mean_sq = np.einsum("k,mkj,j->m", w, Go, w)[:, None]        # ||ū (I-P)||^2
    cross = np.einsum("mkj,j->mk", Go, w)                       # <u_k (I-P), ū (I-P)>
    diag = np.diagonal(Go, axis1=1, axis2=2)
    t = np.sqrt(np.maximum(mean_sq - 2 * cross + diag, 0.0))
    u = np.sqrt(np.maximum(np.diagonal(G, axis1=1, axis2=2), 0.0))
    return t, u


def relative_changes(grams, grams_outside, benign, weights) -> tuple[np.ndarray, np.ndarray]:
    """``(applied, full)`` (K,): ``||a_k t_k|| / ||ΔW_k||`` and ``||t_k|| / ||ΔW_k||`` over the whole
    adapter (modules stacked; :func:`move_norms`), 0 for a zero update."""
    t, u = move_norms(grams, grams_outside, benign)
    tn = np.sqrt((t ** 2).sum(axis=0))
    un = np.sqrt((u ** 2).sum(axis=0))
    live = ~zero_updates(module_grams(grams, "grams"))
    full = np.where(live, tn / np.where(live, un, 1.0), 0.0)
    return np.asarray(weights, float) * full, full
