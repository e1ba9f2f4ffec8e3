"""CLAIR on adapters whose clients are nearly or exactly the same: the default contrasts
(``contrasts="auto"``: pairs the same to rounding are exact zeros, clients within 1e-4 of each
other solved on the dense contrasts) beside the factored form alone (``contrasts="factored"``),
in one process.

    python benchmarks/bench_near_identical.py

Two sets of K = 6 clients, 2 modules of 24 × 20 at r = 4, automatic λ, tol 1e-6:
``near`` — every client's B moved by 1e-5 (relative) from a shared one (seed 2); ``copies`` —
five byte-identical clients and one 1e-2 away (seed 0). Prints per set and form the wall seconds,
the final solves' iterations, status and certified relative gap, and the contrasts used.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from lowrank_fl.adapters import ModuleOptions, aggregate_factors


def _set(kind: str, K=6, q=24, p=20, r=4):
    rng = np.random.default_rng(2 if kind == "near" else 0)
    out = {f"c{k}": {} for k in range(K)}
    for m in range(2):
        A, B = rng.standard_normal((r, p)), rng.standard_normal((q, r))
        for k in range(K):
            E = rng.standard_normal((q, r))
            eps = 1e-5 if kind == "near" else (1e-2 if k == 0 else 0.0)
            B_k = B + eps * np.linalg.norm(B) / np.linalg.norm(E) * E
            out[f"c{k}"][f"l{m}.q_proj"] = (A.copy(), B_k, 2.0)
    return out


def main() -> None:
    warnings.simplefilter("ignore")
    for kind in ("near", "copies"):
        f = _set(kind)
        for contrasts in ("auto", "factored"):
            t = time.perf_counter()
            s = aggregate_factors(f, ModuleOptions(output_dtype="float64", contrasts=contrasts)).summary
            wall = time.perf_counter() - t
            mods = s["modules"].values()
            gaps = ", ".join(f"{float(m['relative_gap'] or 'nan'):.1e}" for m in mods)   # strict JSON: NaN is None
            print(f"{kind:6s} {contrasts:8s} {wall:7.2f} s  iterations {[m['iterations'] for m in mods]}  "
                  f"status {[m['status'] for m in mods]}  gap [{gaps}]  {sorted({m['contrasts'] for m in mods})}")


if __name__ == "__main__":
    main()
