"""Claims of RoLoRA (Chen et al., "Robust federated finetuning of LLMs via alternating optimization
of LoRA"): fifteen checkable claims C1-C15 of its §3-§5 and Appendix A.

Importing this package registers every claim in :data:`verify.claim.REGISTRY`. The experiments live
in one private module per topic:

* :mod:`._sec5_2` — §5.2, Fig. 2: the two-layer LoRA network under label skew (needs torch;
  importable without it);
* :mod:`._aggregation` — C1-C5: the interference identity (1)-(2), RoLoRA's exact aggregation,
  Eckart-Young, FFA-LoRA's floor and expected loss;
* :mod:`._rates` — C6-C10: the population and finite-sample rates, the step-size bound (erratum),
  the concentration of the b-step and of the expected gradient;
* :mod:`._comparisons` — C11-C14: RoLoRA vs FFA-LoRA, the FedAvg-LoRA toy, invariances, random
  initialization;
* :mod:`._support` — the figure, slope and solve-record helpers.

LoRA factors are in PEFT's letters (``DeltaW = B A``, A r × in, B out × r); the rank-one toy keeps
the paper's ``a`` (A side) and ``b`` (B side). Every experiment has keyword-only injection points
(the algorithm, an estimator, a step variant) through which the tests feed a deliberately broken
variant and check that the verdict turns to "fails".
"""
from __future__ import annotations

# registration order (the report's order): §5.2, then C1-C5, C6-C10, C11-C14
from . import _sec5_2  # noqa: F401, I001
from . import _aggregation  # noqa: F401
from . import _rates  # noqa: F401
from . import _comparisons  # noqa: F401
from ._support import PAPER

__all__ = ["PAPER"]
