"""The code version of a verifier task: what its cached result depends on.

``code_version(task)`` is part of every cache key of :class:`verify.sweep.Sweep` and is computed
again by each worker of a process backend before it runs a task (a worker that imported other
code than the main process is refused): ``lowrank_fl``'s version and sources, the versions of
Python and :data:`NUMERICAL_STACK`, the ``verify`` package's sources (all but the report writers
and the command line) and the task's own module file.
"""
from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path
from typing import Callable

__all__ = ["NUMERICAL_STACK", "code_version", "dependency_versions", "warm_digests"]


#: Distributions whose version can change a task's numbers (solver defaults, BLAS-backed kernels,
#: pickling of results); part of every cache key and of the report's ``versions``.
NUMERICAL_STACK = ("numpy", "scipy", "cvxpy", "clarabel", "scs", "joblib")

#: Parts of the ``verify`` package that cannot change a task's result (rendering and the command
#: line); every other source file of the package is in the cache key.
_VERIFY_EXCLUDED = ("report/", "cli.py", "__main__.py")


def dependency_versions() -> dict:
    """``{name: version}`` of the interpreter and of :data:`NUMERICAL_STACK` ("not installed" if absent)."""
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in NUMERICAL_STACK:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _tree_digest(root: Path, exclude: tuple = ()) -> str:
    """Hash of every ``*.py`` file under ``root`` (relative names and bytes), minus ``exclude``."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in exclude):
            continue
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _library_digest() -> str:
    """``lowrank_fl.__version__``, every ``lowrank_fl`` source file and the numerical stack's versions."""
    import lowrank_fl

    h = hashlib.sha256(lowrank_fl.__version__.encode())
    h.update(repr(sorted(dependency_versions().items())).encode())
    h.update(_tree_digest(Path(lowrank_fl.__file__).resolve().parent).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _verifier_digest() -> str:
    """Every source file of the ``verify`` package except :data:`_VERIFY_EXCLUDED`.

    Tasks call helpers of other claim modules, receive functions of other ``verify`` modules as
    parameters (hashed by name only) and get their seeds from :mod:`verify.claim`, so hashing the
    task's module alone would miss edits; the whole package is hashed instead (editing any claim
    module invalidates every cached verifier result, which is safe, not minimal).
    """
    return _tree_digest(Path(__file__).resolve().parent, _VERIFY_EXCLUDED)


@functools.lru_cache(maxsize=None)
def _module_digest(module_name: str) -> str:
    """Hash of the source file of ``module_name`` (tasks defined outside ``verify``, e.g. in tests)."""
    source = getattr(sys.modules.get(module_name), "__file__", None)
    if source is None or not Path(source).is_file():
        return "no-source"
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


def code_version(task: Callable) -> str:
    """Version of the code a task's result depends on.

    ``"<library>-<verifier>-<module>"``: the library digest (``lowrank_fl`` sources and version,
    Python and :data:`NUMERICAL_STACK` versions), the ``verify`` package digest (all of it but the
    report writers and the command line) and the digest of the task's own module file.
    """
    return f"{_library_digest()[:16]}-{_verifier_digest()[:16]}-{_module_digest(task.__module__)[:16]}"


def warm_digests() -> None:
    """Hash the library and the verifier now (cached for the process), so a worker's first task
    does not pay for it."""
    _library_digest()
    _verifier_digest()
