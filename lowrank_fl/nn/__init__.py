"""Neural-network experiments (optional; needs the ``[peft]`` extra: torch, peft, safetensors, scikit-learn).

Modules
-------
copying      CLAIR §8 / S5 copying tasks: fuzzy and clean copying, power-law tokens, masked metric
transformer  the 2-block, 1-head, rotary-position transformer of S5
pretrain     deterministic backbone pretraining, cached as safetensors keyed by its settings
clients      PEFT LoRA fine-tuning of one client; real adapter directories (``save_pretrained``)
aggregate    adapter directory → ΔW = scaling · B A per module; local / FedAvg / oracle / CLAIR
sec8         one replicate of CLAIR's §8 experiment end to end (Table 3, Figures 2-3)
trained_sets PEFT-trained adapter sets with ground truth (tiny Llama GQA / GPT-2 Conv1D bases, §8's backbone)
trained_eval every aggregator on one trained set: client-level flags, robust selections, held-out loss
two_layer    RoLoRA §5.2: f(x) = ReLU(x A B) W_out, label-skew splits, FedAvg-LoRA / FFA-LoRA / RoLoRA

Importing :mod:`lowrank_fl` never imports torch; importing this package without torch raises an
``ImportError`` that names the extra.
"""
from __future__ import annotations

from importlib.util import find_spec as _find_spec

REQUIREMENTS = ("torch", "peft", "safetensors")
_MISSING = [name for name in REQUIREMENTS if _find_spec(name) is None]
if _MISSING:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"lowrank_fl.nn needs {', '.join(_MISSING)}: install the optional extra with "
        "`pip install \".[peft]\"` in a checkout of lowrank_fl (CPU torch is enough).")
