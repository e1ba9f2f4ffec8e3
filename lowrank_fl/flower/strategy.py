"""``ClairStrategy``: the adapters aggregators as a Flower strategy (flwr's Message API).

Each round the strategy reads every reply's LoRA factors (:mod:`.contract`), runs
:func:`lowrank_fl.adapters.aggregate_factors` on them (CLAIR by default, any adapters method),
keeps each client's output — for CLAIR its refined adapter (9), or its own adapter when CLAIR
excluded it — and sends it back to that client, and only to it, in the next
``configure_train`` / ``configure_evaluate``. The global ArrayRecord is the unweighted mean
``ΔW̄`` of the collaborative set (8), written as LoRA factors by the ``"fedavg"`` method on that
set: exact, and like CLAIR itself computed in the reduced coordinates of the joint column and
row spaces, so no out × in matrix is ever formed (for a refined client ``k`` of the set,
``mean_k ΔW̃_k = ΔW̄_Ĉ``, eq. (9) averaged).

Sampling is FedAvg's (``fraction_train``, ``min_train_nodes``, ...). A lost node never stops or
turns the federation:

* a round aggregates the replies it has (at least two). Clients whose ClientApp replied with an
  error are *failed*; nodes that never replied, or that the SuperLink reports unavailable (its
  error reply comes from the SuperLink, not the node, and is mapped back to the node through the
  instruction it answers), are *missing* (the latter also *lost*); replies whose factors cannot
  be read are *rejected*. Each is logged once and listed in :attr:`ClairStrategy.rounds`; they
  keep the adapter they last received.
* the next rounds wait for the configured minimums less the nodes that were sent a message
  before and are not connected now, lost or gone silently (``min_available_nodes``,
  ``min_train_nodes``, ``min_evaluate_nodes``), so a gone node does not hold the federation
  forever; sampling is over the nodes connected.
* a node that comes back with its node id gets its own last adapter; a new node the global
  ArrayRecord, the collaborative mean, never a flagged client's update.
* with few clients the collaborative sets pass :mod:`lowrank_fl.adapters.guard`: a set that is
  not a strict majority decides nothing, everyone keeps their own adapter there, and the round
  lists those modules as ``undecided``.

Clients may use different ranks.
"""
from __future__ import annotations

import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING
from typing import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log
from threadpoolctl import threadpool_limits

from ..adapters import (CLIENT_RULES, DEFAULT_CLIENT_RULE, DEFAULT_REFINE, REFINE, AdapterError,
                        ModuleOptions, aggregate_factors, guard)
from ..adapters.degenerate import zero_update_notes
from ..adapters.split import SHARED
from .contract import (LORA_ARRAYS, LORA_CONFIG, SHARED_ARRAYS, SHARED_CONFIG, SHARED_WEIGHT,
                       factors_from_content, factors_record, layout_difference, shared_weight_value)

__all__ = ["ClairStrategy", "RoundRecord"]


