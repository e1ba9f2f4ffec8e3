"""A lost node and a small federation: the guard on collaborative sets (lowrank_fl.adapters.guard)
and ClairStrategy's failed / missing / lost nodes, on hand-made Messages (no engine)."""
import json
import warnings

import numpy as np
import pytest

from lowrank_fl.adapters import ModuleOptions, aggregate_factors, factors_from_state_dict, guard
from lowrank_fl.adapters.decision import detection_sentence
from lowrank_fl.adapters.synthetic import write_synthetic_adapters

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from lowrank_fl.flower import ClairStrategy, factors_from_content, factors_record  # noqa: E402

RULES = ("per-module", "majority", "any", "pooled")
F64 = ModuleOptions(output_dtype="float64")
NODES = [101, 202, 303, 404]              # the last is the contaminated client
C = "c3"


# ---------------------------------------------------------------- the guard itself
def test_guard_sets():
    assert [guard.majority_size(K) for K in (1, 2, 3, 4, 5, 10)] == [1, 2, 2, 3, 3, 6]
    T, F = True, False
    assert guard.admissible([T, T, T, F]) and not guard.admissible([T, T, F, F])    # K = 4: 3 needed
    assert guard.admissible([T, T, F]) and not guard.admissible([F, F, T])          # K = 3: 2
    assert not guard.admissible([T, F])                                             # never one client
    np.testing.assert_array_equal(guard.guard_set(np.array([F, F, F, T])), [F, F, F, F])
    np.testing.assert_array_equal(guard.guard_set(np.array([T, T, F, T, T])), [T, T, F, T, T])
    assert guard.is_undecided(np.zeros(4, bool)) and not guard.is_undecided(np.array([F, T]))
    np.testing.assert_array_equal(guard.abstain([[F, F, F], [T, F, T]]), [[T, T, T], [T, F, T]])
    assert list(guard.decided_modules({"a": [F, F], "b": [T, T]})) == ["b"]
    with pytest.raises(ValueError, match="benign must be a non-empty 1-D bool array"):
        guard.admissible([1, 0, 1])
    with pytest.raises(ValueError, match="K must be an int >= 1"):
        guard.majority_size(0)


# ---------------------------------------------------------------- the K = 4 split of the issue
@pytest.fixture(scope="module")
def k4(tmp_path_factory):
    """4 clients (the last contaminated): 4 synthetic modules where (8) excludes it, and a module
    ``x`` whose set (8) is the contaminated client alone. In ``x`` the benign updates differ from
    a shared part in three orthogonal rank-one directions X_i Y_i^T and the contaminated update
    sits between them, the rank-one a b^T along their normalised sums with the closest norm (1/3):
    it is nearer every benign client (‖a b^T − X_i Y_i^T‖ = √(8/9)) than they are to each other
    (√2), so it alone collects a majority of votes. Every update is exactly rank 2 (no tie in its
    SVD), and the votes do not change under 1e-4 perturbations of the factors."""
    src = write_synthetic_adapters(tmp_path_factory.mktemp("k4"), n_clients=4, n_layers=2,
                                   modules=("q_proj", "v_proj"), shape=(24, 20), rank=3,
                                   contaminated=1, dtype="float32", seed=3)
    clients = {f"c{k}": factors_from_state_dict(load_file(str(p / "adapter_model.safetensors")),
                                                json.loads((p / "adapter_config.json").read_text()))
               for k, p in enumerate(src)}
    rng = np.random.default_rng(1)
    Y = np.linalg.qr(rng.standard_normal((20, 4)))[0].T
    X = np.linalg.qr(rng.standard_normal((24, 4)))[0]
    shared = 3 * np.outer(X[:, 3], Y[3])
    W = [shared + np.outer(X[:, i], Y[i]) for i in range(3)]
    a, b = X[:, :3].sum(axis=1) / np.sqrt(3), Y[:3].sum(axis=0) / np.sqrt(3)
    W.append(shared + np.outer(a, b) / 3)
    for k, w in enumerate(W):
        U, s, Vt = np.linalg.svd(w)
        assert s[2] <= 1e-9 * s[0] and s[1] >= 0.1 * s[0]            # rank 2, no tie
        clients[f"c{k}"]["x"] = (Vt[:2].astype(np.float32), (U[:, :2] * s[:2]).astype(np.float32), 1.0)
    return clients


