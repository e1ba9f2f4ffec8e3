"""lowrank_fl.flower: ClairStrategy on hand-made Messages (no engine) against aggregate_factors,
the directory CLI and dense reference means; one short simulation of the example app."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from lowrank_fl.adapters import ModuleOptions, aggregate_factors, factors_from_state_dict  # noqa: E402
from lowrank_fl.adapters.synthetic import write_synthetic_adapters  # noqa: E402
from lowrank_fl.cli import main  # noqa: E402
from lowrank_fl.flower import (ClairStrategy, config_from_record, config_record,  # noqa: E402
                               factors_from_content)

ROOT = Path(__file__).resolve().parent.parent
NODES = [11, 22, 33, 44, 55, 66]          # ascending: the strategy's client order is the dirs' order
F32 = ModuleOptions(output_dtype="float32")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    # mixed ranks across clients (and lora_alpha = 2 r: scaling 2 to fold); the last is contaminated
    return write_synthetic_adapters(tmp_path_factory.mktemp("adapters"), n_clients=6, n_layers=2,
                                    modules=("q_proj", "v_proj"), shape=(24, 20), rank=3,
                                    ranks=[3, 3, 2, 3, 3, 3], contaminated=1, dtype="float32", seed=3)


def _state_and_config(path):
    return (load_file(str(path / "adapter_model.safetensors")),
            json.loads((path / "adapter_config.json").read_text()))


def _instruction(node, kind=MessageType.TRAIN):
    return Message(RecordDict({}), dst_node_id=node, message_type=kind)


def _reply(node, state, config, *, examples=10, kind=MessageType.TRAIN):
    content = RecordDict({"lora": ArrayRecord({k: Array(np.asarray(v)) for k, v in state.items()}),
                          "lora_config": config_record(config),
                          "metrics": MetricRecord({"num-examples": examples, "train-loss": float(node)})})
    return Message(content, reply_to=_instruction(node, kind))


def _replies(src, nodes=NODES, which=None):
    which = range(len(src)) if which is None else which
    return [_reply(nodes[k], *_state_and_config(src[k])) for k in which]


def _clients(src, which=None):
    which = range(len(src)) if which is None else which
    return {str(NODES[k]): factors_from_state_dict(*_state_and_config(src[k])) for k in which}


def _timeless(summary):
    """A summary without its timings."""
    out = {k: v for k, v in summary.items() if k != "seconds"}
    out["modules"] = {m: {k: v for k, v in mod.items() if k != "seconds"} for m, mod in summary["modules"].items()}
    return out


def _delta(factors):
    return {m: s * B.astype(float) @ A.astype(float) for m, (A, B, s) in factors.items()}


def _received(arrays: ArrayRecord, cfg: ConfigRecord):
    """What a client reads from the server's message: the same contract, other record name."""
    return factors_from_content(RecordDict({"arrays": arrays, "lora_config": cfg}), arrays_key="arrays")


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages take the run id of the process (a ServerApp sets it); set and restore it."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class _Grid:
    """The part of a Grid that FedAvg's sampling uses."""

    def __init__(self, nodes):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return list(self.nodes)


