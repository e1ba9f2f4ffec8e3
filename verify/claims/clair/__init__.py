"""CLAIR (federated LoRA via collaborative alignment): every checkable claim of the paper.

Importing this module registers the claims (the paper's Lemmas, Theorems, Propositions and §7) in
:data:`verify.claim.REGISTRY`; the §8 transformer experiment is in :mod:`.clair_sec8`.
The experiments live in small private modules, one per group of results:

* :mod:`._clair_algebra` — A: identities, bounds, the rho = 0 erratum, majority rule, Remark 3;
* :mod:`._clair_recovery` — B-D: Theorem 1 (exact recovery, window erratum), oracle and dual
  certificates (Lemmas S1, S3, S7, Prop. S1), Algorithm 1 / FISTA vs CVXPY;
* :mod:`._clair_noisy` — E-F: Theorem 2's rate, Lemma 3, Theorem 3(ii), Theorems 5-6;
* :mod:`._clair_gains` — F: Theorem 4's oracle gain (iid and heterogeneous), the OLS error law;
* :mod:`._clair_sec7` — §7: Tables 1-2, FedAvg negative transfer, the contamination reading;
* :mod:`._clair_compare` — the comparison engine's certified bracket of (7)'s optimum.

Keyword options of each experiment are injection points (a broken projector, refinement, solver,
estimator, vote...) used by the tests to show that every criterion can fail.
"""
from __future__ import annotations

from . import _clair_algebra, _clair_gains, _clair_noisy, _clair_recovery, _clair_sec7  # noqa: F401
from . import _clair_compare  # noqa: F401

__all__: list[str] = []
