"""The machine-readable report (``results.json``)."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..claim import Claim, Evidence, Omitted, _jsonable
from ._common import is_error, omitted_sorted, totals

__all__ = ["build_results"]


def build_results(results: Sequence[tuple[Claim, Evidence]], *, scale: str,
                  omitted: Sequence[Omitted] = (), meta: Mapping | None = None) -> dict:
    """The JSON document of a report.

    Top level: ``scale``, ``versions`` (python, numpy, scipy, cvxpy, clarabel, scs, joblib, lowrank_fl,
    platform),
    ``totals`` (count per verdict, ``errors``, ``claims``), ``claims`` (one object per claim: id,
    paper, reference, kind, erratum, statement, verdict, error, summary, measured, predicted,
    table, figure, notes, seeds, seconds), ``omitted`` (id, paper, reference, statement, reason),
    and the other ``meta`` entries (base_seed, total_seconds, created, ...).
    """
    meta = dict(meta or {})
    claims = []
    for c, e in results:
        entry = {"id": c.id, "paper": c.paper, "reference": c.reference, "kind": c.kind,
                 "erratum": c.erratum, "statement": c.statement, "error": is_error(e)}
        entry.update(e.to_dict())
        claims.append(entry)
    doc = {"scale": scale, "versions": meta.pop("versions", {}), "totals": totals(results)}
    doc.update(meta)
    doc["claims"] = claims
    doc["omitted"] = [{"id": o.id, "paper": o.paper, "reference": o.reference,
                       "statement": o.statement, "reason": o.reason} for o in omitted_sorted(omitted)]
    return _jsonable(doc)