# ---------------------------------------------------------------- against the library's paths
def test_strategy_equals_aggregate_factors_and_the_cli(src, tmp_path):
    st = ClairStrategy(output="merged", module_options=F32)
    arrays, metrics = st.aggregate_train(1, _replies(src))
    ref = aggregate_factors(_clients(src), F32)
    rec = st.rounds[1]
    assert rec.participants == tuple(NODES)
    assert _timeless(rec.summary) == _timeless(ref.summary)
    # the directory CLI on the same adapters: every client's refined adapter bit for bit
    assert main(["adapters", "aggregate", *map(str, src), "--out", str(tmp_path / "merged"),
                 "--output", "merged"]) == 0
    cli = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert [m["benign"] for m in cli["modules"].values()] == [m["benign"] for m in rec.summary["modules"].values()]
    for k, node in enumerate(NODES):
        files = load_file(str(tmp_path / "merged" / src[k].name / "adapter_model.safetensors"))
        sent, cfg = st.adapters[node]
        assert set(sent) == set(files)
        for key in files:
            assert np.array_equal(sent[key].numpy(), files[key]), (node, key)
        assert cfg["adapter"] == ("own" if k == 5 else "refined")
    # the contaminated client (last) is flagged in every module and keeps its own update; under
    # "per-module" a client is flagged when some module excluded it (the same set here)
    sets = np.array([m["benign"] for m in ref.summary["modules"].values()])
    assert rec.flagged == tuple(n for n, keep in zip(NODES, sets.all(axis=0)) if not keep) == (NODES[5],)
    assert NODES[5] in rec.flagged and rec.modules_benign[NODES[5]] == 0
    assert rec.modules_benign == dict(zip(NODES, sets.sum(axis=0).tolist()))
    assert metrics["flagged-clients"] == len(rec.flagged) and metrics["aggregated-clients"] == 6
    assert {k for k in metrics if k.startswith("flagged/")} == {f"flagged/{NODES[5]}"}
    assert {n: metrics[f"modules-benign/{n}"] for n in NODES} == rec.modules_benign
    assert metrics["max-relative-gap"] == max(m["relative_gap"] for m in ref.summary["modules"].values())
    assert metrics["max-relative-gap"] <= F32.tol
    own = _delta(_clients(src)[str(NODES[5])])
    got = _delta(_received(*st.adapters[NODES[5]]))
    assert all(np.allclose(got[m], own[m], rtol=0, atol=1e-6 * np.abs(own[m]).max()) for m in own)
    # clients' train metrics: FedAvg's weighted mean, beside ours
    assert metrics["train-loss"] == pytest.approx(np.mean(NODES))
    assert st.rounds[1].config_record()["flagged"] == [str(n) for n in rec.flagged]


def test_global_arrays_are_the_collaborative_mean(src):
    st = ClairStrategy(output="merged", module_options=ModuleOptions(output_dtype="float64"), refine="paper")
    arrays, _ = st.aggregate_train(1, _replies(src))
    rec = st.rounds[1]
    deltas = {n: _delta(f) for n, f in _clients(src).items()}
    glob = _delta(_received(arrays, st.global_adapter[1]))
    for m, mod in rec.summary["modules"].items():
        members = [str(n) for n, b in zip(NODES, mod["benign"]) if b]
        dense = np.mean([deltas[c][m] for c in members], axis=0)      # the reference, dense 24 × 20
        assert np.allclose(glob[m], dense, rtol=0, atol=1e-12 * np.abs(dense).max())
        # eq. (9) averaged over the set: the mean of the refined updates is the same mean
        refined = np.mean([_delta(_received(*st.adapters[int(c)]))[m] for c in members], axis=0)
        assert np.allclose(refined, dense, rtol=0, atol=1e-12 * np.abs(dense).max())
    # the global factors never exceed the joint rank: no out × in matrix was re-factorized
    for key, arr in arrays.items():
        if key.endswith("lora_A.weight"):
            assert arr.numpy().shape[0] <= sum([3, 3, 2, 3, 3])


@pytest.mark.parametrize("method", ["fedavg", "krum", "median"])
def test_other_methods_send_everyone_the_aggregate(src, method):
    opts = ModuleOptions(method=method, output_dtype="float64")
    st = ClairStrategy(method, output="merged", module_options=opts)
    arrays, metrics = st.aggregate_train(1, _replies(src))
    ref = aggregate_factors(_clients(src), opts).outputs["aggregated"]
    glob = _received(arrays, st.global_adapter[1])
    for m, (A, B, _) in ref.items():
        assert np.array_equal(glob[m][0], A) and np.array_equal(glob[m][1], B)
    assert st.adapters == {} and metrics["flagged-clients"] == 0
    msgs = st.configure_train(2, arrays, ConfigRecord(), _Grid(NODES))
    assert all(m.content["arrays"] is arrays for m in msgs)


