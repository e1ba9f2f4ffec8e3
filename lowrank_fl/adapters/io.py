"""PEFT LoRA adapter directories in and out (no torch needed).

A client directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` as written by
``PeftModel.save_pretrained``. For every adapted module the file holds
``<module>.lora_A.weight`` (r × in) and ``<module>.lora_B.weight`` (out × r); the update is
``ΔW = s · B A`` (out × in) with ``s = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``), ``r`` and ``lora_alpha`` taken from ``rank_pattern`` / ``alpha_pattern`` when a
pattern matches the module (PEFT's own matching rule, :func:`pattern_value`). ``fan_in_fan_out``
only changes how PEFT applies ``ΔW`` to a transposed base weight (GPT-2's ``Conv1D``), not the
factors, so ``ΔW = s B A`` holds for it too; it is carried to the output unchanged.

Only adapters whose effect is a plain ``ΔW = s · B A`` added to the unchanged base weight are
accepted (:func:`check_plain_lora`): initialisations that rewrite the base weight when PEFT loads
the adapter (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA) and LoRA variants with another forward (DoRA,
QA-LoRA, aLoRA, ...) are refused with the client's file and the setting named.

Tensors are read lazily, one module at a time, with the safetensors numpy API (fp32, fp16;
bf16, which numpy has no dtype for, is widened bit-exactly to float32 from the file's bytes) and
converted to float64. Nothing out × in is ever formed here.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["AdapterError", "AdapterWarning", "StorageDtypeError", "ClientAdapter", "AdapterSet", "ModuleFactors",
           "load_adapters", "read_client", "pattern_value",
           "CONFIG_NAME", "WEIGHTS_NAME", "module_key", "check_plain_lora", "PLAIN_INIT",
           "VARIANT_FIELDS", "check_peft_type",
           "default_names", "check_client_names", "check_distinct_dirs", "identical_dirs", "input_dtype",
           "stored_dtypes",
           "config_scaling", "assemble_adapter_set",
           "adapter_fingerprint", "input_fingerprints", "SPLIT_MANIFEST"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
#: the manifest of a client directory of CLAIR's split layout (:mod:`.split`); here so that the
#: reader can refuse such a directory as a client's adapter without importing the writer
SPLIT_MANIFEST = "lowrank_fl_split.json"
_SUFFIX = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """Bad adapter input; the message names the file or the module."""


class StorageDtypeError(AdapterError):
    """An output tensor does not fit its storage dtype (overflow) or loses more than
    :data:`lowrank_fl.adapters.save.STORAGE_REL_ERROR` of it (underflow). ``detail``: the message without the advice."""

    def __init__(self, detail: str):
        super().__init__(f"{detail}; write with --dtype float32")
        self.detail = detail


class AdapterWarning(UserWarning):
    """Suspicious but usable adapter input (e.g. clients built on different base models)."""


#: ``init_lora_weights`` values whose saved adapter is a plain ``ΔW = s B A`` on the unchanged
#: base (PEFT 0.21 ``LoraLayer.update_layer``): True (B = 0), False (random, for debugging),
#: "gaussian", "orthogonal" (nonzero A, B; base untouched), "eva" (A from activations, B = 0),
#: "mica" (B from the base's minor singular vectors and frozen; forward and merge are plain LoRA).
PLAIN_INIT = (True, False, "gaussian", "orthogonal", "eva", "mica")
# initialisations that rewrite the base weight at load (PEFT subtracts s B0 A0 or quantizes it),
# so the model is W_res + s B A with W_res != W0
_BASE_REWRITING = ("pissa", "olora", "corda", "loftq", "lora_ga")
# config fields that turn on a LoRA variant with another forward than W0 x + s B A x
VARIANT_FIELDS = ("use_dora", "use_qalora", "velora_config", "alora_invocation_tokens",
             "monteclora_config", "use_bdlora", "arrow_config", "kasa_config")


def check_peft_type(config: dict, where, *, required: bool = True) -> None:
    """Refuse a config whose ``peft_type`` is not LoRA (AdaLoRA, IA3, ...); a missing
    ``peft_type`` is refused too unless ``required`` is false (a hand-written config dict)."""
    ptype = config.get("peft_type", None if required else "LORA")
    ptype = getattr(ptype, "value", ptype)               # peft's PeftType enum → its string
    if ptype != "LORA":
        raise AdapterError(f"{where}: peft_type is {ptype!r}; only 'LORA' adapters are supported")


def check_plain_lora(config: dict, where) -> None:
    """Refuse a LoRA config whose adapter is not a plain ``ΔW = s · B A`` on the unchanged base.

    ``where`` (the config file) is named in every message. Checks ``init_lora_weights`` (see
    :data:`PLAIN_INIT`; PiSSA/OLoRA/CorDA/LoftQ/LoRA-GA rewrite the base weight when PEFT loads
    the adapter), LoRA variants (DoRA, QA-LoRA, aLoRA, ...) and the types of ``r``,
    ``lora_alpha``, ``use_rslora``, ``rank_pattern``, ``alpha_pattern``.
    """
    init = config.get("init_lora_weights", True)
    if init not in PLAIN_INIT:
        if isinstance(init, str) and init.lower().startswith(_BASE_REWRITING):
            raise AdapterError(
                f"{where}: init_lora_weights={init!r} is not supported: PEFT rewrites the base "
                f"weight when it loads this adapter, so its update is not s·B·A on the base "
                f"model. Convert it to plain LoRA with save_pretrained(..., "
                f"path_initial_model_for_weight_conversion=...) (PEFT's PiSSA/OLoRA/CorDA "
                f"conversion)")
        raise AdapterError(f"{where}: init_lora_weights={init!r} is not supported; expected one "
                           f"of {', '.join(map(repr, PLAIN_INIT))} (a plain LoRA update s·B·A)")
    for key in VARIANT_FIELDS:
        if config.get(key):
            what = "DoRA" if key == "use_dora" else "a LoRA variant"
            raise AdapterError(f"{where}: {key}={config[key]!r} ({what}) is not supported; plain "
                               "LoRA only")
    r = config.get("r", 8)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise AdapterError(f"{where}: field 'r' must be an integer >= 1, got {r!r}")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise AdapterError(f"{where}: field 'lora_alpha' must be a finite number > 0 (the update is "
                           f"lora_alpha / r · B A: 0 erases it, a negative value flips it), got {alpha!r}")
    if not isinstance(config.get("use_rslora", False), bool):
        raise AdapterError(f"{where}: field 'use_rslora' must be true or false, got "
                           f"{config['use_rslora']!r}")
    for key, kind in (("rank_pattern", int), ("alpha_pattern", (int, float))):
        pat = config.get(key) or {}
        if not isinstance(pat, dict):
            raise AdapterError(f"{where}: field {key!r} must be an object {{pattern: value}}, "
                               f"got {pat!r}")
        for k, v in pat.items():
            if (isinstance(v, bool) or not isinstance(v, kind) or (kind is int and v < 1)
                    or (kind is not int and not (math.isfinite(v) and v > 0))):
                raise AdapterError(f"{where}: field {key!r} maps {k!r} to {v!r}; expected "
                                   f"{'an integer >= 1' if kind is int else 'a finite number > 0'}")


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
        emb = [k for k in self.header if "lora_embedding_" in k]
        if emb:
            raise AdapterError(f"{self.weights_file}: tensor {emb[0]!r} is an embedding LoRA "
                               "(lora_embedding_A/B), which is not supported; target linear "
                               "layers only (and save with save_embedding_layers=False)")
        for key, meta in self.header.items():
            if key.startswith("__"):
                continue
            m = _SUFFIX.match(key)
            if m is None and key.endswith("base_layer.weight"):
                raise AdapterError(f"{self.weights_file}: tensor {key!r} is a full base-model "
                                   "weight (PEFT saves embedding layers with "
                                   "save_embedding_layers=True), not a LoRA factor; save with "
                                   "save_embedding_layers=False")
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
    if not w_file.is_file() and (path / "adapter_model.bin").is_file():
        raise AdapterError(f"{path / 'adapter_model.bin'}: a pickled PyTorch file, which this tool "
                           f"never loads; save the adapter with save_pretrained(..., "
                           f"safe_serialization=True) to get {WEIGHTS_NAME}")
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
    check_peft_type(config, cfg_file)
    check_plain_lora(config, cfg_file)
    return ClientAdapter(name=name or path.resolve().name, path=path, config=config,
                         header=_read_header(w_file))


def _check_not_a_split_part(path: Path) -> None:
    """Refuse the client directory of a split-layout output whose update includes the shared part
    (a shared weight above 0): its factors are only the client's own part, so reading them as its
    adapter would silently drop ``shared_weight × shared``. With every weight 0 it is the client's
    own adapter, and is read as one."""
    manifest = path / SPLIT_MANIFEST
    if not manifest.is_file():
        return
    try:
        doc = json.loads(manifest.read_text())
        w = doc["shared_weight"]
        weights = [float(v) for v in (w.values() if isinstance(w, dict) else [w])]
        if not all(0.0 <= v <= 1.0 for v in weights):                 # NaN too
            raise ValueError(w)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise AdapterError(f"{manifest}: not a lowrank-fl split-layout manifest; a client directory of a "
                           "split-layout output cannot be read as an adapter") from None
    if doc.get("shared") is not None and max(weights, default=0.0) > 0:
        raise AdapterError(f"{path}: the client's own part in a lowrank-fl split-layout output (its "
                           f"{SPLIT_MANIFEST}: shared weight up to {max(weights):g}), not its whole adapter: the "
                           f"update is this part plus that weight times {doc['shared']}. Load it with "
                           "lowrank_fl.adapters.peft_load.load_split(..., combine='cat') and save that one adapter, "
                           "or re-run the "
                           "aggregation that wrote it with --output merged (output='merged')")


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


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@-]*$")


def default_names(paths) -> list[str]:
    """Distinct client names from the directories: the last path component, with parent
    components prepended (joined by ``_``) only to the names that collide, as few as make them
    distinct (``site1/adapter``, ``site2/adapter``, ``ad/client_3`` → ``site1_adapter``,
    ``site2_adapter``, ``client_3``). Names equal up to case collide too (their output folders
    would on a case-insensitive filesystem)."""
    parts = [Path(p).resolve().parts for p in paths]
    depth = [1] * len(parts)
    while True:
        names = ["_".join(x[-d:]).lstrip("/_") or "root" for x, d in zip(parts, depth)]
        groups: dict = {}
        for i, n in enumerate(names):
            groups.setdefault(n.lower(), []).append(i)
        clashing = [i for g in groups.values() if len(g) > 1 for i in g]
        if not clashing:
            return names
        grow = [i for i in clashing if depth[i] < len(parts[i])]
        if not grow:                                   # a directory given twice: load says so
            return [Path(p).resolve().name for p in paths]
        for i in grow:
            depth[i] += 1


def check_distinct_dirs(paths) -> None:
    """Refuse a directory given twice (the same after resolving links)."""
    seen: dict = {}
    for p in map(Path, paths):
        key = p.resolve()
        if key in seen:
            raise AdapterError(f"{p}: the same adapter directory is given twice (also as "
                               f"{seen[key]})")
        seen[key] = p


def check_client_names(names, n: int) -> list[str]:
    """``names`` as strings, checked as output directory names (and distinct)."""
    names = [str(x) for x in names]
    if len(names) != n:
        raise AdapterError(f"names: got {len(names)} names for {n} client directories; give one "
                           "per directory")
    for x in names:
        if not _NAME.match(x) or x in ("summary.json", "aggregated"):
            raise AdapterError(f"names: {x!r} is not a usable client name (output directory "
                               "name: letters, digits, _ . - + = @, not starting with '.' or '-', "
                               "not 'aggregated' or 'summary.json')")
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise AdapterError(f"names: {dup[0]!r} is given twice; client names must be distinct")
    seen: dict = {}
    for x in names:
        if x.lower() in seen:
            raise AdapterError(f"names: {seen[x.lower()]!r} and {x!r} differ only in case; their "
                               "output folders would collide on a case-insensitive filesystem")
        seen[x.lower()] = x
    return names


def adapter_fingerprint(path) -> str:
    """``"sha256:<hex>"`` of an adapter directory's config and safetensors bytes: what an
    aggregate's summary records so that ``inspect --summary`` can tell another run's inputs."""
    h = hashlib.sha256()
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        with open(Path(path) / name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0" + name.encode() + b"\0")
    return "sha256:" + h.hexdigest()


def input_fingerprints(adapters: "AdapterSet") -> dict | None:
    """``{client: adapter_fingerprint}`` when every client is an adapter directory, else None
    (in-memory clients have no files to recognise)."""
    if not all(isinstance(c, ClientAdapter) for c in adapters.clients):
        return None
    return {c.name: adapter_fingerprint(c.path) for c in adapters.clients}


def stored_dtypes(adapters: "AdapterSet") -> list[str]:
    """The safetensors dtype tags ("F32", "F16", "BF16", ...) of every client's tensors, sorted."""
    return sorted({meta["dtype"] for c in adapters.clients for k, meta in c.header.items()
                   if not k.startswith("__")})


