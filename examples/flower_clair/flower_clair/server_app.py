"""ServerApp: ClairStrategy over the rounds, then OUT/summary.json (flagged vs the truth,
per-client accuracy before/after refinement, the certificate, timings)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from lowrank_fl.adapters import ModuleOptions
from lowrank_fl.flower import ClairStrategy

from .summary_file import MARKER, foreign_summary
from .task import Settings

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = Settings.load(context.run_config)
    # every client in every round: FedAvg's sampling counts the nodes connected before it waits
    # for min_available_nodes, so a fraction of 1.0 alone can sample 2 nodes in round 1
    K = settings.n_clients
    local = settings.server_method == "local"
    options = ModuleOptions(method="fedavg" if local else settings.server_method, rank_out=settings.rank_out or None)
    # CLAIR's own options only where the method is CLAIR (another method warns about them)
    clair = dict(client_rule=settings.client_rule, refine=settings.refine) if options.method == "clair" else {}
    strategy = (LocalOnly if local else ClairStrategy)(module_options=options, **clair,
                                                       min_available_nodes=K, min_train_nodes=K, min_evaluate_nodes=K)
    t0 = time.perf_counter()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=settings.rounds,
                   train_config=ConfigRecord(), evaluate_config=ConfigRecord())
    wall = time.perf_counter() - t0
    summary = build_summary(strategy, settings, wall, result)
    if settings.out_dir:
        write_summary(Path(settings.out_dir), summary)


class LocalOnly(ClairStrategy):
    """The no-collaboration baseline: every client is sent its own adapter back (the round's
    records and certificate are those of an exact mean nobody receives)."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        out = super().aggregate_train(server_round, replies)
        for msg in replies:
            node = msg.metadata.src_node_id
            if node in self.rounds[server_round].participants:
                self.adapters[node] = (msg.content[self.lora_arrays_key],
                                       ConfigRecord(dict(msg.content[self.lora_config_key], adapter="own")))
        return out


def build_summary(strategy: ClairStrategy, settings: Settings, wall: float, result=None) -> dict:
    """Per round: flagged partitions (the truth is the clients' partition ids), accuracies, gap."""
    rounds = []
    for r, rec in sorted(strategy.rounds.items()):
        ev = strategy.evaluations.get(r, {})
        part = {n: int(m["partition-id"]) for n, m in ev.items()}
        rounds.append({
            "round": r,
            "flagged": sorted(part[n] for n in rec.flagged if n in part),
            "participants": sorted(part[n] for n in rec.participants if n in part),
            "modules_benign": {str(part[n]): c for n, c in rec.modules_benign.items() if n in part},
            "max_relative_gap": rec.max_relative_gap,
            "server_seconds": rec.seconds,
            "failures": len(rec.failures), "missing": len(rec.missing), "rejected": len(rec.rejected),
            # node ids (strings: unsigned 64-bit); a lost node never evaluated, so no partition id
            "failed_nodes": [str(n) for n in sorted(rec.failures)], "missing_nodes": [str(n) for n in rec.missing],
            "lost_nodes": [str(n) for n in rec.lost], "undecided_modules": list(rec.undecided),
            "abstained_modules": list(rec.abstained),
            # the clients' train metrics, averaged by the strategy (e.g. the PEFT template's
            # kept-received: the fraction of clients that kept the adapter they received)
            "train_metrics": {k: v for k, v in dict(result.train_metrics_clientapp.get(r, {})).items()
                              if "/" not in k} if result is not None else {},
            "accuracy": {str(part[n]): {"before": m["accuracy-before"], "after": m["accuracy-after"],
                                        "refined": bool(m["refined"])} for n, m in sorted(ev.items(), key=lambda x: part[x[0]])},
        })
    last = rounds[-1] if rounds else {}
    truth = [k for k in range(settings.n_clients) if settings.is_contaminated(k)]
    return {MARKER: 1, "settings": settings.to_dict(),
            "contaminated": truth, "flagged": last.get("flagged"),
            "flagged_exactly_contaminated": last.get("flagged") == truth,
            "certificate": {"max_relative_gap": max((x["max_relative_gap"] for x in rounds), default=None),
                            "tol": ModuleOptions().tol},
            "accuracy": last.get("accuracy"), "rounds": rounds, "strategy_seconds": wall,
            "lost_nodes": sorted({n for x in rounds for n in x["lost_nodes"]})}


def write_summary(out: Path, summary: dict) -> None:
    """Write ``out/summary.json``; an existing one is replaced only if this app wrote it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    if foreign_summary(path):
        raise FileExistsError(f"{path} exists and was not written by flower_clair; not replacing it")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True))
    os.replace(tmp, path)
