"""Extension findings (ours, not a paper's claims) on adapter sets people train: the paper group
``adapters``.

Importing this package registers the claims in :data:`verify.claim.REGISTRY`:

* :mod:`._trained` — ``adapters.trained.*``: CLAIR's client-level detection and the held-out loss
  of the refined adapters on PEFT-trained sets (needs torch and peft; importable without them).
  Shared helpers of the torch-only claims are :mod:`verify.nn_support`.
* :mod:`._realistic` — ``adapters.realistic.*``: the realistic-federation issue's bar (detection
  and no harm) on fresh sets of the families of :mod:`lowrank_fl.nn.trained_families` (torch, peft).
* :mod:`._poisoned` — ``adapters.poisoned.*``: the default decision under scaled and sign-flipped
  updates (numpy only).
"""
from __future__ import annotations

from . import _trained  # noqa: F401
from . import _realistic  # noqa: F401
from . import _poisoned  # noqa: F401

__all__: list[str] = []
