"""PEFT LoRA adapter directories out (no torch needed): the output's ``adapter_config.json``
(:func:`peft_config`) and ``adapter_model.safetensors`` in a storage dtype that is checked for
what it loses (:func:`storage_array`), written by :func:`save_adapter`. Reading is
:mod:`lowrank_fl.adapters.io`.
"""
from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .io import CONFIG_NAME, WEIGHTS_NAME, StorageDtypeError, module_key

__all__ = ["peft_config", "STORAGE", "STORAGE_REL_ERROR", "stored_values", "storage_array", "save_adapter"]


#: config fields reset in an output: they described how the clients' adapters were initialised
#: or trained, not the aggregate written (a plain s·B·A with lora_alpha = r, scaling 1)
_RESET = {"init_lora_weights": True, "loftq_config": {}, "eva_config": None,
          "corda_config": None, "lora_ga_config": None, "inference_mode": True,
          "use_dora": False, "use_rslora": False}


def peft_config(base_config: dict, ranks: dict) -> dict:
    """The config of an output adapter with these per-module ``ranks``, from a client's config.

    ``r`` (the most common rank), ``lora_alpha = r``, ``rank_pattern`` and ``alpha_pattern``
    (the other modules, escaped names, ``alpha = rank``) make every module's scaling exactly 1;
    ``use_rslora`` is false, ``init_lora_weights`` true (a plain ``B A``, whatever initialised the
    clients), and the initialisers' configs (``loftq_config``, ``eva_config``, ...) are cleared.
    ``target_modules``, ``fan_in_fan_out``, ``base_model_name_or_path``, ``task_type`` and the
    other fields that describe the model are kept."""
    counts: dict = {}
    for r in ranks.values():
        counts[r] = counts.get(r, 0) + 1
    r0 = max(sorted(counts), key=lambda r: counts[r])      # most common rank, smallest on ties
    cfg = dict(base_config)
    for key, value in _RESET.items():
        if key in cfg or key in ("init_lora_weights", "use_rslora"):
            cfg[key] = value
    cfg.update(r=r0, lora_alpha=r0)
    pattern = {re.escape(module_key(m)): r for m, r in ranks.items() if r != r0}
    cfg["rank_pattern"] = pattern
    cfg["alpha_pattern"] = dict(pattern)
    return cfg


#: storage dtypes of outputs: safetensors tag and the numpy dtype of the stored bits
STORAGE = {"float32": ("F32", "<f4"), "float16": ("F16", "<f2"), "bfloat16": ("BF16", "<u2"),
           "float64": ("F64", "<f8")}


#: the largest relative Frobenius error ``||cast(x) - x||_F / ||x||_F`` a stored tensor may have:
#: 20x float16's unit roundoff 2^-11 (2.6x bfloat16's 2^-8). Rounding in a dtype's normal range
#: stays below its unit roundoff, so only underflow (subnormals, values flushed to 0) exceeds it.
STORAGE_REL_ERROR = 1e-2


def _cast(x: np.ndarray, dtype: str) -> tuple[str, np.ndarray, np.ndarray]:
    """(tag, the stored array, its values as floats) of ``x`` in a storage dtype."""
    if dtype not in STORAGE:
        raise ValueError(f"dtype must be one of {list(STORAGE)}, got {dtype!r}")
    tag, np_dtype = STORAGE[dtype]
    with np.errstate(over="ignore", invalid="ignore"):
        wide = np.ascontiguousarray(x, dtype="<f4" if dtype == "bfloat16" else np_dtype)
    if dtype == "bfloat16":
        u = wide.view("<u4").astype(np.uint64)
        wide = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
        back = (wide.astype(np.uint32) << 16).view(np.float32)
    else:
        back = wide
    return tag, wide, back


def stored_values(x, dtype: str) -> np.ndarray:
    """The float64 values ``x`` has once stored in ``dtype`` (rounded to nearest; inf where it
    overflows), same shape."""
    with np.errstate(over="ignore"):
        return _cast(np.asarray(x), dtype)[2].astype(np.float64)


def storage_array(x, dtype: str, name: str) -> tuple[str, np.ndarray]:
    """``x`` cast to a storage dtype (see :data:`STORAGE`): ``(safetensors tag, array)``.

    bfloat16 is rounded to nearest (ties to even) from float32 and returned as its uint16 bits.
    Raises :class:`StorageDtypeError` naming ``name`` when a value does not fit the dtype (beyond
    float16's 65504, say), instead of storing inf, and when the cast changes the tensor by more
    than :data:`STORAGE_REL_ERROR` in relative Frobenius norm (small values underflowing float16:
    ``|x| < 6.1e-5`` are subnormal, ``< 3e-8`` become 0).
    """
    x = np.asarray(x)
    tag, wide, back = _cast(x, dtype)
    if not np.all(np.isfinite(back)):
        big = float(np.max(np.abs(x)))
        raise StorageDtypeError(f"{name}: values up to {big:.3g} do not fit {dtype} (they would be "
                                "stored as inf)")
    x64 = np.asarray(x, dtype=np.float64)
    norm = float(np.linalg.norm(x64))
    if norm > 0:
        rel = float(np.linalg.norm(back.astype(np.float64) - x64)) / norm
        if rel > STORAGE_REL_ERROR:
            nonzero = np.abs(x64[x64 != 0])
            raise StorageDtypeError(
                f"{name}: storing it as {dtype} changes it by {rel:.2g} (relative Frobenius "
                f"error, above {STORAGE_REL_ERROR:g}): its values (down to {nonzero.min():.2g}, "
                f"median {np.median(nonzero):.2g}) underflow {dtype}")
    return tag, wide


