"""The message contract between :class:`~lowrank_fl.flower.ClairStrategy` and its ClientApps.

Client → server (the reply to a TRAIN message), in the reply's ``RecordDict``:

``"lora"`` : ArrayRecord
    The client's LoRA factors keyed like PEFT's state dict (what
    ``peft.get_peft_model_state_dict`` returns): ``<module>.lora_A.weight`` (A, r × in) and
    ``<module>.lora_B.weight`` (B, out × r) for every adapted module; float16/32/64 (bf16 has no
    numpy dtype: send float32). ``ArrayRecord(get_peft_model_state_dict(model))`` is enough.
``"lora_config"`` : ConfigRecord
    ``r`` (int), ``lora_alpha`` (number), ``use_rslora`` (bool, default False) and, where the
    adapter has per-module values, ``rank_pattern`` / ``alpha_pattern`` as JSON strings of PEFT's
    dicts (a ConfigRecord holds no dicts), and ``peft_type``, ``init_lora_weights`` and the LoRA
    variant switches (``use_dora``, ...) where the config has them, so that the server refuses
    (as "rejected", with the reason) an adapter that is not plain LoRA, as the CLI does.
    :func:`config_record` builds it from a ``LoraConfig.to_dict()``. A module's scaling is PEFT's: ``lora_alpha / r`` (``/ sqrt(r)``
    with rsLoRA), patterns first. Optional ``client-id`` (str): clients are aggregated in the
    order of their ids (then node ids), so that runs whose node ids differ give the same numbers.
a MetricRecord (optional)
    Anything the client reports (``num-examples``, ``train-loss``, ...); averaged across the
    replies as FedAvg does when every reply has one with ``num-examples``.

Server → client (TRAIN and EVALUATE messages):

``"arrays"`` : ArrayRecord
    This client's adapter in the same PEFT keys: its refined adapter (9) when it took part in the
    last aggregation and CLAIR kept it in the collaborative set, its own adapter when CLAIR
    excluded it, else the global ArrayRecord (the benign-set mean, or the initial arrays —
    possibly empty — before any aggregation). Ranks vary by module and client.
``"lora_config"`` : ConfigRecord
    The config of those factors, in the format above, with every module's scaling 1
    (``lora_alpha = r`` per module through the patterns), plus ``adapter``: ``"refined"``,
    ``"own"`` or ``"global"``.
``"config"`` : ConfigRecord
    The run's config with ``server-round``, as FedAvg sends it.

With ``ClairStrategy(output="split")`` (the default for CLAIR) a refined client's ``"arrays"``
hold only its own part (rank ``r_k``: :func:`lowrank_fl.adapters.split.client_part`) and its
``"lora_config"`` a ``shared-weight`` (a number, or a JSON object ``{module: weight}``); the
round's shared part ``ΔW̄_Ĉ (I - P_Â)`` comes beside it as the ArrayRecord ``"shared"`` with its
ConfigRecord ``"shared_config"`` (computed once per round, the same for every client). The
client's update is ``own + shared-weight × shared`` per module: :func:`factors_from_content`
returns that sum as one stacked factorization, so a ClientApp reads either layout the same way.
"""
from __future__ import annotations

import json
from typing import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from ..adapters import AdapterError, factors_from_state_dict
from ..adapters.io import VARIANT_FIELDS
from ..adapters.save import peft_config
from ..linalg import compact_factors

__all__ = ["LORA_ARRAYS", "LORA_CONFIG", "SHARED_ARRAYS", "SHARED_CONFIG", "SHARED_WEIGHT",
           "ADAPTER_KINDS", "config_record", "config_from_record", "factors_from_content",
           "factors_record", "factors_to_state_dict", "shared_weight_value", "layout_difference"]

LORA_ARRAYS = "lora"
LORA_CONFIG = "lora_config"
#: the split layout's shared part (ArrayRecord, ConfigRecord) and each client's weight of it
SHARED_ARRAYS = "shared"
SHARED_CONFIG = "shared_config"
SHARED_WEIGHT = "shared-weight"
#: what the server sends a client: its refined adapter, its own (outside the collaborative set),
#: or the global ArrayRecord; "shared": the split layout's shared part
ADAPTER_KINDS = ("refined", "own", "global", "shared")
_PATTERNS = ("rank_pattern", "alpha_pattern")
# carried so the server can refuse what the CLI refuses (check_plain_lora, check_peft_type)
_CHECKED = ("peft_type", "init_lora_weights") + VARIANT_FIELDS