@dataclass(frozen=True)
class RoundRecord:
    """What :class:`ClairStrategy` kept of one ``aggregate_train`` call.

    participants : tuple of int
        Node ids whose factors were aggregated, in the order of ``summary["clients"]`` (where
        each is named ``str(node_id)``): by the replies' ``client-id`` if any, then node id.
    flagged : tuple of int
        Participants CLAIR left out of the collaborative set: under a client-level ``client_rule``
        (``"updates"``, the default, ``"pooled"``, ``"raw"``, ``"majority"``, ``"any"``) its
        decision, under ``"per-module"`` the clients excluded from the set (8) of at least one
        module. Empty for the other methods.
    modules_benign : dict
        ``{node id: number of modules where it is in the set (8)}`` (CLAIR), the evidence.
    failures, rejected : dict
        ``{node id: reason}``: error replies; replies whose factors could not be read or do not
        match the others' modules.
    missing : tuple of int
        Nodes sent a TRAIN message that did not reply themselves: no reply at all, or an error
        the SuperLink sent in their place (node unavailable, reply expired). Not in ``failures``.
    lost : tuple of int
        The missing nodes the SuperLink reported unavailable (gone: no heartbeat).
    undecided : tuple of str
        Modules where the evidence could not decide (:mod:`lowrank_fl.adapters.guard`): every
        client kept its own adapter there, nobody was flagged for them (all of them when the
        client-level set was not a strict majority).
    abstained : tuple of str
        Under a client-level rule: modules whose own set (8) could not decide, so they gave no
        evidence to the rule (its set applies there).
    max_relative_gap : float
        The largest relative duality gap of the solves of (7) over the modules (0 otherwise).
    seconds : dict
        ``aggregate`` (the adapters aggregation), ``mean`` (the global mean), ``total``.
    summary : dict or None
        :func:`~lowrank_fl.adapters.aggregate_factors`' summary (``summary.json``'s content).
    """

    server_round: int
    participants: tuple
    flagged: tuple = ()
    modules_benign: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    missing: tuple = ()
    lost: tuple = ()
    undecided: tuple = ()
    abstained: tuple = ()
    max_relative_gap: float = 0.0
    seconds: dict = field(default_factory=dict)
    summary: dict | None = None

    def config_record(self) -> ConfigRecord:
        """The node ids (as strings: they are unsigned 64-bit) and the evidence, as a ConfigRecord."""
        ids = lambda nodes: [str(n) for n in nodes]          # noqa: E731
        return ConfigRecord({"participants": ids(self.participants), "flagged": ids(self.flagged),
                             "failed": ids(self.failures), "rejected": ids(self.rejected),
                             "missing": ids(self.missing), "lost": ids(self.lost),
                             "undecided": list(self.undecided), "abstained": list(self.abstained),
                             "modules-benign": [int(self.modules_benign[n]) for n in self.participants]
                             if self.modules_benign else []})