@pytest.mark.parametrize("rule", ["majority", "pooled", "per-module", "any", "raw"])
def test_client_rules_and_rank_out(src, rule):
    """Every client rule: the strategy sends each client what aggregate_factors gives it under
    the same rule, and flags the clients the rule's detection flags."""
    opts = ModuleOptions(rank_out=2, output_dtype="float64")
    st = ClairStrategy(output="merged", module_options=opts, client_rule=rule)
    st.aggregate_train(1, _replies(src))
    ref = aggregate_factors(_clients(src), opts, client_rule=rule)
    assert [str(n) for n in st.rounds[1].flagged] == ref.summary["detection"]["flagged"]
    if rule in ("majority", "pooled"):
        assert st.rounds[1].flagged == (NODES[5],)
    for n in NODES:
        got = _received(*st.adapters[n])
        for m, (A, B, _) in ref.outputs[str(n)].items():
            assert got[m][0].shape[0] <= 2
            assert np.array_equal(got[m][0], A) and np.array_equal(got[m][1], B)


def test_the_raw_rule_flags_a_scaled_client_through_the_strategy(src):
    """A client sending 4x its update (its lora_B scaled): the raw rule flags it in the strategy as in
    aggregate_factors, and the client receives its own update."""
    replies, clients = [], {}
    for k, path in enumerate(src):
        state, config = _state_and_config(path)
        if k == 2:
            state = {n: (4 * t if "lora_B" in n else t) for n, t in state.items()}
        replies.append(_reply(NODES[k], state, config))
        clients[str(NODES[k])] = factors_from_state_dict(state, config)
    opts = ModuleOptions(output_dtype="float64")
    st = ClairStrategy(output="merged", module_options=opts, client_rule="raw")
    st.aggregate_train(1, replies)
    ref = aggregate_factors(clients, opts, client_rule="raw")
    assert ref.summary["detection"]["flagged"] == [str(NODES[2])]
    assert st.rounds[1].flagged == (NODES[2],)
    got = _received(*st.adapters[NODES[2]])
    own = _delta(clients[str(NODES[2])])
    for m, (A, B, _) in ref.outputs[str(NODES[2])].items():
        assert np.array_equal(got[m][0], A) and np.array_equal(got[m][1], B)
        np.testing.assert_allclose(B @ A, own[m], rtol=1e-9, atol=1e-12)


def test_client_ids_order_the_clients(src):
    """Replies carrying ``client-id`` are aggregated in that order, whatever their node ids."""
    replies = _replies(src)
    for k, msg in enumerate(replies):
        msg.content["lora_config"]["client-id"] = f"c{len(NODES) - k}"    # reverse of the node order
    st = ClairStrategy(output="merged", module_options=F32)
    st.aggregate_train(1, replies)
    assert st.rounds[1].participants == tuple(reversed(NODES))
    rev = dict(reversed(list(_clients(src).items())))
    ref = aggregate_factors(rev, F32)
    assert _timeless(st.rounds[1].summary) == _timeless(ref.summary)


def test_jobs_are_passed_through(src):
    """Two joblib processes over the modules: the same sets and outputs as one process (to
    float32 rounding: a worker's BLAS may round differently from the main process')."""
    one, two = ClairStrategy(output="merged", module_options=F32), ClairStrategy(output="merged", module_options=F32, jobs=2)
    one.aggregate_train(1, _replies(src))
    two.aggregate_train(1, _replies(src))
    assert [m["benign"] for m in one.rounds[1].summary["modules"].values()] == \
        [m["benign"] for m in two.rounds[1].summary["modules"].values()]
    assert one.rounds[1].flagged == two.rounds[1].flagged == (NODES[5],)
    for n in NODES:
        a, b = one.adapters[n][0], two.adapters[n][0]
        assert set(a) == set(b)
        for k in a:
            x, y = a[k].numpy(), b[k].numpy()
            assert np.allclose(x, y, rtol=0, atol=1e-5 * np.abs(x).max()), (n, k)


