"""Synthetic LoRA adapters in real PEFT format (for tests, benchmarks and examples).

Each benign client ``k`` of a module gets ``A_k = A + δ E_k`` (a shared row space: ``A`` is r × in with
orthonormal rows) and its own ``B_k``;
contaminated clients get an unrelated ``A`` (their difference is in ``A`` alone: it shows on the input
side of the feature profile, ``column_ratios``, not on its output side). Written as ``adapter_config.json`` +
``adapter_model.safetensors`` with keys
``base_model.model.model.layers.{i}.self_attn.{m}.lora_{A,B}.weight`` (Llama naming).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["write_synthetic_adapters", "LLAMA_ATTENTION"]

LLAMA_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def _config(rank: int, alpha: float, modules) -> dict:
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "lora_dropout": 0.0, "target_modules": list(modules), "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "rank_pattern": {}, "alpha_pattern": {}, "base_model_name_or_path": "synthetic",
            "inference_mode": True, "init_lora_weights": True, "modules_to_save": None}


def write_synthetic_adapters(out, *, n_clients: int = 10, n_layers: int = 32,
                             modules=LLAMA_ATTENTION, shape=(4096, 4096), rank: int = 16,
                             contaminated: int = 1, delta: float = 0.05, b_scale: float = 0.02,
                             alpha: float | None = None, dtype: str = "float16", ranks=None,
                             seed=0) -> list[Path]:
    """Write ``n_clients`` adapter directories ``out/client_00`` ... and return their paths.

    Parameters
    ----------
    shape : (out, in)
    rank : int
        LoRA rank (``ranks``: optional per-client list overriding it).
    contaminated : int
        Number of contaminated clients (the last ones): their ``A`` is unrelated to the
        shared one in every module.
    delta : float
        Benign misalignment ``||A_k - A||_F / ||A||_F`` (relative, per module).
    dtype : {"float16", "float32"}
    """
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    out = Path(out)
    ranks = [rank] * n_clients if ranks is None else list(ranks)
    q, p = shape
    names = [f"model.layers.{i}.self_attn.{m}" for i in range(n_layers) for m in modules]
    tensors = [dict() for _ in range(n_clients)]
    rmax = max(ranks)
    for name in names:
        A0 = np.linalg.qr(rng.standard_normal((p, rmax)))[0].T          # (rmax, in), orthonormal
        for k in range(n_clients):
            r = ranks[k]
            if k >= n_clients - contaminated:
                A = np.linalg.qr(rng.standard_normal((p, r)))[0].T
            else:
                E = rng.standard_normal((r, p))
                A = A0[:r] + delta * E / np.linalg.norm(E) * np.sqrt(r)
            B = b_scale * rng.standard_normal((q, r))
            key = f"base_model.model.{name}"
            tensors[k][f"{key}.lora_A.weight"] = A.astype(dtype)
            tensors[k][f"{key}.lora_B.weight"] = B.astype(dtype)
    paths = []
    for k in range(n_clients):
        d = out / f"client_{k:02d}"
        d.mkdir(parents=True, exist_ok=True)
        save_file(tensors[k], str(d / "adapter_model.safetensors"))
        cfg = _config(ranks[k], float(alpha if alpha is not None else 2 * ranks[k]), modules)
        (d / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
        paths.append(d)
    return paths
