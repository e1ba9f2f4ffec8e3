"""Load a client's CLAIR output in PEFT, whatever its layout (needs the peft extra).

The split layout (:mod:`lowrank_fl.adapters.split`) gives client ``k`` two adapters: its own part
``OUT/<client>/`` and ``OUT/shared/``, to be added with the weight its manifest records per module
(``a_k``: 1 for (9), 0 outside the collaborative set). :func:`load_split` loads both on a base
model and either keeps both active (``combine="active"``: PEFT adds their outputs) or concatenates
them into one adapter with PEFT's ``add_weighted_adapter(..., combination_type="cat")``
(``combine="cat"``: one adapter of rank ``r_k + rank(shared)``, the others deleted). The shared
part's weight is set as its per-layer PEFT scale (``set_scale``: ``a · lora_alpha / r``, and the
written configs have ``lora_alpha = r``), so both forms give ``ΔW_k`` part + ``a`` shared exactly.
A merged-layout client directory (no manifest) is loaded as the plain adapter it is.

>>> model = load_split(base_model, "OUT", "client_00")            # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path

from .io import AdapterError, module_key
from .split import MANIFEST, SHARED, read_manifest

__all__ = ["load_split", "COMBINE"]

COMBINE = ("active", "cat")


def _lora_layers(peft_model, adapter: str):
    """``{module_key: layer}`` of the PEFT layers that hold ``adapter``."""
    out = {}
    for name, mod in peft_model.named_modules():
        if adapter in getattr(mod, "lora_A", {}) and hasattr(mod, "set_scale"):
            out[module_key(name)] = mod
    return out


def _has_adapter_layers(model) -> bool:
    """Whether PEFT has injected adapter layers into ``model`` (what a load leaves in the base)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    modules = getattr(model, "modules", None)
    return callable(modules) and any(isinstance(m, BaseTunerLayer) for m in modules())


def load_split(model, out_dir, client: str, *, combine: str = "active",
               adapter_name: str = "default", is_trainable: bool = False):
    """A ``peft.PeftModel`` on ``model`` (a base transformers model, fresh: PEFT modifies it in
    place, so a model already holding adapters is refused) holding client ``client``'s output
    from ``out_dir`` (an aggregate's ``OUT``).

    Split layout: its own part loaded as ``adapter_name``; where the manifest gives the shared
    part a weight above 0 in some module, ``OUT/shared`` loaded as ``"shared"`` and scaled per
    module by that weight, then both made active (``combine="active"``) or concatenated into
    ``adapter_name`` (``combine="cat"``; the parts are deleted). Merged layout: the adapter.
    """
    from peft import PeftModel

    if combine not in COMBINE:
        raise ValueError(f"combine must be one of {list(COMBINE)}, got {combine!r}")
    if adapter_name == SHARED:
        raise ValueError(f"adapter_name {SHARED!r} is the shared part's name; choose another")
    if isinstance(model, PeftModel) or _has_adapter_layers(model):
        # PEFT injects LoRA layers into the base model in place: loading into it again would
        # stack this client's adapter on what is already there
        raise ValueError("model already carries PEFT adapters (a previous load_split or "
                         "PeftModel.from_pretrained injected them into it in place); pass a fresh base model")
    client_dir = Path(out_dir) / client
    if not client_dir.is_dir():
        raise AdapterError(f"{client_dir}: no such output directory (client {client!r})")
    if not (client_dir / MANIFEST).is_file():             # merged layout: a plain adapter
        return PeftModel.from_pretrained(model, str(client_dir), adapter_name=adapter_name,
                                         is_trainable=is_trainable)
    doc = read_manifest(client_dir)
    weights = doc["shared_weight"]
    values = weights.values() if isinstance(weights, dict) else [weights]
    if all(float(w) == 0 for w in values):                        # outside the set everywhere
        return PeftModel.from_pretrained(model, str(client_dir), adapter_name=adapter_name,
                                         is_trainable=is_trainable)
    if doc.get("shared", "") is None:
        raise AdapterError(f"{client_dir / MANIFEST}: shared_weight {weights!r} above 0 but no shared "
                           "adapter was written (shared: null)")
    own_name = f"{adapter_name}_own" if combine == "cat" else adapter_name
    peft_model = PeftModel.from_pretrained(model, str(client_dir), adapter_name=own_name,
                                           is_trainable=is_trainable)
    shared_dir = (client_dir / doc.get("shared", f"../{SHARED}")).resolve()
    peft_model.load_adapter(str(shared_dir), adapter_name=SHARED, is_trainable=is_trainable)
    layers = _lora_layers(peft_model, SHARED)
    if isinstance(weights, dict):
        keyed = {module_key(m): float(w) for m, w in weights.items()}
        missing = sorted(set(layers) - set(keyed))
        if missing:
            raise AdapterError(f"{client_dir / MANIFEST}: no shared weight for module {missing[0]!r}")
    else:
        keyed = {m: float(weights) for m in layers}
    for m, layer in layers.items():
        layer.set_scale(SHARED, keyed[m])          # a · lora_alpha / r, and lora_alpha = r
    if combine == "active":
        peft_model.base_model.set_adapter([adapter_name, SHARED], inference_mode=not is_trainable)
        return peft_model
    # cat: A = [A_own · s_own; A_shared · a], B = [B_own, B_shared] (PEFT multiplies each A by
    # its weight and its layer's scaling)
    peft_model.add_weighted_adapter([own_name, SHARED], [1.0, 1.0], adapter_name,
                                    combination_type="cat")
    peft_model.set_adapter(adapter_name)
    peft_model.delete_adapter(own_name)
    peft_model.delete_adapter(SHARED)
    return peft_model
