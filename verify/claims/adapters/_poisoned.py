"""Extension finding (ours): the default client-level decision under poisoned updates.

One client of ten sends its update scaled (× 10, × 1e3, × 1e6) or sign-flipped (its ``B``, or its
``A``: the same ``-ΔW_k``, the factor reversed against the common LoRA initialization), beside one
contaminated client (an unrelated row space), in a synthetic federation whose benign clients share
a row space and a direction (``B_k = B* + noise``, CLAIR's model (3)-(4) with a common task). The
criteria, fixed before any run: at every attack the attacker is flagged, the contaminated client
is still flagged, no benign client is; and each benign client's output moves from its own adapter
no more than in the same federation without the attack (+0.05 relative Frobenius change, the
issue's tolerance), under the default refinement and under (9) (``refine="paper"``, whose ``P_Â``
is re-solved without the flagged clients). The A-side flip must be flagged as a reversed factor
(``by_reversed_init``), and no other attack as one. Every solve of (7) must reach its tolerance.

numpy only; seconds per federation.
"""
from __future__ import annotations

import numpy as np

from ...claim import SOLVES_KEY, Evidence, claim, solve_record, verdict_from

__all__: list[str] = []

PAPER = "adapters"
ATTACKS = ("x10", "x1e3", "x1e6", "flip", "flipA")
#: the criterion's tolerance on the benign clients' relative change (the issue's +0.05)
MOVE_TOL = 0.05
#: the refinements judged: the library's default and (9)
REFINES = ("exchangeable", "paper")


def _federation(seed, *, K=10, modules=4, q=48, p=40, r=4, attack=None):
    rng = np.random.default_rng(seed)
    out = {f"c{k}": {} for k in range(K)}
    for m in range(modules):
        A0 = np.linalg.qr(rng.standard_normal((p, r)))[0].T
        Bs = rng.standard_normal((q, r))
        for k in range(K):
            if k == K - 1:                                     # contaminated: its own row space
                A = np.linalg.qr(rng.standard_normal((p, r)))[0].T
            else:
                A = A0 + 0.05 * rng.standard_normal((r, p)) / np.sqrt(p)
            B = 0.02 * (Bs + rng.standard_normal((q, r)))
            if k == 0 and attack == "flipA":
                A = -A
            elif k == 0 and attack is not None:
                B = -B if attack == "flip" else B * float(attack[1:])
            out[f"c{k}"][f"layer{m}.q_proj"] = (A, B, 2.0)
    return out


class _Solve:
    def __init__(self, status, gap):
        # the summary is strict JSON: an undefined gap (NaN) reads None, and must fail the certificate
        self.status, self.relative_gap = status, float("nan") if gap is None else float(gap)


def _task(*, seed, attack):
    from lowrank_fl.adapters import ModuleOptions, aggregate_factors

    rec, solves = {}, []
    for refine in REFINES:
        res = aggregate_factors(_federation(seed, attack=None if attack == "none" else attack),
                                ModuleOptions(output_dtype="float64"), refine=refine)
        s = res.summary
        for m in s["modules"].values():
            solves.append(solve_record(_Solve(m["status"], m["relative_gap"]), tol=1e-6,
                                       what=f"program (7), attack {attack}"))
            if m["refit"] is not None:
                solves.append(solve_record(_Solve(m["refit"]["status"], m["refit"]["relative_gap"]),
                                           tol=1e-6, what=f"program (7) without the flagged, {attack}"))
        rec[refine] = {"flagged": s["detection"]["flagged"],
                       "reversed": s["detection"]["updates"]["by_reversed_init"],
                       "moves": {n: c["relative_change"] for n, c in s["refinement"]["clients"].items()}}
    rec[SOLVES_KEY] = solves
    return rec


def _verdict(rows: dict) -> bool:
    ok = True
    for attack, rec in rows.items():
        for refine in REFINES:
            want = ["c9"] if attack == "none" else ["c0", "c9"]
            ok &= rec[refine]["flagged"] == want
            ok &= rec[refine].get("reversed") == (["c0"] if attack == "flipA" else [])
            clean = rows["none"][refine]["moves"]
            ok &= all(rec[refine]["moves"][n] <= clean[n] + MOVE_TOL for n in (f"c{k}" for k in range(1, 9)))
    return bool(ok)


@claim("adapters.poisoned.scaled_or_flipped", paper=PAPER,
       reference="extension of (8)-(9) (lowrank_fl.adapters.detect_updates, plan)",
       statement="Extension finding (ours): a client sending its update scaled by 10, 1e3 or 1e6, or "
                 "sign-flipped (through B or A), is flagged by the default rule beside a contaminated client, "
                 "no benign client is, and the benign clients' outputs move no more than without the attack.",
       kind="comparison")
def _poisoned(ctx) -> Evidence:
    reps = ctx.pick(smoke=1, quick=2, full=4)
    grid = [{"attack": a} for a in ("none",) + ATTACKS]
    out = ctx.map(_task, grid, replicates=reps)
    per_rep = [{g["attack"]: out[i][j] for i, g in enumerate(grid)} for j in range(reps)]
    oks = [_verdict(rows) for rows in per_rep]
    table = []
    for i, g in enumerate(grid):
        for refine in REFINES:
            worst = max(max(out[i][j][refine]["moves"][f"c{k}"] - per_rep[j]["none"][refine]["moves"][f"c{k}"]
                            for k in range(1, 9)) for j in range(reps))
            table.append({"attack": g["attack"], "refine": refine,
                          "flagged": sorted({n for j in range(reps) for n in out[i][j][refine]["flagged"]}),
                          "worst_benign_move_minus_clean": worst})
    return Evidence(
        verdict=verdict_from(all(oks)),
        summary=f"{sum(oks)}/{reps} federations meet every criterion (attacker and contaminated flagged "
                f"at every attack, no benign client, benign moves within +{MOVE_TOL} of the clean run)",
        measured={"per_federation_ok": oks, "table": table},
        predicted={"flagged": "['c0', 'c9'] under every attack, ['c9'] without",
                   "benign move - clean": f"<= {MOVE_TOL}"},
        table=table,
        notes="c0 is the attacker, c9 the contaminated client (unrelated row space); the benign clients "
              "share a row space and a direction. A sign flip is visible only because they share a "
              "direction: where benign updates share only a row space (independent B_k), -ΔW_k has the "
              "distribution of ΔW_k and no statistic of the updates can see it (tests/test_adapters_updates.py); "
              "a flip through A still shows, as A reversed against the common initialization "
              "(tests/test_adapters_init_reversal.py).")