def input_dtype(adapters: "AdapterSet") -> str:
    """The storage dtype the clients share ("float32", "float16" or "bfloat16"); "float32" when
    they differ or are wider (an output in the inputs' precision loses nothing they hold)."""
    tags = set(stored_dtypes(adapters))
    return {frozenset({"F16"}): "float16", frozenset({"BF16"}): "bfloat16"}.get(
        frozenset(tags), "float32")


def load_adapters(paths, *, names=None, split_parts: bool = False) -> AdapterSet:
    """Open K >= 2 client adapter directories and check they are compatible.

    Parameters
    ----------
    paths : sequence of path-like
        One PEFT adapter directory per client.
    names : sequence of str, optional
        Client names, one per directory, distinct (they name the output directories). Default:
        :func:`default_names` (the directory names, with parent directories added where they
        collide, e.g. ``site1/adapter``).
    split_parts : bool
        Read client directories of a CLAIR split-layout output as they are (``adapters inspect``
        does). By default one whose shared weight is above 0 is refused: its factors are only the
        client's own part, and its update adds the shared adapter
        (:func:`lowrank_fl.adapters.peft_load.load_split`).

    Raises
    ------
    AdapterError
        Missing files, a non-LoRA ``peft_type``, an adapter that is not plain LoRA
        (:func:`check_plain_lora`), a corrupt or truncated safetensors file, mismatched module
        sets or shapes, a LoRA rank above ``min(out, in)``, fewer than 2 clients, a directory
        given twice without ``names``, bad names, a split-layout client part (``split_parts``). Each
        message names the file or module.
        Non-finite weights are reported when a module is read.

    Warns
    -----
    AdapterWarning
        Clients whose configs name different ``base_model_name_or_path`` (an aggregate of
        updates to different base models is meaningless unless they are the same weights under
        different names); clients whose directories hold byte-identical adapters
        (:func:`identical_dirs`: one client given under two paths would count twice).
    """
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        missing = [str(p) for p in paths if not p.is_dir()]
        raise AdapterError(f"need at least 2 client adapter directories, got {len(paths)}"
                           + (f" ({missing[0]}: no such directory)" if missing else ""))
    if names is None:
        check_distinct_dirs(paths)
        names = default_names(paths)
    else:
        names = check_client_names(names, len(paths))
    clients = [read_client(p, n) for p, n in zip(paths, names)]
    if not split_parts:
        for p in paths:
            _check_not_a_split_part(p)
    bases = {}
    for c in clients:
        bases.setdefault(c.config.get("base_model_name_or_path"), []).append(c.name)
    if len(bases) > 1:
        warnings.warn("clients were fine-tuned from different base models (base_model_name_or_"
                      "path): " + "; ".join(f"{b!r}: {', '.join(n)}" for b, n in bases.items())
                      + " — aggregating them is meaningful only if these are the same weights",
                      AdapterWarning, stacklevel=2)
    twins = identical_dirs(paths, names)
    if twins:
        warnings.warn("byte-identical adapters (the same sha256 of config and weights): "
                      + "; ".join(" = ".join(t) for t in twins)
                      + " — one client given under two paths counts twice in every mean; pass each "
                      "client once (clients that all returned the untrained init are identical too)",
                      AdapterWarning, stacklevel=2)
    return assemble_adapter_set(clients)


def identical_dirs(paths, names) -> list[list[str]]:
    """Groups (of 2 or more) of client names whose adapter directories hold the same bytes
    (:func:`adapter_fingerprint`); only directories whose two files have equal sizes are hashed."""
    by_size: dict = {}
    for p, n in zip(map(Path, paths), names):
        key = tuple((p / f).stat().st_size for f in (CONFIG_NAME, WEIGHTS_NAME))
        by_size.setdefault(key, []).append((p, n))
    groups: dict = {}
    for same in by_size.values():
        if len(same) > 1:
            for p, n in same:
                groups.setdefault(adapter_fingerprint(p), []).append(n)
    return [g for g in groups.values() if len(g) > 1]


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
            if a[0] > min(shapes[m]):
                raise AdapterError(f"{c.weights_file}: module {m!r} has LoRA rank {a[0]} but is "
                                   f"{shapes[m][0]} x {shapes[m][1]}; a rank above "
                                   f"min(out, in) = {min(shapes[m])} is impossible")
            ranks[m].append(a[0])
            c.scaling(m, a[0])  # config/weights rank agreement, checked up front
    modules = sorted(shapes)
    return AdapterSet(clients=clients, modules=modules, shapes=shapes, ranks=ranks)