def _write_safetensors(path: Path, tensors: dict) -> None:
    """A safetensors file from ``{name: (tag, array)}`` (tags as in :data:`STORAGE`), the tensors in
    name order: :func:`save_adapter`'s bytes do not depend on the order of ``factors``. (The
    command's streamed writer, :mod:`.stream`, lays tensors out as the modules finish.)"""
    tensors = dict(sorted(tensors.items()))
    header, offset = {}, 0
    for name, (tag, a) in tensors.items():
        header[name] = {"dtype": tag, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for _, a in tensors.values():
            fh.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def _as_ba(module, factors) -> tuple[np.ndarray, np.ndarray]:
    """``(B, A)`` from a module's entry: the library's ``(A, B, scaling)`` (scaling folded into
    ``B``) or a ``(B, A)`` pair, checked (2-D, inner dimensions equal, finite scaling)."""
    where = f"factors[{module!r}]"
    if not isinstance(factors, (tuple, list)) or len(factors) not in (2, 3):
        raise ValueError(f"{where} must be (A, B, scaling) or (B, A), got {type(factors).__name__}"
                         + (f" of length {len(factors)}" if isinstance(factors, (tuple, list)) else ""))
    if len(factors) == 3:
        A, B, s = factors
        try:
            s = float(s)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: scaling must be a finite number, got {s!r}") from None
        if not np.isfinite(s):
            raise ValueError(f"{where}: scaling must be finite, got {s}")
    else:
        (B, A), s = factors, 1.0
    A, B = np.asarray(A), np.asarray(B)
    if A.ndim != 2 or B.ndim != 2 or B.shape[1] != A.shape[0]:
        raise ValueError(f"{where}: B {tuple(B.shape)} and A {tuple(A.shape)} are not the factors of an "
                         "out x in update (B (out, r), A (r, in))")
    if s != 1.0:
        B = B.astype(np.float64) * s
    return B, A


def save_adapter(out_dir, base_config: dict, factors: dict, *, dtype="float32",
                 overwrite: bool = False) -> None:
    """Write a PEFT adapter directory whose ``scaling · B A`` equals the given products.

    Parameters
    ----------
    out_dir : path-like
        Created (parents too) if missing. One that already holds an adapter
        (``adapter_config.json`` or ``adapter_model.safetensors``) is refused unless ``overwrite``.
    base_config : dict or peft.LoraConfig
        A client's ``adapter_config.json`` (or its ``LoraConfig``); the output's config is :func:`peft_config` of it
        (every module's scaling 1, its rank the rank of the factors given).
    factors : dict
        Per module (the safetensors module names, e.g. ``base_model.model.model.layers.0.self_attn.q_proj``),
        either the library's ``(A (r, in), B (out, r), scaling)`` — as :func:`lowrank_fl.adapters.aggregate_factors`
        returns them; ``ΔW = scaling · B A`` — or a pair ``(B (out, r), A (r, in))`` with ``ΔW = B A``.
    dtype : {"float32", "float16", "bfloat16", "float64"}
        Storage dtype of the tensors. A value that does not fit it is an error
        (:func:`storage_array`).
    overwrite : bool
        Replace an adapter already in ``out_dir``.
    """
    out_dir = Path(out_dir)
    if not isinstance(base_config, Mapping) and callable(getattr(base_config, "to_dict", None)):
        base_config = base_config.to_dict()                  # a peft LoraConfig
    if not isinstance(base_config, Mapping):
        raise TypeError(f"base_config must be an adapter config (a mapping or a peft LoraConfig), got "
                        f"{type(base_config).__name__}")
    # LoraConfig.to_dict() holds target_modules as a set: JSON needs a list
    base_config = {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in base_config.items()}
    if not overwrite:
        held = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if (out_dir / n).exists()]
        if held:
            raise FileExistsError(f"out_dir {str(out_dir)!r} already holds an adapter ({', '.join(held)}); "
                                  "pass overwrite=True to replace it")
    tensors, ranks = {}, {}
    for m, entry in factors.items():
        B, A = _as_ba(m, entry)
        tensors[f"{m}.lora_A.weight"] = storage_array(A, dtype, f"module {m!r} (lora_A)")
        tensors[f"{m}.lora_B.weight"] = storage_array(B, dtype, f"module {m!r} (lora_B)")
        ranks[m] = int(A.shape[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = peft_config(base_config, ranks)
    _write_safetensors(out_dir / WEIGHTS_NAME, tensors)
    tmp = out_dir / (CONFIG_NAME + ".tmp")
    tmp.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    os.replace(tmp, out_dir / CONFIG_NAME)
