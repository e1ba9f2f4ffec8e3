"""PEFT LoRA adapter directories in and out (no torch needed).

A client directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` as written by
``PeftModel.save_pretrained``. For every adapted module the file holds
``<module>.lora_A.weight`` (r × in) and ``<module>.lora_B.weight`` (out × r); the update is
``ΔW = s · B A`` (out × in) with ``s = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``), ``r`` and ``lora_alpha`` taken from ``rank_pattern`` / ``alpha_pattern`` when a
pattern matches the module (PEFT's own matching rule, :func:`pattern_value`). ``fan_in_fan_out``
only changes how PEFT applies ``ΔW`` to a transposed base weight (GPT-2's ``Conv1D``), not the
factors, so ``ΔW = s B A`` holds for it too; it is carried to the output unchanged.

Tensors are read lazily, one module at a time, with the safetensors numpy API (fp32, fp16;
bf16, which numpy has no dtype for, is widened bit-exactly to float32 from the file's bytes) and
converted to float64. Nothing out × in is ever formed here.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["AdapterError", "ClientAdapter", "AdapterSet", "ModuleFactors", "load_adapters",
           "read_client", "save_adapter", "peft_config", "pattern_value", "CONFIG_NAME", "WEIGHTS_NAME",
           "module_key", "config_scaling", "assemble_adapter_set"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
_SUFFIX = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """Bad adapter input; the message names the file or the module."""


def module_key(module: str) -> str:
    """The base model's module name PEFT matches patterns against: the safetensors module name
    without PEFT's ``base_model.model.`` prefix."""
    return module[len(_PREFIX):] if module.startswith(_PREFIX) else module


def pattern_value(patterns: dict | None, module: str, default):
    """PEFT's ``rank_pattern`` / ``alpha_pattern`` lookup: the first key ``k`` (in order) with
    ``re.match(rf"(.*\\.)?({k})$", name)`` for the module's base-model name; else ``default``."""
    name = module_key(module)
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


@dataclass(frozen=True)
class ModuleFactors:
    """One module's factors for every client, float64, PEFT letters.

    Attributes
    ----------
    name : str
        Module name as in the safetensors keys (without ``.lora_A/.lora_B.weight``).
    A : list of ndarray, each (r_k, in)
    B : list of ndarray, each (out, r_k)
    scaling : ndarray, shape (K,)
        ``s_k``: ``ΔW_k = s_k B_k A_k``.
    """

    name: str
    A: list
    B: list
    scaling: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.B[0].shape[0], self.A[0].shape[1]

    @property
    def ranks(self) -> list[int]:
        return [a.shape[0] for a in self.A]

    def delta(self, k: int) -> np.ndarray:
        """``ΔW_k`` (out, in): forms the full matrix, for tests and small modules only."""
        return self.scaling[k] * (self.B[k] @ self.A[k])


