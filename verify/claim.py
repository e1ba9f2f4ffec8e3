"""Claims, evidence, verdicts and the registry.

A claim is data plus one experiment::

    @claim("fedrep.thm1.rate", paper="fedrep", reference="Theorem 1, eq. (7)",
           statement="The principal-angle distance contracts linearly at rate 1 - E0 sigma_min^2 / ...",
           kind="rate")
    def _(ctx: Context, *, algorithm=fedrep) -> Evidence:
        n = ctx.pick(smoke=100, quick=400, full=2000)
        results = ctx.map(_one_run, [{"n": n, "algorithm": algorithm}], replicates=ctx.pick(2, 5, 20))
        ...
        return Evidence(verdict=..., summary=..., measured=..., predicted=...)

* ``ctx.pick(smoke, quick, full)`` chooses a size by scale.
* ``ctx.map(task, grid, replicates)`` runs ``task(seed=<int>, **params)`` for every grid point and
  replicate through the sweep (cached, resumable, any backend) and returns a list (one per grid
  point) of lists (one per replicate). ``task`` must be a module-level function (picklable).
  Seeds are derived with ``SeedSequence`` from the base seed, the claim id, the index of the map
  call within the context (0 for the first ``ctx.map``, 1 for the second, ...), the grid index and
  the replicate index, so results do not depend on the backend or on the order of execution, and
  two maps of one claim never share seeds. ``ctx.for_claim(other_id)`` is a fresh context whose
  map calls are numbered from 0 again: a claim that reuses another claim's runs through it (same
  task, grid and replicates, in the same map order) gets that claim's seeds and its cache entries.
* ``ctx.seed(point, replicate, call=k)`` is the seed the ``k``-th map call gives to that task
  (default ``call=0``: the first map's). For a seed of work done in the claim body, pass a point
  index beyond every grid (e.g. ``ctx.seed(99, 0)``).
* Keyword options of the experiment (``algorithm=...`` above) are the injection points through
  which tests feed a deliberately broken variant and check that the verdict turns to "fails".
* ``ctx.save_figure(fig, title=...)`` stores a matplotlib figure for the report (PNG and SVG, in the
  style of :mod:`verify.plotting`) and returns its relative path.

Rules the machinery enforces (issue 9 §1):

* **Solve records.** Every solve or run a claim's evidence rests on is reported: a task returns a
  dict with :func:`solve_record` entries under the reserved key :data:`SOLVES_KEY` (``ctx.map``
  collects and removes them), the claim body calls ``ctx.record_solve(result, tol=...)``. A
  ``ConvergenceWarning`` that no one handled (a solve stopped at its cap) is captured by the
  harness and recorded as a non-converged solve (:mod:`verify.convergence`).
  :meth:`Claim.run` summarises them in ``Evidence.solves``; a claim whose evidence rests on a
  non-converged solve (status other than "optimal"/"completed", or a relative gap above its stated
  tolerance) cannot hold or confirm an erratum: its verdict becomes "inconclusive", and the summary
  says why. Runs whose divergence *is* the finding are not recorded as solves.
* **Baselines.** A comparison against a baseline first checks that the baseline reaches its own
  reference (:func:`verify.criteria.baseline_check`), recorded in ``Evidence.baselines``; a failed
  baseline check makes "holds"/"fails" inconclusive.
* **Remarks.** ``kind="remark"`` marks a claim that checks only a definition or the verifier's own
  code: it is reported, never counted as verified (:attr:`Claim.counted`).
* **Relaxed criteria.** A threshold changed after a run is reported with the original:
  ``Evidence.relaxations`` (see :func:`verify.criteria.relaxation`).

Claims the toolkit does not implement are registered with :func:`omit` and a reason; the report
lists them. A claim that needs optional packages declares them (``requires=("torch", "peft")``);
when one is missing, :meth:`Claim.run` does not run the experiment and returns the verdict
``"requires torch"`` (its own status in the report, never "inconclusive"), naming what is missing.
"""
from __future__ import annotations