# ---------------------------------------------------------------- the federation's realities
def test_configure_sends_each_node_its_own_adapter(src):
    st = ClairStrategy(output="merged", module_options=F32)
    initial = ArrayRecord()
    first = st.configure_train(1, initial, ConfigRecord({"lr": 0.1}), _Grid(NODES))
    assert sorted(m.metadata.dst_node_id for m in first) == NODES
    assert all(m.content["arrays"] is initial and m.content["lora_config"]["adapter"] == "global"
               and m.content["config"]["server-round"] == 1 and m.content["config"]["lr"] == 0.1
               for m in first)
    arrays, _ = st.aggregate_train(1, _replies(src))
    newcomer = 77                                 # joined after the aggregation: the global mean
    for configure, kind in ((st.configure_train, MessageType.TRAIN), (st.configure_evaluate, MessageType.EVALUATE)):
        msgs = configure(2, arrays, ConfigRecord(), _Grid(NODES + [newcomer]))
        assert len(msgs) == 7
        for msg in msgs:
            node = msg.metadata.dst_node_id
            assert msg.metadata.message_type == kind
            want = st.adapters.get(node, st.global_adapter)
            assert msg.content["arrays"] is want[0] and msg.content["lora_config"] is want[1]
        assert next(m for m in msgs if m.metadata.dst_node_id == newcomer).content["lora_config"]["adapter"] == "global"
    # refined adapters differ between clients (personalisation), and from the global one
    a, b = (_delta(_received(*st.adapters[n])) for n in NODES[:2])
    assert all(not np.allclose(a[m], b[m]) for m in a)


def test_partial_participation_dropouts_and_bad_replies(src):
    st = ClairStrategy(output="merged", module_options=F32, fraction_train=0.5, min_train_nodes=2)
    msgs = st.configure_train(1, ArrayRecord(), ConfigRecord(), _Grid(NODES))
    assert len(msgs) == 3                         # int(6 * 0.5) sampled
    st.aggregate_train(1, _replies(src))          # everyone replied anyway: all aggregated
    before = dict(st.adapters)
    # round 2: all 6 sampled; node 22 fails, node 33 never answers, node 44's reply is unreadable
    st.configure_train(2, ArrayRecord(), ConfigRecord(), _Grid(NODES))
    st._sent[2] = {n: _instruction(n) for n in NODES}   # what configure_train sent (sampling aside)
    replies = _replies(src, which=[0, 4, 5])
    replies.append(Message(Error(code=1, reason="out of memory"), reply_to=_instruction(22)))
    bad = _reply(44, *_state_and_config(src[3]))
    del bad.content["lora_config"]
    replies.append(bad)
    with pytest.warns(UserWarning, match="node 44 left out: no ConfigRecord 'lora_config'"):
        _, metrics = st.aggregate_train(2, replies)
    rec = st.rounds[2]
    assert rec.participants == (11, 55, 66) and rec.failures == {22: "out of memory"}
    assert rec.missing == (33,) and set(rec.rejected) == {44}
    assert (metrics["failed-clients"], metrics["missing-clients"], metrics["rejected-clients"]) == (1, 1, 1)
    ref = aggregate_factors(_clients(src, which=[0, 4, 5]), F32)
    assert [m["benign"] for m in rec.summary["modules"].values()] == \
        [m["benign"] for m in ref.summary["modules"].values()]
    for n in (11, 55, 66):
        got = st.adapters[n][0]
        for m, (A, B, _) in ref.outputs[str(n)].items():
            assert np.array_equal(got[f"{m}.lora_A.weight"].numpy(), A)
    for n in (22, 33, 44):                        # left out: keep what they were last sent
        assert st.adapters[n] is before[n]


