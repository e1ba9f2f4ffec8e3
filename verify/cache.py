"""The verifier's on-disk task cache: a format that cannot execute code, validated on load.

One entry per task: ``<dir>/<label>/<task>/<key>.npz``, written atomically (temporary file, then
rename). The archive holds ``__json__``, a JSON document (header + the result's structure), and
one array per numpy array or numpy scalar of the result (``a0``, ``a1``, ...). It is read with
``numpy.load(allow_pickle=False)``: nothing in an entry is ever unpickled.

Results may be built from ``None``, ``bool``, ``int``, ``float`` (NaN and ±inf included), ``str``,
lists, tuples, dicts (any keys of these types), numpy arrays of a numeric, boolean or string dtype
and numpy scalars; floats round-trip bit for bit. Anything else raises :class:`UncacheableResult`
(the sweep then runs that task without caching).

:func:`load_entry` checks the header (format version, claim label, task, seed, key), that the
archive holds exactly the arrays the document names with the recorded dtype and shape, and returns
``(False, None)`` on any mismatch so the caller recomputes. The check catches corrupt, truncated,
stale and wrong-type entries; it does not authenticate an entry (whoever can write the cache can
also write the code it runs).

Concurrency: :class:`TaskLocks` takes one POSIX record lock per task (``fcntl.lockf`` on a byte of
``<label>/<task>/.lock`` at an offset derived from the key). The kernel drops the locks of a process
that dies, so a killed run leaves nothing stale; two runs on one cache compute each task once.

The directory: a cache is a new or empty directory, marked with :data:`MARKER` on first use; a
non-empty directory without it (and holding anything but entries) is refused, so a user's folder
is never marked. :func:`clear_cache` removes only the files the cache writes, never other files.
"""
from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

try:  # POSIX only; without it runs on one cache may duplicate work (nothing is corrupted)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["safe_name", "FORMAT", "UncacheableResult", "encode", "decode", "store_entry", "load_entry",
           "TaskLocks", "clear_cache", "mark_cache_dir", "is_cache_dir", "not_a_cache_message",
           "MARKER"]

#: Format tag of an entry; entries of another format are recomputed (never read).
FORMAT = "lowrank_fl.verify.cache/2"
#: File that marks a directory as a task cache (the CACHEDIR.TAG convention: backup tools skip it).
MARKER = "CACHEDIR.TAG"
_MARKER_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                "# lowrank_fl verifier task cache (lowrank-fl cache clear empties it).\n")
_MARKER_ID = "# lowrank_fl verifier task cache ("      # also in the text of earlier versions
_DTYPE_KINDS = "biufcU"


def safe_name(name: str) -> str:
    """``name`` as a directory name of the cache (claim ids and task names)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "_"


class UncacheableResult(TypeError):
    """A task result holds a value the cache format does not store."""


# ----------------------------------------------------------------------------- codec
def encode(result: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``(document, arrays)``: a JSON-able structure and the arrays it refers to by name."""
    arrays: dict[str, np.ndarray] = {}

    def put(value: np.ndarray, tag: str) -> dict:
        if value.dtype.kind not in _DTYPE_KINDS or value.dtype.hasobject:
            raise UncacheableResult(f"cannot cache an array of dtype {value.dtype}")
        name = f"a{len(arrays)}"
        arrays[name] = np.asarray(value, order="C")
        return {tag: name, "dtype": value.dtype.str, "shape": list(value.shape)}

    def walk(x):
        if x is None or isinstance(x, (bool, str)):
            return x
        if type(x) is int:
            return x
        if type(x) is float:
            return x
        if isinstance(x, np.ndarray):
            return put(x, "array")
        if isinstance(x, np.generic):
            return put(np.asarray(x), "scalar")
        if type(x) is list:
            return [walk(v) for v in x]
        if type(x) is tuple:
            return {"tuple": [walk(v) for v in x]}
        if type(x) is dict:
            return {"dict": [[walk(k), walk(v)] for k, v in x.items()]}
        raise UncacheableResult(f"cannot cache a value of type {type(x).__module__}.{type(x).__qualname__}")

    return walk(result), arrays