import importlib.util
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .convergence import SOLVES_KEY, VALUE_KEY, capture_convergence

__all__ = [
    "KINDS", "VERDICTS", "SCALES", "PAPERS",
    "Evidence", "Claim", "Omitted", "Context",
    "claim", "omit", "REGISTRY", "OMITTED", "verdict_from", "jsonable", "REQUIRES_VERDICT",
    "BUDGET_VERDICT",
    "missing_requirements",
    "SOLVES_KEY", "CONVERGED_STATUSES", "UNCOUNTED_KINDS", "solve_record", "summarize_solves",
    "enforce_rules",
]

KINDS = ("identity", "bound", "rate", "scaling", "comparison", "phase transition", "erratum", "remark")
#: kinds reported but not counted as verified (they check a definition or the verifier's own code)
UNCOUNTED_KINDS = ("remark",)
#: statuses of a solve/run that the evidence may rest on
CONVERGED_STATUSES = ("optimal", "completed")
#: at most this many non-converged records are kept verbatim in ``Evidence.solves``
_MAX_LISTED = 10
VERDICTS = ("holds", "fails", "inconclusive", "erratum confirmed", "requires torch",
            "exceeded time budget")
#: the verdict of a claim whose optional packages (``Claim.requires``) are not installed
REQUIRES_VERDICT = "requires torch"
#: the verdict of a claim stopped at its time budget (:mod:`verify.budgets`): it does not hold
BUDGET_VERDICT = "exceeded time budget"
SCALES = ("smoke", "quick", "full")
PAPERS = {
    "clair": "CLAIR: Federated LoRA fine-tuning via collaborative alignment",
    "fedrep": "FedRep: Exploiting shared representations for personalized FL",
    "flute": "FLUTE: Federated representation learning in the under-parameterized regime",
    "rolora": "RoLoRA: Robust federated finetuning via alternating optimization of LoRA",
    "fedavg_ft": "FedAvg with fine tuning: local updates lead to representation learning",
    # not a paper: our extension findings on adapters people train (verify/claims/adapters/)
    "adapters": "Extension findings: CLAIR and robust aggregators on PEFT-trained adapters",
}


def verdict_from(passed: bool | None, *, erratum: bool = False) -> str:
    """Map a pass/fail outcome to a verdict.

    ``passed=None`` means the experiment could not decide (``"inconclusive"``). For an erratum
    claim, "passed" means the paper's error was reproduced (``"erratum confirmed"``).
    """
    if passed is None:
        return "inconclusive"
    if erratum:
        return "erratum confirmed" if passed else "fails"
    return "holds" if passed else "fails"


def solve_record(result: Any, *, tol: float | None = None, what: str = "") -> dict:
    """A small JSON-able record of one solve or run the evidence rests on.

    Parameters
    ----------
    result : SolverResult, Trace, or anything with a ``status`` (and optionally ``relative_gap``)
    tol : float, optional
        The relative duality gap the claim relies on (its stated tolerance); ``None`` checks the
        status only.
    what : str
        What was solved (``"program (7), FISTA"``); default: the result's class name.

    Returns
    -------
    dict
        ``{"what", "status", "relative_gap", "tol", "ok"}``: ``ok`` is True when the status is one
        of :data:`CONVERGED_STATUSES` and the relative gap (when the result has one and ``tol`` is
        given) is at most ``tol`` in absolute value (a gap below ``-tol`` contradicts weak duality:
        a broken certificate).
    """
    status = str(getattr(result, "status", "unknown"))
    gap = getattr(result, "relative_gap", None)
    gap = None if gap is None else float(gap)
    ok = status in CONVERGED_STATUSES
    if tol is not None and gap is not None:
        ok = ok and bool(np.isfinite(gap) and abs(gap) <= tol)   # a gap below -tol breaks weak duality
    return {"what": what or type(result).__name__, "status": status, "relative_gap": gap,
            "tol": None if tol is None else float(tol), "ok": bool(ok)}


