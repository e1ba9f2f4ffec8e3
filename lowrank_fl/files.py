"""Reading a user's array files and writing output directories, with one-line errors.

Every failure is a ``ValueError`` or ``FileNotFoundError`` whose message names the option and the
path (the command line prints it as one line, exit status 2). Output directories are written
through a staging directory next to the target and swapped in at the end, so an interrupted or
failed command leaves the previous contents (or nothing) behind, never a half-written directory.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

__all__ = ["load_npz", "load_npy", "stage_output_dir", "commit_output_dir", "discard_staging"]


def _existing_file(path, option: str) -> Path:
    if path is None or str(path) == "":
        raise ValueError(f"{option} must name a file, got ''")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory, expected a file")
    if not path.exists():
        raise FileNotFoundError(f"{option} file not found: {path}")
    return path


def load_npz(path, *, option: str = "input") -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` archive, read without pickle.

    Raises ``ValueError`` for an empty, truncated or non-``.npz`` file (a bare ``.npy`` array
    included) and for object arrays, ``FileNotFoundError`` when it does not exist.
    """
    path = _existing_file(path, option)
    if path.stat().st_size == 0:
        raise ValueError(f"{option} {path} is empty, expected an .npz archive")
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{option} {path} is not an .npz archive (numpy.savez output): "
                         f"{_reason(exc)}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{option} {path} is a single array ({type(data).__name__}), not an .npz "
                         "archive: save it with numpy.savez(path, NAME=array)")
    try:
        with data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(f"{option} {path} is a damaged .npz archive (truncated?): "
                         f"{_reason(exc)}") from None


def load_npy(path, *, option: str = "input") -> np.ndarray:
    """One array from an ``.npy`` file, read without pickle; errors as in :func:`load_npz`."""
    path = _existing_file(path, option)
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{option} {path} is not an .npy array file (numpy.save output): "
                         f"{_reason(exc)}") from None
    if not isinstance(data, np.ndarray):
        data.close()
        raise ValueError(f"{option} {path} is an .npz archive, expected a single .npy array")
    return data


def _reason(exc: BaseException) -> str:
    text = str(exc).split("\n")[0]
    if "allow_pickle" in text or "pickle" in text:  # numpy's advice would be unsafe here
        return "not a numpy file"
    return text or type(exc).__name__


def stage_output_dir(path, *, overwrite: bool = False, option: str = "--out",
                     marker: str | None = None) -> Path:
    """Check that ``path`` may be written and return a new empty staging directory beside it.

    ``path`` must be a directory path that does not exist or is empty, or, with ``overwrite``,
    a directory holding a previous output (the file ``marker`` when given). The staging directory
    is created now, so an unwritable location fails before any work. Finish with
    :func:`commit_output_dir` (or :func:`discard_staging` on failure).
    """
    if path is None or str(path) == "":
        raise ValueError(f"{option} must name a directory, got ''")
    target = Path(path).expanduser().absolute()
    cwd = Path.cwd().resolve()
    if target.resolve() == cwd or target.resolve() in cwd.parents:
        raise ValueError(f"{option} {path} is the current directory or one of its parents; "
                         "name a directory of its own")
    if target.exists() and not target.is_dir():
        raise ValueError(f"{option} {path} is a file, not a directory")
    if target.is_dir() and any(target.iterdir()):
        if not overwrite:
            raise ValueError(f"{option} {path} is not empty; pass --overwrite to replace its contents")
        if marker is not None and not (target / marker).is_file():
            raise ValueError(f"{option} {path} does not hold a previous output (no {marker}); "
                             "refusing to clear it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.partial-"))
        # mkdtemp makes it 0700; it becomes the output, so give it the mode of a plain mkdir
        os.chmod(staging, 0o777 & ~_umask())
        return staging
    except OSError as exc:
        raise ValueError(f"cannot write {option} {path}: {exc.strerror or exc}") from None


def _umask() -> int:
    """The process's umask (read from /proc where possible: setting it to read it is racy)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def commit_output_dir(staging: Path, path) -> Path:
    """Replace ``path`` by the finished ``staging`` directory (old contents removed)."""
    target = Path(path).expanduser().absolute()
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
        os.replace(target, old / "previous")
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def discard_staging(staging: Path | None) -> None:
    """Remove an unfinished staging directory."""
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