def decode(document: Any, arrays) -> Any:
    """Inverse of :func:`encode`; ``ValueError`` when the document and the arrays disagree."""
    used = set()

    def get(node: dict) -> np.ndarray:
        name = node.get("array", node.get("scalar"))
        if not isinstance(name, str) or name not in arrays:
            raise ValueError(f"entry names a missing array {name!r}")
        value = arrays[name]
        if value.dtype.str != node.get("dtype") or list(value.shape) != node.get("shape") \
                or value.dtype.kind not in _DTYPE_KINDS:
            raise ValueError(f"array {name}: dtype/shape {value.dtype.str}{list(value.shape)} "
                             f"!= recorded {node.get('dtype')}{node.get('shape')}")
        used.add(name)
        return value

    def walk(x):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict) and len(x) == 1 and isinstance(x.get("tuple"), list):
            return tuple(walk(v) for v in x["tuple"])
        if isinstance(x, dict) and len(x) == 1 and isinstance(x.get("dict"), list):
            out = {}
            for pair in x["dict"]:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise ValueError("malformed dict item")
                key = walk(pair[0])
                out[key] = walk(pair[1])
            return out
        if isinstance(x, dict) and set(x) == {"array", "dtype", "shape"}:
            return np.array(get(x))
        if isinstance(x, dict) and set(x) == {"scalar", "dtype", "shape"} and x["shape"] == []:
            return get(x)[()]
        raise ValueError(f"unknown node {str(x)[:80]}")

    value = walk(document)
    if used != set(arrays):
        raise ValueError(f"entry has arrays the document does not name: {sorted(set(arrays) - used)}")
    return value


# ----------------------------------------------------------------------------- entries
def store_entry(path: Path, result: Any, header: dict) -> None:
    """Write ``result`` atomically to ``path`` (raises :class:`UncacheableResult` first if needed)."""
    document, arrays = encode(result)
    text = json.dumps({"header": {"format": FORMAT, **header}, "result": document})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, __json__=np.array(text), **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_entry(path: Path | None, header: dict) -> tuple[bool, Any]:
    """``(True, result)`` when ``path`` is a valid entry whose header matches, else ``(False, None)``."""
    if path is None or not path.is_file():
        return False, None
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile) or "__json__" not in data.files:
                return False, None
            doc = json.loads(str(data["__json__"][()]))
            if not isinstance(doc, dict) or doc.get("header") != {"format": FORMAT, **header}:
                return False, None
            arrays = {k: data[k] for k in data.files if k != "__json__"}
        return True, decode(doc["result"], arrays)
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, RecursionError):
        return False, None


# ----------------------------------------------------------------------------- locks
class TaskLocks:
    """Per-task exclusive locks shared by every process using one cache (POSIX record locks).

    ``try_acquire(path)`` returns True when this process now holds the task's lock, False when
    another process holds it; ``acquire(path)`` waits for it; ``release(path)`` drops it. One file
    descriptor per task directory stays open until :meth:`close` (closing any descriptor of a
    lock file would drop every lock this process holds on it).
    """

    def __init__(self):
        self._fds: dict[Path, int] = {}
        self._held: set[Path] = set()

    @staticmethod
    def _offset(path: Path) -> int:
        # keys are hex digests; anything else still maps to the same byte in every process
        return int(path.stem[:15], 16) if _is_hex(path.stem[:15]) else zlib.crc32(path.stem.encode())

    def _fd(self, path: Path) -> int:
        lock_file = path.parent / ".lock"
        if lock_file not in self._fds:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fds[lock_file] = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fds[lock_file]

    def try_acquire(self, path: Path) -> bool:
        if fcntl is None:
            return True
        try:
            fcntl.lockf(self._fd(path), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._offset(path))
        except (BlockingIOError, PermissionError):
            return False
        self._held.add(path)
        return True

    def acquire(self, path: Path) -> None:
        if fcntl is not None:
            fcntl.lockf(self._fd(path), fcntl.LOCK_EX, 1, self._offset(path))
            self._held.add(path)

    def release(self, path: Path) -> None:
        if fcntl is not None and path in self._held:
            fcntl.lockf(self._fd(path), fcntl.LOCK_UN, 1, self._offset(path))
            self._held.discard(path)

    def release_all(self) -> None:
        for path in list(self._held):
            self.release(path)

    def close(self) -> None:
        self.release_all()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _is_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