def test_a_client_on_other_modules_is_rejected_not_fatal(src):
    replies = _replies(src)
    state, cfg = _state_and_config(src[2])
    replies[2] = _reply(NODES[2], {k: v for k, v in state.items() if "layers.0." not in k}, cfg)
    with pytest.warns(UserWarning, match=r"modules differ from the other clients' \(2 vs 4 modules\): lacks 2 "
                      r"module\(s\) of the other clients' \(base_model.model.model.layers.0.self_attn.q_proj"):
        arrays, _ = ClairStrategy(output="merged", module_options=F32).aggregate_train(1, replies)
    assert arrays is not None
    # same modules, one of another shape: the message names the module and both shapes
    state = dict(state)
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"
    state[key] = np.zeros((state[key].shape[0], 21), state[key].dtype)
    replies[2] = _reply(NODES[2], state, cfg)
    st = ClairStrategy(output="merged", module_options=F32)
    with pytest.warns(UserWarning, match=r"node 33 left out: module 'base_model.model.model.layers.1.self_attn"
                      r".v_proj' is 24 x 21 \(out x in\) in this reply but 24 x 20 in the other clients'"):
        st.aggregate_train(1, replies)
    assert set(st.rounds[1].rejected) == {33}


def test_fewer_than_two_readable_replies_keep_the_global(src):
    st = ClairStrategy(output="merged", module_options=F32)
    with pytest.warns(UserWarning, match="needs at least 2"):
        arrays, metrics = st.aggregate_train(1, _replies(src, which=[0]))
    assert arrays is None and metrics["aggregated-clients"] == 1 and st.adapters == {}


def test_refined_adapters_round_trip_with_rank_patterns(src):
    """Round 2 replies are the refined adapters (per-module ranks, rank_pattern/alpha_pattern):
    the contract carries the patterns and the aggregation reads the same ΔW."""
    st = ClairStrategy(output="merged", module_options=ModuleOptions(output_dtype="float64"))
    st.aggregate_train(1, _replies(src))
    replies = []
    for n in NODES:
        arrays, cfg = st.adapters[n]
        lora = config_from_record(cfg)
        ranks = {arrays[k].numpy().shape[0] for k in arrays if k.endswith("lora_A.weight")}
        if len(ranks) > 1:
            assert lora["rank_pattern"] and lora["alpha_pattern"]
        replies.append(Message(RecordDict({"lora": arrays, "lora_config": cfg}), reply_to=_instruction(n)))
    st.aggregate_train(2, replies)
    assert st.rounds[2].participants == tuple(NODES)
    with pytest.raises(Exception, match="rank"):
        cfg = dict(st.adapters[NODES[0]][1])
        cfg["rank_pattern"] = json.dumps({})
        cfg["r"] = 1
        factors_from_content(RecordDict({"lora": st.adapters[NODES[0]][0], "lora_config": ConfigRecord(cfg)}))


def test_contract_scaling_matches_peft_rules():
    rng = np.random.default_rng(0)
    state = {"base_model.model.x.lora_A.weight": rng.standard_normal((4, 5)),
             "base_model.model.x.lora_B.weight": rng.standard_normal((3, 4)),
             "base_model.model.y.lora_A.weight": rng.standard_normal((2, 5)),
             "base_model.model.y.lora_B.weight": rng.standard_normal((3, 2))}
    cfg = {"r": 4, "lora_alpha": 8, "use_rslora": True, "rank_pattern": {"y": 2}, "alpha_pattern": {"y": 3}}
    rec = config_record(cfg)
    assert config_from_record(rec) == cfg
    got = factors_from_content(RecordDict({"lora": ArrayRecord({k: Array(v) for k, v in state.items()}),
                                           "lora_config": rec}))
    assert got["base_model.model.x"][2] == 8 / 2.0 and got["base_model.model.y"][2] == pytest.approx(3 / np.sqrt(2))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="method='fedavg' but module_options.method='clair'"):
        ClairStrategy("fedavg", module_options=ModuleOptions())
    with pytest.raises(ValueError, match="method must be one of"):
        ClairStrategy("bulyan")
    assert ClairStrategy("krum").method == "krum"          # the adapters' robust baselines too
    with pytest.raises(ValueError, match="client_rule must be one of"):
        ClairStrategy(client_rule="vote")
    with pytest.raises(ValueError, match="refine"):
        ClairStrategy(refine="mean")
    with pytest.raises(ValueError, match="jobs must be"):
        ClairStrategy(jobs=0)
    with pytest.raises(TypeError, match="module_options must be"):
        ClairStrategy(module_options={"method": "clair"})
    with pytest.raises(ValueError, match="config has no 'lora_alpha'"):
        config_record({"r": 4})