def summarize_solves(records: Sequence[Mapping]) -> dict:
    """``{"count", "not_converged", "by_status", "max_relative_gap", "failures"}`` of solve records
    (``failures``: the first few non-converged records verbatim); ``{}`` when there are none."""
    if not records:
        return {}
    by_status: dict[str, int] = {}
    for r in records:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    gaps = [r["relative_gap"] for r in records if r.get("relative_gap") is not None]
    bad = [dict(r) for r in records if not r["ok"]]
    return {"count": len(records), "not_converged": len(bad), "by_status": by_status,
            "max_relative_gap": max(gaps) if gaps else None, "failures": bad[:_MAX_LISTED]}


def _pop_solves(result: Any, sink: list) -> Any:
    """Move the records a task reported under :data:`SOLVES_KEY` into ``sink``; return the result
    without them (a copy: cached objects are never modified)."""
    if isinstance(result, Mapping) and SOLVES_KEY in result:
        records = result[SOLVES_KEY]
        if isinstance(records, Mapping):
            records = [records]
        sink.extend(dict(r) for r in records)
        if VALUE_KEY in result:   # a non-dict result that carried captured warnings
            return result[VALUE_KEY]
        return {k: v for k, v in result.items() if k != SOLVES_KEY}
    return result


def jsonable(x: Any, nonfinite: dict | None = None, path: str = "") -> Any:
    """Convert numpy scalars/arrays (and nested containers) to plain JSON types.

    Non-finite floats become ``None`` (JSON ``null``); when ``nonfinite`` is a dict, each one is
    recorded there as ``{json_pointer: "inf" | "-inf" | "nan"}``, the pointer (RFC 6901) relative to
    ``x`` and prefixed with ``path``, so a reader of the JSON knows what the ``null`` stood for.
    """
    if isinstance(x, Mapping):
        return {str(k): jsonable(v, nonfinite, f"{path}/{_pointer_token(k)}") for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v, nonfinite, f"{path}/{i}") for i, v in enumerate(x)]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist(), nonfinite, path)
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        if np.isfinite(v):
            return v
        if nonfinite is not None:
            nonfinite[path] = str(v)
        return None
    return x


