"""Apply a library mutant by monkeypatching and find the claims whose verdict it changes.

A mutant replaces one library object (a function, or a method of a class) for the duration of a
``with apply(mutant):`` block. Python modules hold their own references to what they imported
(``from .penalized import solve_penalized``), so patching the defining module alone would leave
most callers on the original: :func:`apply` replaces the object in *every* loaded module (and
class) that refers to it, and restores each one on exit. The working tree is never modified.

A mutant is *caught* by a claim when the claim's verdict under the mutant differs from its
verdict on the unmodified library at the same scale and seeds (an experiment that raises under
the mutant counts, and is listed separately as ``errored_in``).
"""
from __future__ import annotations

import importlib
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from ..claim import REGISTRY, Claim, Context, Evidence
from ..runner import ERROR_PREFIX, load_modules, run_claims, select_claims

__all__ = ["Mutant", "MutantOutcome", "apply", "resolve", "baseline_verdicts", "run_mutant"]


@dataclass(frozen=True)
class Mutant:
    """A realistic bug injected into one library object.

    Attributes
    ----------
    id : str
        Short name (``"clair.gap_sign"``).
    target : str
        ``"package.module:name"`` or ``"package.module:Class.method"``: the object replaced.
    description : str
        The bug in one sentence, as a reviewer would describe it.
    papers : tuple of str
        Papers whose claims exercise the code path; their claims are run under the mutant.
    make : callable
        ``make(original) -> replacement``.
    claims : tuple of str
        Optional glob patterns restricting which of those papers' claims are run.
    """

    id: str
    target: str
    description: str
    papers: tuple
    make: Callable
    claims: tuple = ()


@dataclass
class MutantOutcome:
    mutant: str
    target: str
    description: str
    papers: list
    caught_by: list = field(default_factory=list)
    errored_in: list = field(default_factory=list)
    claims_run: int = 0
    seconds: float = 0.0

    @property
    def escaped(self) -> bool:
        return not self.caught_by

    def to_dict(self) -> dict:
        return {"mutant": self.mutant, "target": self.target, "description": self.description,
                "papers": self.papers, "caught_by": self.caught_by, "errored_in": self.errored_in,
                "claims_run": self.claims_run, "escaped": self.escaped,
                "seconds": round(self.seconds, 2)}


def resolve(target: str):
    """``(owner, attribute name, original object)`` for ``"module:name"`` or ``"module:Cls.name"``."""
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:name', got {target!r}")
    module_name, attr_path = target.split(":", 1)
    owner = importlib.import_module(module_name)
    *parents, name = attr_path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    if not hasattr(owner, name):
        raise ValueError(f"target {target!r}: {owner!r} has no attribute {name!r}")
    return owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)


def _holders(original) -> list[tuple[object, str]]:
    """Every (module or class, attribute) among loaded ``lowrank_fl``/``verify`` modules bound to
    ``original``."""
    found = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.split(".")[0] in ("lowrank_fl", "verify"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                found.append((mod, attr))
            elif isinstance(value, type) and value.__module__ == mod_name:
                for cattr, cvalue in list(vars(value).items()):
                    if cvalue is original:
                        found.append((value, cattr))
    return found


@contextmanager
def apply(mutant: Mutant) -> Iterator[None]:
    """Replace the target everywhere it is referenced; restore on exit."""
    owner, name, original = resolve(mutant.target)
    replacement = mutant.make(original)
    holders = _holders(original) or [(owner, name)]
    if (owner, name) not in holders:
        holders.append((owner, name))
    try:
        for holder, attr in holders:
            setattr(holder, attr, replacement)
        yield
    finally:
        for holder, attr in holders:
            setattr(holder, attr, original)


def _claims_for(mutant: Mutant) -> list[Claim]:
    load_modules("verify.claims", mutant.papers, required=True)
    return select_claims(REGISTRY, papers=list(mutant.papers), ids=list(mutant.claims) or None)


def _verdicts(claims: Sequence[Claim], scale: str, base_seed: int) -> dict[str, Evidence]:
    ctx = Context(scale=scale, base_seed=base_seed)   # sequential, no cache: a mutant's results
    return {c.id: e for c, e in run_claims(claims, ctx)}   # must never be stored under the code key


def baseline_verdicts(papers: Sequence[str], scale: str, base_seed: int = 0) -> dict[str, str]:
    """Verdicts of every claim of ``papers`` on the unmodified library."""
    load_modules("verify.claims", papers, required=True)
    claims = select_claims(REGISTRY, papers=list(papers))
    return {cid: e.verdict for cid, e in _verdicts(claims, scale, base_seed).items()}


def run_mutant(mutant: Mutant, baseline: dict[str, str], scale: str,
               base_seed: int = 0) -> MutantOutcome:
    """Run the mutant's claims under the patch and compare with ``baseline`` verdicts."""
    claims = _claims_for(mutant)
    missing = [c.id for c in claims if c.id not in baseline]
    if missing:
        raise ValueError(f"baseline has no verdict for {missing[:3]}")
    start = time.perf_counter()
    with apply(mutant):
        evidence = _verdicts(claims, scale, base_seed)
    outcome = MutantOutcome(mutant=mutant.id, target=mutant.target,
                            description=mutant.description, papers=list(mutant.papers),
                            claims_run=len(claims), seconds=time.perf_counter() - start)
    for cid, ev in evidence.items():
        if ev.verdict != baseline[cid]:
            outcome.caught_by.append(cid)
            if ev.summary.startswith(ERROR_PREFIX):
                outcome.errored_in.append(cid)
    return outcome