def test_importing_the_library_does_not_import_flwr():
    code = ("import sys, lowrank_fl, lowrank_fl.adapters, lowrank_fl.clair; "
            "assert 'flwr' not in sys.modules, 'flwr imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.slow
def test_the_example_app_runs_on_the_simulation_engine(tmp_path):
    """examples/flower_clair end to end on Ray, at a toy size (a backbone of 20 steps: the numbers
    are not the example's; the plumbing is): every client takes part, CLAIR's decision reaches
    the clients (flagged ones evaluate their own adapter), the certificate is there."""
    pytest.importorskip("ray")
    pytest.importorskip("peft")
    out = tmp_path / "out"
    sets = ["pretrain_steps=20", "n_train=100", "n_test=40", "rounds=2"]
    proc = subprocess.run(["bash", str(ROOT / "examples" / "flower_clair" / "run.sh"), str(out),
                           *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["contaminated"] == [8, 9]
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    for r in summary["rounds"]:
        assert r["participants"] == list(range(10)) and r["failures"] == r["missing"] == 0
        assert 0 <= r["max_relative_gap"] <= 1e-6
        refined = {int(k) for k, a in r["accuracy"].items() if a["refined"]}
        # under a client-level rule ("any") a flagged client gets its own adapter back, the others a refined one
        assert sorted(set(range(10)) - refined) == r["flagged"]
        assert all(0 <= a["before"] <= 1 and 0 <= a["after"] <= 1 for a in r["accuracy"].values())
        assert set(r["modules_benign"]) == {str(k) for k in range(10)}
    assert summary["flagged"] == summary["rounds"][-1]["flagged"]
    assert summary["certificate"]["max_relative_gap"] == max(r["max_relative_gap"] for r in summary["rounds"])
    assert summary["simulation_wall_seconds"] > 0
    # the app replaces only a summary it wrote itself
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "summary.json").write_text("{}")
    sys.path.insert(0, str(ROOT / "examples" / "flower_clair"))
    try:
        from flower_clair.server_app import write_summary
        with pytest.raises(FileExistsError, match="not written by flower_clair"):
            write_summary(tmp_path / "foreign", {"flower_clair": 1})
    finally:
        sys.path.remove(str(ROOT / "examples" / "flower_clair"))
    assert (tmp_path / "foreign" / "summary.json").read_text() == "{}"
    # and the driver refuses it before it simulates anything (it used to run the whole federation first)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "flower_clair" / "run.py"),
                           str(tmp_path / "foreign")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "was not written by flower_clair; choose another OUT" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "foreign").iterdir()) == ["summary.json"]


@pytest.mark.parametrize("change,reason", [({"use_dora": True}, r"use_dora=True \(DoRA\) is not supported"),
                                           ({"init_lora_weights": "pissa"}, "rewrites the base weight"),
                                           ({"peft_type": "ADALORA"}, "peft_type is 'ADALORA'")])
