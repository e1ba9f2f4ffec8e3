"""A PEFT client's side of the message contract: the factors it receives into its ``PeftModel``,
its trained LoRA back into a reply. Needs torch and peft (the ``[peft]`` extra), imported here
only when called.

Received (:func:`load_adapter`): ``{module: (A, B, scaling)}`` keyed like PEFT's state dict
(``base_model.model.<module>``, what :func:`~lowrank_fl.flower.factors_from_content` returns)
go into the LoRA layers of one adapter of the model through PEFT's own
``set_peft_model_state_dict``. Each module's update ``s B A`` is kept exactly (to the precision
of the model's weights): the model's scaling ``s_m`` (``lora_alpha / r``, patterns, rsLoRA) is
read from its layers and B written as ``B s / s_m``. A received rank below the adapter's is
padded — the extra rows of A keep the adapter's current values, the extra columns of B are 0, so
``B A`` is unchanged and the spare ranks train like a fresh LoRA; a larger one is refused (load it
under a new ``adapter_name``, which is created with the received ranks, or have the server cut
its outputs with ``ModuleOptions(rank_out=r)``).

Reply (:func:`adapter_record`): ``get_peft_model_state_dict`` of the adapter as the ArrayRecord
and its ``LoraConfig`` as the ConfigRecord — exactly what PEFT saves.
"""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from ..adapters import AdapterError
from ..adapters.io import module_key
from .contract import config_record

__all__ = ["lora_layers", "load_adapter", "adapter_record", "adapter_factors"]


def lora_layers(model, adapter_name: str = "default") -> dict:
    """``{module: LoRA layer}`` of ``adapter_name`` in a ``PeftModel``, keyed as PEFT's state dict
    keys its factors (``base_model.model.<module>``)."""
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in model.named_modules()
            if isinstance(mod, LoraLayer) and adapter_name in getattr(mod, "lora_A", {})}


def _check_model(model) -> None:
    if not hasattr(model, "peft_config") or not callable(getattr(model, "named_modules", None)):
        raise TypeError(f"model must be a peft PeftModel, got {type(model).__name__}")


def _new_adapter(model, factors: Mapping, adapter_name: str) -> None:
    """Add ``adapter_name`` on exactly the received modules, with their ranks and scaling 1."""
    from peft import LoraConfig

    base = next(iter(model.peft_config.values()))
    ranks = {module_key(m): int(np.shape(A)[0]) for m, (A, _, _) in factors.items()}
    r = max(set(ranks.values()), key=list(ranks.values()).count)
    pattern = {re.escape(m): k for m, k in ranks.items() if k != r}
    cfg = LoraConfig(r=r, lora_alpha=r, target_modules=sorted(ranks), rank_pattern=pattern,
                     alpha_pattern=dict(pattern), lora_dropout=0.0, bias="none",
                     fan_in_fan_out=bool(getattr(base, "fan_in_fan_out", False)))
    model.add_adapter(adapter_name, cfg)


