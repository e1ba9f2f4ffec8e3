"""How the A-reversal test (``by_reversed_init``, :mod:`lowrank_fl.adapters.init_reversal`) reads
trained adapter sets: per set, the modules tested, the lowest row cosine of any client with the
typical ``A`` (after matching), the lowest mean row cosine, and whom the flag names (every client
of these sets trained from the common initialization, so any name is a false flag). Then each set
again with its first client's ``A`` sign-flipped in every module (``-ΔW``): it must be named.

Usage (sets are built, or read from the cache, as ``bench_trained_detection.py`` builds them)::

    python benchmarks/bench_init_reversal.py --families gpt2-uneven llama-personal --seeds 6000 6001 [--cache DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from lowrank_fl.adapters.init_reversal import init_cosines, reversed_init_flags
from lowrank_fl.nn.trained_families import FAMILIES, family_settings
from lowrank_fl.nn.trained_sets import trained_set


def read_set(factors: dict, flip: str | None = None) -> dict:
    """The test's reading of ``{client: {module: (A, B, scaling)}}`` (``flip``: a client whose A is negated)."""
    names = sorted(factors)
    mods = sorted(factors[names[0]])
    ev = [init_cosines([(-1.0 if n == flip else 1.0) * factors[n][m][0] for n in names],
                       [factors[n][m][1] for n in names]) for m in mods]
    tested = [e for e in ev if e is not None]
    flags = reversed_init_flags(ev, len(names))
    means = np.array([e.mean for e in tested]) if tested else np.full((1, len(names)), np.nan)
    return {"tested": f"{len(tested)}/{len(mods)}",
            "lowest_mean_cosine": None if not tested else float(np.nanmin(means)),
            "flagged": [n for n, f in zip(names, flags) if f]}


def lowest_row_cosine(factors: dict) -> float:
    """The lowest matched row cosine of any client with the typical A, over the tested modules."""
    names = sorted(factors)
    ev = [init_cosines([factors[n][m][0] for n in names], [factors[n][m][1] for n in names])
          for m in sorted(factors[names[0]])]
    lows = [np.nanmin(e.lowest) for e in ev if e is not None and np.isfinite(e.lowest).any()]
    return float(min(lows)) if lows else float("nan")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", required=True, choices=list(FAMILIES))
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    ap.add_argument("--cache", type=Path, help="cache of bases and sets (default $LOWRANK_FL_CACHE/"
                    "trained_sets, else the system temporary directory)",
                    default=Path(os.environ.get("LOWRANK_FL_CACHE", tempfile.gettempdir())) / "trained_sets")
    a = ap.parse_args(argv)
    for seed in a.seeds:
        for fam in a.families:
            ts = trained_set(family_settings(fam, seed), cache_dir=a.cache)
            first = sorted(ts.factors)[0]
            rec = {"family": fam, "seed": seed, "K": len(ts.factors), **read_set(ts.factors),
                   "lowest_row_cosine": lowest_row_cosine(ts.factors),
                   "flipped_first_client_flagged": read_set(ts.factors, flip=first)["flagged"]}
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
