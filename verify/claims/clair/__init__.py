"""Claims of CLAIR (federated LoRA via collaborative alignment): every checkable claim of the paper.

Importing this package registers the claims in :data:`verify.claim.REGISTRY`. The experiments live
in one private module per topic:

* :mod:`._sec8_backbone` — §8's backbone: the rule's choice, the baseline gate of every §8 claim and
  ``clair.sec8.backbone_seeds`` (needs torch; the rule itself is :mod:`._backbone_rule`);
* :mod:`._sec8` — §8: Table 3, detection, the regime comparisons, the contaminated task and the
  background reading (needs torch and peft; importable without them);
* :mod:`._algebra` — A: identities, bounds, the rho = 0 remark, majority rule, Remark 3;
* :mod:`._gains` — F: Theorem 4's oracle gain (iid and heterogeneous), the OLS error law;
* :mod:`._noisy` — E-F: Theorem 2's rate, Lemma 3, Theorem 3(ii), Theorems 5-6;
* :mod:`._recovery` — B-D: Theorem 1 (exact recovery, window remark), oracle and dual
  certificates (Lemmas S1, S3, S7, Prop. S1), Algorithm 1 / FISTA vs CVXPY;
* :mod:`._sec7` — §7: Tables 1-2, FedAvg negative transfer, the contamination reading;
* :mod:`._compare` — the comparison engine's certified bracket of (7)'s optimum;
* :mod:`._support` — contrasts, pairs, the refinement's definition and the majority vote.

Keyword options of each experiment are injection points (a broken projector, refinement, solver,
estimator, vote...) used by the tests to show that every criterion can fail.
"""
from __future__ import annotations

# registration order (the report's order): §8 (its backbone first), then A, F, E-F, B-D, §7, (7)
from . import _sec8  # noqa: F401, I001  (imports _sec8_backbone, which registers first)
from . import _algebra  # noqa: F401
from . import _gains  # noqa: F401
from . import _noisy  # noqa: F401
from . import _recovery  # noqa: F401
from . import _sec7  # noqa: F401
from . import _compare  # noqa: F401

__all__: list[str] = []
