"""The comparison as an object: per-method rows, pairwise agreement, ``to_dict`` / ``table``.

``Comparison.to_dict()`` is exactly what ``compare.json`` holds (builtins only, no pandas); its
layout is documented by ``compare.schema.json`` beside this module (:data:`SCHEMA_VERSION`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources

__all__ = ["SCHEMA_VERSION", "MethodRow", "PairRow", "Comparison", "load_schema"]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class MethodRow:
    """One method's outcome.

    ``outcome`` is ``"ok"`` (it returned a point, certified below), ``"not_run"`` (``reason``
    says why: solver missing, memory estimate over the limit), ``"time_limit"``, ``"error"`` or
    ``"crashed"`` (``reason`` holds the message). ``objective``, ``dual``, ``gap`` and
    ``relative_gap`` are recomputed by the library from the returned point (``None`` without a
    point); ``status``, ``iterations`` are the solver's; ``seconds`` is the solve measured in its
    process; ``peak_memory_bytes`` is measured as ``memory_measure`` says. ``history`` (iterative
    methods) holds ``seconds`` and ``objective`` per recorded iteration (at most 500 points,
    times interpolated at the run's mean time per iteration).
    """

    name: str
    kind: str
    outcome: str
    reason: str | None = None
    status: str | None = None
    objective: float | None = None
    dual: float | None = None
    gap: float | None = None
    relative_gap: float | None = None
    iterations: int | None = None
    seconds: float | None = None
    peak_memory_bytes: float | None = None
    memory_measure: str | None = None
    estimated_memory_bytes: float | None = None
    rank: int | None = None
    collaborative_set: list | None = None
    message: str = ""
    history: dict | None = None


@dataclass(frozen=True)
class PairRow:
    """Agreement of two methods that both returned a point.

    ``objective_difference``: ``objective(a) - objective(b)`` and its ``relative`` version
    (divided by the comparison's ``scale``); ``projector_distance``: ``||P_a - P_b||_op`` of the
    top-``rank`` projectors; ``collaborative_sets_agree`` and ``clients_differing`` (CLAIR
    programs; ``None`` otherwise).
    """

    a: str
    b: str
    objective_difference: float
    relative_objective_difference: float
    projector_distance: float
    collaborative_sets_agree: bool | None = None
    clients_differing: list | None = None


def _clean(x):
    """JSON-safe builtins: non-finite floats become None (JSON has no inf/nan)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


@dataclass(frozen=True)
class Comparison:
    """Outcome of :func:`lowrank_fl.compare.compare_clair` (and the nuclear / noiseless
    variants).

    Attributes
    ----------
    problem : {"clair", "nuclear", "noiseless"}
    instance : dict
        Sizes and constants of the program (``K, q, p, G, lam_L, lam_S, weights`` or
        ``n, m, d, mu``).
    settings : dict
        ``tol``, ``max_iter``, ``time_limit``, ``memory_limit_bytes``, ``rank`` (and how it was
        chosen), ``tau`` rule, ``alpha``.
    scale : float
        The program's scale that relative gaps and differences divide by (see
        :mod:`~lowrank_fl.compare.certify`).
    lower_bound : float or None
        The best certified lower bound on the optimum: the largest ``dual`` over the methods.
    lower_bound_method : str or None
    methods : list of MethodRow
    pairs : list of PairRow
    """

    problem: str
    instance: dict
    settings: dict
    scale: float
    lower_bound: float | None
    lower_bound_method: str | None
    methods: list
    pairs: list = field(default_factory=list)

    def row(self, name: str) -> MethodRow:
        for r in self.methods:
            if r.name == name:
                return r
        raise KeyError(f"no method {name!r} in this comparison; methods: "
                       f"{[r.name for r in self.methods]}")

    def to_dict(self, *, history: bool = True) -> dict:
        """Builtins only (the content of ``compare.json``); ``history=False`` drops the
        per-iteration histories."""
        methods = []
        for r in self.methods:
            d = asdict(r)
            if not history:
                d["history"] = None
            methods.append(d)
        return _clean({"schema_version": SCHEMA_VERSION, "problem": self.problem,
                       "instance": dict(self.instance), "settings": dict(self.settings),
                       "scale": self.scale, "lower_bound": self.lower_bound,
                       "lower_bound_method": self.lower_bound_method, "methods": methods,
                       "pairs": [asdict(p) for p in self.pairs]})

    @classmethod
    def from_dict(cls, d: dict) -> "Comparison":
        """Inverse of :meth:`to_dict` (e.g. on a loaded ``compare.json``)."""
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"compare.json schema_version must be {SCHEMA_VERSION}, got "
                             f"{d.get('schema_version')!r}")
        return cls(problem=d["problem"], instance=dict(d["instance"]),
                   settings=dict(d["settings"]), scale=d["scale"], lower_bound=d["lower_bound"],
                   lower_bound_method=d["lower_bound_method"],
                   methods=[MethodRow(**m) for m in d["methods"]],
                   pairs=[PairRow(**p) for p in d["pairs"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def table(self) -> str:
        """Markdown: one row per method, then the pairwise agreement."""
        clair = self.problem != "nuclear"
        K = self.instance.get("K")
        cols = ["method", "outcome", "status", "objective", "rel. gap", "subopt.", "iters",
                "seconds", "peak memory"] + (["set (8)"] if clair else []) + ["note"]
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in self.methods:
            subopt = None
            if r.objective is not None and self.lower_bound is not None:
                subopt = (r.objective - self.lower_bound) / self.scale
            mem = None if r.peak_memory_bytes is None else \
                f"{_mb(r.peak_memory_bytes)} ({'tm' if r.memory_measure == 'tracemalloc' else 'rss'})"
            note = r.reason or ("" if r.status in ("optimal", "completed", None) else r.message)
            cells = [r.name, r.outcome, r.status or "-", _g(r.objective, 10), _g(r.relative_gap),
                     _g(subopt), _g(r.iterations), _g(r.seconds), mem or "-"]
            if clair:
                cells.append("-" if r.collaborative_set is None
                             else f"{len(r.collaborative_set)}/{K}")
            cells.append(note.replace("|", "/"))
            lines.append("| " + " | ".join(cells) + " |")
        if self.pairs:
            head = "| a | b | rel. obj. diff | projector dist. |"
            head += " same set (8) |" if clair else ""
            lines += ["", head, "|" + "---|" * (5 if clair else 4)]
            for p in self.pairs:
                cell = f"| {p.a} | {p.b} | {_g(p.relative_objective_difference)} | " \
                       f"{_g(p.projector_distance)} |"
                if clair:
                    same = "yes" if p.collaborative_sets_agree else \
                        f"no (clients {p.clients_differing})"
                    cell += f" {same} |"
                lines.append(cell)
        lb = "-" if self.lower_bound is None else f"{self.lower_bound:.10g}"
        lines += ["", f"Lower bound {lb} (best certified dual, {self.lower_bound_method}); "
                      f"relative values divide by the scale {self.scale:.6g}; memory: tm = "
                      "tracemalloc peak, rss = resident-set growth."]
        return "\n".join(lines) + "\n"


def _g(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}"


def _mb(x: float) -> str:
    return f"{x / 1e6:.3g} MB"                    # decimal, as the estimates and --memory-limit (GB = 1e9 B)


def load_schema() -> dict:
    """The JSON schema of ``compare.json`` (shipped as package data)."""
    text = resources.files(__package__).joinpath("compare.schema.json").read_text()
    return json.loads(text)
