"""The machine-readable report (``results.json``), described by ``results.schema.json``.

Non-finite numbers are written as ``null`` and each claim lists them in ``nonfinite``
(JSON pointer relative to the claim -> ``"inf"``, ``"-inf"`` or ``"nan"``), so the file is strict
JSON that any tool reads.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from ..claim import Claim, Evidence, Omitted, jsonable
from ._common import is_error, omitted_sorted, stops, totals, totals_by_paper
from .references import REFERENCES

__all__ = ["build_results", "SCHEMA_PATH", "SCHEMA_VERSION", "load_schema"]

SCHEMA_VERSION = 2
SCHEMA_PATH = Path(__file__).with_name("results.schema.json")


def load_schema() -> dict:
    """The published JSON schema of ``results.json``."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def build_results(results: Sequence[tuple[Claim, Evidence]], *, scale: str,
                  omitted: Sequence[Omitted] = (), meta: Mapping | None = None) -> dict:
    """The JSON document of a report.

    Top level: ``schema_version``, ``scale``, ``versions`` (python, numpy, scipy, cvxpy, clarabel,
    scs, joblib, lowrank_fl, platform), ``provenance`` (git commit, command, dependencies, machine),
    ``totals`` (count per verdict, ``errors``, ``claims``), ``totals_by_paper``, ``stops`` (ids
    of the claims cut short: ``stalled`` on a stalled solve, ``time_budget`` at their budget),
    ``claims`` (one
    object per claim: id, paper, reference, kind, erratum, statement, verdict, error, summary,
    measured, predicted, table, figure, notes, seeds, seconds, nonfinite), ``omitted`` (id,
    paper, reference, statement, reason), ``references`` (BibTeX fields per paper), and the other
    ``meta`` entries (base_seed, backend, total_seconds, tasks, created).
    """
    meta = dict(meta or {})
    omitted = omitted_sorted(omitted)
    claims = []
    for c, e in results:
        entry = {"id": c.id, "paper": c.paper, "reference": c.reference, "kind": c.kind,
                 "erratum": c.erratum, "statement": c.statement, "error": is_error(e)}
        entry.update(e.to_dict())
        claims.append(entry)
    doc = {"schema_version": SCHEMA_VERSION, "scale": scale, "versions": meta.pop("versions", {}),
           "totals": totals(results), "totals_by_paper": totals_by_paper(results, omitted),
           "stops": stops(results)}
    doc.update(meta)
    doc["claims"] = claims
    doc["omitted"] = [{"id": o.id, "paper": o.paper, "reference": o.reference,
                       "statement": o.statement, "reason": o.reason} for o in omitted]
    doc["references"] = REFERENCES
    nonfinite: dict = {}
    out = jsonable(doc, nonfinite)
    if nonfinite:  # only meta can still hold one (claims were converted above)
        out["nonfinite"] = nonfinite
    return out