def _read_header(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise AdapterError(f"{path}: not a safetensors file (truncated header)")
            (n,) = struct.unpack("<Q", raw)
            size = path.stat().st_size
            if n > size - 8:
                raise AdapterError(f"{path}: truncated safetensors file (header of {n} bytes, "
                                   f"file of {size} bytes)")
            header = json.loads(fh.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{path}: not a safetensors file ({exc})") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > path.stat().st_size:
        raise AdapterError(f"{path}: truncated safetensors file (data ends at byte {8 + n + end}, "
                           f"file has {path.stat().st_size})")
    header["__header_len__"] = n
    return header


def config_scaling(config: dict, module: str, rank: int, *, where="config") -> float:
    """PEFT's scaling of ``module`` under an adapter config: ``lora_alpha / r`` (``/ sqrt(r)``
    with ``use_rslora``), both from ``rank_pattern`` / ``alpha_pattern`` when a key matches.
    ``rank`` is the rank of the weights, checked against the config's; ``where`` names the
    config in messages."""
    alpha = pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha", 8))
    r_cfg = pattern_value(config.get("rank_pattern"), module, config.get("r", rank))
    if int(r_cfg) != rank:
        raise AdapterError(f"{where}: module {module!r} has rank {rank} in the weights but "
                           f"r = {r_cfg} in the config")
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)


@dataclass
class ClientAdapter:
    """One client's adapter directory: its config and the lazily read tensor index."""

    name: str
    path: Path
    config: dict
    header: dict = field(repr=False)

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_NAME

    def module_shapes(self) -> dict:
        """``{module: (A shape, B shape)}`` from the safetensors header (no data read)."""
        mods: dict = {}
        for key, meta in self.header.items():
            if key.startswith("__"):
                continue
            m = _SUFFIX.match(key)
            if m is None:
                raise AdapterError(f"{self.weights_file}: tensor {key!r} is not a LoRA factor "
                                   "(lora_A/lora_B weight); only plain LoRA adapters are supported")
            mods.setdefault(m["module"], {})[m["which"]] = tuple(meta["shape"])
        for mod, ab in mods.items():
            if set(ab) != {"A", "B"}:
                missing = ({"A", "B"} - set(ab)).pop()
                raise AdapterError(f"{self.weights_file}: module {mod!r} has no lora_{missing} "
                                   "weight")
            a, b = ab["A"], ab["B"]
            if len(a) != 2 or len(b) != 2 or a[0] != b[1]:
                raise AdapterError(f"{self.weights_file}: module {mod!r} has lora_A {a} and "
                                   f"lora_B {b}; expected (r, in) and (out, r)")
        return {k: (v["A"], v["B"]) for k, v in mods.items()}

    def scaling(self, module: str, rank: int) -> float:
        return config_scaling(self.config, module, rank, where=self.path / CONFIG_NAME)

    def read(self, key: str) -> np.ndarray:
        """One tensor as float64 (fp32/fp16 through safetensors' numpy API, bf16 bit-exactly)."""
        from safetensors import safe_open

        meta = self.header[key]
        try:
            if meta["dtype"] == "BF16":
                start, end = meta["data_offsets"]
                off = 8 + self.header["__header_len__"] + start
                raw = np.fromfile(self.weights_file, dtype="<u2", count=(end - start) // 2,
                                  offset=off)
                x = (raw.astype(np.uint32) << 16).view(np.float32).reshape(meta["shape"])
            else:
                with safe_open(str(self.weights_file), framework="numpy") as fh:
                    x = fh.get_tensor(key)
        except AdapterError:
            raise
        except Exception as exc:  # safetensors raises its own error types on corrupt files
            raise AdapterError(f"{self.weights_file}: cannot read tensor {key!r} ({exc})") from None
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise AdapterError(f"{self.weights_file}: tensor {key!r} has non-finite values")
        return x


def read_client(path, name: str | None = None) -> ClientAdapter:
    """Open one adapter directory (config and safetensors header; no tensor data read)."""
    path = Path(path)
    if not path.is_dir():
        raise AdapterError(f"{path}: not a directory (expected a PEFT adapter directory with "
                           f"{CONFIG_NAME} and {WEIGHTS_NAME})")
    cfg_file, w_file = path / CONFIG_NAME, path / WEIGHTS_NAME
    for f in (cfg_file, w_file):
        if not f.is_file():
            raise AdapterError(f"{f}: missing (a PEFT adapter directory holds {CONFIG_NAME} and "
                               f"{WEIGHTS_NAME})")
    try:
        config = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{cfg_file}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{cfg_file}: expected a JSON object")
    ptype = config.get("peft_type")
    if ptype != "LORA":
        raise AdapterError(f"{cfg_file}: peft_type is {ptype!r}; only 'LORA' adapters are "
                           "supported")
    if config.get("use_dora"):
        raise AdapterError(f"{cfg_file}: use_dora=true (DoRA) is not supported; plain LoRA only")
    return ClientAdapter(name=name or path.resolve().name, path=path, config=config,
                         header=_read_header(w_file))


@dataclass
class AdapterSet:
    """K compatible client adapters (same module names and ``(out, in)`` shapes; ranks and
    scalings may differ per client and module).

    Attributes
    ----------
    clients : list of ClientAdapter, input order
    modules : list of str
        Module names (safetensors keys without ``.lora_A/.lora_B.weight``), sorted.
    shapes : dict
        ``{module: (out, in)}``.
    ranks : dict
        ``{module: [r_k per client]}``.
    """

    clients: list
    modules: list
    shapes: dict
    ranks: dict

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.clients]

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    def factors(self, module: str) -> ModuleFactors:
        """Read one module's factors from every client (float64)."""
        if module not in self.shapes:
            raise AdapterError(f"unknown module {module!r}")
        A, B, s = [], [], []
        for c, r in zip(self.clients, self.ranks[module]):
            A.append(c.read(f"{module}.lora_A.weight"))
            B.append(c.read(f"{module}.lora_B.weight"))
            s.append(c.scaling(module, r))
        return ModuleFactors(name=module, A=A, B=B, scaling=np.array(s))


