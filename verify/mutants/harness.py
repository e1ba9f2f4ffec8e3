"""Apply a library mutant by monkeypatching and find the claims whose verdict it changes.

A mutant replaces one library object (a function, or a method of a class) for the duration of a
``with apply(mutant):`` block. Python modules hold their own references to what they imported
(``from .penalized import solve_penalized``), so patching the defining module alone would leave
most callers on the original: :func:`apply` replaces the object in *every* loaded module (and
class) that refers to it, and restores each one on exit. The working tree is never modified.

A mutant is *caught* by a claim when the claim's verdict under the mutant differs from its
verdict on the unmodified library at the same scale and seeds (an experiment that raises under
the mutant counts, and is listed separately as ``errored_in``). Claims run under their time
budgets (:mod:`verify.budgets`); a claim stopped at its budget is listed in ``stopped_by_budget``
(not in ``caught_by``), and a mutant whose claims were *all* stopped is ``caught_by_budget``: a
bug that makes the solvers crawl is caught by the clock, not by a verdict.
"""
from __future__ import annotations

import importlib
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, Sequence

from ..budgets import budget_for, load_budgets
from ..claim import BUDGET_VERDICT, REGISTRY, Claim, Context, Evidence
from ..runner import ERROR_PREFIX, load_modules, run_claims, select_claims

