"""What each client receives, decided once every module is solved: the collaborative set, the
refinement target and each client's weight ``a_k`` (:mod:`.noharm`), with the evidence.

``refine="exchangeable"`` (default): target the collaborative mean (``P_Â = 0`` in (9)'s formula),
weights from each client's agreement with the others, at least
:data:`lowrank_fl.adapters.noharm.EXCHANGEABLE_WEIGHT` where the collaborating clients look exchangeable
(:mod:`.exchangeable`); ``"agreement"``: the same target, the agreement alone; ``"shrink"``: every weight at least
:data:`lowrank_fl.adapters.noharm.SHRINK_WEIGHT`; ``"paper"``: (9) exactly, ``a_k = 1``, with
``P_Â`` re-estimated without the flagged clients (:func:`lowrank_fl.adapters.aggregate.refit_without`)
so that they do not steer it; ``"own"``: every client keeps its adapter.
``summary.json["refinement"]`` reports the floor applied, the set's exchangeability (under
"exchangeable"; None otherwise) and, per client, its weight, its agreement, how far its output is
from its own adapter (relative Frobenius change over the whole adapter) and how far the full move
would take it, and why.
"""
from __future__ import annotations

import warnings

import numpy as np

from . import guard
from .aggregate import refit_without
from .exchangeable import exchangeability
from .updates import zero_updates
from .noharm import (DEFAULT_REFINE, REFINE, agreement, floor_weight, refine_weights, relative_changes,
                     uncapped_weights)

__all__ = ["REFINE", "DEFAULT_REFINE", "check_refine", "resolve_refine", "apply_refinement",
           "refinement_summary"]


def check_refine(refine: str) -> str:
    if refine not in REFINE:
        raise ValueError(f"refine must be one of {list(REFINE)}, got {refine!r}")
    return refine


def resolve_refine(refine: str | None, shared_weights=None, method: str = "clair") -> str:
    """``refine``, or by default :data:`DEFAULT_REFINE`; explicit ``shared_weights`` are the
    weights of (9)'s move, so they imply ``"paper"`` (its target) when ``refine`` is not given.
    For a ``method`` other than CLAIR (no refinement) either one given is warned about."""
    if method != "clair":
        given = [f"{n}={v!r}" for n, v in (("refine", refine), ("shared_weights", shared_weights))
                 if v is not None]
        if given:
            warnings.warn(f"{' and '.join(given)} ignored: they set CLAIR's refinement (9), and method "
                          f"{method!r} has none", UserWarning, stacklevel=3)
    if refine is None:
        return "paper" if shared_weights is not None else DEFAULT_REFINE
    return check_refine(refine)


def _set(results, decided) -> np.ndarray:
    """The client-level collaborative set: ``decided``, or (per-module rule) the clients every
    module keeps."""
    if decided is not None:
        return np.asarray(decided, bool)
    return guard.abstain([r.benign for r in results]).all(axis=0)     # undecided modules abstain


_PLANNED = ("Z", "XZ", "VZt")


def _restore(res) -> None:
    """Undo a previous plan on this module (an aggregation written twice, with other rules or
    modes, starts each time from the solve's own state)."""
    st = res.state
    saved = st.get("solve_state")
    if saved is None:
        st["solve_state"] = {k: st[k] for k in _PLANNED if k in st}
        st["solve_gram_outside"] = res.gram_outside
        return
    st.update(saved)
    res.gram_outside = st["solve_gram_outside"]
    res.refit = None
    for k in ("mean_cache", "mbar_cache", "target"):
        st.pop(k, None)


def _target_mean(res) -> None:
    """Make the module's refinement target the collaborative mean: (9)'s formula with ``P_Â = 0``
    (an empty ``Z``)."""
    st = res.state
    if "Z" not in st or st.get("target") == "mean":
        return
    st["Z"] = st["Z"][:, :0]
    if "XZ" in st:
        st["XZ"] = st["XZ"][..., :0]
    if "VZt" in st:
        st["VZt"] = st["VZt"][:0]
    st.pop("mean_cache", None)
    st.pop("mbar_cache", None)
    st["target"] = "mean"


def apply_refinement(results, decided, options, refine: str = DEFAULT_REFINE, factors=None) -> dict:
    """Prepare every CLAIR module's state for ``refine`` and return the weights
    ``{module: (K,) a_k}`` the writers apply (0 outside a module's set is applied by them).
    ``factors``: a callable ``module -> ModuleFactors`` to re-read a module whose state keeps no
    coordinates (the split layout), needed by ``"paper"`` with flagged clients."""
    check_refine(refine)
    clair = [r for r in results if r.method == "clair"]
    if not clair:
        return {}
    b = _set(clair, decided)
    grams = np.array([r.gram for r in clair], float)
    # "paper": a_k = 1 everywhere; the writers apply 0 outside each module's own set
    a = np.ones(len(b)) if refine == "paper" else refine_weights(grams, b, refine)
    for r in clair:
        if not r.state.get("released"):
            _restore(r)
    if refine == "paper":
        refit_without(clair, decided, options, factors=factors)
    elif refine in ("agreement", "exchangeable", "shrink"):
        for r in clair:
            _target_mean(r)
    return {r.name: a.copy() for r in clair}


