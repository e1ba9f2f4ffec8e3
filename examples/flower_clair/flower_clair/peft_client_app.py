"""A PEFT-native ClientApp (the template for a Hugging Face + PEFT user): a causal LM with a PEFT
LoRA adapter; the adapter the server sends goes into the ``PeftModel`` with
:func:`lowrank_fl.flower.load_adapter`, the trained LoRA goes back with
:func:`lowrank_fl.flower.adapter_record` (``get_peft_model_state_dict`` + the ``LoraConfig``).

With ``keep-better`` (default true) a client compares the adapter it received with its own last
one on its validation split and trains on from the better (``kept-received`` in its metrics, with
both validation losses). The server cuts its outputs to the clients' rank (``rank-out``, set by
``run.py --client peft``), so every adapter a client receives fits its LoRA.
"""
from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from lowrank_fl.flower import LORA_ARRAYS, LORA_CONFIG, adapter_record, factors_from_content, load_adapter

from .peft_task import accuracy, data, peft_model, train, val_loss
from .task import Settings

app = ClientApp()
_MODELS: dict = {}


def _model(settings: Settings):
    """One PeftModel per process (a SuperNode's ClientApp process serves many messages)."""
    key = (settings.seed, settings.rank)
    if key not in _MODELS:
        _MODELS[key] = peft_model(settings)
    return _MODELS[key]


def _received(msg: Message):
    """The adapter the server sent (None before any aggregation) and its kind."""
    kind = msg.content[LORA_CONFIG].get("adapter", "global")
    if len(msg.content["arrays"]) == 0:
        return None, kind
    return factors_from_content(msg.content, arrays_key="arrays", config_key=LORA_CONFIG), kind


def _own(context: Context):
    """This client's last trained adapter (its reply), kept in the context's state."""
    if "own" not in context.state.array_records:
        return None
    return factors_from_content(RecordDict({"a": context.state.array_records["own"],
                                            "c": context.state.config_records["own-config"]}),
                                arrays_key="a", config_key="c")


@app.train()
def train_(msg: Message, context: Context) -> Message:
    settings = Settings.load(context.run_config)
    partition = int(context.node_config["partition-id"])
    model = _model(settings)
    received, _ = _received(msg)
    own = _own(context)
    metrics = {"num-examples": settings.n_train}
    start = received if received is not None else own
    if received is not None and own is not None and settings.keep_better:
        load_adapter(model, own)
        metrics["val-loss-own"] = val_loss(model, settings, partition)
        load_adapter(model, received)
        metrics["val-loss-received"] = val_loss(model, settings, partition)
        keep = metrics["val-loss-received"] <= metrics["val-loss-own"]
        metrics["kept-received"] = int(keep)
        start = received if keep else own
    if start is not None:
        load_adapter(model, start)
    metrics["train-loss"] = train(model, settings, partition, int(msg.content["config"]["server-round"]))
    arrays, cfg = adapter_record(model, client_id=f"partition-{partition:04d}")
    context.state["own"], context.state["own-config"] = arrays, cfg
    return Message(content=RecordDict({LORA_ARRAYS: arrays, LORA_CONFIG: cfg, "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


@app.evaluate()
def evaluate_(msg: Message, context: Context) -> Message:
    settings = Settings.load(context.run_config)
    partition = int(context.node_config["partition-id"])
    model = _model(settings)
    received, kind = _received(msg)
    test = data(settings, partition, "test")
    own = _own(context)
    before = after = float("nan")
    if own is not None:
        load_adapter(model, own)
        before = accuracy(model, test)
    if received is not None:
        load_adapter(model, received)
        after = accuracy(model, test)
    metrics = MetricRecord({"num-examples": settings.n_test, "accuracy-before": before, "accuracy-after": after,
                            "partition-id": partition, "refined": int(kind == "refined"),
                            "contaminated": int(settings.is_contaminated(partition))})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
