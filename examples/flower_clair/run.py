"""Run the flower_clair app end to end on Flower's simulation engine (Ray, CPU) and write
OUTDIR/summary.json. Usage: python run.py OUTDIR [--client copying|peft] [--set KEY=VALUE ...]
(keys of task.Settings). ``--client peft`` runs the PEFT-native template (peft_client_app: a tiny
Hugging Face Llama with PEFT LoRA; the server cuts its outputs to the clients' rank)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from flower_clair.summary_file import foreign_summary   # standard library only


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--client", choices=("copying", "peft"), default="copying",
                    help="the ClientApp: the copying transformer of lowrank_fl.nn (default) or the PEFT template")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a Settings field (e.g. rounds=1); JSON values")
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            overrides[key.replace("-", "_")] = value
    out = args.out.resolve()
    path = out / "summary.json"
    if foreign_summary(path):
        ap.error(f"{path} exists and was not written by flower_clair; choose another OUT")
    overrides.setdefault("out_dir", str(out))
    overrides.setdefault("cache_dir", str(out / "backbone"))
    if args.client == "peft":
        overrides.setdefault("rank_out", overrides.get("rank", 3))
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ["FLOWER_CLAIR_SETTINGS"] = json.dumps(overrides)   # read by the apps (and Ray's workers)

    from flwr.simulation import run_simulation

    if args.client == "peft":
        from flower_clair.peft_client_app import app as client_app
    else:
        from flower_clair.client_app import app as client_app
    from flower_clair.server_app import app as server_app
    from flower_clair.task import Settings, backbone

    settings = Settings.load()
    t0 = time.perf_counter()
    if args.client == "copying":
        backbone(settings)                # pretrained once here, cached for the clients
    t_pre = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=settings.n_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    wall = time.perf_counter() - t0
    if not path.exists():
        print(f"flower_clair: the simulation wrote no {path}", file=sys.stderr)
        return 1
    summary = json.loads(path.read_text())
    summary["simulation_wall_seconds"] = wall
    summary["pretrain_seconds"] = t_pre
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True))
    os.replace(tmp, path)
    lost = [f"{sum(r[k] for r in summary.get('rounds', []))} {k}" for k in ("failures", "missing", "rejected")
            if sum(r[k] for r in summary.get("rounds", []))]
    print(f"flagged {summary['flagged']} (contaminated {summary['contaminated']}); largest relative gap "
          f"{summary['certificate']['max_relative_gap']:.2e}; simulation {wall:.1f} s; wrote {path}"
          + (f"; client replies left out over the rounds: {', '.join(lost)}" if lost else ""))
    for k, acc in sorted((summary["accuracy"] or {}).items(), key=lambda x: int(x[0])):
        print(f"  client {k}: accuracy {acc['before']:.3f} -> {acc['after']:.3f}"
              f"{'' if acc['refined'] else ' (not a refined adapter)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