def refinement_summary(results, decided, names, refine: str, weights: dict) -> dict:
    """``summary.json["refinement"]``: the mode and, per client, ``weight`` (a_k), ``agreement``
    (cos with the others' mean; None outside the set), ``relative_change`` (applied) and
    ``full_change`` (with ``a_k = 1``) over the whole adapter (None where the client's update is
    zero and the change is not: no relative change is defined), and ``why``."""
    clair = [r for r in results if r.method == "clair"]
    b = _set(clair, decided)
    grams = np.array([r.gram for r in clair], float)
    cos = agreement(grams, b)
    # the weights the writers apply: 0 outside each module's own set (per-module) or the client set
    sets = [np.asarray(r.benign if decided is None else decided, bool) for r in clair]
    a = (np.mean([np.where(b_m, weights[r.name], 0.0) for r, b_m in zip(clair, sets)], axis=0)
         if clair else np.zeros(len(names)))
    if refine == "paper":
        go = np.array([r.gram_outside for r in clair], float)
    else:
        go = grams
    applied, full = relative_changes(grams, go, b, a)
    zero = zero_updates(grams) if clair else np.zeros(len(names), bool)
    base = uncapped_weights(grams, b, refine) if clair else np.zeros(len(names))   # before the cap
    floor = floor_weight(grams, b, refine) if clair and b.sum() >= 2 else 0.0
    floor_name = "the exchangeable floor" if refine == "exchangeable" else "the shrink floor"
    per = {}
    for k, n in enumerate(names):
        ck = float(np.nan_to_num(cos[k], nan=0.0))
        # the floor decided the weight: above the agreement by more than the module mean's rounding
        floored = floor > 0 and base[k] > ck + 1e-9 * max(1.0, abs(ck))
        if not b[k] and a[k] == 0:
            why = "outside the collaborative set: keeps its own adapter"
        elif not b[k]:
            why = (f"refined in the modules whose own set (8) keeps it (mean weight {a[k]:.3g}), its own "
                   "adapter elsewhere")
        elif refine == "own":
            why = "refine='own': keeps its own adapter"
        elif refine == "paper":
            why = "refine='paper': (9) exactly" + (
                "; its own update is zero, so it receives the collaborative part alone (no relative "
                "change is defined)" if zero[k] else "")
        elif zero[k]:
            why = "its update is zero: nothing to move, it keeps its (zero) adapter"
        elif a[k] == 0:
            why = (f"its update does not agree with the others' mean (cosine {cos[k]:.3f}): keeps its "
                   "own adapter")
        elif a[k] < base[k] * (1 - 1e-9):
            why = (f"moved {a[k]:.3g} of the way to the collaborative mean, {applied[k]:.3g} of its own "
                   f"update's size: the weight {base[k]:.3g} ("
                   + (floor_name if floored else "its agreement")
                   + f") is capped so that the output moves at most that fraction of its own update "
                   f"(the mean is {full[k]:.3g}x its update away)")
        elif refine == "shrink" and floored:
            why = (f"moved {a[k]:.3g} of the way to the collaborative mean: refine='shrink' moves every "
                   f"collaborating client at least {floor:g} of the way (its agreement {ck:.3f})")
        elif refine == "exchangeable" and floored:
            why = (f"moved {a[k]:.3g} of the way to the collaborative mean: the collaborating clients look "
                   f"exchangeable (their differences look like noise), so every one moves at least "
                   f"{floor:.3g} of the way, which keeps half of the mean's noise reduction if they are noise "
                   f"(its agreement {ck:.3f})")
        else:
            why = (f"moved {a[k]:.3g} of the way to the collaborative mean: its agreement (cosine) with "
                   "the others' mean")
        undefined = zero[k] and a[k] > 0                       # a zero update moved: no relative change
        per[n] = {"weight": float(a[k]), "agreement": None if np.isnan(cos[k]) else float(cos[k]),
                  "relative_change": None if undefined else float(applied[k]),
                  "full_change": None if zero[k] else float(full[k]), "why": why}
    ex = exchangeability(grams, b) if clair and refine == "exchangeable" else None
    return {"mode": refine, "target": {"agreement": "the collaborative mean", "exchangeable": "the collaborative mean",
                                       "shrink": "the collaborative mean",
                                       "paper": "(9): own part in P_Â, the collaborative mean outside",
                                       "own": "own adapter"}[refine],
            "floor": float(floor), "exchangeability": None if ex is None else ex.as_dict(), "clients": per}
