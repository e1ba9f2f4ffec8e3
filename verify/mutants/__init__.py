"""Mutation testing of the verifier: does every claim notice a broken library?

``catalogue.CATALOGUE`` lists realistic bugs (a flipped sign, a skipped orthonormalization,
sampling with replacement, ...), each applied by monkeypatching one library object
(:func:`harness.apply`); ``python -m verify.mutants`` runs each mutant against the claims of the
papers it affects and reports which claims' verdicts changed.
"""
from .harness import Mutant, MutantOutcome, apply, baseline_verdicts, run_mutant

__all__ = ["Mutant", "MutantOutcome", "apply", "baseline_verdicts", "run_mutant"]