def test_a_client_whose_adapter_is_not_plain_lora_is_rejected(src, change, reason):
    """config_record carries use_dora / init_lora_weights / peft_type, so the server refuses what
    the CLI refuses: the reply is 'rejected' with the reason, the others are aggregated."""
    state, cfg = _state_and_config(src[1])
    rec = config_record(dict(cfg, **change))
    assert config_from_record(rec)[next(iter(change))] == next(iter(change.values()))
    replies = _replies(src)
    replies[1] = _reply(NODES[1], state, dict(cfg, **change))
    st = ClairStrategy(output="merged", module_options=F32)
    with pytest.warns(UserWarning, match=f"node {NODES[1]} left out: .*{reason}"):
        st.aggregate_train(1, replies)
    assert set(st.rounds[1].rejected) == {NODES[1]}
    assert st.rounds[1].participants == tuple(n for n in NODES if n != NODES[1])


def test_config_record_of_a_peft_lora_config_carries_the_checked_fields():
    peft = pytest.importorskip("peft")
    rec = config_record(peft.LoraConfig(r=4, lora_alpha=8, use_dora=True).to_dict())
    assert (rec["peft_type"], rec["use_dora"], rec["init_lora_weights"]) == ("LORA", True, True)
    with pytest.raises(Exception, match="DoRA"):
        factors_from_state_dict({"m.lora_A.weight": np.ones((4, 6)), "m.lora_B.weight": np.ones((5, 4))},
                                config_from_record(rec))


# ---------------------------------------------------------------- the split layout (the default)
def _received_by(st, node):
    """What ``node`` reads from the strategy's next message (its own part plus, in the split
    layout, the round's shared part)."""
    records = {"arrays": st.adapters[node][0], "lora_config": st.adapters[node][1]}
    if node in st.shared_parts:
        records["shared"], records["shared_config"] = st.shared_parts[node]
    return factors_from_content(RecordDict(records), arrays_key="arrays")


@pytest.mark.parametrize("refine", ["agreement", "paper"])
def test_split_messages_sum_to_the_merged_adapters(src, refine):
    # the same round in both layouts: each client's own part + weight × shared part is its merged
    # refined adapter (float64, to rounding); one shared record per round; rank r_k per own part
    opts = ModuleOptions(output_dtype="float64")
    split, merged = (ClairStrategy(module_options=opts, refine=refine, output=o) for o in (None, "merged"))
    assert split.output == "split" and merged.output == "merged"
    for st in (split, merged):
        st.aggregate_train(1, _replies(src))
    assert split.rounds[1].flagged == merged.rounds[1].flagged == (NODES[5],)
    shared = {id(p) for p in split.shared_parts.values()}
    assert len(shared) == 1 and set(split.shared_parts) <= set(NODES[:5])
    if refine == "paper":                           # (9): every collaborating client weight 1
        assert set(split.shared_parts) == set(NODES[:5])
    for k, n in enumerate(NODES):
        got, want = _delta(_received_by(split, n)), _delta(_received(*merged.adapters[n]))
        for m in want:
            np.testing.assert_allclose(got[m], want[m], rtol=0, atol=1e-12 * np.abs(want[m]).max())
        if n not in split.shared_parts:              # weight 0 or flagged: its own adapter, as is
            assert "shared-weight" not in split.adapters[n][1]
        ranks = json.loads(split.adapters[n][1]["rank_pattern"]) if "rank_pattern" in split.adapters[n][1] \
            else {m: split.adapters[n][1]["r"] for m in want}
        assert {int(v) for v in ranks.values()} <= {2, 3}   # the clients' own ranks, never Σ r_k


def test_split_configure_sends_the_shared_part_and_reads_back(src):
    st = ClairStrategy(module_options=ModuleOptions(output_dtype="float64"), refine="paper")
    arrays, _ = st.aggregate_train(1, _replies(src))
    msgs = st.configure_train(2, arrays, ConfigRecord({}), _Grid(NODES))
    assert {m.metadata.dst_node_id for m in msgs} == set(NODES)
    for msg in msgs:
        node = msg.metadata.dst_node_id
        has = "shared" in msg.content.array_records
        assert has == (node in st.shared_parts) == (node != NODES[5])
        if has:
            assert msg.content.config_records["shared_config"]["adapter"] == "shared"
            assert msg.content.config_records["lora_config"]["shared-weight"] == 1.0
        got = factors_from_content(msg.content, arrays_key="arrays")
        want = _received_by(st, node)
        for m in want:
            np.testing.assert_array_equal(want[m][0], got[m][0])