def _pointer_token(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class Evidence:
    """What one run of a claim's experiment found.

    Attributes
    ----------
    verdict : str
        One of :data:`VERDICTS`.
    summary : str
        One-line evidence for the summary table ("slope -1.08 ± 0.05 <= -0.5").
    measured, predicted : dict
        JSON-able values: what was measured and what the paper (or an analytic formula) predicts.
    table : list of dict, optional
        Rows for a side-by-side table (e.g. paper's number, ours, analytic prediction).
    figure : str, optional
        Path of the figure relative to the report directory (set through ``ctx.save_figure``).
    seeds : list of int
        Every seed the experiment used (filled in by :meth:`Claim.run`).
    seconds : float
        Runtime (filled in by :meth:`Claim.run`).
    notes : str
        Caveats, e.g. why a verdict is inconclusive or which erratum is involved.
    solves : dict
        Summary of every solve/run the evidence rests on (:func:`summarize_solves`; filled in by
        :meth:`Claim.run` from the records the tasks and the body reported).
    baselines : list of dict
        Checks that each compared baseline reached its own reference
        (:func:`verify.criteria.baseline_check`).
    relaxations : list of dict
        Criteria changed after a run: the original and the relaxed criterion with their outcomes
        (:func:`verify.criteria.relaxation`).
    budget : dict
        The time budget the claim ran under (filled in by :func:`verify.runner.run_claims` when
        budgets are on): ``{"limit_s", "source", "exceeded"}``.
    """

    verdict: str
    summary: str
    measured: dict = field(default_factory=dict)
    predicted: dict = field(default_factory=dict)
    table: list | None = None
    figure: str | None = None
    seeds: list = field(default_factory=list)
    seconds: float = 0.0
    notes: str = ""
    solves: dict = field(default_factory=dict)
    baselines: list = field(default_factory=list)
    relaxations: list = field(default_factory=list)
    budget: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if not isinstance(self.summary, str) or not self.summary:
            raise ValueError("summary must be a non-empty string")

    def to_dict(self) -> dict:
        """JSON-able dict; non-finite numbers are ``null`` and listed in ``nonfinite``
        (JSON pointer relative to this dict -> ``"inf"``, ``"-inf"`` or ``"nan"``). ``solves``,
        ``baselines``, ``relaxations`` and ``budget`` appear only when used (older JSON stays as it
        was)."""
        nonfinite: dict = {}
        d = {"verdict": self.verdict, "summary": self.summary, "measured": self.measured,
             "predicted": self.predicted, "table": self.table, "figure": self.figure,
             "seeds": self.seeds, "seconds": self.seconds, "notes": self.notes}
        for name in ("solves", "baselines", "relaxations", "budget"):
            if getattr(self, name):
                d[name] = getattr(self, name)
        out = jsonable(d, nonfinite)
        out["nonfinite"] = nonfinite
        return out


@dataclass(frozen=True)
class Claim:
    """A checkable statement of a paper with its experiment.

    ``experiment(ctx, **options) -> Evidence``; ``erratum=True`` marks claims where the paper is
    known to be wrong (the experiment then shows the error and answers "erratum confirmed").
    ``requires`` names optional packages the experiment imports (e.g. ``("torch", "peft")``).
    """

    id: str
    paper: str
    reference: str
    statement: str
    kind: str
    experiment: Callable[..., Evidence]
    erratum: bool = False
    requires: tuple = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.paper not in PAPERS:
            raise ValueError(f"paper must be one of {sorted(PAPERS)}, got {self.paper!r}")
        if not self.id.startswith(self.paper + "."):
            raise ValueError(f"claim id {self.id!r} must start with its paper {self.paper!r}")

    @property
    def counted(self) -> bool:
        """Whether the claim counts as verified when it holds (a "remark" is reported only)."""
        return self.kind not in UNCOUNTED_KINDS

    def run(self, ctx: "Context | None" = None, **options) -> Evidence:
        """Run the experiment under ``ctx`` (default: smoke scale, sequential, no cache).

        The solve records the experiment reported, and the ConvergenceWarnings it let through
        (:mod:`verify.convergence`), are summarised in ``Evidence.solves``; a non-converged one,
        or a failed baseline check, turns a "holds" (or "erratum confirmed")
        into "inconclusive" (:func:`enforce_rules`).
        """
        from .plotting import use_style

        ctx = (ctx or Context()).for_claim(self.id)
        missing = missing_requirements(self.requires)
        if missing:
            return Evidence(
                verdict=REQUIRES_VERDICT,
                summary=f"not run: needs {', '.join(self.requires)} (missing: {', '.join(missing)}); "
                        "install the extra from a checkout of lowrank_fl: pip install \".[peft]\"",
                measured={"missing": missing}, notes="The optional dependencies are not installed.")
        use_style()  # figures drawn by the experiment get the report's style
        start = time.perf_counter()
        # ConvergenceWarnings of the body's own solves that the claim let through become records
        # (tasks' are captured in their workers: verify.convergence)
        with capture_convergence(ctx.solves):
            evidence = self.experiment(ctx, **options)
        if not isinstance(evidence, Evidence):
            raise TypeError(f"claim {self.id} returned {type(evidence).__name__}, expected Evidence")
        evidence = replace(evidence, solves=summarize_solves(ctx.solves) or evidence.solves)
        return replace(enforce_rules(evidence), seeds=sorted(set(ctx.seeds_used)),
                       seconds=round(time.perf_counter() - start, 3))


def enforce_rules(evidence: Evidence) -> Evidence:
    """Apply the framework's rules to a claim's evidence.

    * A non-converged solve in ``evidence.solves`` → a "holds"/"erratum confirmed" verdict becomes
      "inconclusive" (a "fails" stays: a failure that rests on an unconverged solve is reported as
      it is, with the solve listed).
    * A failed check in ``evidence.baselines`` → "holds"/"fails" become "inconclusive": a
      comparison against a baseline that does not reach its own reference decides nothing.
    """
    reasons = []
    bad = evidence.solves.get("not_converged", 0) if evidence.solves else 0
    if bad and evidence.verdict in ("holds", "erratum confirmed"):
        first = evidence.solves["failures"][0]
        gap = first.get("relative_gap")
        reasons.append(f"{bad} of {evidence.solves['count']} solves not converged (e.g. {first['what']}: "
                       f"status {first['status']}" + (f", relative gap {gap:.1e} > tol {first['tol']:.1e}"
                                                       if gap is not None and first.get("tol") is not None
                                                       and not gap <= first["tol"] else "") + ")")
    failed = [b for b in evidence.baselines if not b.get("ok")]
    if failed and evidence.verdict in ("holds", "fails", "erratum confirmed"):
        reasons.append(f"baseline {failed[0].get('what', '?')} missed its reference")
    if not reasons:
        return evidence
    why = "; ".join(reasons)
    return replace(evidence, verdict="inconclusive",
                   summary=f"inconclusive ({why}; was {evidence.verdict}): {evidence.summary}",
                   notes=(evidence.notes + "\n\n" if evidence.notes else "")
                   + f"Verdict {evidence.verdict!r} withheld by the framework: {why}.")


@dataclass(frozen=True)
class Omitted:
    """A claim of a paper that the toolkit does not check, with the reason."""

    id: str
    paper: str
    reference: str
    statement: str
    reason: str


REGISTRY: dict[str, Claim] = {}
OMITTED: dict[str, Omitted] = {}


def missing_requirements(packages: Sequence[str]) -> list[str]:
    """The packages of ``packages`` that cannot be imported (found without importing them)."""
    return [p for p in packages if importlib.util.find_spec(p) is None]


def claim(id: str, *, paper: str, reference: str, statement: str, kind: str, erratum: bool = False,
          requires: Sequence[str] = ()):
    """Decorator registering ``experiment`` as the claim ``id`` (``requires``: optional packages)."""

    def register(experiment: Callable[..., Evidence]) -> Claim:
        if id in REGISTRY:
            raise ValueError(f"claim {id!r} is registered twice")
        c = Claim(id=id, paper=paper, reference=reference, statement=statement, kind=kind,
                  experiment=experiment, erratum=erratum, requires=tuple(requires))
        REGISTRY[id] = c
        return c

    return register


def omit(id: str, *, paper: str, reference: str, statement: str, reason: str) -> Omitted:
    """Register a claim that is left out, with the reason (listed in the report)."""
    o = Omitted(id=id, paper=paper, reference=reference, statement=statement, reason=reason)
    OMITTED[id] = o
    return o


def _seed_for(base_seed: int, claim_id: str, point: int, replicate: int, call: int = 0) -> int:
    """Deterministic per-task seed from ``SeedSequence(base_seed, spawn_key=key)``.

    ``key = (crc32(claim), point, replicate)`` for the first map call of a context (``call=0``;
    the key used before maps were numbered, so single-map claims keep their seeds) and
    ``(crc32(claim), call, point, replicate)`` for the later ones. Keys of different lengths give
    different SeedSequence pools, so no two calls share a stream.
    """
    crc = zlib.crc32(claim_id.encode())
    key = (crc, point, replicate) if call == 0 else (crc, call, point, replicate)
    ss = np.random.SeedSequence(base_seed, spawn_key=key)
    return int(ss.generate_state(1, dtype=np.uint32)[0])


@dataclass
class Context:
    """Execution context of a claim: scale, sweep runner, figure directory, base seed.

    ``sweep`` is a :class:`verify.sweep.Sweep` (default: sequential, no cache). ``map_calls``
    counts the :meth:`map` calls made through this context; it numbers their seed streams.
    """

    scale: str = "smoke"
    sweep: Any = None
    out_dir: Path | None = None
    base_seed: int = 0
    claim_id: str = ""
    seeds_used: list = field(default_factory=list)
    solves: list = field(default_factory=list)
    map_calls: int = field(default=0, init=False)

    def __post_init__(self):
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {self.scale!r}")
        if self.sweep is None:
            from .sweep import Sweep

            self.sweep = Sweep(backend="sequential")

    def for_claim(self, claim_id: str) -> "Context":
        """A fresh context for ``claim_id`` (same scale, sweep, output and base seed).

        Its map calls are numbered from 0, so the same sequence of maps reproduces the seeds of
        ``claim_id``'s own run (and hits its cache entries). Seeds it uses are recorded in its own
        ``seeds_used``; a caller that wants them in its evidence extends its list with them.
        """
        # inside a claim (claim_id set), a sub-context reports its solves to the same evidence
        return Context(scale=self.scale, sweep=self.sweep, out_dir=self.out_dir,
                       base_seed=self.base_seed, claim_id=claim_id, seeds_used=[],
                       solves=self.solves if self.claim_id else [])

    def record_solve(self, result: Any, *, tol: float | None = None, what: str = "") -> dict:
        """Record a solve/run done in the claim body (see :func:`solve_record`); returns the record."""
        rec = solve_record(result, tol=tol, what=what)
        self.solves.append(rec)
        return rec

    def pick(self, smoke, quick, full):
        """The value for the current scale."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.scale]

    def seed(self, point: int = 0, replicate: int = 0, *, call: int = 0) -> int:
        """The seed that the ``call``-th :meth:`map` of this context (counting from 0) gives to grid
        point ``point``, replicate ``replicate``; recorded in the evidence.

        The default ``call=0`` is the first map's seed (what ``seed(point, replicate)`` always
        returned). A seed for work done in the claim body should use a ``point`` beyond every
        grid of that map (e.g. ``ctx.seed(99, 0)``) so it is not shared with a task.
        """
        s = _seed_for(self.base_seed, self.claim_id, point, replicate, call)
        self.seeds_used.append(s)
        return s

    def map(self, task: Callable, grid: Sequence[Mapping], replicates: int) -> list[list]:
        """Run ``task(seed=..., **params)`` for every grid point × replicate.

        Returns ``out[i][j]`` = result of grid point ``i``, replicate ``j``. Each call draws from
        its own seed stream (the ``k``-th call of this context uses ``seed(i, j, call=k)``), so two
        maps of one claim never share seeds while reruns of the claim reproduce them. Solve records
        a task returned under :data:`SOLVES_KEY` are collected into ``self.solves`` and removed
        from the results.
        """
        grid = [dict(g) for g in grid]
        call = self.map_calls
        self.map_calls += 1
        seeds = [[self.seed(i, j, call=call) for j in range(replicates)] for i in range(len(grid))]
        out = self.sweep.map(task, grid, seeds, label=self.claim_id)
        return [[_pop_solves(r, self.solves) for r in row] for row in out]

    def save_figure(self, fig, name: str | None = None, *, title: str | None = None) -> str | None:
        """Save a matplotlib figure as ``figures/<name or claim id>.png`` and ``.svg``.

        :func:`verify.plotting.save` gives it the report's style, a title naming the claim
        (``"<claim id>: <title>"``, or the claim id before the figure's own suptitle), legible log
        ticks and markers for off-scale points. Returns the PNG's path relative to the output
        directory; without an output directory the figure is closed and ``None`` returned.
        """
        import matplotlib.pyplot as plt

        from .plotting import save

        path = None
        if self.out_dir is not None:
            stem = (name or self.claim_id).replace("/", "_")
            rel = Path("figures") / f"{stem}.png"
            heading = self.claim_id if not title else f"{self.claim_id}: {title}"
            save(fig, Path(self.out_dir) / rel, title=heading or None)
            path = rel.as_posix()
        plt.close(fig)
        return path