# ----------------------------------------------------------------------------- the directory
# What a cache holds: MARKER at the top, ``<label>/<task>/`` directories, and in them entries
# (``<hex key>.npz``), the lock file and temporary files of interrupted writes (``tmp*.tmp``).
_ENTRY = re.compile(r"[0-9a-f]{16,64}\.npz")
_TEMP = re.compile(r"tmp[A-Za-z0-9_]+\.tmp")


def _is_our_marker(path: Path) -> bool:
    try:
        lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        return len(lines) == 2 and lines[0] == _MARKER_TEXT.splitlines()[0] \
            and lines[1].startswith(_MARKER_ID)
    except OSError:
        return False


def _is_entry_file(path: Path) -> bool:
    """A file the cache itself writes: a valid entry archive (format checked), the lock, a temp."""
    if path.is_symlink() or not path.is_file():
        return False
    if path.name == ".lock" or _TEMP.fullmatch(path.name):
        return True
    if not _ENTRY.fullmatch(path.name):
        return False
    try:
        with np.load(path, allow_pickle=False) as data:
            doc = json.loads(str(data["__json__"][()]))
        return str(doc["header"]["format"]).startswith(FORMAT.rpartition("/")[0] + "/")
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, AttributeError):
        return False


def _has_cache_layout(cache_dir: Path) -> bool:
    """Only ``<label>/<task>/`` directories holding entry files (a cache written before MARKER)."""
    for label in cache_dir.iterdir():
        if label.is_symlink() or not label.is_dir():
            return False
        for task in label.iterdir():
            if task.is_symlink() or not task.is_dir():
                return False
            if not all(_is_entry_file(f) for f in task.iterdir()):
                return False
    return True


def is_cache_dir(cache_dir: Path) -> bool:
    """Whether the directory ``cache_dir`` is empty, holds this tool's MARKER, or only entries."""
    return (_is_our_marker(cache_dir / MARKER) or not any(cache_dir.iterdir())
            or _has_cache_layout(cache_dir))


def not_a_cache_message(cache_dir) -> str:
    """Why ``cache_dir`` may not be used as a cache (one line)."""
    return (f"{cache_dir} is not empty and is not a lowrank_fl task cache (no {MARKER} written "
            "by lowrank-fl); name a new or empty directory, or the cache itself")


def mark_cache_dir(cache_dir: Path) -> None:
    """Create ``cache_dir`` (if needed) and its :data:`MARKER`; ``OSError`` if it is not writable
    or is a non-empty directory that is not a task cache (a user's folder is never marked)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    if not is_cache_dir(cache_dir):
        raise FileExistsError(errno.EEXIST, not_a_cache_message(cache_dir))
    marker = cache_dir / MARKER
    if not marker.is_file():
        marker.write_text(_MARKER_TEXT)
    probe = tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".tmp", delete=True)
    probe.close()


def clear_cache(cache_dir: Path, labels: list[str] | None = None) -> int:
    """Delete the cache entries (all, or those of the claim directories ``labels``); returns the
    number of entries removed.

    Only files the cache writes are removed (:func:`_is_entry_file`: entry archives whose format
    is checked, lock and temporary files, at ``<label>/<task>/``), then the directories left
    empty; anything else stays. ``ValueError`` when ``cache_dir`` is not a task cache (no
    :data:`MARKER` of this tool and files of other kinds): nothing is deleted then.
    """
    cache_dir = Path(cache_dir)
    if not cache_dir.exists():
        return 0
    if not cache_dir.is_dir():
        raise ValueError(f"cache directory {cache_dir} is a file")
    if not is_cache_dir(cache_dir):
        raise ValueError(f"{cache_dir} does not look like a lowrank_fl task cache (no {MARKER}, "
                         "and it holds other files): not deleting it")
    targets = [cache_dir / label for label in labels] if labels is not None else \
        [p for p in cache_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    removed = 0
    for label in targets:
        if label.is_symlink() or not label.is_dir():
            continue
        emptied = False
        for task in [t for t in label.iterdir() if t.is_dir() and not t.is_symlink()]:
            entries = [f for f in task.iterdir() if _is_entry_file(f)]
            for f in entries:
                removed += f.suffix == ".npz"
                f.unlink()
            emptied |= bool(entries) and _rmdir_if_empty(task)
        if emptied:
            _rmdir_if_empty(label)
    return removed


def _rmdir_if_empty(path: Path) -> bool:
    """Remove a directory the cache emptied; one holding anything else stays."""
    try:
        path.rmdir()
        return True
    except OSError:
        return False