def test_split_messages_errors_name_what_is_missing(src):
    st = ClairStrategy(module_options=ModuleOptions(output_dtype="float64"), refine="paper")
    st.aggregate_train(1, _replies(src))
    arrays, cfg = st.adapters[NODES[0]]
    with pytest.raises(Exception, match="split layout .* no ArrayRecord 'shared'"):
        factors_from_content(RecordDict({"arrays": arrays, "lora_config": cfg}), arrays_key="arrays")
    bad = ConfigRecord(dict(cfg))
    bad["shared-weight"] = "[1, 2]"
    with pytest.raises(Exception, match="shared-weight"):
        factors_from_content(RecordDict({"arrays": arrays, "lora_config": bad}), arrays_key="arrays")
    with pytest.raises(ValueError, match="rank_out"):
        ClairStrategy(module_options=ModuleOptions(rank_out=2), output="split")
    assert ClairStrategy(module_options=ModuleOptions(rank_out=2)).output == "merged"
    with pytest.raises(ValueError, match="output must be"):
        ClairStrategy(output="both")


def test_split_read_is_never_of_higher_rank_than_merged(src):
    # the stacked own + shared parts are compacted to the update's rank: at most the merged
    # adapter's rank per module, and the same ΔW (a PEFT client sized for the merged adapter
    # accepts the split one too)
    opts = ModuleOptions(output_dtype="float64")
    split, merged = (ClairStrategy(module_options=opts, refine="paper", output=o) for o in ("split", "merged"))
    for st in (split, merged):
        st.aggregate_train(1, _replies(src))
    for n in NODES:
        got, want = _received_by(split, n), _received(*merged.adapters[n])
        for m in want:
            assert got[m][0].shape[0] <= want[m][0].shape[0]
            np.testing.assert_allclose(_delta(got)[m], _delta(want)[m], rtol=0,
                                       atol=1e-12 * np.abs(_delta(want)[m]).max())


def test_kinds_and_refusals_of_the_split_layout(src):
    # a collaborating client with weight 0 everywhere gets its own adapter, labelled "own"; split
    # is CLAIR's; a per-module shared-weight must name exactly the adapter's modules
    st = ClairStrategy(module_options=ModuleOptions(output_dtype="float64"))
    st.aggregate_train(1, _replies(src))
    weights = st.rounds[1].summary["refinement_weights"]
    for n in NODES:
        w = weights[str(n)]
        zero = not (any(w.values()) if isinstance(w, dict) else w)
        assert (st.adapters[n][1]["adapter"] == "own") == (zero or n == NODES[5])
        assert (n in st.shared_parts) == (not zero and n != NODES[5])
    own = ClairStrategy(module_options=ModuleOptions(output_dtype="float64"), refine="own")
    own.aggregate_train(1, _replies(src))                  # every weight 0: nobody refined
    assert own.shared_parts == {} and {own.adapters[n][1]["adapter"] for n in NODES} == {"own"}
    with pytest.raises(ValueError, match="CLAIR's layout"):
        ClairStrategy("fedavg", output="split")
    assert ClairStrategy("fedavg").output == "merged"
    node = next(iter(st.shared_parts))
    cfg = ConfigRecord(dict(st.adapters[node][1]))
    cfg["shared-weight"] = json.dumps({"nonexistent": 1.0})
    content = RecordDict({"arrays": st.adapters[node][0], "lora_config": cfg,
                          "shared": st.shared_parts[node][0], "shared_config": st.shared_parts[node][1]})
    with pytest.raises(Exception, match="must name exactly the adapter's modules"):
        factors_from_content(content, arrays_key="arrays")
