"""The verifier: the five papers' checkable claims as experiments with verdicts and reports.

``python -m verify`` (= ``lowrank-fl verify``) runs the registry and writes a report.
"""
from .claim import Claim, Context, Evidence, REGISTRY, OMITTED, claim, omit

__all__ = ["Claim", "Context", "Evidence", "REGISTRY", "OMITTED", "claim", "omit"]
