"""PEFT adapter directories → per-module updates ``ΔW = scaling · B A`` → aggregation.

The one place where the §8 experiment reads adapters and aggregates them, through the library's
adapters package (:func:`lowrank_fl.adapters.io.load_adapters`: PEFT's scaling rules, checks of
the directories). Aggregators act on stacks ``(K, q, p)`` per module, client axis first, float64:

* ``"local"`` — each client keeps its own ``ΔW``;
* ``"fedavg"`` — the mean over all clients;
* ``"oracle"`` — the mean over the true benign set (others keep their own);
* ``"clair"`` — :func:`lowrank_fl.clair.pipeline.fit` per module (64 × 64, no reduction needed):
  refined estimates (9) on the estimated set ``Ĉ`` (8), the others keep their own;
* ``"clair-auto"`` — CLAIR with automatic tuning, :func:`lowrank_fl.adapters.aggregate.aggregate_module`
  on the clients' factors: λ from :func:`lowrank_fl.adapters.tuning.auto_lambdas`, ``τ`` at the
  largest gap of the block norms (the paper's λ and ``τ`` not used).
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

from ..adapters.aggregate import ModuleOptions, aggregate_module
from ..adapters.io import ModuleFactors, load_adapters, module_key
from ..clair.pipeline import fedavg, fit, oracle_fedavg

__all__ = ["load_deltas", "load_factors", "stack_deltas", "Aggregate", "aggregate", "METHODS"]

METHODS = ("local", "fedavg", "oracle", "clair", "clair-auto")


def load_factors(adapter_dirs: Sequence) -> dict[str, ModuleFactors]:
    """``{module name: ModuleFactors}`` of K >= 2 PEFT LoRA adapter directories (read with
    :func:`lowrank_fl.adapters.io.load_adapters`; module names without PEFT's
    ``base_model.model.`` prefix)."""
    adapters = load_adapters(adapter_dirs, names=[f"client{k}" for k in range(len(adapter_dirs))])
    return {module_key(m): adapters.factors(m) for m in adapters.modules}


def load_deltas(adapter_dir) -> dict[str, np.ndarray]:
    """``{module name: ΔW = scaling · B A}`` (float64, out × in) of one PEFT LoRA adapter directory."""
    return {m: v[0] for m, v in stack_deltas([adapter_dir, adapter_dir]).items()}


def stack_deltas(adapter_dirs: Sequence, factors: Mapping[str, ModuleFactors] | None = None) -> dict[str, np.ndarray]:
    """``{module: (K, q, p)}``, ``ΔW_k = s_k B_k A_k`` over the clients' adapter directories (or
    over already loaded ``factors``)."""
    factors = load_factors(adapter_dirs) if factors is None else factors
    return {n: np.stack([f.delta(k) for k in range(len(f.A))]) for n, f in factors.items()}


class Aggregate(NamedTuple):
    """``deltas[method][module]`` (K, q, p); ``benign[module]`` bool (K,) CLAIR's ``Ĉ``;
    ``clair_status[module]`` the solver status of (7); ``block_norms[module]`` (G,) the pair
    norms ``||Ŝ_{A⊥}^{(j,k)}||_F`` compared with ``τ`` in (8); ``benign_auto[module]`` the
    set of ``"clair-auto"``."""

    deltas: dict
    benign: dict
    clair_status: dict
    block_norms: dict
    benign_auto: dict = {}


def aggregate(stacks: Mapping[str, np.ndarray], modules: Sequence[str], truth, *, lam_L: float,
              lam_S: float, tau, alpha: float = 0.5, rank: int = 3, methods=METHODS,
              solver_options: Mapping | None = None,
              factors: Mapping[str, ModuleFactors] | None = None) -> Aggregate:
    """Aggregate the ``modules`` of ``stacks`` by each method; other modules stay local.

    ``truth``: bool (K,), the true benign set (used by ``"oracle"`` only). ``factors``: the
    clients' LoRA factors per module (:func:`load_factors`), needed by ``"clair-auto"``.
    ``benign``, ``clair_status``, ``block_norms`` are CLAIR's (``"clair"``, else ``"clair-auto"``).
    """
    truth = np.asarray(truth, dtype=bool)
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"methods must be among {METHODS}, got {sorted(unknown)}")
    if "clair-auto" in methods and factors is None:
        raise ValueError("methods with 'clair-auto' need factors= (the clients' LoRA factors)")
    out = {m: dict(stacks) for m in methods}
    benign, status, norms, benign_auto = {}, {}, {}, {}
    for name in modules:
        W = stacks[name]
        if "fedavg" in methods:
            out["fedavg"][name] = fedavg(W)
        if "oracle" in methods:
            out["oracle"][name] = oracle_fedavg(W, truth)
        if "clair" in methods:
            res = fit(W, lam_L=lam_L, lam_S=lam_S, rank=rank, alpha=alpha, tau=tau,
                      **dict(solver_options or {}))
            out["clair"][name] = res.refined
            benign[name] = np.asarray(res.benign)
            status[name] = res.status
            norms[name] = np.asarray(res.block_norms)
        if "clair-auto" in methods:
            res = aggregate_module(factors[name], ModuleOptions(method="clair", rank=rank, alpha=alpha,
                                                                output_dtype="float64"))
            refined = []
            for k in range(W.shape[0]):
                B, A, _ = res.outputs(k)
                refined.append(B @ A)
            out["clair-auto"][name] = np.stack(refined)
            benign_auto[name] = np.asarray(res.benign)
            if "clair" not in methods:
                benign[name] = np.asarray(res.benign)
                status[name] = res.status
                norms[name] = np.asarray(res.block_norms)
    return Aggregate(out, benign, status, norms, benign_auto)