def _aggregate(clients, rule):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aggregate_factors(clients, F64, client_rule=rule)


def test_the_k4_split_is_the_issues(k4):
    """(8) itself, before the guard (its votes are in the summary): module x's set is the
    contaminated client alone, the others exclude it; "any" on those raw sets would flag every
    benign client and make the contaminated update the collaborative mean."""
    res = _aggregate(k4, "per-module")
    raw = {m: np.array(v["votes"]) >= 0.5 for m, v in res.summary["modules"].items()}
    assert raw["x"].tolist() == [False, False, False, True]
    assert all(b.tolist() == [True, True, True, False] for m, b in raw.items() if m != "x")
    assert not np.all(list(raw.values()), axis=0).any()       # unguarded "any": nobody is left
    # not a tie-break: the same set under 1e-4 perturbations of module x's factors
    for seed in range(3):
        rng = np.random.default_rng(seed)
        moved = {c: {**f, "x": (f["x"][0] + 1e-4 * rng.standard_normal(f["x"][0].shape).astype(np.float32),
                                f["x"][1], f["x"][2])} for c, f in k4.items()}
        votes = np.array(_aggregate(moved, "per-module").summary["modules"]["x"]["votes"])
        assert (votes >= 0.5).tolist() == [False, False, False, True]


@pytest.mark.parametrize("rule", RULES)
def test_every_client_rule_keeps_every_benign_client_benign(k4, rule):
    res = _aggregate(k4, rule)
    det = res.summary["detection"]
    assert set(det["flagged"]) <= {C}
    mods = res.summary["modules"]
    assert mods["x"]["benign"] == [False] * 4                    # undecided: everyone keeps own
    assert det["undecided_modules"] == ["x"] and det["modules"]["x"]["flagged"] == []
    assert "the evidence cannot decide in 1 module(s) (x)" in detection_sentence(det)
    for m, v in mods.items():                                    # no applied set is one client
        applied = np.array(v["benign_applied"])
        assert applied.sum() in (0, 3, 4), (rule, m, applied)
        assert applied[:3].all() or not applied.any(), (rule, m, applied)
    # per-module: x's own set applies, undecided, so in x every client's output is its own
    # update; the client-level rules apply their client-level set in x too
    x_applied = mods["x"]["benign_applied"]
    assert (x_applied == [False] * 4) == (rule == "per-module")
    for k in range(4):
        A, B, s = k4[f"c{k}"]["x"]
        A2, B2, _ = res.outputs[f"c{k}"]["x"]
        own = np.allclose(B2 @ A2, s * B.astype(float) @ A.astype(float), atol=1e-6)
        assert own == (not x_applied[k]), (rule, k)
    if rule != "pooled":                  # the rules over (8) flag the contaminated client
        assert det["flagged"] == [C]


