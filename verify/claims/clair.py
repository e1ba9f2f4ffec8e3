"""CLAIR (federated LoRA via collaborative alignment): every checkable claim of the paper.

Importing this module registers the claims (the paper's Lemmas, Theorems, Propositions and §7) in
:data:`verify.claim.REGISTRY`; item 32 (the §8 transformer experiment) is registered as omitted.
The experiments live in small private modules, one per group of results:

* :mod:`._clair_algebra` — A: identities, bounds, the rho = 0 erratum, majority rule, Remark 3;
* :mod:`._clair_recovery` — B-D: Theorem 1 (exact recovery, window erratum), oracle and dual
  certificates (Lemmas S1, S3, S7, Prop. S1), Algorithm 1 / FISTA vs CVXPY;
* :mod:`._clair_noisy` — E-F: Theorem 2's rate, Lemma 3, Theorem 3(ii), Theorems 5-6;
* :mod:`._clair_gains` — F: Theorem 4's oracle gain (iid and heterogeneous), the OLS error law;
* :mod:`._clair_sec7` — §7: Tables 1-2, FedAvg negative transfer, the contamination reading.

Keyword options of each experiment are injection points (a broken projector, refinement, solver,
estimator, vote...) used by the tests to show that every criterion can fail.
"""
from __future__ import annotations

from ..claim import omit
from . import _clair_algebra, _clair_gains, _clair_noisy, _clair_recovery, _clair_sec7  # noqa: F401

__all__: list[str] = []

omit("clair.sec8.transformer", paper="clair", reference="§8, Table 3, Figures 2-3",
     statement="On a 2-layer transformer with LoRA on 10 clients, CLAIR detects the contaminated client on "
               "each attention matrix and ranks Local < CLAIR in masked next-token accuracy (Table 3).",
     reason="Out of scope: transformer training (torch) is not part of this linear/low-rank toolkit; the "
            "reported effects (+0.1-0.2 points) have no error bars, and the contaminated client's task, the "
            "'noisy-long' evaluation distribution and the layer-to-client aggregation are unspecified "
            "(§8 leaves the contaminated client's task, the layer aggregation and w_g unspecified).")
