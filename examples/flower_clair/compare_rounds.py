"""The multi-round picture: the example's federation under several servers, benign and
contaminated clients' accuracy per round. Usage:
python compare_rounds.py OUT [--rounds R] [--methods clair,fedavg-factors,local] [--set KEY=VALUE ...]

Runs ``run.py OUT/<method> --set server_method=<method>`` for each method (one simulation each,
the backbone shared through OUT/backbone) and writes OUT/rounds.json and OUT/rounds.md: per round
and method the mean accuracy of the benign clients with the adapter the server sent them
(``after``; for "local" their own), its minimum, and the contaminated clients' mean.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--methods", default="clair,fedavg-factors,local")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    table = {}
    for method in args.methods.split(","):
        sets = [f"rounds={args.rounds}", f'server_method="{method}"', f'cache_dir="{out / "backbone"}"', *args.set]
        cmd = [sys.executable, str(HERE / "run.py"), str(out / method)] + [a for s in sets for a in ("--set", s)]
        print("compare_rounds:", method, flush=True)
        subprocess.run(cmd, check=True)
        summary = json.loads((out / method / "summary.json").read_text())
        bad = set(summary["contaminated"])
        rows = []
        for r in summary["rounds"]:
            acc = {int(k): v["after"] for k, v in r["accuracy"].items()}
            benign = [a for k, a in acc.items() if k not in bad]
            rows.append({"round": r["round"], "benign_mean": sum(benign) / len(benign), "benign_min": min(benign),
                         "contaminated_mean": sum(acc[k] for k in bad) / len(bad) if bad else None,
                         "flagged": r["flagged"]})
        table[method] = rows
    (out / "rounds.json").write_text(json.dumps(table, indent=2))
    lines = ["| round | " + " | ".join(table) + " |", "|---|" + "---|" * len(table)]
    for i in range(args.rounds):
        cells = []
        for rows in table.values():
            r = rows[i]
            bad = "" if r["contaminated_mean"] is None else f"; contaminated {r['contaminated_mean']:.3f}"
            cells.append(f"{r['benign_mean']:.3f} (min {r['benign_min']:.3f}{bad})")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    (out / "rounds.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
