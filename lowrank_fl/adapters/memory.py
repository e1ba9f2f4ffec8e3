"""The adapters' aggregators on in-memory factors: no directories, no files.

A federation that already holds its clients' LoRA factors (a Flower server, a notebook, a
training loop) passes a mapping ``client → {module: (A, B, scaling)}`` (PEFT letters: A is
r × in, B is out × r, ``ΔW = scaling · B A``) or PEFT state dicts with their configs, and gets
each output's factors back with the same summary as ``summary.json``. The numbers are those of
the directory path (:func:`lowrank_fl.adapters.aggregate_to_dir`): the same
:class:`~lowrank_fl.adapters.AdapterSet` checks, the same per-module solve, the same outputs.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> clients = {f"c{k}": {"layer.q_proj": (rng.standard_normal((2, 6)), rng.standard_normal((5, 2)), 1.0)}
...            for k in range(3)}
>>> res = aggregate_factors(clients, ModuleOptions(method="fedavg", output_dtype="float64"))
>>> A, B, s = res.outputs["aggregated"]["layer.q_proj"]
>>> mean = np.mean([B_ @ A_ for A_, B_, _ in (c["layer.q_proj"] for c in clients.values())], axis=0)
>>> bool(np.allclose(s * B @ A, mean))
True
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .aggregate import CLIENT_RULES, DEFAULT_CLIENT_RULE, ModuleOptions, client_decision
from .plan import apply_refinement, refinement_summary, resolve_refine
from .io import (AdapterError, AdapterSet, assemble_adapter_set, check_peft_type, check_plain_lora,
                 config_scaling)
from .run import Aggregation, aggregate_adapters, resolve_layout
from .split import SHARED, client_part, fold_weights, shared_part, shared_used
from .split import shared_weights as split_weights
from ..jsontext import finite_json

__all__ = ["MemoryClient", "FactorAggregation", "aggregate_factors", "adapter_set",
           "factors_from_state_dict"]

_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")


def _float64(x, what: str) -> np.ndarray:
    """An array-like (numpy, or a torch tensor of any float dtype) as a float64 numpy array."""
    if hasattr(x, "detach"):                       # torch: bf16 has no numpy dtype, widen first
        if x.is_complex():
            raise AdapterError(f"{what}: complex values (LoRA factors are real)")
        x = x.detach().to("cpu").double().numpy()
    if np.iscomplexobj(x):
        raise AdapterError(f"{what}: complex values (LoRA factors are real)")
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"{what}: not a numeric array ({exc})") from None
    if a.ndim != 2:
        raise AdapterError(f"{what}: expected a 2-D array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise AdapterError(f"{what}: has {int(np.size(a) - np.isfinite(a).sum())} non-finite values")
    return a


@dataclass
class MemoryClient:
    """One client's factors held in memory, with the interface the aggregators read.

    modules : dict
        ``{module: (A (r, in), B (out, r), scaling)}``, float64.
    """

    name: str
    modules: dict
    config: dict = field(default_factory=dict)

    @classmethod
    def from_factors(cls, name: str, modules: Mapping) -> "MemoryClient":
        if not isinstance(modules, Mapping) or not modules:
            raise AdapterError(f"client {name!r}: expected a non-empty mapping module → (A, B, scaling), "
                               f"got {type(modules).__name__}")
        checked = {}
        for module, value in modules.items():
            where = f"client {name!r}, module {module!r}"
            if not isinstance(value, (tuple, list)) or len(value) != 3:
                raise AdapterError(f"{where}: expected a tuple (A, B, scaling)")
            A, B = _float64(value[0], f"{where}, A"), _float64(value[1], f"{where}, B")
            if A.shape[0] == 0:
                raise AdapterError(f"{where}: rank 0 (A is {A.shape}): no LoRA factors")
            if A.shape[0] != B.shape[1]:
                raise AdapterError(f"{where}: A is {A.shape} and B is {B.shape}; expected A (r, in) and "
                                   "B (out, r) with the same r")
            s = value[2]
            if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(float(s)) or float(s) <= 0:
                raise AdapterError(f"{where}: scaling must be a finite number > 0, got {s!r}")
            checked[str(module)] = (A, B, float(s))
        return cls(name=str(name), modules=checked)

    @property
    def path(self) -> str:
        return f"client {self.name!r}"

    @property
    def weights_file(self) -> str:
        return self.path

    def module_shapes(self) -> dict:
        return {m: (A.shape, B.shape) for m, (A, B, _) in self.modules.items()}

    def scaling(self, module: str, rank: int) -> float:
        return self.modules[module][2]

    def read(self, key: str) -> np.ndarray:
        m = _KEY.match(key)
        if m is None or m["module"] not in self.modules:
            raise AdapterError(f"{self.path}: no tensor {key!r}")
        A, B, _ = self.modules[m["module"]]
        return A if m["which"] == "A" else B


def factors_from_state_dict(state_dict: Mapping, config) -> dict:
    """``{module: (A, B, scaling)}`` from a PEFT LoRA state dict and its adapter config.

    ``state_dict``: keys ``<module>.lora_A.weight`` / ``<module>.lora_B.weight`` (what
    ``peft.get_peft_model_state_dict`` returns and ``adapter_model.safetensors`` holds) or with
    the adapter name, ``<module>.lora_A.<adapter>.weight`` (``model.state_dict()``); values
    numpy arrays or torch tensors. ``config``: ``r``, ``lora_alpha``, ``use_rslora``,
    ``rank_pattern``, ``alpha_pattern``: a PEFT ``LoraConfig``, its ``to_dict()`` or the JSON
    file's content. The config is checked as the directory path checks ``adapter_config.json``
    (:func:`~lowrank_fl.adapters.io.check_plain_lora`: DoRA, PiSSA/LoftQ initialisations, bad
    field types are refused; a ``peft_type`` other than LORA too, a missing one is allowed).
    """
    if not isinstance(config, Mapping) and callable(getattr(config, "to_dict", None)):
        config = config.to_dict()                      # a peft LoraConfig
    if not isinstance(config, Mapping):
        raise AdapterError(f"config must be a mapping or a peft LoraConfig (an adapter config), got "
                           f"{type(config).__name__}")
    config = dict(config)
    check_peft_type(config, "config", required=False)
    check_plain_lora(config, "config")
    parts: dict = {}
    for key, value in state_dict.items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"state dict key {key!r} is not a LoRA factor (lora_A/lora_B weight); only "
                               "plain LoRA adapters are supported")
        parts.setdefault(m["module"], {})[m["which"]] = _float64(value, key)
    out = {}
    for module, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"module {module!r} has no lora_{({'A', 'B'} - set(ab)).pop()} weight")
        rank = ab["A"].shape[0]
        out[module] = (ab["A"], ab["B"], config_scaling(config, module, rank, where="config"))
    if not out:
        raise AdapterError("the state dict holds no LoRA factors")
    return out


def adapter_set(clients: Mapping) -> AdapterSet:
    """An :class:`AdapterSet` of in-memory clients ``{name: {module: (A, B, scaling)}}`` (input
    order kept), with the checks of :func:`lowrank_fl.adapters.load_adapters`. Names are strings
    that can name a directory (written by :func:`~lowrank_fl.adapters.aggregate_to_dir`): no
    ``/``, ``\\`` or NUL, not ``''``, ``'.'`` or ``'..'``."""
    if not isinstance(clients, Mapping):
        raise AdapterError(f"clients must be a mapping name → {{module: (A, B, scaling)}}, got "
                           f"{type(clients).__name__}")
    for name in clients:
        if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise AdapterError(f"clients: client names must be strings usable as a directory name (no "
                               f"'/', '\\' or NUL; not '', '.' or '..'), got {name!r}")
    return assemble_adapter_set([MemoryClient.from_factors(n, f) for n, f in clients.items()])


@dataclass(frozen=True)
class FactorAggregation:
    """What :func:`aggregate_factors` returns.

    outputs : dict
        ``{output: {module: (A (rho, in), B (out, rho), scaling)}}``, scaling 1.0 (folded into
        B). CLAIR: one output per client (its refined adapter (9), or its own when outside the
        collaborative set; in the split layout its own part, and ``"shared"``); the other
        methods: ``"aggregated"``.
    summary : dict
        The content of ``summary.json`` (method, clients, per-module sets, λ, certificates).
    aggregation : Aggregation
        The per-module results.
    """

    outputs: dict
    summary: dict
    aggregation: Aggregation


def aggregate_factors(clients: Mapping, options: ModuleOptions = ModuleOptions(), *,
                      client_rule: str = DEFAULT_CLIENT_RULE, jobs: int = 1, scheduler: str | None = None,
                      progress: bool = False, output: str = "merged",
                      shared_weights=None, refine: str | None = None) -> FactorAggregation:
    """Aggregate in-memory clients ``{name: {module: (A, B, scaling)}}`` (or an
    :class:`AdapterSet`) module by module with ``options.method``.

    ``client_rule``, ``jobs``, ``scheduler``, ``shared_weights``, ``refine``: as in
    :func:`lowrank_fl.adapters.aggregate_to_dir`. ``output``: CLAIR's layout, "merged" (default
    here: one refined adapter per client) or "split" (each client's own part, and the shared
    part under ``"shared"``; :mod:`lowrank_fl.adapters.split`). The outputs are those the
    directory path writes (same dtype: ``options.output_dtype``).
    """
    if client_rule not in CLIENT_RULES:
        raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {client_rule!r}")
    layout = resolve_layout(output, options)
    refine = resolve_refine(refine, shared_weights, options.method)  # named before the clients are read
    adapters = clients if isinstance(clients, AdapterSet) else adapter_set(clients)
    clair = options.method == "clair"
    split = clair and layout == "split"
    if split and SHARED in adapters.names:
        raise AdapterError(f"a client is named {SHARED!r}, the shared part's name in the split "
                           "layout; rename it or use output='merged'")
    agg = aggregate_adapters(adapters, options, jobs=jobs, scheduler=scheduler, progress=progress)
    decided = client_decision(agg.results, client_rule) if clair and client_rule != "per-module" else None
    weights = refinement = None
    if clair:
        planned = apply_refinement(agg.results, decided, options, refine, factors=adapters.factors)
        weights = split_weights(planned if shared_weights is None else shared_weights, adapters.names,
                                adapters.modules)
        refinement = refinement_summary(agg.results, decided, adapters.names, refine, weights)
    names = adapters.names if clair else ["aggregated"]
    outputs: dict = {n: {} for n in names + ([SHARED] if split else [])}
    applied: dict = {n: {} for n in names}
    errors: dict = {}
    dt = np.dtype(options.output_dtype)
    for r in agg.results:
        b = np.asarray(r.benign if decided is None else decided, bool) if clair else None
        f = adapters.factors(r.name) if split else None
        for k, name in enumerate(names):
            a = float(weights[r.name][k]) if clair else 1.0
            if clair:
                applied[name][r.name] = a if b[k] else 0.0
            if split:
                B, A = client_part(r, f, k, b, applied[name][r.name], dt)
                outputs[name][r.name] = (A, B, 1.0)
                continue
            B, A, err = r.outputs(k, benign=decided, rank_out=options.rank_out, weight=a)
            outputs[name][r.name] = (A, B, 1.0)
            if options.rank_out is not None:
                errors.setdefault(name, {})[r.name] = err
        if split:
            B, A = shared_part(r, f, b, dt)
            outputs[SHARED][r.name] = (A, B, 1.0)
    if split and not shared_used(applied):
        del outputs[SHARED]          # nobody uses it (refine="own", every weight 0): not written on disk either
    summary = agg.summary(client_rule, errors if options.rank_out is not None else None)
    summary["outputs"] = list(outputs)
    if clair:
        summary["layout"] = layout
        summary["refinement_weights"] = {n: fold_weights(applied[n]) for n in names}
        summary["refinement"] = refinement
    # the summary as summary.json reads back (strict JSON: NaN None, inf "inf"), not raw floats
    return FactorAggregation(outputs=outputs, summary=finite_json(summary), aggregation=agg)
