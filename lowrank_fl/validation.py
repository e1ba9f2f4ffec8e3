"""Input checks shared by the whole package.

Every public function validates its arguments with these helpers so that bad input fails early
with a message that names the argument, says what was given and what is expected.
"""
from __future__ import annotations

import numbers
import warnings
import zlib

import numpy as np

__all__ = [
    "as_float_array",
    "check_int",
    "check_positive",
    "check_in_interval",
    "check_gap_tolerance",
    "check_choice",
    "check_instance",
    "as_generator",
]


def _ragged(x, name: str) -> None:
    """Raise ``ValueError`` naming the first element of the list ``x`` whose shape differs from
    the first one's (nothing when ``x`` is not such a list)."""
    if not isinstance(x, (list, tuple)) or not x:
        return
    try:
        shapes = [np.shape(e) for e in x]
    except ValueError:                             # ragged deeper down: no element shape to name
        return
    odd = next((i for i, sh in enumerate(shapes) if sh != shapes[0]), None)
    if odd is not None:
        raise ValueError(f"{name}: its elements must all have one shape, got {shapes[0]} for "
                         f"{name}[0] and {shapes[odd]} for {name}[{odd}]")


def as_float_array(x, name: str, *, ndim: int | tuple[int, ...] | None = None,
                   shape: tuple | None = None, finite: bool = True) -> np.ndarray:
    """Return ``x`` as a float64 ndarray, checking dimensions, shape and finiteness.

    ``shape`` may contain ``None`` for free axes. Raises ``TypeError`` for non-numeric or complex
    input (casting would silently drop the imaginary part) and ``ValueError`` naming ``name``
    otherwise.
    """
    try:
        complex_ = np.iscomplexobj(x)
    except ValueError:                             # a ragged list (numpy cannot make an array)
        _ragged(x, name)
        raise TypeError(f"{name} must be a numeric array, got a {type(x).__name__} numpy cannot "
                        "make one of") from None
    if complex_:
        raise TypeError(f"{name} must be a real numeric array, got complex values "
                        f"(dtype {np.asarray(x).dtype})")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        _ragged(x, name)
        raise TypeError(f"{name} must be a numeric array, got {type(x).__name__}") from exc
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {arr.shape}")
    if shape is not None:
        if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
            want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    if finite and not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} must be finite, got {bad} non-finite entries (NaN or inf)")
    return arr


def check_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int, requiring ``minimum <= value <= maximum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_positive(value, name: str, *, strict: bool = True) -> float:
    """Return ``value`` as a float, requiring ``value > 0`` (or ``>= 0`` if not ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not np.isfinite(value) or (value <= 0 if strict else value < 0):
        want = "> 0" if strict else ">= 0"
        raise ValueError(f"{name} must be finite and {want}, got {value}")
    return value


#: a relative duality gap is computed to about float64's rounding of the objectives: a tolerance
#: below this is met only by a gap that rounds to 0, not by a certificate
GAP_TOL_FLOOR = 1e-14


def check_gap_tolerance(value, name: str = "tol") -> float:
    """A relative duality-gap tolerance as a float in (0, 1): a relative gap of 1 or more
    certifies nothing (the start ``(0, 0)`` already has a relative gap of at most 1, so such a
    solve could stop there "optimal"). Below :data:`GAP_TOL_FLOOR` a warning: float64 cannot
    resolve such a gap, and a solve stops only where rounding happens to give 0."""
    value = check_positive(value, name)
    if value >= 1:
        raise ValueError(f"{name} must be below 1 (a relative duality gap of {value:g} certifies nothing: "
                         f"CLAIR's start (0, 0) has one of at most 1), got {value:g}")
    if value < GAP_TOL_FLOOR:
        warnings.warn(f"{name}={value:g} is below what float64 can certify (relative gaps are computed to "
                      f"about {GAP_TOL_FLOOR:g}): the solve can stop only where rounding gives a gap of 0, "
                      f"or run to max_iter", UserWarning, stacklevel=3)
    return value


def check_in_interval(value, name: str, low: float, high: float, *, closed: str = "both") -> float:
    """Return ``value`` as a float in the interval from ``low`` to ``high``.

    ``closed`` is one of ``"both"``, ``"left"``, ``"right"``, ``"neither"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    left_ok = value >= low if closed in ("both", "left") else value > low
    right_ok = value <= high if closed in ("both", "right") else value < high
    if not (np.isfinite(value) and left_ok and right_ok):
        lb = "[" if closed in ("both", "left") else "("
        rb = "]" if closed in ("both", "right") else ")"
        raise ValueError(f"{name} must lie in {lb}{low}, {high}{rb}, got {value}")
    return value


def check_choice(value, name: str, choices) -> str:
    """Require ``value`` to be one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)!r}, got {value!r}")
    return value


def check_instance(value, name: str, cls: type):
    """Require ``value`` to be a ``cls`` (e.g. the problem type an algorithm runs on); returns it."""
    if not isinstance(value, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"{name} must be {article} {cls.__name__} ({cls.__module__}), "
                        f"got {type(value).__name__}")
    return value


def as_generator(seed, stream: str | None = None) -> np.random.Generator:
    """Turn ``seed`` (int, ``SeedSequence``, ``Generator`` or ``None``) into a ``Generator``.

    ``None`` draws fresh OS entropy (not reproducible); every other input is deterministic.
    A ``Generator`` is returned as is, so callers can share one stream.

    ``stream`` names an independent stream for an int or ``SeedSequence`` seed (it is mixed into
    the ``SeedSequence`` spawn key). Algorithms pass their own name, so that ``seed=0`` given to a
    problem generator and to an algorithm does not replay the same random numbers (which would,
    e.g., make a "random" initialization equal to the ground truth).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    key = () if stream is None else (zlib.crc32(stream.encode()),)
    if seed is None:
        return np.random.default_rng()
    if isinstance(seed, np.random.SeedSequence):
        if not key:
            return np.random.default_rng(seed)
        return np.random.default_rng(np.random.SeedSequence(seed.entropy, spawn_key=tuple(seed.spawn_key) + key))
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=key) if key else int(seed))
    raise TypeError(f"seed must be an int, numpy SeedSequence or Generator, got {type(seed).__name__}")