def load_adapters(paths, *, names=None) -> AdapterSet:
    """Open K >= 2 client adapter directories and check they are compatible.

    Parameters
    ----------
    paths : sequence of path-like
        One PEFT adapter directory per client.
    names : sequence of str, optional
        Client names (default: the directory names; they must be distinct).

    Raises
    ------
    AdapterError
        Missing files, a non-LoRA ``peft_type``, a corrupt or truncated safetensors file,
        mismatched module sets or shapes, fewer than 2 clients, duplicate names. Each message
        names the file or module. Non-finite weights are reported when a module is read.
    """
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise AdapterError(f"need at least 2 client adapter directories, got {len(paths)}")
    names = [None] * len(paths) if names is None else list(names)
    return assemble_adapter_set([read_client(p, n) for p, n in zip(paths, names)])


def assemble_adapter_set(clients) -> AdapterSet:
    """Check that opened clients (:class:`ClientAdapter`, or in-memory clients with the same
    ``name``, ``path``, ``weights_file``, ``module_shapes``, ``scaling``, ``read``) are compatible
    and collect them into an :class:`AdapterSet`; errors as in :func:`load_adapters`."""
    if len(clients) < 2:
        raise AdapterError(f"need at least 2 clients, got {len(clients)}")
    seen: dict = {}
    for c in clients:
        if c.name in seen:
            raise AdapterError(f"{c.path}: client name {c.name!r} is also the name of "
                               f"{seen[c.name]}; clients need distinct names")
        seen[c.name] = c.path
    ref_shapes = clients[0].module_shapes()
    if not ref_shapes:
        raise AdapterError(f"{clients[0].weights_file}: no LoRA modules found")
    shapes = {m: (b[0], a[1]) for m, (a, b) in ref_shapes.items()}
    ranks = {m: [] for m in shapes}
    for c in clients:
        mods = ref_shapes if c is clients[0] else c.module_shapes()
        if set(mods) != set(shapes):
            extra = sorted(set(mods) - set(shapes))
            missing = sorted(set(shapes) - set(mods))
            raise AdapterError(f"{c.weights_file}: module set differs from {clients[0].path}'s "
                               f"(missing: {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                               f"extra: {extra[:3]}{'...' if len(extra) > 3 else ''})")
        for m, (a, b) in mods.items():
            if (b[0], a[1]) != shapes[m]:
                raise AdapterError(f"{c.weights_file}: module {m!r} has shape (out, in) = "
                                   f"{(b[0], a[1])}, but {clients[0].path} has {shapes[m]}")
            ranks[m].append(a[0])
            c.scaling(m, a[0])  # config/weights rank agreement, checked up front
    modules = sorted(shapes)
    return AdapterSet(clients=clients, modules=modules, shapes=shapes, ranks=ranks)


def peft_config(base_config: dict, ranks: dict) -> dict:
    """``base_config`` with ``r``, ``lora_alpha``, ``rank_pattern``, ``alpha_pattern`` and
    ``use_rslora`` set so that every module's scaling is 1 and its rank is ``ranks[module]``."""
    counts: dict = {}
    for r in ranks.values():
        counts[r] = counts.get(r, 0) + 1
    r0 = max(sorted(counts), key=lambda r: counts[r])      # most common rank, smallest on ties
    cfg = dict(base_config)
    cfg.update(r=r0, lora_alpha=r0, use_rslora=False)
    pattern = {re.escape(module_key(m)): r for m, r in ranks.items() if r != r0}
    cfg["rank_pattern"] = pattern
    cfg["alpha_pattern"] = dict(pattern)
    return cfg


def save_adapter(out_dir, base_config: dict, factors: dict, *, dtype="float32") -> None:
    """Write a PEFT adapter directory whose ``scaling · B A`` equals the given products.

    Parameters
    ----------
    out_dir : path-like
        Created (parents too) if missing.
    base_config : dict
        A client's ``adapter_config.json``; copied, with ``r``, ``lora_alpha``,
        ``rank_pattern``, ``alpha_pattern`` and ``use_rslora`` rewritten so that every module's
        scaling is 1 (``lora_alpha = r``) and its rank is the rank of the factors given.
    factors : dict
        ``{module: (B (out, rho), A (rho, in))}`` with ``ΔW = B A`` (scaling already folded in).
    dtype : str
        Storage dtype of the tensors (``"float32"`` default; ``"float16"`` halves the size).
    """
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = peft_config(base_config, {m: int(A.shape[0]) for m, (B, A) in factors.items()})
    tensors = {}
    for m, (B, A) in factors.items():
        tensors[f"{m}.lora_A.weight"] = np.ascontiguousarray(A, dtype=dtype)
        tensors[f"{m}.lora_B.weight"] = np.ascontiguousarray(B, dtype=dtype)
    save_file(tensors, str(out_dir / WEIGHTS_NAME))
    tmp = out_dir / (CONFIG_NAME + ".tmp")
    tmp.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    os.replace(tmp, out_dir / CONFIG_NAME)
