"""FedRep as FLUTE's baseline (FLUTE Sec. 6, Figs. 1 and 3) — deprecated module.

FedRep runs on FLUTE's :class:`~lowrank_fl.problems.UnderparameterizedProblem` directly:
:func:`lowrank_fl.algorithms.fedrep` takes it, evaluates through the problem's own hook
(``problem.evaluate``: FLUTE's MSE convention, distance to ``span(U_k)``, ``error_target`` and
``error_truth`` in ``extra``). FLUTE's "FedRep" is ``fedrep(problem, T, eta, init="moments")`` and
its "FedRep(RI)" (FLUTE's data-independent Gaussian start, orthonormalized) is
``fedrep(problem, T, eta, init="random")`` — QR removes FLUTE's scale ``alpha``, so there is no
``init_scale``. FLUTE does not report FedRep's step size or round counts.

:func:`fedrep_flute_baseline` is kept for one release as a thin wrapper that warns.
"""
from __future__ import annotations

import warnings

from ..validation import check_choice, check_instance
from ..problems.underparameterized import UnderparameterizedProblem
from ..results import Trace
from .fedrep import check_bool, fedrep

__all__ = ["fedrep_flute_baseline"]


def fedrep_flute_baseline(problem: UnderparameterizedProblem, rounds: int, step_size: float, *,
                          init: str = "moments", fresh_samples: bool = False, seed=None) -> Trace:
    """Deprecated: use ``fedrep(problem, rounds, step_size, data=..., init=...)``.

    ``fresh_samples=False`` is ``data="fixed"``, ``True`` is ``data="fresh"``; ``init`` is
    ``"moments"`` (FedRep) or ``"random"`` (FedRep(RI)). The problem must carry a dataset.
    """
    warnings.warn("fedrep_flute_baseline() is deprecated and will be removed in the next release; "
                  "use fedrep(problem, rounds, step_size, data='fixed'|'fresh', init=...) — it "
                  "runs on an UnderparameterizedProblem directly", DeprecationWarning, stacklevel=2)
    check_instance(problem, "problem", UnderparameterizedProblem)
    if problem.X is None:
        raise ValueError("problem must carry a dataset (samples_per_client=N): FedRep fits heads "
                         "on samples")
    check_choice(init, "init", ("moments", "random"))
    data = "fresh" if check_bool(fresh_samples, "fresh_samples") else "fixed"
    return fedrep(problem, rounds, step_size, data=data, init=init, seed=seed)
