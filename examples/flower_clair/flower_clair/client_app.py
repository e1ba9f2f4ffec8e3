"""ClientApp: local LoRA fine-tuning on the client's copying task; evaluation of the adapter the
server refined for this client (and of the client's own adapter, for comparison)."""
from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from lowrank_fl.flower import LORA_ARRAYS, LORA_CONFIG, factors_from_content, factors_record
from lowrank_fl.nn.sec8 import merged_model

from .task import Settings, backbone, combine, deltas, evaluate, train_lora

app = ClientApp()


def _received(msg: Message):
    """The adapter the server sent this client (None when it sent none yet) and its kind."""
    kind = msg.content[LORA_CONFIG].get("adapter", "global")
    if len(msg.content["arrays"]) == 0:
        return None, kind
    return factors_from_content(msg.content, arrays_key="arrays", config_key=LORA_CONFIG), kind


def _store(context: Context, name: str, factors: dict) -> None:
    arrays, cfg = factors_record(factors)
    context.state[name] = arrays
    context.state[name + "-config"] = cfg


def _load(context: Context, name: str):
    if name not in context.state.array_records:
        return None
    content = RecordDict({"a": context.state.array_records[name], "c": context.state.config_records[name + "-config"]})
    return factors_from_content(content, arrays_key="a", config_key="c")


@app.train()
def train(msg: Message, context: Context) -> Message:
    settings = Settings.load(context.run_config)
    partition = int(context.node_config["partition-id"])
    held, _ = _received(msg)
    base = merged_model(backbone(settings), deltas(held)) if held else backbone(settings)
    new = train_lora(base, settings, partition, int(msg.content["config"]["server-round"]))
    own, err = combine(held, new, settings.send_rank)   # this client's whole update
    _store(context, "own", own)
    arrays, cfg = factors_record(own)
    cfg["client-id"] = f"partition-{partition:04d}"   # a stable order for the server's solve
    content = RecordDict({LORA_ARRAYS: arrays, LORA_CONFIG: cfg,
                          "metrics": MetricRecord({"num-examples": settings.n_train, "truncation-error": err})})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_(msg: Message, context: Context) -> Message:
    settings = Settings.load(context.run_config)
    partition = int(context.node_config["partition-id"])
    received, kind = _received(msg)
    before = evaluate(settings, _load(context, "own"), partition)
    after = evaluate(settings, received, partition)
    metrics = MetricRecord({"num-examples": settings.n_test, "accuracy-before": before,
                            "accuracy-after": after, "partition-id": partition,
                            "refined": int(kind == "refined"),
                            "contaminated": int(settings.is_contaminated(partition))})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
