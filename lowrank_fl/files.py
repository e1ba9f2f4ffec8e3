"""Reading a user's array files, with one-line errors (never unpickling).

Every failure is a ``ValueError`` or ``FileNotFoundError`` whose message names the option and the
path (the command line prints it as one line, exit status 2). Output directories are written
through :mod:`lowrank_fl.outdir`.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

__all__ = ["load_npz", "load_npy"]


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
        if _pickled(exc):
            raise ValueError(f"{option} {path}: {_PICKLED}") from None
        raise ValueError(f"{option} {path} is a damaged .npz archive (truncated?): "
                         f"{_reason(exc)}") from None


def load_npy(path, *, option: str = "input") -> np.ndarray:
    """One array from an ``.npy`` file, read without pickle; errors as in :func:`load_npz`."""
    path = _existing_file(path, option)
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        if _pickled(exc):
            raise ValueError(f"{option} {path}: {_PICKLED}") from None
        raise ValueError(f"{option} {path} is not an .npy array file (numpy.save output): "
                         f"{_reason(exc)}") from None
    if not isinstance(data, np.ndarray):
        data.close()
        raise ValueError(f"{option} {path} is an .npz archive, expected a single .npy array")
    return data


_PICKLED = ("it holds an object array, which is never loaded (reading it means unpickling, which can run "
            "code); save numeric arrays (e.g. numpy.asarray(x, dtype=float))")


def _pickled(exc: BaseException) -> bool:
    """Whether numpy refused the data because it is an object (pickled) array."""
    return "Object arrays cannot be loaded" in str(exc)        # numpy's own words for that refusal


def _reason(exc: BaseException) -> str:
    text = str(exc).split("\n")[0]
    if "allow_pickle" in text or "pickle" in text:  # numpy's advice would be unsafe here
        return "not a numpy file"
    return text or type(exc).__name__
