"""PEFT adapter directories → per-module updates ``ΔW = scaling · B A`` → aggregation.

The one place where the §8 experiment reads adapters and aggregates them (a small stand-in for the
adapters package: ``adapter_model.safetensors`` read with ``safetensors.numpy``, the scaling
``lora_alpha / r`` from ``adapter_config.json``). Aggregators act on stacks ``(K, q, p)`` per
module, client axis first, float64:

* ``"local"`` — each client keeps its own ``ΔW``;
* ``"fedavg"`` — the mean over all clients;
* ``"oracle"`` — the mean over the true benign set (others keep their own);
* ``"clair"`` — :func:`lowrank_fl.clair.pipeline.fit` per module (64 × 64, no reduction needed):
  refined estimates (9) on the estimated set ``Ĉ`` (8), the others keep their own.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

import numpy as np
from safetensors.numpy import load_file

from ..clair.pipeline import fedavg, fit, oracle_fedavg

__all__ = ["load_deltas", "stack_deltas", "Aggregate", "aggregate", "METHODS"]

METHODS = ("local", "fedavg", "oracle", "clair")


def load_deltas(adapter_dir) -> dict[str, np.ndarray]:
    """``{module name: ΔW = scaling · B A}`` (float64, out × in) of one PEFT LoRA adapter directory.

    Module names are those of the base model (PEFT's ``base_model.model.`` prefix removed).
    """
    d = Path(adapter_dir)
    cfg = json.loads((d / "adapter_config.json").read_text())
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scaling = alpha / np.sqrt(r) if cfg.get("use_rslora") else alpha / r
    tensors = load_file(str(d / "adapter_model.safetensors"))
    out = {}
    for key, A in tensors.items():
        if ".lora_A." not in key:
            continue
        name = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        B = tensors[key.replace(".lora_A.", ".lora_B.")]
        out[name] = scaling * (B.astype(np.float64) @ A.astype(np.float64))
    return out


def stack_deltas(adapter_dirs: Sequence) -> dict[str, np.ndarray]:
    """``{module: (K, q, p)}`` over the clients' adapter directories (same modules on each)."""
    per = [load_deltas(p) for p in adapter_dirs]
    names = sorted(per[0])
    if any(sorted(p) != names for p in per):
        raise ValueError("adapter_dirs must adapt the same modules on every client")
    return {n: np.stack([p[n] for p in per]) for n in names}


class Aggregate(NamedTuple):
    """``deltas[method][module]`` (K, q, p); ``benign[module]`` bool (K,) CLAIR's ``Ĉ``;
    ``clair_status[module]`` the solver status of (7); ``block_norms[module]`` (G,) the pair
    norms ``||Ŝ_{A⊥}^{(j,k)}||_F`` compared with ``τ`` in (8)."""

    deltas: dict
    benign: dict
    clair_status: dict
    block_norms: dict


def aggregate(stacks: Mapping[str, np.ndarray], modules: Sequence[str], truth, *, lam_L: float,
              lam_S: float, tau, alpha: float = 0.5, rank: int = 3, methods=METHODS,
              solver_options: Mapping | None = None) -> Aggregate:
    """Aggregate the ``modules`` of ``stacks`` by each method; other modules stay local.

    ``truth``: bool (K,), the true benign set (used by ``"oracle"`` only).
    """
    truth = np.asarray(truth, dtype=bool)
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"methods must be among {METHODS}, got {sorted(unknown)}")
    out = {m: dict(stacks) for m in methods}
    benign, status, norms = {}, {}, {}
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
    return Aggregate(out, benign, status, norms)
