"""CLAIR inside Flower (optional; needs the ``[flower]`` extra: ``flwr[simulation]``).

Modules
-------
contract   the message contract: LoRA factors as an ArrayRecord keyed like PEFT's state dict,
           r / lora_alpha / use_rslora / patterns in a ConfigRecord, both directions
peft_io    a PEFT client's side: received factors into a ``PeftModel`` (``load_adapter``), its
           trained LoRA into a reply (``adapter_record``); torch and peft imported when called
strategy   ``ClairStrategy``: a ``flwr.serverapp.strategy.Strategy`` (FedAvg's sampling) that runs
           :func:`lowrank_fl.adapters.aggregate_factors` on the replies and sends every client its
           own refined adapter

Importing :mod:`lowrank_fl` never imports flwr; importing this package without flwr raises an
``ImportError`` that names the extra.
"""
from __future__ import annotations

from importlib.util import find_spec as _find_spec

if _find_spec("flwr") is None:  # pragma: no cover - depends on the installation
    raise ImportError("lowrank_fl.flower needs flwr: install the optional extra with "
                      "`pip install \".[flower]\"` in a checkout of lowrank_fl.")

from .contract import (ADAPTER_KINDS, LORA_ARRAYS, LORA_CONFIG, SHARED_ARRAYS,  # noqa: E402
                       SHARED_CONFIG, SHARED_WEIGHT, config_from_record, config_record,
                       factors_from_content, factors_record, factors_to_state_dict)
from .peft_io import adapter_factors, adapter_record, load_adapter, lora_layers  # noqa: E402
from .strategy import ClairStrategy, RoundRecord  # noqa: E402

__all__ = ["ClairStrategy", "RoundRecord", "LORA_ARRAYS", "LORA_CONFIG", "SHARED_ARRAYS",
           "SHARED_CONFIG", "SHARED_WEIGHT", "ADAPTER_KINDS",
           "config_record", "config_from_record", "factors_from_content", "factors_record",
           "factors_to_state_dict", "load_adapter", "adapter_record", "adapter_factors", "lora_layers"]
