"""Shared parts of the synthetic problem classes: the optional fixed per-client dataset.

A problem dataclass (frozen) that may carry a dataset drawn once — features ``X`` (n, m, d) and
labels ``y`` (n, m) (or (n, m, q) for vector outputs) — inherits :class:`ClientDataset` and calls
:meth:`ClientDataset._validate_dataset` at the end of its ``__post_init__``. The mixin then gives
``samples_per_client``, :meth:`require_dataset` and :meth:`client_index` with the same checks and
messages everywhere. :func:`check_orthonormal` is the shared check for ground-truth bases.

The label attribute is ``y`` by default; a class whose labels are stored under another name
(e.g. ``Y``) sets ``_label_name``.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from ..validation import as_float_array

__all__ = ["ClientDataset", "Samples", "check_orthonormal", "ORTHO_TOL", "renamed_size"]


class Samples(NamedTuple):
    """What every problem's ``sample(m, seed)`` returns, client axis first.

    X : ndarray, shape (n_clients, m, d)
    y : ndarray, shape (n_clients, m) (or (n_clients, m, q) for vector outputs)
    """

    X: np.ndarray
    y: np.ndarray


def renamed_size(func: str, new_value, old_value, new: str, old: str):
    """Resolve a size given under its new keyword ``new`` or its deprecated alias ``old``
    (``DeprecationWarning`` naming the new one; ``TypeError`` if both or neither are given)."""
    if old_value is not None:
        if new_value is not None:
            raise TypeError(f"{func}() got both {new!r} and its deprecated alias {old!r}")
        warnings.warn(f"{func}(): the keyword {old!r} is deprecated and will be removed in the next "
                      f"release; use {new!r} instead", DeprecationWarning, stacklevel=3)
        return old_value
    if new_value is None:
        raise TypeError(f"{func}() missing required keyword argument {new!r}")
    return new_value

ORTHO_TOL = 1e-8


def check_orthonormal(A: np.ndarray, name: str, *, axis: str = "columns") -> None:
    """Raise ``ValueError`` unless ``A`` has orthonormal columns (``A^T A = I`` within
    :data:`ORTHO_TOL`) or, with ``axis="rows"``, orthonormal rows (``A A^T = I``).

    Problems reject a non-orthonormal ground truth rather than orthonormalize it silently: that
    would change the data the caller asked for.
    """
    G = A.T @ A if axis == "columns" else A @ A.T
    dev = float(np.max(np.abs(G - np.eye(G.shape[0])))) if G.size else 0.0
    if not dev <= ORTHO_TOL:
        raise ValueError(
            f"{name} must have orthonormal {axis} (within {ORTHO_TOL:g}), got max deviation from "
            f"the identity {dev:.3g}; orthonormalize it first (lowrank_fl.linalg.orth) if its "
            f"span is what you mean")


class ClientDataset:
    """Mixin for problem dataclasses with an optional fixed dataset ``X`` / labels."""

    _label_name = "y"

    def _validate_dataset(self, n_clients: int, d: int, label_shape: tuple = ()) -> None:
        """Check and store ``X`` (n_clients, m, d) and the labels (n_clients, m, *label_shape),
        given together or both ``None``."""
        lab = self._label_name
        X, y = self.X, getattr(self, lab)
        if (X is None) != (y is None):
            raise ValueError(f"X and {lab} must be given together (both arrays or both None)")
        if X is None:
            return
        X = as_float_array(X, "X", shape=(n_clients, None, d))
        if X.shape[0] < 1 or X.shape[1] < 1:
            raise ValueError(f"X must hold at least one client and one sample per client, "
                             f"got shape {X.shape}")
        y = as_float_array(y, lab, shape=X.shape[:2] + tuple(label_shape))
        object.__setattr__(self, "X", X)
        object.__setattr__(self, lab, y)

    @property
    def samples_per_client(self) -> int | None:
        """``m`` of the fixed dataset, or ``None`` in the population regime."""
        return None if self.X is None else self.X.shape[1]

    def require_dataset(self, what: str):
        """Return ``(X, labels)``; ``ValueError`` naming ``what`` when there is no dataset."""
        if self.X is None:
            raise ValueError(f"{what} needs a fixed dataset; this problem has no fixed dataset "
                             f"(build it with samples_per_client=m, or from your data with "
                             f"from_data(X, y))")
        return self.X, getattr(self, self._label_name)

    def client_index(self, clients) -> np.ndarray:
        """Validate a 1-D integer array of client indices in ``[0, n_clients)``."""
        idx = np.asarray(clients)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"clients must be a 1-D integer array, got {idx!r}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_clients):
            raise ValueError(f"clients must lie in [0, {self.n_clients}), got "
                             f"{idx.min()}..{idx.max()}")
        return idx
