"""Write PEFT adapter directories module by module, while the other modules are still solving.

A CLAIR aggregate writes one adapter per client, and every client's file holds every module, so
with ``safetensors.numpy.save_file`` (one dict, written at once) nothing can be written before the
last module is solved, and the main process then writes gigabytes alone while the workers idle.
:class:`SafetensorsStreamWriter` writes a standard safetensors file tensor by tensor instead: the
data are appended behind a header region reserved from the tensor names known up front, and
:meth:`~SafetensorsStreamWriter.close` writes the header in front, padded with spaces as the
format allows ("the header ... may be trailing padded with whitespace"). The result is read by
``safetensors.safe_open`` and PEFT like any other file (tests check both).

The writers write into the staging directory of :class:`lowrank_fl.outdir.OutputDir`, so a failed
or interrupted run leaves no half-written adapter behind.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

from .io import CONFIG_NAME, WEIGHTS_NAME, StorageDtypeError
from .save import STORAGE, STORAGE_REL_ERROR, peft_config, storage_array, stored_values

__all__ = ["SafetensorsStreamWriter", "AdapterStreamWriter"]

# an entry's bytes beside its name: {"dtype":"F32","shape":[a,b],"data_offsets":[s,e]}, with every
# integer given 20 digits (2**64 has 20)
_ENTRY_OVERHEAD = len('"":{"dtype":"F32","shape":[,],"data_offsets":[,]},') + 4 * 20


class SafetensorsStreamWriter:
    """A safetensors file written one tensor at a time (2-D or any shape, little-endian).

    Parameters
    ----------
    path : path-like
        The file to write (replaced if it exists).
    names : iterable of str
        Every tensor name that will be added (sizes the reserved header; adding another is an
        error).
    """

    def __init__(self, path, names):
        self.path = Path(path)
        names = list(names)
        if len(set(names)) != len(names):
            raise ValueError("names: duplicate tensor names")
        self._allowed = set(names)
        size = 2 + sum(len(json.dumps(n)) + _ENTRY_OVERHEAD for n in names)
        self._reserved = 8 * -(-size // 8)          # 8-byte aligned data, as safetensors writes
        self._entries: dict = {}
        self._offset = 0
        self._file = open(self.path, "wb")
        self._file.seek(8 + self._reserved)

    def add(self, name: str, array: np.ndarray, dtype: str = "float32") -> None:
        """Append ``array`` (converted to ``dtype``: float32, float16, bfloat16 or float64; a value
        that does not fit is an error naming the tensor, :func:`~.save.storage_array`)."""
        if name not in self._allowed:
            raise ValueError(f"tensor {name!r} was not declared to this writer")
        if name in self._entries:
            raise ValueError(f"tensor {name!r} was already written")
        if dtype not in STORAGE:
            raise ValueError(f"dtype must be one of {list(STORAGE)}, got {dtype!r}")
        tag, a = storage_array(array, dtype, f"tensor {name!r}")
        self._file.write(memoryview(a).cast("B"))
        end = self._offset + a.nbytes
        self._entries[name] = {"dtype": tag, "shape": list(a.shape), "data_offsets": [self._offset, end]}
        self._offset = end

    def close(self) -> None:
        """Write the header in front; every declared tensor must have been added."""
        missing = self._allowed.difference(self._entries)
        if missing:
            self.abort()
            raise ValueError(f"{len(missing)} declared tensor(s) never written, e.g. {sorted(missing)[0]!r}")
        header = json.dumps(self._entries, separators=(",", ":")).encode()
        if len(header) > self._reserved:     # cannot happen: the reserve bounds every entry
            self.abort()
            raise RuntimeError("safetensors header larger than its reserved space")
        self._file.seek(0)
        self._file.write(struct.pack("<Q", self._reserved) + header.ljust(self._reserved, b" "))
        self._file.close()

    def abort(self) -> None:
        """Close and delete the partial file."""
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)


def _rel_change(X, Xs) -> float:
    n = float(np.linalg.norm(X))
    return float(np.linalg.norm(Xs - X)) / n if n > 0 else 0.0


def _check_product_change(module: str, B: np.ndarray, A: np.ndarray, dtype: str) -> None:
    """Refuse a storage dtype that changes ``ΔW = B A`` by more than :data:`STORAGE_REL_ERROR`
    (relative Frobenius): each factor may round within the bound and their product not. The
    error ``||Bs As - B A||_F`` comes from the (2ρ x 2ρ) Grams of ``[Bs, B]`` and ``[As; -A]``:
    nothing out x in is formed."""
    if dtype == "float64":
        return
    B, A = np.asarray(B, np.float64), np.asarray(A, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        Bs, As = stored_values(B, dtype), stored_values(A, dtype)
        if not (np.all(np.isfinite(Bs)) and np.all(np.isfinite(As))):
            return                                   # overflow: storage_array names the tensor
        # first a bound from the (ρ x ρ) Grams (a quarter of the exact check's work):
        # ||Bs As - B A|| <= ||dB|| ||A||_2 + ||B||_2 ||dA|| + ||dB|| ||dA||; the exact error
        # only when the bound exceeds the limit (the same decision either way)
        GB, GA = B.T @ B, A @ A.T
        ref2 = float(np.sum(GB * GA))
        if ref2 <= 0:
            return
        dB, dA = float(np.linalg.norm(Bs - B)), float(np.linalg.norm(As - A))
        nA2 = math.sqrt(max(float(np.linalg.eigvalsh(GA)[-1]), 0.0))
        nB2 = math.sqrt(max(float(np.linalg.eigvalsh(GB)[-1]), 0.0))
        if (dB * nA2 + nB2 * dA + dB * dA) <= STORAGE_REL_ERROR * math.sqrt(ref2):
            return
        Bc, Ac = np.hstack([Bs, B]), np.vstack([As, -A])
        err2 = float(np.sum((Bc.T @ Bc) * (Ac @ Ac.T)))
    rel = math.sqrt(max(err2, 0.0) / ref2)
    if rel > STORAGE_REL_ERROR:
        worse = max((("lora_A", A, As), ("lora_B", B, Bs)), key=lambda t: _rel_change(t[1], t[2]))
        nonzero = np.abs(worse[1][worse[1] != 0])
        raise StorageDtypeError(
            f"tensor '{module}.{worse[0]}.weight': storing the factors as {dtype} changes the "
            f"module's update B·A by {rel:.2g} (relative Frobenius error, above "
            f"{STORAGE_REL_ERROR:g}): {worse[0]}'s small values (down to {nonzero.min():.2g}, "
            f"median {np.median(nonzero):.2g}) underflow {dtype}")


class AdapterStreamWriter:
    """One PEFT adapter directory, written module by module.

    ``add(module, B, A)`` with ``ΔW = B A`` (B out × ρ, A ρ × in, scaling folded in); ``close``
    writes the header and ``adapter_config.json`` (from ``base_config``, see :func:`peft_config`).
    """

    def __init__(self, out_dir, base_config: dict, modules, *, dtype: str = "float32",
                 label: str | None = None):
        self.out_dir = Path(out_dir)
        #: names the output in errors (e.g. "client 'c1'"); default: its directory's name
        self.label = label or f"output {self.out_dir.name!r}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.base_config = dict(base_config)
        self.dtype = dtype
        self.ranks: dict = {}
        names = [f"{m}.lora_{x}.weight" for m in modules for x in "AB"]
        self._writer = SafetensorsStreamWriter(self.out_dir / WEIGHTS_NAME, names)

    def add(self, module: str, B: np.ndarray, A: np.ndarray) -> None:
        if B.ndim != 2 or A.ndim != 2 or B.shape[1] != A.shape[0]:
            raise ValueError(f"module {module!r}: factors must be B (out, rho) and A (rho, in), got "
                             f"{B.shape} and {A.shape}")
        try:
            _check_product_change(module, B, A, self.dtype)
            self._writer.add(f"{module}.lora_A.weight", A, self.dtype)
            self._writer.add(f"{module}.lora_B.weight", B, self.dtype)
        except StorageDtypeError as exc:
            raise StorageDtypeError(f"{self.label}, {exc.detail}") from None
        self.ranks[module] = int(A.shape[0])

    def close(self) -> None:
        self._writer.close()
        cfg = peft_config(self.base_config, self.ranks)
        (self.out_dir / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True))

    def abort(self) -> None:
        self._writer.abort()
