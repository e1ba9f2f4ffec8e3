"""How often the raw-distance statistic (``client_rule="raw"``) and the update rule flag somebody in
clean federations: every client one shared unit direction per module plus noise of norm 0.5 (d =
200), the whole update scaled by ``exp(σ z_k)`` (honest sizes spread as uneven training spreads
them), 6 modules, dense Grams. No client is contaminated, so every federation with a flag is a
false alarm; the raw statistic's c_K is a 1 % level only for normal scores (README, "The
raw-distance statistic"). The update rule gets no row-space evidence here (outside shares 0).

Usage::

    python benchmarks/bench_raw_statistic_null.py [--federations 400] [--seed 7]
"""
from __future__ import annotations

import argparse
import warnings

import numpy as np

from lowrank_fl.adapters.detect import raw_flags
from lowrank_fl.adapters.detect_updates import update_flags


def false_alarms(K: int, sigma: float, n: int, rng, modules: int = 6, d: int = 200) -> tuple[float, float]:
    """(raw, updates): the share of ``n`` clean federations of ``K`` clients where each flags somebody."""
    raw = upd = 0
    for _ in range(n):
        sizes = np.exp(sigma * rng.standard_normal(K))
        U = []
        for _ in range(modules):
            s = rng.standard_normal(d)
            U.append(sizes[:, None] * (s / np.linalg.norm(s) + 0.5 * rng.standard_normal((K, d)) / np.sqrt(d)))
        G = np.einsum("mkd,mjd->mkj", np.array(U), np.array(U))
        raw += bool(raw_flags(G).any())
        upd += bool(update_flags(G, np.zeros((modules, K))).any())
    return raw / n, upd / n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--federations", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    warnings.simplefilter("ignore", RuntimeWarning)       # near-tied t-tests of the update rule
    print("K  sigma  raw    updates")
    for K in (4, 10, 20):
        for sigma in (0.0, 0.1, 0.2, 0.3):
            r, u = false_alarms(K, sigma, args.federations, rng)
            print(f"{K:<2} {sigma:<6} {r:.3f}  {u:.3f}", flush=True)


if __name__ == "__main__":
    main()