def _record_value(value):
    """A config value a ConfigRecord can hold: bool/int/float/str as is (an enum as its value),
    anything else (a variant's config dict) as JSON."""
    value = getattr(value, "value", value)
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def config_record(config: Mapping, **extra) -> ConfigRecord:
    """A ConfigRecord of a LoRA config (a ``LoraConfig.to_dict()`` or ``adapter_config.json``'s
    content): ``r``, ``lora_alpha``, ``use_rslora``, the patterns as JSON, ``peft_type``,
    ``init_lora_weights`` and the variant switches that are set; ``extra`` added."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (a LoRA config), got {type(config).__name__}")
    for key in ("r", "lora_alpha"):
        if key not in config:
            raise ValueError(f"config has no {key!r}; expected a LoRA config with r and lora_alpha")
    rec = ConfigRecord({"r": int(config["r"]), "lora_alpha": float(config["lora_alpha"]),
                        "use_rslora": bool(config.get("use_rslora") or False)})
    for key in _PATTERNS:
        if config.get(key):
            rec[key] = json.dumps({str(k): v for k, v in dict(config[key]).items()}, sort_keys=True)
    for key in _CHECKED:
        if config.get(key) is not None and (key in ("peft_type", "init_lora_weights") or config[key]):
            rec[key] = _record_value(config[key])
    for key, value in extra.items():
        rec[key] = value
    return rec


def config_from_record(record: Mapping) -> dict:
    """The LoRA config dict (``r``, ``lora_alpha``, ``use_rslora``, patterns, ``peft_type``,
    ``init_lora_weights``, variant switches) of a ConfigRecord written by :func:`config_record`."""
    cfg: dict = {}
    for key in ("r", "lora_alpha"):
        if key not in record:
            raise AdapterError(f"the LoRA ConfigRecord has no {key!r} (keys: {sorted(record)})")
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AdapterError(f"the LoRA ConfigRecord's {key!r} must be a number, got {value!r}")
        cfg[key] = value
    cfg["use_rslora"] = bool(record.get("use_rslora", False))
    for key in _PATTERNS:
        if key in record:
            try:
                pattern = json.loads(record[key])
            except (TypeError, ValueError) as exc:
                raise AdapterError(f"the LoRA ConfigRecord's {key!r} must be a JSON object string, "
                                   f"got {record[key]!r} ({exc})") from None
            if not isinstance(pattern, dict):
                raise AdapterError(f"the LoRA ConfigRecord's {key!r} must be a JSON object, got {pattern!r}")
            cfg[key] = pattern
    for key in _CHECKED:
        if key in record:
            cfg[key] = record[key]
    return cfg


def shared_weight_value(weight):
    """The ConfigRecord value of a client's shared weight (a number, or ``{module: weight}``)."""
    if isinstance(weight, dict):
        return json.dumps({str(m): float(w) for m, w in weight.items()}, sort_keys=True)
    return float(weight)


def _shared_weights(value, modules) -> dict:
    """``{module: weight}`` from a ConfigRecord's ``shared-weight`` (an object must name exactly
    the message's modules)."""
    if isinstance(value, str):
        try:
            doc = json.loads(value)
        except ValueError as exc:
            raise AdapterError(f"{SHARED_WEIGHT!r} must be a number or a JSON object string, got "
                               f"{value!r} ({exc})") from None
        if not isinstance(doc, dict):
            raise AdapterError(f"{SHARED_WEIGHT!r} must be a number or a JSON object, got {doc!r}")
        unknown, missing = sorted(set(doc) - set(modules)), sorted(set(modules) - set(doc))
        if unknown or missing:
            raise AdapterError(f"{SHARED_WEIGHT!r} must name exactly the adapter's modules: unknown "
                               f"{unknown[:3]}, missing {missing[:3]}")
        return {m: float(doc[m]) for m in modules}
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdapterError(f"{SHARED_WEIGHT!r} must be a number or a JSON object string, got {value!r}")
    return {m: float(value) for m in modules}


def factors_from_content(content: RecordDict, *, arrays_key: str = LORA_ARRAYS,
                         config_key: str = LORA_CONFIG, shared_key: str = SHARED_ARRAYS,
                         shared_config_key: str = SHARED_CONFIG) -> dict:
    """``{module: (A (r, in), B (out, r), scaling)}`` (float64) of a message's content, by the
    contract above; a split-layout message (a ``shared-weight`` in the config) gives the sum of
    the client's part and its weight times ``shared_key``'s factors (``[A_own; A_shared]``,
    ``[s B_own, w s' B_shared]`` compacted to the sum's numerical rank by a QR-SVD of the
    stacked factors, balanced, scaling 1). Raises
    :class:`~lowrank_fl.adapters.AdapterError` naming what is missing."""
    own = _factors(content, arrays_key, config_key)
    weight = content.config_records[config_key].get(SHARED_WEIGHT)
    if weight is None:
        return own
    weights = _shared_weights(weight, own)
    if not any(weights.values()):
        return own
    if shared_key not in content.array_records:
        raise AdapterError(f"the message is in the split layout ({SHARED_WEIGHT!r} in {config_key!r}) but has "
                           f"no ArrayRecord {shared_key!r} with the shared part (ArrayRecords: "
                           f"{sorted(content.array_records)})")
    shared = _factors(content, shared_key, shared_config_key)
    out = {}
    for m, (A, B, s) in own.items():
        w = weights[m]
        if w == 0:
            out[m] = (A, B, s)
            continue
        if m not in shared:
            raise AdapterError(f"module {m!r} has shared weight {w} but no factors in {shared_key!r}")
        As, Bs, ss = shared[m]
        out[m] = _compact(np.vstack([A, As]), np.hstack([s * B, (w * ss) * Bs]))
    return out