__all__ = ["Mutant", "MutantOutcome", "apply", "resolve", "claims_for", "baseline_verdicts", "run_mutant"]


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
    local : bool
        Replace the target only in its owner (``"pkg.mod:name"`` patches ``mod``'s global
        ``name``, e.g. one module's ``np``-free import of a shared helper), not everywhere.
    tests : tuple of str
        Test files (repository-relative) that cover the target: what ``--target tests`` runs
        under the mutant (:mod:`verify.mutants.pytest_mode`); empty for claims-only mutants.
    """

    id: str
    target: str
    description: str
    papers: tuple
    make: Callable
    claims: tuple = ()
    local: bool = False
    tests: tuple = ()


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
    stopped_by_budget: list = field(default_factory=list)

    @property
    def caught_by_budget(self) -> bool:
        """Every claim run under the mutant was stopped at its time budget."""
        return bool(self.claims_run) and len(self.stopped_by_budget) == self.claims_run

    @property
    def escaped(self) -> bool:
        return not self.caught_by and not self.stopped_by_budget

    def to_dict(self) -> dict:
        return {"mutant": self.mutant, "target": self.target, "description": self.description,
                "papers": self.papers, "caught_by": self.caught_by, "errored_in": self.errored_in,
                "claims_run": self.claims_run, "escaped": self.escaped,
                "seconds": round(self.seconds, 2), "stopped_by_budget": self.stopped_by_budget,
                "caught_by_budget": self.caught_by_budget}


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


class _Slot(NamedTuple):
    """A place that holds a reference: an attribute, a dict item, or a function's default."""

    obj: object
    key: object
    kind: str            # "attr", "item", "kwdefault" or "default"

    def set(self, value) -> None:
        if self.kind == "attr":
            setattr(self.obj, self.key, value)
        elif self.kind == "item":
            self.obj[self.key] = value
        elif self.kind == "kwdefault":
            self.obj.__kwdefaults__[self.key] = value
        else:
            defaults = list(self.obj.__defaults__)
            defaults[self.key] = value
            self.obj.__defaults__ = tuple(defaults)


def _default_slots(fn, original) -> list[_Slot]:
    """Keyword and positional defaults of ``fn`` bound to ``original`` (a claim's injection points
    such as ``algorithm=fedrep`` hold the library function from import time)."""
    fn = getattr(fn, "__func__", fn)
    found = []
    for key, value in (getattr(fn, "__kwdefaults__", None) or {}).items():
        if value is original:
            found.append(_Slot(fn, key, "kwdefault"))
    for i, value in enumerate(getattr(fn, "__defaults__", None) or ()):
        if value is original:
            found.append(_Slot(fn, i, "default"))
    return found


def _holders(original) -> list[_Slot]:
    """Every slot among loaded ``lowrank_fl``/``verify`` modules bound to ``original``: module and
    class attributes, values of module-level dicts (method registries), and the defaults of
    module-level functions, methods and claim experiments."""
    found, seen = [], set()

    def scan_function(fn):
        if id(fn) not in seen:
            seen.add(id(fn))
            found.extend(_default_slots(fn, original))

    for mod_name, mod in list(sys.modules.items()):
        if mod is None or mod_name.split(".")[0] not in ("lowrank_fl", "verify"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                found.append(_Slot(mod, attr, "attr"))
            if callable(value) and not isinstance(value, type):
                scan_function(value)
            experiment = getattr(value, "experiment", None)        # a registered Claim
            if callable(experiment):
                scan_function(experiment)
            if isinstance(value, dict) and not attr.startswith("__"):
                for key, item in list(value.items()):
                    if item is original:
                        found.append(_Slot(value, key, "item"))
                    elif callable(getattr(item, "experiment", None)):
                        scan_function(item.experiment)
            elif isinstance(value, type) and value.__module__ == mod_name:
                for cattr, cvalue in list(vars(value).items()):
                    if cvalue is original:
                        found.append(_Slot(value, cattr, "attr"))
                    elif callable(cvalue) or isinstance(cvalue, (staticmethod, classmethod)):
                        scan_function(cvalue)
    return found


@contextmanager
def apply(mutant: Mutant) -> Iterator[None]:
    """Replace the target everywhere it is referenced (only in its owner with ``mutant.local``);
    restore on exit."""
    owner, name, original = resolve(mutant.target)
    replacement = mutant.make(original)
    target_slot = _Slot(owner, name, "attr")
    holders = [target_slot] if mutant.local else _holders(original)
    if target_slot not in holders:
        holders.append(target_slot)
    done = []
    try:
        for slot in holders:
            slot.set(replacement)
            done.append(slot)
        yield
    finally:
        for slot in reversed(done):
            slot.set(original)


def claims_for(mutant: Mutant) -> list[Claim]:
    """The claims a mutant is run against: its papers' claims, restricted by ``mutant.claims``.

    Claims with optional requirements (``Claim.requires``, the torch-based §8 / §5.2 replicates,
    minutes each) are left out unless ``mutant.claims`` names them: the standing check runs on the
    base install and within the CI budget.
    """
    load_modules("verify.claims", mutant.papers, required=True)
    chosen = select_claims(REGISTRY, papers=list(mutant.papers), ids=list(mutant.claims) or None)
    if mutant.claims:
        return chosen
    return [c for c in chosen if not getattr(c, "requires", ())]


def _verdicts(claims: Sequence[Claim], scale: str, base_seed: int,
              time_budget: tuple = ("auto", None)) -> dict[str, Evidence]:
    ctx = Context(scale=scale, base_seed=base_seed)   # sequential, no cache: a mutant's results
    mode, number = time_budget                         # must never be stored under the code key
    table = load_budgets() if mode in ("auto", "factor") else {}
    return {c.id: e for c, e in run_claims(
        claims, ctx, budgets=lambda c: budget_for(c.id, scale, mode, number, table))}


def baseline_verdicts(papers: Sequence[str], scale: str, base_seed: int = 0, *,
                      ids: Sequence[str] | None = None,
                      time_budget: tuple = ("auto", None)) -> dict[str, str]:
    """Verdicts of the claims of ``papers`` (only ``ids``, exact ids or globs, when given) on the
    unmodified library."""
    load_modules("verify.claims", papers, required=True)
    claims = select_claims(REGISTRY, papers=list(papers), ids=list(ids) if ids else None)
    return {cid: e.verdict for cid, e in _verdicts(claims, scale, base_seed, time_budget).items()}


def run_mutant(mutant: Mutant, baseline: dict[str, str], scale: str,
               base_seed: int = 0, *, time_budget: tuple = ("auto", None)) -> MutantOutcome:
    """Run the mutant's claims under the patch and compare with ``baseline`` verdicts.

    ``time_budget``: ``(mode, number)`` as :func:`verify.budgets.parse_time_budget` returns it.
    """
    claims = claims_for(mutant)
    missing = [c.id for c in claims if c.id not in baseline]
    if missing:
        raise ValueError(f"baseline has no verdict for {missing[:3]}")
    start = time.perf_counter()
    with apply(mutant):
        evidence = _verdicts(claims, scale, base_seed, time_budget)
    outcome = MutantOutcome(mutant=mutant.id, target=mutant.target,
                            description=mutant.description, papers=list(mutant.papers),
                            claims_run=len(claims), seconds=time.perf_counter() - start)
    for cid, ev in evidence.items():
        if ev.verdict == BUDGET_VERDICT and baseline[cid] != BUDGET_VERDICT:
            outcome.stopped_by_budget.append(cid)
        elif ev.verdict != baseline[cid]:
            outcome.caught_by.append(cid)
            if ev.summary.startswith(ERROR_PREFIX):
                outcome.errored_in.append(cid)
    return outcome
