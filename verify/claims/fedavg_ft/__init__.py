"""Claims of "FedAvg with fine tuning: local updates lead to representation learning" (Collins,
Hassani, Mokhtari, Shakkottai, 2022): checkable claims C1-C13 of the paper's Sec. 3-5 and App. B-C.

Importing this package registers every claim in :data:`verify.claim.REGISTRY`. The experiments live
in one private module per topic:

* :mod:`._representation` — C1-C7: the one-round identities, Lemma 5, Theorem 1's representation
  learning, D-GD's stall and lower bound (Fig. 1, Prop. 1), Fig. 3 (stationarity, fine-tuning);
  the setup, the injection points and the omitted CIFAR experiments;
* :mod:`._extensions` — C8-C13: the rate's scaling, Theorem 2's hypotheses along a run, diversity,
  partial participation and two extensions beyond the paper;
* :mod:`._support` — the paper's constants, the algorithms and the rate fit.
"""
from __future__ import annotations

# registration order (the report's order): C1-C7, then C8-C13
from . import _representation  # noqa: F401, I001
from . import _extensions  # noqa: F401
from ._support import P as PAPER

__all__ = ["PAPER"]
