"""Claims of FLUTE (Liu, Shen & Yang, "Federated representation learning in the under-parameterized
regime", ICML 2024): its theorems, remarks, appendix results and App. C experiments.

Importing this package registers every claim in :data:`verify.claim.REGISTRY`. The experiments live
in one private module per topic:

* :mod:`._rates` — Theorem 5.5 and Remark 5.3: global convergence from a small init, the linear
  rate (8) and its gap dependence, the normalizations of Algorithm 1, the over-parameterized case,
  fresh samples;
* :mod:`._appendix` — App. A: Prop. A.2 (entry time), Prop. A.9 (absorbing region), Lemma A.10
  (inverse SNR), Lemmas A.13-A.14 (gradient discrepancy), the exact identities of App. A.1;
* :mod:`._statistics` — Theorem 5.1, Remarks 5.2 and 5.7: the error in N, M and the gap;
* :mod:`._comparisons` — Example 1 (averaging local optima), Figs. 1 and 3 (FedRep), the empirical ERM;
* :mod:`._regularization` — gamma: eq. (4)'s limit, App. C's divergence boundary (erratum), Fig. 4;
* :mod:`._support` — App. C constants and the shared verdict, fit and plotting helpers.

Defaults follow App. C (``d = 10``, ``M = 15``, ``lambda_i = 2 min(d, M)/(i + 1)``, ``eta = 0.03``,
``alpha = 1/(10 d)``, noise variance 0.3) and the appendix normalization the theorems analyse.
Every experiment has keyword-only injection points (the algorithm, an estimator, a Gram-matrix
routine) through which the tests feed a deliberately broken variant (``tests/_broken_variants.py``)
and check that the verdict turns to "fails".
"""
from __future__ import annotations

from ...claim import omit
# registration order (the report's order): theorems, appendix, statistics, comparisons, gamma
from . import _rates  # noqa: F401, I001
from . import _appendix  # noqa: F401
from . import _statistics  # noqa: F401
from . import _comparisons  # noqa: F401
from . import _regularization  # noqa: F401
from ._support import ETA, NOISE, PAPER

__all__ = ["PAPER", "ETA", "NOISE"]

omit("flute.table1.cifar", paper=PAPER, reference="Table 1, Sec. 7.2, Figs. 5-12",
     statement="General FLUTE / FLUTE* beat FedRep, FedPer, FedRoD, FedCP, ... on CIFAR-10/100 "
               "partitions, with better neural-collapse (NC2) structure.",
     reason="Needs CNN training on CIFAR (general FLUTE, Algorithm 2): outside this toolkit's "
            "linear/low-rank scope. In the paper's own Table 1 plain FLUTE is not best in three "
            "columns; only FLUTE* is.")
omit("flute.thm5_1.constants", paper=PAPER, reference="Theorem 5.1 (N bound), Remark 5.3",
     statement="The per-client sample requirement grows like lambda_1^4 / (eta^2 Delta^6) "
               "(or (lambda_1*/Delta)^10 overall).",
     reason="The absolute constants c, c' are unspecified and the bound is loose by orders of "
            "magnitude; only the N^(-1/2) and M scalings (flute.thm5_1.sample_scaling, "
            "flute.rem5_2.client_scaling) and the gap monotonicity (flute.rem5_7.gap_dependence) "
            "are falsifiable. verify.conditions.flute reports the bound with c = 1.")
