"""CLAIR's outputs in the split layout: one shared adapter, and each client's own part.

For a collaborative client ``k`` with weight ``a_k`` in [0, 1], the refined update is

    ΔW̃_k = ΔW_k (I - a_k (I - P_Â)) + a_k ΔW̄_Ĉ (I - P_Â)

(``a_k = 1``: the paper's (9), ``ΔW_k P_Â + ΔW̄_Ĉ (I - P_Â)``; ``a_k = 0``: the client's own
adapter). The second term is common to the collaborative set, so it is written once:

* ``OUT/shared/``: per module ``ΔW̄_Ĉ (I - P_Â)`` as the concatenation of the collaborative
  clients' factors, ``B = [c_k s_k B_k / |Ĉ|]_k``, ``A = [A_k (I - P_Â) / c_k]_k`` (``c_k``
  balances the two blocks' norms, for float16) (rank ``Σ_{k∈Ĉ} r_k``,
  at most the inputs' total rank, so the file is at most the inputs' size; where that exceeds
  ``min(out, in)``, the same product at rank ``min(out, in)``,
  :func:`lowrank_fl.linalg.compact_factors`);
* ``OUT/<client>/``: the client's own part, rank ``r_k``: ``B = s_k B_k``,
  ``A = A_k - a_k A_k (I - P_Â)``, and the manifest :data:`MANIFEST` with the weight of the
  shared part per module (``a_k``, 0 where the client is outside the module's ``Ĉ``; one number
  when it is the same in every module).

``A_k (I - P_Â) = A_k - (X_k Z)(V Z)^T`` with ``P_Â = V Z Z^T V^T``, ``X_k = A_k V``: the writer
needs only the clients' factors (read again, module by module) and the module's small
``X Z`` (K × r × rank) and ``V Z`` (in × rank), never the bases ``U``, ``V``. The sum is exact
given ``P_Â`` (also with ``--energy``, where the merged layout uses the truncated coordinates).
Loading in PEFT: :mod:`lowrank_fl.adapters.peft_load`.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..linalg import compact_factors
from .io import SPLIT_MANIFEST, AdapterError, ModuleFactors

__all__ = ["LAYOUTS", "DEFAULT_LAYOUT", "SHARED", "MANIFEST", "shared_weights", "client_part",
           "shared_part", "shared_used", "keep_split_state", "fold_weights", "write_manifest", "read_manifest"]

#: output layouts of CLAIR: "split" (``OUT/shared/`` + each client's part) or "merged" (one
#: adapter per client holding (9), rank up to min(r_k + Σ r_k, out, in): its size grows like K²)
LAYOUTS = ("split", "merged")
DEFAULT_LAYOUT = "split"
#: the shared adapter's directory in ``OUT``
SHARED = "shared"
#: the manifest in each client's output directory of the split layout
MANIFEST = SPLIT_MANIFEST


def _some(items: list, n: int) -> str:
    """The first ``n`` of ``items``, and how many more there are."""
    more = len(items) - n
    return ", ".join(map(repr, items[:n])) + (f" and {more} more" if more > 0 else "")


def shared_weights(weights, names: list, modules: list) -> dict:
    """``{module: (K,) float array}`` of the weights ``a_k`` in [0, 1] from ``weights``:

    None (1 everywhere: (9)); a number; a (K,) array-like (the same in every module); a mapping
    client name → number; or a mapping module → (K,) array-like or (client name → number) (each
    module given)."""
    K = len(names)

    def vector(w, where):
        if isinstance(w, Mapping):
            unknown = sorted(set(w) - set(names))
            if unknown:
                also = (f" (a mapping by module names every module; modules are {_some(list(modules), 3)})"
                        if where == "shared_weights" else "")
                raise ValueError(f"{where}: unknown client(s) {_some(unknown, 3)}; clients are "
                                 f"{_some(list(names), 5)}{also}")
            missing = [n for n in names if n not in w]
            if missing:
                raise ValueError(f"{where}: no weight for client(s) {_some(missing, 3)}")
            w = [w[n] for n in names]
        try:
            v = np.asarray(w, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: not numbers ({w!r:.80})") from None
        given = v
        if v.ndim == 0:
            v = np.full(K, float(v))
        if v.shape != (K,):
            raise ValueError(f"{where}: expected one weight per client ({K}), got shape {v.shape}")
        ok = np.isfinite(v) & (v >= 0) & (v <= 1)
        if not ok.all():
            bad = (f"{float(given):g}" if given.ndim == 0 else
                   ", ".join(f"{n}: {x:g}" for n, x in zip(names, v) if not 0 <= x <= 1)[:200])
            raise ValueError(f"{where}: weights must lie in [0, 1], got {bad}")
        return v

    if weights is None:
        return {m: np.ones(K) for m in modules}
    if isinstance(weights, Mapping) and weights and set(weights) <= set(modules) \
            and not set(weights) & set(names):
        missing = [m for m in modules if m not in weights]
        if missing:
            raise ValueError(f"shared_weights: no weights for module(s) {missing[:3]}")
        return {m: vector(weights[m], f"shared_weights[{m!r}]") for m in modules}
    v = vector(weights, "shared_weights")
    return {m: v for m in modules}


def _need_split_state(res) -> None:
    if res.method != "clair":
        raise ValueError(f"module {res.name!r}: the split layout is CLAIR's (method {res.method!r} "
                         "has one output)")
    if res.state.get("released") or "XZ" not in res.state:
        raise RuntimeError(f"module {res.name!r}: its output state was released; aggregate again")


def _projected_out(res, f: ModuleFactors, k: int) -> np.ndarray:
    """``A_k (I - P_Â) = A_k - (X_k Z)(V Z)^T`` (r_k, in), float64."""
    r = f.ranks[k]
    XZ = res.state["XZ"][k, :r]                               # (r_k, rank) = A_k V Z
    return f.A[k] - XZ @ np.asarray(res.state["VZt"], np.float64)


def client_part(res, f: ModuleFactors, k: int, benign, weight: float, dtype) -> tuple:
    """``(B, A)`` of client ``k``'s own part: ``s_k B_k``, ``A_k - a_k A_k (I - P_Â)``; its own
    adapter where it is outside ``benign`` or ``weight`` is 0."""
    _need_split_state(res)
    B = f.scaling[k] * f.B[k]
    if not benign[k] or weight == 0:
        return B.astype(dtype), f.A[k].astype(dtype)
    return B.astype(dtype), (f.A[k] - weight * _projected_out(res, f, k)).astype(dtype)


def shared_part(res, f: ModuleFactors, benign, dtype) -> tuple:
    """``(B, A)`` of ``ΔW̄_Ĉ (I - P_Â)`` over the clients in ``benign``, concatenated (a zero
    rank-1 update when the set is empty)."""
    _need_split_state(res)
    idx = np.flatnonzero(np.asarray(benign, bool))
    q, p = f.shape
    if idx.size == 0:
        return np.zeros((q, 1), dtype), np.zeros((1, p), dtype)
    Bs, As = [], []
    for k in idx:
        Bk, Ak = (f.scaling[k] / idx.size) * f.B[k], _projected_out(res, f, k)
        # balanced: both factors get the same Frobenius norm (a product-preserving rescaling that
        # keeps small values, 1/|Ĉ| and A_k (I - P_Â), away from float16's underflow)
        nb, na = np.linalg.norm(Bk), np.linalg.norm(Ak)
        c = np.sqrt(na / nb) if nb > 0 and na > 0 else 1.0
        Bs.append(Bk * c)
        As.append(Ak / c)
    B, A = compact_factors(np.hstack(Bs), np.vstack(As))
    return B.astype(dtype), A.astype(dtype)


def keep_split_state(res) -> None:
    """Keep only what the split layout needs (``Z``, ``X Z``, ``V Z``; a few hundred kB per
    module), dropping the bases ``U``, ``V`` and the coordinates: the merged outputs
    (:meth:`ModuleResult.outputs`) then raise."""
    _need_split_state(res)
    st = res.state
    res.state = {k: st[k] for k in ("Z", "XZ", "VZt") if k in st}
    res.state["split_only"] = True


def fold_weights(per_module: dict):
    """One number when every module has the same weight, else ``{module: weight}``."""
    vals = set(per_module.values())
    return vals.pop() if len(vals) == 1 else dict(per_module)


def shared_used(applied: dict) -> bool:
    """Whether some client's output includes the shared part: a weight above 0 in some module of
    ``applied`` (``{client: {module: a}}``, 0 outside a module's set); ``refine="own"``, or
    nobody in a collaborative set, leaves it unused, and it is then not written."""
    return any(a > 0 for per in applied.values() for a in per.values())


def write_manifest(client_dir, client: str, weights: dict, shared: bool = True) -> None:
    """The client's :data:`MANIFEST`: the shared adapter's place (null where no client uses it,
    ``shared=False``, and it was not written) and its weight per module."""
    doc = {"layout": "split", "client": client, "shared": f"../{SHARED}" if shared else None,
           "shared_weight": fold_weights(weights),
           "note": ("the client's update is this adapter plus shared_weight times ../shared "
                    "(lowrank_fl.adapters.peft_load.load_split)" if shared else
                    "the client's update is this adapter: no client uses a shared part, none was written")}
    (Path(client_dir) / MANIFEST).write_text(json.dumps(doc, indent=1))


def read_manifest(client_dir) -> dict:
    """The manifest of a split-layout client directory (an error naming it when absent)."""
    path = Path(client_dir) / MANIFEST
    if not path.is_file():
        raise AdapterError(f"{client_dir}: no {MANIFEST}; not a client directory of a split-layout "
                           "output (a merged output's client directory is a plain PEFT adapter)")
    doc = json.loads(path.read_text())
    if doc.get("layout") != "split" or "shared_weight" not in doc:
        raise AdapterError(f"{path}: not a lowrank-fl split-layout manifest")
    return doc

