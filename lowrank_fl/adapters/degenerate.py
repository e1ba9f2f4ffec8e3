"""Degenerate updates: clients that coincide, modules nobody trained, clients that trained nothing.

* Clients whose updates of a module are the same to rounding (:func:`~.updates.raw_distances` 0):
  their pair contrasts of (7) are exact zeros (:func:`zero_pairs`); where every pair is such, the
  module has nothing to solve (:func:`identical_module`, ``lam_rule`` :data:`IDENTICAL_RULE`).
* A module whose every update is zero (:func:`~.reduce.reduce_module` gives it zero coordinates,
  so every method's aggregate is zero) and a client whose update is zero in every module or in
  some: :func:`zero_update_notes` words them for the command line and the Flower strategy.
"""
from __future__ import annotations

import numpy as np

from .. import clair
from ..algorithms import lora_aggregation as lora
from ..clair.factored import PairContrasts
from .updates import outside_shares, update_gram

__all__ = ["IDENTICAL_RULE", "zero_pairs", "identical_module", "zero_update_notes"]

#: ``lam_rule`` of a module whose clients' updates are all the same to rounding
#: (:func:`identical_module`)
IDENTICAL_RULE = "identical updates: nothing to solve"


def zero_pairs(D, h: int, same):
    """The contrasts with the pairs ``same`` (bool (G,), eq. (6) order: clients whose updates are
    the same to rounding, :func:`~.updates.raw_distances` 0) set to exactly zero. What the
    reduction leaves of such a pair is rounding (about 1e-16 of the updates; the factored form's
    Grams cancel it only to about 1e-8), and (7) with a zero block has an optimum with
    ``L_g = S_g = 0``: the program without the pair. Left as rounding, it slowed the factored solve
    300-fold and broke its certificate (a negative duality gap)."""
    if not same.any():
        return D
    if isinstance(D, PairContrasts):
        T = D.T.copy()
        T[same] = 0.0
        return PairContrasts(T=T, X=D.X)
    B = D.reshape(same.size, h, D.shape[1]).copy()
    B[same] = 0.0
    return B.reshape(D.shape)


def identical_module(red, o, res, rank: int) -> None:
    """Every client's update is the same to rounding (:func:`~.updates.raw_distances` all 0): the
    contrasts (5) are zero, so (7)'s solution is exactly ``L̂ = Ŝ = 0`` for any λ, every pair is
    collaborative and (9) returns each client's own update. Solving (7) on what the reduction
    leaves (rounding, about 1e-16 of the updates) would give a subspace, flags and a duality gap of
    noise (relative gaps of -0.6 to 0.5 were seen); nothing is solved. ``P′`` is then any
    rank-``rank`` subspace: the mean update's leading row space. ``red``: the module's
    :class:`~.reduce.ReducedModule`; ``o``: its :class:`~.aggregate.ModuleOptions`; ``res``: the
    :class:`~.aggregate.ModuleResult` filled here."""
    K = red.Y.shape[0]
    G = K * (K - 1) // 2
    Vt = np.linalg.svd(lora.mean_product(red.X, red.Y))[2]
    Z = np.ascontiguousarray(Vt[:rank].T)
    zeros = np.zeros(G)
    benign, votes = clair.collaborative_set(zeros, K, 0.0, alpha=o.alpha)
    res.clipped, res.separated, res.benign = [], False, [bool(x) for x in benign]
    res.lam_L, res.lam_S = (None, None) if o.lam_L is None else (float(o.lam_L), float(o.lam_S))
    res.lam_rule = IDENTICAL_RULE
    res.weights, res.rank, res.numerical_rank = np.full(G, 1.0 / K).tolist(), rank, 0
    res.status, res.relative_gap, res.iterations, res.tau = "optimal", 0.0, 0, 0.0
    res.votes, res.block_norms, res.contrast_norms = votes.tolist(), zeros.tolist(), zeros.tolist()
    res.outside = outside_shares(red.Y, red.X, Z).tolist()
    res.gram_outside = update_gram(red.Y, red.X - (red.X @ Z) @ Z.T)
    res.gap_ratio = float(clair.largest_gap_split(zeros, min_below=clair.majority_pairs(K, o.alpha)).gap_ratio)
    res.state.update(Z=Z, objective=0.0, singular_values=np.zeros(Vt.shape[0]),
                     warnings=["every client's update is the same to rounding: the contrasts of (7) are "
                               "zero, L̂ = Ŝ = 0 without a solve, and every client is collaborative"])


def zero_update_notes(modules: dict, names: list) -> list[str]:
    """One-line warnings on zero updates from a summary's ``modules`` (each with ``zero_updates``,
    the indices of the clients whose update of it is zero) and the client ``names``: modules
    nobody trained (their outputs are zero), clients untrained in every module (aggregated as a
    zero update) and clients untrained in some."""
    notes, K, M = [], len(names), len(modules)
    dead = [m for m, s in modules.items() if len(s["zero_updates"]) == K]
    if dead:
        more = f" and {len(dead) - 3} more" if len(dead) > 3 else ""
        notes.append(f"{len(dead)} module(s) where every client's update is zero (nobody trained them): "
                     f"their outputs are zero: {', '.join(dead[:3])}{more}")
    n_zero = [sum(k in s["zero_updates"] for s in modules.values()) for k in range(K)]
    zero = [n for n, z in zip(names, n_zero) if z == M]
    if zero:
        notes.append(f"{', '.join(zero)}: lora_B (or lora_A) is all zeros in every module, PEFT's initial "
                     "state: an untrained adapter, aggregated as a zero update")
    some = {n: z for n, z in zip(names, n_zero) if len(dead) < z < M}
    if some:
        notes.append(", ".join(f"{n} ({z} of {M})" for n, z in some.items())
                     + ": the update is all zeros in some modules (left untrained there?); the update rule's "
                     "module profile sees such a client as spread unlike the others, unless three or more are "
                     "zero alike (a group)")
    return notes
