"""Options of the solvers of (7) (:func:`~lowrank_fl.clair.penalized.solve_penalized`): the
"left at its default" marker, and the check that no option of the other family of methods is
given (it would be ignored silently)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["DEFAULT", "check_applicable"]


class _Default:
    """Marker of an option left at its default (``tol``: 1e-8 for the iterative methods, the
    CVXPY certificate's :data:`~lowrank_fl.clair.programs.DEFAULT_TOL` for ``"cvxpy"``)."""

    def __repr__(self):
        return "<default>"


DEFAULT = _Default()

# options that only one family of methods reads, with their defaults
_ITERATIVE_ONLY = {"max_iter": 10000, "step_size": None, "init": None, "check_every": 5,
                   "svd": "auto", "stall_window": DEFAULT}
_CVXPY_ONLY = {"solver": None, "nuclear": "schur", "on_inaccurate": "warn",
               "solver_options": None, "verbose": False}


def check_applicable(method, **given):
    """Refuse a non-default option that the chosen method would silently ignore."""
    unused = _ITERATIVE_ONLY if method == "cvxpy" else _CVXPY_ONLY
    for name, default in unused.items():
        value = given[name]
        same = value is default or (default is not None and np.ndim(value) == 0
                                    and not isinstance(value, Mapping) and value == default)
        if not same:
            family = "iterative methods ('fista', 'proxgrad')" if method == "cvxpy" \
                else "method='cvxpy'"
            raise ValueError(f"{name} is only used with {family}, got {name}={value!r} with "
                             f"method={method!r}")