# ---------------------------------------------------------------- through the strategy
def _instruction(node, server_round=1):
    msg = Message(RecordDict({}), dst_node_id=node, message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = msg.object_id      # what the grid sets when it pushes
    return msg


def _reply(instruction, factors, cid):
    arrays, cfg = factors_record(factors)
    cfg["client-id"] = cid
    return Message(RecordDict({"lora": arrays, "lora_config": cfg,
                               "metrics": MetricRecord({"num-examples": 10, "train-loss": float(cid[1:]),
                                                              "partition-id": int(cid[1:])})}),
                   reply_to=instruction)


class _Grid:
    """``get_node_ids`` of a Grid; FedAvg's sampling calls it once, then once per second while it
    waits for nodes: a wait fails here instead of hanging."""

    def __init__(self, nodes, patience=3):          # 3 looks: no waiting
        self.nodes, self.calls, self.patience = list(nodes), 0, patience

    def get_node_ids(self):
        self.calls += 1
        if self.calls > self.patience:
            raise TimeoutError(f"sampling waits for nodes ({len(self.nodes)} connected)")
        return list(self.nodes)


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    saved = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _round(st, server_round, grid, clients, *, lost=(), failed=()):
    """configure_train on ``grid``, replies from every sampled node but ``lost`` (the SuperLink's
    NODE_UNAVAILABLE error in their place) and ``failed`` (an error of their own)."""
    msgs = st.configure_train(server_round, ArrayRecord(), ConfigRecord(), grid)
    replies = []
    for msg in msgs:
        msg.metadata.__dict__["_message_id"] = msg.object_id
        node = msg.metadata.dst_node_id
        if node in lost:
            replies.append(create_message_error_unavailable_res_message(msg.metadata, "node_unavail"))
        elif node in failed:
            replies.append(Message(Error(code=0, reason="ClientApp raised"), reply_to=msg))
        elif node in clients:
            replies.append(_reply(msg, *clients[node]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st.aggregate_train(server_round, replies)
    return st.rounds[server_round]


@pytest.mark.parametrize("rule", RULES)
def test_a_benign_node_lost_mid_round(k4, rule):
    """Five nodes, a benign one killed in round 1: the round aggregates the four replies (the
    issue's K = 4 split), the node is missing and lost (not failed), no benign client is flagged,
    the global adapter is the benign clients' mean; round 2 samples the four alive nodes without
    waiting for the fifth; a node that comes back gets the collaborative mean, never the
    contaminated update."""
    gone = 505
    by_node = {n: (k4[f"c{k}"], f"c{k}") for k, n in enumerate(NODES)}
    st = ClairStrategy(module_options=F64, client_rule=rule, min_available_nodes=5, min_train_nodes=5,
                       min_evaluate_nodes=5)
    rec = _round(st, 1, _Grid(NODES + [gone]), by_node, lost={gone})
    assert rec.participants == tuple(NODES)
    assert rec.failures == {} and rec.missing == (gone,) and rec.lost == (gone,)
    assert set(rec.flagged) <= {NODES[3]} and rec.undecided == (("x",) if rule == "per-module" else ())
    assert rec.abstained == (() if rule == "per-module" else ("x",))    # the round says so either way
    assert st.lost_nodes == {gone}
    assert all(st.adapters[n][1]["adapter"] == "refined" for n in NODES[:3])
    # the global arrays: per module the mean over the applied set, never c3's update alone
    glob = factors_from_content(RecordDict({"a": st.global_adapter[0], "c": st.global_adapter[1]}),
                                arrays_key="a", config_key="c")
    delta = {m: s * B.astype(float) @ A.astype(float) for m, (A, B, s) in ((m, k4[C][m]) for m in k4[C])}
    for m, (A, B, _) in glob.items():
        assert not np.allclose(B @ A, delta[m], atol=1e-6), m
    applied = np.array(rec.summary["modules"]["x"]["benign_applied"])
    members = range(4) if not applied.any() else np.flatnonzero(applied)   # undecided: everyone
    assert len(members) >= 3
    mean = np.mean([k4[f"c{k}"]["x"][1].astype(float) @ k4[f"c{k}"]["x"][0].astype(float)
                    for k in members], axis=0)
    np.testing.assert_allclose(glob["x"][1] @ glob["x"][0], mean, atol=1e-6)
    # round 2: four alive, minimum 5 configured → samples the four, no wait
    grid = _Grid(NODES)
    msgs = st.configure_train(2, ArrayRecord(), ConfigRecord(), grid)
    assert sorted(m.metadata.dst_node_id for m in msgs) == NODES
    assert grid.calls == 3          # the minimums, FedAvg's count, sample_nodes: no wait
    assert st.min_available_nodes == 5                           # restored after sampling
    # the node comes back (same id, or a fresh one): the collaborative mean
    for node in (gone, 606):
        msgs = st.configure_evaluate(2, st.global_adapter[0], ConfigRecord(), _Grid(NODES + [node]))
        back = next(m for m in msgs if m.metadata.dst_node_id == node)
        assert back.content["lora_config"]["adapter"] == "global"
        assert back.content["arrays"] is st.global_adapter[0]
    assert st.lost_nodes == set()                                # reconnected: counted again
    # a node gone silently (no reply, no SuperLink error) between rounds does not hold round 3
    msgs = st.configure_train(3, ArrayRecord(), ConfigRecord(), _Grid(NODES[1:]))
    assert sorted(m.metadata.dst_node_id for m in msgs) == NODES[1:]


def test_failed_and_missing_are_different_and_said_once(k4, caplog):
    by_node = {n: (k4[f"c{k}"], f"c{k}") for k, n in enumerate(NODES)}
    st = ClairStrategy(module_options=F64, min_available_nodes=6, min_train_nodes=6)
    silent, broken, gone = 606, 707, 505
    with caplog.at_level("INFO", logger="flwr"):
        rec = _round(st, 1, _Grid(NODES + [gone, silent, broken]), by_node, lost={gone}, failed={broken})
    assert rec.failures == {broken: "ClientApp raised"}
    assert rec.missing == (gone, silent) and rec.lost == (gone,)
    text = caplog.text
    assert text.count("missing:") == 1 and f"{gone} (unavailable (lost))" in text and f"{silent} (no reply)" in text
    assert text.count(f"node {broken} failed") == 1 and f"node {gone} failed" not in text
    cfg = rec.config_record()
    assert cfg["lost"] == [str(gone)] and cfg["failed"] == [str(broken)] and cfg["undecided"] == []
    assert cfg["abstained"] == ["x"]                  # the pooled rule: x's own set gave no evidence


def test_client_ids_are_not_averaged(k4):
    """partition-id (an id) is dropped from the averaged train and evaluate metrics."""
    by_node = {n: (k4[f"c{k}"], f"c{k}") for k, n in enumerate(NODES)}
    st = ClairStrategy(module_options=F64)
    msgs = st.configure_train(1, ArrayRecord(), ConfigRecord(), _Grid(NODES))
    replies = [_reply(m, *by_node[m.metadata.dst_node_id]) for m in msgs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, metrics = st.aggregate_train(1, replies)
    assert "partition-id" not in metrics and metrics["train-loss"] == pytest.approx(1.5)
    ev = [Message(RecordDict({"m": MetricRecord({"num-examples": 5, "accuracy": a, "partition-id": k,
                                                 "node_id": 9})}),
                  reply_to=Message(RecordDict({}), dst_node_id=n, message_type=MessageType.EVALUATE))
          for k, (n, a) in enumerate(zip(NODES, (0.1, 0.2, 0.3, 0.4)))]
    agg = st.aggregate_evaluate(1, ev)
    assert "partition-id" not in agg and "node_id" not in agg and agg["accuracy"] == pytest.approx(0.25)
    assert st.evaluations[1][NODES[2]]["partition-id"] == 2      # each node's own metrics keep it
    with pytest.raises(ValueError, match="id_metrics must be"):
        ClairStrategy(id_metrics="partition-id")
    assert ErrorCode.NODE_UNAVAILABLE == 5


def test_a_module_nobody_trained_and_an_untrained_client_leave_the_round_running(k4, caplog):
    """Every client's lora_B of one module is zero, and client c1 is zero everywhere: the round
    aggregates (that module's outputs are zero), warns about both, and the run goes on (the module
    used to end the federation with an AdapterError)."""
    import logging

    clients = {c: dict(f) for c, f in k4.items()}
    dead = next(m for m in clients["c0"] if m != "x")
    for c in clients:
        A, B, s = clients[c][dead]
        clients[c][dead] = (A, np.zeros_like(B), s)
    clients["c1"] = {m: (A, np.zeros_like(B), s) for m, (A, B, s) in clients["c1"].items()}
    by_node = {n: (clients[f"c{k}"], f"c{k}") for k, n in enumerate(NODES)}
    st = ClairStrategy(module_options=F64, min_available_nodes=4, min_train_nodes=4)
    with caplog.at_level(logging.WARNING):
        rec = _round(st, 1, _Grid(NODES), by_node)
    assert rec.participants == tuple(NODES) and rec.summary is not None
    said = caplog.text
    assert f"1 module(s) where every client's update is zero (nobody trained them): their outputs are zero: {dead}" \
        in said
    assert f"{NODES[1]}: lora_B (or lora_A) is all zeros in every module" in said
    glob = factors_from_content(RecordDict({"a": st.global_adapter[0], "c": st.global_adapter[1]}),
                                arrays_key="a", config_key="c")
    assert not np.any(glob[dead][1] @ glob[dead][0])


def test_where_most_nodes_sent_no_update_the_round_flags_nobody(k4):
    """Three of four nodes untrained (lora_B zero everywhere): the update rule abstains in the round as
    in the command (the typical update is zero), so the one node that trained is not flagged and
    every module is undecided, not a set of the three zero clients."""
    clients = {c: ({m: (A, np.zeros_like(B), s) for m, (A, B, s) in f.items()} if c != "c0" else dict(f))
               for c, f in k4.items()}
    by_node = {n: (clients[f"c{k}"], f"c{k}") for k, n in enumerate(NODES)}
    st = ClairStrategy(module_options=F64, min_available_nodes=4, min_train_nodes=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = _round(st, 1, _Grid(NODES), by_node)
    det = rec.summary["detection"]
    assert det["untrained"] == [str(n) for n in NODES[1:]] and det["undecided"] and det["flagged"] == []
    assert rec.flagged == () and set(rec.undecided) == set(k4["c0"])


def test_strategy_options_are_checked_and_logged(caplog):
    import logging

    with pytest.raises(ValueError, match=r"scheduler must be a dask scheduler's address \('tcp://HOST:PORT'\)"):
        ClairStrategy(scheduler="notanaddress")
    for kw, match in ((dict(fraction_train=2.0), r"fraction_train must be a number in \[0, 1\], got 2.0"),
                      (dict(fraction_evaluate=-1), r"fraction_evaluate must be a number in \[0, 1\]"),
                      (dict(min_train_nodes=-1), "min_train_nodes must be an int >= 0, got -1"),
                      (dict(min_available_nodes=2.5), "min_available_nodes must be an int >= 0")):
        with pytest.raises(ValueError, match=match):
            ClairStrategy(**kw)
    st = ClairStrategy(refine="paper", client_rule="any")
    with caplog.at_level(logging.INFO):
        st.summary()
    assert "lowrank_fl: method clair, client rule any, refine paper, output split, jobs 1" in caplog.text
    # CLAIR's options given to another method: said, and ignored (the defaults: silent)
    with pytest.warns(UserWarning, match=r"^client_rule='raw' and refine='own' ignored: CLAIR's options, and "
                                         r"method 'fedavg' has no client-level decision or refinement$"):
        ClairStrategy("fedavg", client_rule="raw", refine="own")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = ClairStrategy("fedavg")
    assert (st.client_rule, st.refine) == ("updates", "exchangeable")


def test_replies_that_cannot_be_aggregated_cost_the_round_not_the_run(k4, caplog):
    """FFA-LoRA needs every client's A frozen and equal; these clients trained theirs: the round
    says why and keeps the global arrays, and the strategy goes on to the next round."""
    import logging

    by_node = {n: (k4[f"c{k}"], f"c{k}") for k, n in enumerate(NODES)}
    st = ClairStrategy(module_options=ModuleOptions(method="ffa"), min_available_nodes=4, min_train_nodes=4)
    with caplog.at_level(logging.WARNING):
        rec = _round(st, 1, _Grid(NODES), by_node)
    assert "round 1: the replies could not be aggregated (module" in caplog.text
    assert "needs the same (frozen) A" in caplog.text and "the global arrays are unchanged" in caplog.text
    assert rec.participants == tuple(NODES) and rec.summary is None and st.global_adapter is None
    assert _round(st, 2, _Grid(NODES), by_node).participants == tuple(NODES)        # the run goes on