class ClairStrategy(FedAvg):
    """CLAIR (or another :data:`lowrank_fl.adapters.METHODS` aggregator) on LoRA factors,
    personalised: each client receives its own refined adapter.

    Parameters
    ----------
    method : str, optional
        An adapters method (``"clair"``, ``"fedavg"``, ``"flexlora"``, ...); default
        ``module_options.method`` (``"clair"``). Given with ``module_options`` whose method
        differs: ``ValueError``.
    module_options : ModuleOptions, optional
        Per-module options (rank of ``P_Â``, λ, ``rank_out``, output dtype, ...).
    client_rule : str, optional
        CLAIR's client-level decision (:data:`lowrank_fl.adapters.CLIENT_RULES`):
        ``"pooled"`` (one client-level set from every module's block norms,
        :mod:`lowrank_fl.adapters.detect`), ``"per-module"`` (each module its own set (8)),
        ``"majority"`` (benign in at least half of the modules), ``"any"`` (benign in all),
        ``"updates"`` (the default: the update rule, :mod:`lowrank_fl.adapters.detect_updates`), and
        ``"raw"`` (the raw-distance statistic, :func:`lowrank_fl.adapters.detect.raw_evidence`).
        Given for another method (which has no client-level decision): a warning, and ignored.
    refine : str, optional
        What a collaborating client is sent (:data:`lowrank_fl.adapters.REFINE`): ``"exchangeable"``
        (the default: toward the collaborative mean by its agreement with the others, at least
        :data:`lowrank_fl.adapters.noharm.EXCHANGEABLE_WEIGHT` where the clients look exchangeable,
        :mod:`lowrank_fl.adapters.noharm`), ``"agreement"`` (the agreement alone), ``"shrink"``
        (every weight at least :data:`lowrank_fl.adapters.noharm.SHRINK_WEIGHT`), ``"paper"``
        ((9) exactly), ``"own"``. Given for another method (no refinement): a warning, and ignored.
    output : {"split", "merged"}, optional
        CLAIR's layout (:mod:`lowrank_fl.adapters.split`); default "split", "merged" with
        ``module_options.rank_out`` (which truncates merged outputs). ``"split"``: the round's
        shared part ``ΔW̄_Ĉ (I - P_Â)`` is computed once and sent beside each refined client's own
        part (rank ``r_k``) and weight (the contract's ``"shared"`` records; the server keeps
        O(K) factors, not K adapters of rank up to ``r_k + Σ r_k``); ``"merged"``: each client's
        refined adapter as one factorization. The client reads both the same way
        (:func:`~lowrank_fl.flower.factors_from_content` returns the sum).
    jobs, scheduler
        Passed to :func:`~lowrank_fl.adapters.aggregate_factors` (joblib processes over
        modules; a dask scheduler address).
    lora_arrays_key, lora_config_key : str
        The record names of the message contract (:mod:`lowrank_fl.flower.contract`).
    **fedavg
        FedAvg's sampling and record options (``fraction_train``, ``fraction_evaluate``,
        ``min_train_nodes``, ``min_evaluate_nodes``, ``min_available_nodes``,
        ``weighted_by_key``, ``arrayrecord_key``, ``configrecord_key``,
        ``train_metrics_aggr_fn``, ``evaluate_metrics_aggr_fn``). FedAvg sizes its sample from
        the nodes connected *before* it waits for ``min_available_nodes``: for every node from
        round 1 on, set ``min_train_nodes`` (and ``min_evaluate_nodes``) to the federation's size.
        Every minimum is lowered by the nodes gone since (module docstring).
    id_metrics : tuple of str
        Client metric keys that name a client (ids), never averaged across clients; besides
        these, every key ending in ``-id`` or ``_id``. Default ``("partition-id", "client-id",
        "node-id")``.

    Attributes
    ----------
    rounds : dict
        ``{server round: RoundRecord}``.
    evaluations : dict
        ``{server round: {node id: dict of the node's evaluation metrics}}``.
    adapters : dict
        ``{node id: (ArrayRecord, ConfigRecord)}``: what each node is sent next (split layout:
        its own part, the ConfigRecord holding its ``shared-weight``).
    shared_parts : dict
        ``{node id: (ArrayRecord, ConfigRecord)}``: the shared part sent beside ``adapters``
        (split layout; one object per round, referenced by its refined nodes).
    lost_nodes : set
        Nodes the SuperLink reported unavailable and not seen connected since.
    """

    def __init__(self, method: str | None = None, *, module_options: ModuleOptions | None = None,
                 client_rule: str | None = None, refine: str | None = None, jobs: int = 1,
                 scheduler: str | None = None, lora_arrays_key: str = LORA_ARRAYS, lora_config_key: str = LORA_CONFIG,
                 id_metrics: tuple = ("partition-id", "client-id", "node-id"), output: str | None = None,
                 **fedavg) -> None:
        # FedAvg's own options, which it takes unchecked (fraction_train=2 sampled everyone)
        for name in ("fraction_train", "fraction_evaluate"):
            v = fedavg.get(name, 1.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {v!r}")
        for name in ("min_train_nodes", "min_evaluate_nodes", "min_available_nodes"):
            v = fedavg.get(name, 2)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        super().__init__(**fedavg)
        if module_options is None:
            module_options = ModuleOptions() if method is None else ModuleOptions(method=method)
        elif not isinstance(module_options, ModuleOptions):
            raise TypeError(f"module_options must be a lowrank_fl.adapters.ModuleOptions, got "
                            f"{type(module_options).__name__}")
        elif method is not None and method != module_options.method:
            raise ValueError(f"method={method!r} but module_options.method={module_options.method!r}; "
                             "give one of them")
        given = [f"{n}={v!r}" for n, v in (("client_rule", client_rule), ("refine", refine)) if v is not None]
        if given and module_options.method != "clair":
            warnings.warn(f"{' and '.join(given)} ignored: CLAIR's options, and method "
                          f"{module_options.method!r} has no client-level decision or refinement",
                          UserWarning, stacklevel=2)
        client_rule = DEFAULT_CLIENT_RULE if client_rule is None else client_rule
        refine = DEFAULT_REFINE if refine is None else refine
        if client_rule not in CLIENT_RULES:
            raise ValueError(f"client_rule must be one of {list(CLIENT_RULES)}, got {client_rule!r}")
        if refine not in REFINE:
            raise ValueError(f"refine must be one of {list(REFINE)}, got {refine!r}")
        if output not in (None, "split", "merged"):
            raise ValueError(f"output must be 'split' or 'merged', got {output!r}")
        if output == "split" and module_options.rank_out is not None:
            raise ValueError("output='split' is exact at the inputs' ranks; rank_out truncates merged "
                             "outputs: use output='merged' with it")
        if output == "split" and module_options.method != "clair":
            raise ValueError(f"output='split' is CLAIR's layout; method {module_options.method!r} sends "
                             "every client one aggregate (leave output unset)")
        output = output or ("merged" if module_options.rank_out is not None or module_options.method != "clair"
                            else "split")
        if scheduler is not None and not (isinstance(scheduler, str) and ":" in scheduler):
            raise ValueError(f"scheduler must be a dask scheduler's address ('tcp://HOST:PORT') or None, "
                             f"got {scheduler!r}")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs == 0 or jobs < -1:
            raise ValueError(f"jobs must be an int >= 1 or -1 (all cores), got {jobs!r}")
        for name, key in (("lora_arrays_key", lora_arrays_key), ("lora_config_key", lora_config_key)):
            if not isinstance(key, str) or not key:
                raise ValueError(f"{name} must be a non-empty string, got {key!r}")
        if lora_config_key == self.configrecord_key:
            raise ValueError(f"lora_config_key and configrecord_key are both {lora_config_key!r}")
        if isinstance(id_metrics, str) or not all(isinstance(k, str) for k in id_metrics):
            raise ValueError(f"id_metrics must be a tuple of metric names, got {id_metrics!r}")
        self.id_metrics = tuple(id_metrics)
        self.module_options = module_options
        self.client_rule = client_rule
        self.refine = refine
        self.output = output
        self.jobs = jobs
        self.scheduler = scheduler
        self.lora_arrays_key = lora_arrays_key
        self.lora_config_key = lora_config_key
        self.rounds: dict = {}
        self.evaluations: dict = {}
        self.adapters: dict = {}
        self.shared_parts: dict = {}             # node → (ArrayRecord, ConfigRecord) of its shared part
        self._global: tuple | None = None        # (ArrayRecord, ConfigRecord) of the last mean
        self._sent: dict = {}                    # server round → {node: TRAIN message sent}
        self.lost_nodes: set = set()
        self._seen: set = set()                  # nodes sent a message so far
        self._order: dict = {}                   # node → sort key (client-id, node id)

    @property
    def global_adapter(self) -> tuple | None:
        """``(ArrayRecord, ConfigRecord)`` of the last collaborative-set mean (None before)."""
        return self._global

    @property
    def method(self) -> str:
        return self.module_options.method

    def summary(self) -> None:
        """Log the configuration (Flower calls this when the strategy starts)."""
        super().summary()
        clair = (f", client rule {self.client_rule}, refine {self.refine}, output {self.output}"
                 if self.method == "clair" else "")
        log(INFO, "\t└──> lowrank_fl: method %s%s, jobs %s%s", self.method, clair, self.jobs,
            f", scheduler {self.scheduler}" if self.scheduler else "")

    # ------------------------------------------------------------------ sending
    def _personal(self, messages: Iterable[Message], arrays: ArrayRecord) -> list[Message]:
        """FedAvg's sampled messages with each node's own adapter in place of ``arrays``."""
        out = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            shared = msg.content
            if node in self.adapters:
                adapter, cfg = self.adapters[node]
            elif self._global is not None and arrays is self._global[0]:
                adapter, cfg = self._global
            else:                                 # the initial arrays, passed through
                adapter, cfg = arrays, ConfigRecord({"adapter": "global"})
            # FedAvg's messages share one RecordDict: each gets its own (same metadata)
            records = {self.arrayrecord_key: adapter, self.configrecord_key: shared[self.configrecord_key],
                       self.lora_config_key: cfg}
            if node in self.adapters and node in self.shared_parts:    # split: the round's shared part
                records[SHARED_ARRAYS], records[SHARED_CONFIG] = self.shared_parts[node]
            msg.content = RecordDict(records)
            out.append(msg)
        return out

    _MINIMUMS = ("min_available_nodes", "min_train_nodes", "min_evaluate_nodes")

    @contextmanager
    def _alive_minimums(self, grid):
        """FedAvg's minimums less the nodes sent a message before and not connected now (lost,
        or gone silently; at least 1), while sampling: a node that is gone must not make
        ``sample_nodes`` wait for it forever. Before the first message the configured minimums
        hold (the federation gathers)."""
        connected = set(grid.get_node_ids())
        self.lost_nodes -= connected              # back with the same id: counted again
        gone = self._seen - connected
        saved = {k: getattr(self, k) for k in self._MINIMUMS}
        if gone:
            for k, v in saved.items():
                setattr(self, k, max(1, v - len(gone)))
            if saved["min_available_nodes"] > len(connected):
                log(INFO, "configure: %d node(s) gone (%s): waiting for %d nodes, not %d",
                    len(gone), sorted(gone), self.min_available_nodes, saved["min_available_nodes"])
        try:
            yield
        finally:
            for k, v in saved.items():
                setattr(self, k, v)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid):
        """FedAvg's sampling (minimums less the lost nodes); each sampled node gets its own
        adapter (see the contract)."""
        with self._alive_minimums(grid):
            messages = list(super().configure_train(server_round, arrays, config, grid))
        self._seen.update(m.metadata.dst_node_id for m in messages)
        # the Message objects: the grid sets their message ids when it pushes them, and the
        # SuperLink's error replies name only the message they answer
        self._sent[server_round] = {m.metadata.dst_node_id: m for m in messages}
        return self._personal(messages, arrays)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid):
        """FedAvg's sampling (minimums less the lost nodes); each sampled node evaluates its own
        (refined) adapter."""
        with self._alive_minimums(grid):
            messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        self._seen.update(m.metadata.dst_node_id for m in messages)
        return self._personal(messages, arrays)

    # ------------------------------------------------------------------ aggregating
    def _read(self, valid: list[Message]) -> tuple[dict, dict, list[Message]]:
        """``{node: factors}`` of the readable replies, ``{node: reason}`` of the others, and the
        accepted messages. Replies whose modules or shapes differ from the most common ones
        are rejected (a client on another base model must not stop the round)."""
        clients, rejected, accepted = {}, {}, {}
        for msg in valid:
            node = msg.metadata.src_node_id
            try:
                clients[node] = factors_from_content(msg.content, arrays_key=self.lora_arrays_key,
                                                     config_key=self.lora_config_key)
                accepted[node] = msg
            except AdapterError as exc:
                rejected[node] = str(exc)
        self._order = {n: self._client_id(accepted[n]) for n in accepted}
        layouts = {n: tuple(sorted((m, A.shape[1], B.shape[0]) for m, (A, B, _) in f.items()))
                   for n, f in clients.items()}
        if layouts:
            common, _ = Counter(layouts.values()).most_common(1)[0]
            for n, lay in layouts.items():
                if lay != common:
                    rejected[n] = layout_difference(lay, common)
                    del clients[n], accepted[n]
        for node, reason in sorted(rejected.items()):
            log(WARNING, "aggregate_train: reply of node %s left out: %s", node, reason)
            warnings.warn(f"ClairStrategy: reply of node {node} left out: {reason}", stacklevel=3)
        return clients, rejected, [accepted[n] for n in sorted(accepted)]

    def _client_id(self, msg: Message) -> tuple:
        """Sort key of a reply: its optional ``client-id`` (a string in the LoRA ConfigRecord),
        then its node id. Node ids are drawn anew by each simulation or deployment; a stable
        ``client-id`` keeps CLAIR's pair order, and so the rounding, the same across runs."""
        cid = msg.content.config_records[self.lora_config_key].get("client-id")
        node = msg.metadata.src_node_id
        return (0, cid, node) if isinstance(cid, str) else (1, "", node)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Aggregate the replies' LoRA factors; keep each client's output; return the
        collaborative-set mean as the global ArrayRecord and a MetricRecord (see the module)."""
        t0 = time.perf_counter()
        replies = list(replies)
        valid = [m for m in replies if not m.has_error()]
        failures, missing, lost = self._absent(server_round, replies)
        clients, rejected, accepted = self._read(valid)
        nodes = sorted(clients, key=self._order.__getitem__)       # CLAIR's client order
        base = dict(server_round=server_round, participants=tuple(nodes), failures=failures,
                    rejected=rejected, missing=missing, lost=lost)
        if len(nodes) < 2:
            return self._unchanged(f"round {server_round}: {len(nodes)} readable "
                                   f"repl{'y' if len(nodes) == 1 else 'ies'}; aggregation needs at least 2, "
                                   "the global arrays are unchanged", base, t0, accepted)

        named = {str(n): clients[n] for n in nodes}
        # one BLAS thread, as the per-module solves: the outputs built here (SVDs of small
        # coordinate matrices) then round the same way in every run, whatever the machine's load
        with threadpool_limits(limits=1):
            t1 = time.perf_counter()
            split = self.method == "clair" and self.output == "split"
            try:
                res = aggregate_factors(named, self.module_options, client_rule=self.client_rule,
                                        jobs=self.jobs, scheduler=self.scheduler,
                                        output="split" if split else "merged",
                                        refine=self.refine if self.method == "clair" else None)
            except AdapterError as exc:       # the replies cannot be aggregated: the round, not the run
                return self._unchanged(f"round {server_round}: the replies could not be aggregated ({exc}); "
                                       "the global arrays are unchanged", base, t0, accepted)
            t_agg = time.perf_counter() - t1
            t1 = time.perf_counter()
            benign = self._benign_sets(res, len(nodes))
            mean = (self._collaborative_mean(named, benign) if self.method == "clair"
                    else res.outputs["aggregated"])
            t_mean = time.perf_counter() - t1
        self._global = factors_record(mean, adapter="global")
        if self.method == "clair":
            # split: the shared part once for the round, each client its own part and weight
            # (absent where no client uses it: refine="own", or every weight 0)
            shared = factors_record(res.outputs[SHARED], adapter="shared") if SHARED in res.outputs else None
            for k, n in enumerate(nodes):
                weight = res.summary["refinement_weights"][str(n)]
                # refined: in the set (8) of some module with a weight above 0 there (else its own)
                refined = any(b[k] for b in benign.values()) and bool(
                    any(weight.values()) if isinstance(weight, dict) else weight)
                arrays, cfg = factors_record(res.outputs[str(n)], adapter="refined" if refined else "own")
                self.shared_parts.pop(n, None)
                if split and (any(weight.values()) if isinstance(weight, dict) else weight):
                    cfg[SHARED_WEIGHT] = shared_weight_value(weight)
                    self.shared_parts[n] = shared
                self.adapters[n] = (arrays, cfg)
        else:                                     # one aggregate for everyone
            self.adapters.clear()
            self.shared_parts.clear()
        for note in zero_update_notes(res.summary["modules"], list(named)):
            log(WARNING, "aggregate_train: round %s: %s", server_round, note)
            warnings.warn(f"ClairStrategy: round {server_round}: {note}", stacklevel=2)
        decided = guard.decided_modules(benign)  # undecided modules flag nobody
        flagged = tuple(n for k, n in enumerate(nodes) if not all(b[k] for b in decided.values())) \
            if self.method == "clair" else ()
        undecided = tuple(m for m in benign if m not in decided)
        det = res.summary.get("detection", {})
        abstained = tuple(m for m in det.get("undecided_modules", []) if m not in undecided)
        if undecided or abstained:
            msg = (f"round {server_round}: the evidence cannot decide in {len(undecided) + len(abstained)} of "
                   f"{len(benign)} module(s) (a set that would not be a strict majority of the {len(nodes)} "
                   "clients): " + ("every client keeps its own adapter there" if undecided else
                                   f"they abstain from the {self.client_rule} rule"))
            log(WARNING, "aggregate_train: %s", msg)
            warnings.warn(f"ClairStrategy: {msg}", stacklevel=2)
        mb = ({n: int(res.summary["client_benign"]["modules_benign"][str(n)]) for n in nodes}
              if self.method == "clair" else {})
        record = RoundRecord(**base, flagged=flagged, modules_benign=mb, undecided=undecided, abstained=abstained,
                             # the solves' own floats (the summary writes NaN as None and inf as "inf")
                             max_relative_gap=float(max(r.relative_gap for r in res.aggregation.results)),
                             seconds={"aggregate": t_agg, "mean": t_mean, "total": time.perf_counter() - t0},
                             summary=res.summary)
        self.rounds[server_round] = record
        if flagged:
            log(INFO, "aggregate_train: CLAIR flagged node(s) %s", list(flagged))
        return self._global[0], self._metrics(record, accepted)

    def _unchanged(self, msg: str, base: dict, t0: float, accepted: list):
        """A round that leaves the global arrays as they were: said (log and warning), recorded."""
        log(WARNING, "aggregate_train: %s", msg)
        warnings.warn(f"ClairStrategy: {msg}", stacklevel=3)
        record = RoundRecord(**base, seconds={"total": time.perf_counter() - t0})
        self.rounds[base["server_round"]] = record
        return None, self._metrics(record, accepted)

    def _absent(self, server_round: int, replies: list) -> tuple[dict, tuple, tuple]:
        """``failures`` ``{node: reason}`` (the ClientApp's error replies), ``missing`` (sent a TRAIN
        message, no reply of its own) and ``lost`` (missing, reported unavailable by the
        SuperLink); logged once. Updates :attr:`lost_nodes`."""
        sent = self._sent.pop(server_round, {})
        by_message = {m.metadata.message_id: n for n, m in sent.items() if m.metadata.message_id}
        failures, superlink, unmapped = {}, {}, []
        for m in replies:
            if not m.has_error():
                continue
            src = m.metadata.src_node_id
            if src != SUPERLINK_NODE_ID or src in sent:        # the node's own error reply
                failures[src] = str(m.error.reason)
            elif m.metadata.reply_to_message_id in by_message:  # the SuperLink's, for that node
                superlink[by_message[m.metadata.reply_to_message_id]] = m.error
            else:
                unmapped.append(str(m.error.reason))
        answered = {m.metadata.src_node_id for m in replies if m.metadata.src_node_id not in superlink}
        missing = tuple(sorted(n for n in sent if n not in answered or n in superlink))
        lost = tuple(sorted(n for n, e in superlink.items() if e.code == ErrorCode.NODE_UNAVAILABLE))
        self.lost_nodes |= set(lost)
        for node, reason in sorted(failures.items()):
            log(WARNING, "aggregate_train: round %s: node %s failed: %s", server_round, node, reason)
        if missing:
            why = {n: ("unavailable (lost)" if n in lost else str(superlink[n].reason)) if n in superlink
                   else "no reply" for n in missing}
            log(WARNING, "aggregate_train: round %s: %d node(s) missing: %s", server_round, len(missing),
                ", ".join(f"{n} ({w})" for n, w in why.items()))
        for reason in unmapped:
            log(WARNING, "aggregate_train: round %s: a SuperLink error for no node sent this round: %s",
                server_round, reason)
        return failures, missing, lost

    def _benign_sets(self, res, K: int) -> dict:
        """``{module: bool (K,)}``: the set each module's mean and refinement used (all True for
        the non-CLAIR methods)."""
        mods = res.summary["modules"]
        if self.method != "clair":
            return {m: np.ones(K, bool) for m in mods}
        # the set each module's refinement applied under client_rule (its own (8) under "per-module")
        return {m: np.asarray(v["benign_applied"], bool) for m, v in mods.items()}

    def _collaborative_mean(self, named: dict, benign: dict) -> dict:
        """``{module: (A, B, 1.0)}`` with ``B A`` the mean of ``ΔW_k`` over each module's set,
        by the ``"fedavg"`` method on that set (reduced coordinates; modules grouped by set)."""
        names = list(named)
        groups: dict = {}
        for m, b in benign.items():
            groups.setdefault(tuple(bool(x) for x in b), []).append(m)
        opts = replace(self.module_options, method="fedavg", byzantine=None)   # fedavg reads no f
        mean = {}
        for key, mods in groups.items():
            members = [c for c, keep in zip(names, key) if keep]
            if not members:                       # undecided (adapters.guard): nobody excluded
                members = names
            if len(members) == 1:                 # the mean of one update is that update
                mean.update({m: (named[members[0]][m][0], named[members[0]][m][1] * named[members[0]][m][2], 1.0)
                             for m in mods})
                continue
            sub = {c: {m: named[c][m] for m in mods} for c in members}
            mean.update(aggregate_factors(sub, opts, jobs=self.jobs, scheduler=self.scheduler)
                        .outputs["aggregated"])
        return {m: mean[m] for m in benign}

    def _metrics(self, record: RoundRecord, accepted: list[Message]) -> MetricRecord:
        """Our round metrics (counts, certificate, timings, ``flagged/<node id>`` = 1 for each
        flagged client and ``modules-benign/<node id>`` its evidence), plus the clients'
        MetricRecords averaged as FedAvg does when every accepted reply carries exactly one with
        ``weighted_by_key``."""
        out = MetricRecord()
        contents = [m.content for m in accepted]
        if contents and all(len(c.metric_records) == 1 and self.weighted_by_key in
                            next(iter(c.metric_records.values())) for c in contents):
            out = self._without_ids(self.train_metrics_aggr_fn(contents, self.weighted_by_key))
        out.update({"aggregated-clients": len(record.participants), "flagged-clients": len(record.flagged),
                    "failed-clients": len(record.failures), "missing-clients": len(record.missing),
                    "lost-clients": len(record.lost), "undecided-modules": len(record.undecided),
                    "abstained-modules": len(record.abstained),
                    "rejected-clients": len(record.rejected), "max-relative-gap": record.max_relative_gap,
                    "aggregate-seconds": float(record.seconds.get("aggregate", 0.0)),
                    "mean-seconds": float(record.seconds.get("mean", 0.0)),
                    "server-seconds": float(record.seconds["total"])})
        # the flagged clients and the evidence, per node (node ids are unsigned 64-bit: keys,
        # not values, of a MetricRecord)
        out.update({f"flagged/{n}": 1 for n in record.flagged})
        out.update({f"modules-benign/{n}": int(v) for n, v in record.modules_benign.items()})
        return out

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        """FedAvg's weighted mean of the evaluation metrics; each node's own metrics are kept
        in :attr:`evaluations`."""
        replies = list(replies)
        per_node = {}
        for m in replies:
            if m.has_error():
                continue
            node_metrics = {}
            for rec in m.content.metric_records.values():
                node_metrics.update(dict(rec))
            per_node[m.metadata.src_node_id] = node_metrics
        self.evaluations[server_round] = per_node
        agg = super().aggregate_evaluate(server_round, replies)
        return agg if agg is None else self._without_ids(agg)

    def _is_id(self, key: str) -> bool:
        return key in self.id_metrics or key.endswith(("-id", "_id"))

    def _without_ids(self, metrics):
        """The averaged client metrics without those that name a client (an average of ids
        means nothing)."""
        if metrics is None:
            return None
        for key in [k for k in metrics if self._is_id(k)]:
            del metrics[key]
        return metrics