def _compact(A, B, rtol: float = 1e-12):
    """``(A', B', 1)`` with ``B' A' = B A`` at the product's numerical rank (singular values above
    ``rtol σ_1``, :func:`lowrank_fl.linalg.compact_factors`), so the sum of the two parts is never of
    a higher rank than the update itself (nor than the merged layout's adapter)."""
    B2, A2 = compact_factors(B, A, rtol=rtol)
    return A2, B2, 1.0


def _factors(content: RecordDict, arrays_key: str, config_key: str) -> dict:
    if arrays_key not in content.array_records:
        raise AdapterError(f"no ArrayRecord {arrays_key!r} with the LoRA factors (ArrayRecords: "
                           f"{sorted(content.array_records)})")
    if config_key not in content.config_records:
        raise AdapterError(f"no ConfigRecord {config_key!r} with r / lora_alpha (ConfigRecords: "
                           f"{sorted(content.config_records)})")
    arrays = content.array_records[arrays_key]
    try:
        state = {key: arr.numpy() for key, arr in arrays.items()}
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"ArrayRecord {arrays_key!r}: an array is not a numpy array ({exc})") from None
    return factors_from_state_dict(state, config_from_record(content.config_records[config_key]))


def factors_to_state_dict(factors: Mapping, *, dtype=None) -> dict:
    """``{module: (A, B, scaling)}`` → PEFT state-dict keys with ``scaling`` folded into B."""
    out = {}
    for module, (A, B, s) in factors.items():
        A, B = np.asarray(A), np.asarray(B)
        if s != 1.0:
            B = B * s
        dt = dtype or np.result_type(A, B)
        out[f"{module}.lora_A.weight"] = np.ascontiguousarray(A, dtype=dt)
        out[f"{module}.lora_B.weight"] = np.ascontiguousarray(B, dtype=dt)
    return out


def factors_record(factors: Mapping, *, adapter: str | None = None,
                   dtype=None) -> tuple[ArrayRecord, ConfigRecord]:
    """The ArrayRecord and ConfigRecord of ``{module: (A, B, scaling)}`` (scaling folded into B,
    every module's scaling 1 in the config, per-module ranks in the patterns). ``adapter``: one
    of :data:`ADAPTER_KINDS` (what the server sends), None for a client's reply."""
    if adapter is not None and adapter not in ADAPTER_KINDS:
        raise ValueError(f"adapter must be one of {list(ADAPTER_KINDS)}, got {adapter!r}")
    state = factors_to_state_dict(factors, dtype=dtype)
    arrays = ArrayRecord({k: Array(v) for k, v in state.items()})
    cfg = peft_config({}, {m: int(np.shape(A)[0]) for m, (A, _, _) in factors.items()})
    return arrays, config_record(cfg, **({} if adapter is None else {"adapter": adapter}))


def layout_difference(lay: tuple, common: tuple) -> str:
    """Why a reply's module layout ``lay`` (``(module, in, out)`` triples) differs from the most
    common one, ``common``: the first module that
    differs, with both shapes (out x in), or the modules one side lacks."""
    mine = {m: (o, i) for m, i, o in lay}
    ref = {m: (o, i) for m, i, o in common}
    extra, lacks = sorted(set(mine) - set(ref)), sorted(set(ref) - set(mine))
    for m in sorted(set(mine) & set(ref)):
        if mine[m] != ref[m]:
            return (f"module {m!r} is {mine[m][0]} x {mine[m][1]} (out x in) in this reply but "
                    f"{ref[m][0]} x {ref[m][1]} in the other clients'")
    parts = []
    if lacks:
        parts.append(f"lacks {len(lacks)} module(s) of the other clients' ({', '.join(lacks[:3])}"
                     f"{', ...' if len(lacks) > 3 else ''})")
    if extra:
        parts.append(f"has {len(extra)} module(s) the others lack ({', '.join(extra[:3])}"
                     f"{', ...' if len(extra) > 3 else ''})")
    return f"modules differ from the other clients' ({len(mine)} vs {len(ref)} modules): " + "; ".join(parts)
