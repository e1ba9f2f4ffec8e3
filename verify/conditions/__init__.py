"""Theorem-condition calculators, one module per paper.

Each module ``verify.conditions.<paper>`` defines

* ``generate(seed=0, **params) -> dict`` — an instance (arrays and scalars) built from parameters;
* ``evaluate(instance: Mapping) -> list[Condition]`` — each theorem's constants and hypotheses.

``lowrank-fl conditions <paper> --instance FILE.npz`` loads the arrays of an npz file as the
instance; ``--param name=value`` generates one instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Condition", "PAPER_MODULES"]

PAPER_MODULES = ("clair", "fedrep", "flute", "rolora", "fedavg_ft")


@dataclass(frozen=True)
class Condition:
    """One hypothesis or constant of a theorem evaluated on an instance.

    ``value`` is what the instance has, ``required`` states what the theorem needs (text such as
    ``"< 0.2475"``), ``holds`` is True/False, or None for a constant that is only reported.
    """

    theorem: str
    name: str
    value: Any
    required: str = ""
    holds: bool | None = None
    note: str = ""