def load_adapter(model, factors: Mapping, *, adapter_name: str = "default") -> dict:
    """Put ``factors`` (``{module: (A (ρ, in), B (out, ρ), scaling)}``) into ``adapter_name`` of
    ``model`` (a ``PeftModel``) through ``set_peft_model_state_dict``; returns
    ``{module: ρ}``. An adapter the model does not have is added with the received modules and
    ranks (scaling 1). The model's other adapters and its active adapter are left alone.

    Raises :class:`~lowrank_fl.adapters.AdapterError` naming the module where the modules or the
    shapes do not match, or a received rank exceeds the adapter's."""
    import torch
    from peft import set_peft_model_state_dict

    _check_model(model)
    if not isinstance(factors, Mapping) or not factors:
        raise AdapterError("factors must be a non-empty {module: (A, B, scaling)} mapping")
    if adapter_name not in model.peft_config:
        _new_adapter(model, factors, adapter_name)
    layers = lora_layers(model, adapter_name)
    missing, extra = sorted(set(layers) - set(factors)), sorted(set(factors) - set(layers))
    if missing or extra:
        raise AdapterError(f"adapter {adapter_name!r}: the received modules differ from the model's "
                           f"(received but not in the model: {extra[:3]}; in the model, not received: "
                           f"{missing[:3]})")
    state, ranks = {}, {}
    for m, (A, B, s) in factors.items():
        layer = layers[m]
        a_w, b_w = layer.lora_A[adapter_name].weight, layer.lora_B[adapter_name].weight
        A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
        rho, r = A.shape[0], a_w.shape[0]
        if A.ndim != 2 or B.ndim != 2 or B.shape[1] != rho:
            raise AdapterError(f"module {m!r}: A {A.shape} and B {B.shape} are not LoRA factors")
        if (B.shape[0], A.shape[1]) != (b_w.shape[0], a_w.shape[1]):
            raise AdapterError(f"module {m!r} is {B.shape[0]} x {A.shape[1]} (out x in) in the received "
                               f"adapter but {b_w.shape[0]} x {a_w.shape[1]} in the model")
        if rho > r:
            raise AdapterError(f"module {m!r}: received rank {rho} exceeds adapter {adapter_name!r}'s rank "
                               f"{r}; load it under a new adapter_name (created with the received ranks) "
                               "or have the server cut its outputs (ModuleOptions(rank_out=...), which sends "
                               "the merged layout)")
        s_model = float(layer.scaling[adapter_name])
        A_new = a_w.detach().to(torch.float64).cpu().numpy().copy()     # spare rows: as they are
        A_new[:rho] = A
        B_new = np.zeros((B.shape[0], r))
        B_new[:, :rho] = B * (float(s) / s_model)
        state[f"{m}.lora_A.weight"] = torch.from_numpy(A_new).to(a_w.dtype)
        state[f"{m}.lora_B.weight"] = torch.from_numpy(B_new).to(b_w.dtype)
        ranks[m] = rho
    res = set_peft_model_state_dict(model, state, adapter_name=adapter_name)
    unexpected = [k for k in getattr(res, "unexpected_keys", []) if "lora_" in k]
    if unexpected:                                  # pragma: no cover - PEFT changed its keys
        raise AdapterError(f"PEFT did not place {unexpected[:3]} into adapter {adapter_name!r}")
    return ranks


def adapter_record(model, *, adapter_name: str = "default", client_id: str | None = None,
                   dtype=None) -> tuple[ArrayRecord, ConfigRecord]:
    """The reply's ArrayRecord (``get_peft_model_state_dict`` of ``adapter_name``; bf16 and other
    dtypes without numpy counterparts as float32, ``dtype`` to force one) and ConfigRecord (its
    ``LoraConfig``, plus ``client-id`` if given)."""
    import torch
    from peft import get_peft_model_state_dict

    _check_model(model)
    if adapter_name not in model.peft_config:
        raise AdapterError(f"the model has no adapter {adapter_name!r} (adapters: {sorted(model.peft_config)})")
    state = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    arrays = {}
    for key, t in state.items():
        t = t.detach().cpu()
        if dtype is not None:
            arrays[key] = Array(t.numpy().astype(dtype))
        else:
            arrays[key] = Array((t.float() if t.dtype == torch.bfloat16 else t).numpy())
    extra = {} if client_id is None else {"client-id": str(client_id)}
    return ArrayRecord(arrays), config_record(model.peft_config[adapter_name].to_dict(), **extra)


def adapter_factors(model, *, adapter_name: str = "default") -> dict:
    """``{module: (A, B, scaling)}`` (float64) of ``adapter_name``: the reply read as the server
    reads it."""
    from ..adapters import factors_from_state_dict
    from .contract import config_from_record

    arrays, cfg = adapter_record(model, adapter_name=adapter_name)
    return factors_from_state_dict({k: v.numpy() for k, v in arrays.items()}, config_from_record(cfg))
