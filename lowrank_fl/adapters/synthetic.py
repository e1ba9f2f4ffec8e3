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
                             seed=0, overwrite: bool = False) -> list[Path]:
    """Write ``n_clients`` adapter directories ``out/client_00`` ... and return their paths.

    The defaults are a 7B-shaped federation (10 clients × 32 layers × 4 attention projections of
    4096 × 4096 at rank 16 in float16: about 335 MB); tests and examples pass small shapes.

    Parameters
    ----------
    out : path-like
        Parent directory (created). A ``client_XX`` already holding files is refused unless
        ``overwrite``.
    n_clients : int >= 1
        (one client makes a set every aggregation refuses: a test input)
    n_layers : int >= 1
    modules : sequence of str
        Projections per layer (Llama names, e.g. ``("q_proj", "v_proj")``).
    shape : (out, in)
    rank : int
        LoRA rank, ``1 <= rank <= min(shape)`` (``ranks``: optional per-client list overriding it).
    contaminated : int
        Number of contaminated clients (the last ones), ``0 <= contaminated < n_clients``: their
        ``A`` is unrelated to the shared one in every module.
    delta : float >= 0
        Benign misalignment ``||A_k - A||_F / ||A||_F`` (relative, per module).
    b_scale : float > 0
        Standard deviation of the entries of every ``B`` (drawn independently per client).
    alpha : float > 0, optional
        ``lora_alpha`` of every config (default ``2 r``).
    dtype : {"float16", "float32"}
    seed : int
    overwrite : bool
        Replace client directories that already hold files.
    """
    from safetensors.numpy import save

    from ..validation import check_int

    check_int(n_clients, "n_clients", minimum=1)
    check_int(n_layers, "n_layers", minimum=1)
    check_int(contaminated, "contaminated", minimum=0)
    if contaminated >= n_clients:
        raise ValueError(f"contaminated must be below n_clients = {n_clients}, got {contaminated}")
    if len(tuple(shape)) != 2:
        raise ValueError(f"shape must be (out, in), got {shape!r}")
    q, p = (check_int(v, "shape", minimum=1) for v in shape)
    what = "rank" if ranks is None else "ranks"
    ranks = [rank] * n_clients if ranks is None else list(ranks)
    if len(ranks) != n_clients:
        raise ValueError(f"ranks must give one rank per client ({n_clients}), got {len(ranks)}")
    for r in ranks:
        check_int(r, what, minimum=1)
        if r > min(q, p):
            raise ValueError(f"{what} must be at most min(shape) = {min(q, p)}, got {r}")
    if not (np.isfinite(delta) and delta >= 0):
        raise ValueError(f"delta must be a finite number >= 0, got {delta!r}")
    if not (np.isfinite(b_scale) and b_scale > 0):
        raise ValueError(f"b_scale must be a finite number > 0, got {b_scale!r}")
    if alpha is not None and not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0 or None, got {alpha!r}")
    if dtype not in ("float16", "float32"):
        raise ValueError(f"dtype must be 'float16' or 'float32', got {dtype!r}")
    modules = list(modules)
    if not modules:
        raise ValueError("modules must name at least one projection")
    if len(set(modules)) != len(modules):
        raise ValueError(f"modules must not repeat a projection, got {modules}")
    out = Path(out)
    held = [out / f"client_{k:02d}" for k in range(n_clients)
            if (out / f"client_{k:02d}").is_dir() and any((out / f"client_{k:02d}").iterdir())]
    if held and not overwrite:
        raise FileExistsError(f"out {str(out)!r} already holds {held[0].name} (and {len(held) - 1} more client "
                              "folder(s)); pass overwrite=True to replace them")
    rng = np.random.default_rng(seed)
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
        # the bytes written by Python (safetensors' save_file creates its files 0600, unlike the config)
        (d / "adapter_model.safetensors").write_bytes(save(tensors[k]))
        cfg = _config(ranks[k], float(alpha if alpha is not None else 2 * ranks[k]), modules)
        (d / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
        paths.append(d)
    return paths
