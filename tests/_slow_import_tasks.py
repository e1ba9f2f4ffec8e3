"""A claim whose module takes IMPORT_SECONDS to import in a worker process (as a module importing
torch does), for the test that worker start-up is not charged to a claim's time budget.

The sleep happens only in processes other than the one named by ``$SLOW_IMPORT_PARENT`` (the test
process sets it to its pid; loky workers inherit it)."""
from __future__ import annotations

import os
import time

from verify.claim import Claim, Evidence, verdict_from

IMPORT_SECONDS = 3.0
if os.environ.get("SLOW_IMPORT_PARENT") not in (None, str(os.getpid())):
    time.sleep(IMPORT_SECONDS)


def square_task(seed, x):
    return {"y": x * x}


def _squares_experiment(ctx):
    out = ctx.map(square_task, [{"x": x} for x in range(3)], replicates=2)
    ok = all(r["y"] == x * x for x, row in enumerate(out) for r in row)
    return Evidence(verdict=verdict_from(ok), summary="squares of 0, 1, 2",
                    measured={"y": [row[0]["y"] for row in out]}, predicted={"y": [0, 1, 4]})


def squares_claim(k: int) -> Claim:
    """A claim of a fraction of a second of work, over 6 tasks (so they go to the workers)."""
    return Claim(id=f"fedrep.dummy.squares{k}", paper="fedrep", reference="eq. (3)",
                 statement="Squares are squares.", kind="identity", experiment=_squares_experiment)
