"""In-memory adapters (lowrank_fl.adapters.memory) against the directory path and PEFT itself."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from lowrank_fl.adapters import ModuleOptions, aggregate_to_dir, load_adapters
from lowrank_fl.adapters.io import AdapterError
from lowrank_fl.adapters.memory import aggregate_factors, factors_from_state_dict
from lowrank_fl.adapters.synthetic import write_synthetic_adapters


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    # mixed ranks: the outputs' rank patterns and the reduction's Σ r_k are exercised
    return write_synthetic_adapters(root, n_clients=5, n_layers=2, modules=("q_proj", "v_proj"),
                                    shape=(24, 20), rank=3, ranks=[3, 3, 2, 4, 3], contaminated=1,
                                    dtype="float16", seed=5)


def _from_files(paths):
    """The clients' factors read independently of the library's reader: safetensors' own loader
    and the config's lora_alpha / r."""
    clients = {}
    for p in paths:
        cfg = json.loads((p / "adapter_config.json").read_text())
        sd = load_file(str(p / "adapter_model.safetensors"))
        clients[p.name] = factors_from_state_dict(sd, cfg)
    return clients


@pytest.mark.parametrize("method,rule,rank_out,output", [("clair", "per-module", None, "merged"),
                                                          ("clair", "majority", None, "merged"),
                                                          ("clair", "any", 2, "merged"),
                                                          ("clair", "pooled", None, "split"),
                                                          ("clair", "per-module", None, "split"),
                                                          ("fedavg", "per-module", None, "merged"),
                                                          ("flexlora", "per-module", None, "merged")])
def test_in_memory_equals_directory_bit_for_bit(src, tmp_path, method, rule, rank_out, output):
    opts = ModuleOptions(method=method, rank_out=rank_out)
    weights = [1.0, 0.5, 1.0, 0.0, 1.0] if rule == "pooled" else None
    _, ref = aggregate_to_dir(load_adapters(src), opts, tmp_path / "out", client_rule=rule,
                              progress=False, output=output, shared_weights=weights)
    got = aggregate_factors(_from_files(src), opts, client_rule=rule, output=output,
                            shared_weights=weights)
    for key in ("method", "clients", "outputs", "client_benign", "rank_out_relative_error",
                "layout", "refinement_weights"):
        assert got.summary.get(key) == ref.get(key), key
    for m, a in ref["modules"].items():
        b = got.summary["modules"][m]
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
    assert list(got.outputs) == ref["outputs"]
    for name in ref["outputs"]:
        files = load_file(str(tmp_path / "out" / name / "adapter_model.safetensors"))
        assert set(files) == {f"{m}.lora_{x}.weight" for m in got.outputs[name] for x in "AB"}
        for m, (A, B, s) in got.outputs[name].items():
            assert s == 1.0
            assert np.array_equal(files[f"{m}.lora_A.weight"], A) and np.array_equal(files[f"{m}.lora_B.weight"], B)


def test_clair_in_memory_detects_the_contaminated_client(src):
    got = aggregate_factors(_from_files(src), ModuleOptions(output_dtype="float64"))
    names = got.summary["clients"]
    for m in got.summary["modules"].values():
        # clients 0-2 share the 3-dim row space; client 3 (rank 4) has a 4th direction of its
        # own (the synthetic A0[:4]), client 4 is contaminated
        assert m["benign"][:3] == [True] * 3 and m["benign"][4] is False
        assert m["status"] == "optimal"
    # the excluded client keeps its own update exactly; benign ones get (9)
    own = _from_files(src)[names[-1]]
    for m, (A, B, _) in got.outputs[names[-1]].items():
        A0, B0, s0 = own[m]
        assert np.allclose(B @ A, s0 * B0 @ A0, atol=1e-12)


def test_factors_from_state_dict_match_peft_delta_weights():
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(12, 10, bias=False)
            self.v_proj = torch.nn.Linear(12, 8, bias=False)
            self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"q_proj": torch.nn.Linear(12, 12)})])

    torch.manual_seed(0)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True,
                          rank_pattern={"v_proj": 2}, alpha_pattern={"layers.0.q_proj": 5},
                          init_lora_weights=False)
    model = peft.get_peft_model(Net(), cfg)
    mods = dict(model.named_modules())
    want = {name[len("base_model.model."):]: mod.get_delta_weight("default").detach().double().numpy()
            for name, mod in mods.items() if hasattr(mod, "get_delta_weight") and name.startswith("base_model")}
    assert len(want) == 3
    config = json.loads(json.dumps(cfg.to_dict(), default=list))
    saved = peft.get_peft_model_state_dict(model)                                # PEFT's saved keys
    live = {k: v for k, v in model.state_dict().items() if ".lora_" in k}      # with ".default."
    for sd in (saved, live):
        f = factors_from_state_dict(sd, config)
        got = {k[len("base_model.model."):]: s * B @ A for k, (A, B, s) in f.items()}
        assert got.keys() == want.keys()
        for k in want:
            assert np.allclose(got[k], want[k], rtol=1e-6, atol=1e-7), k
    # scalings: rsLoRA 8/2, v_proj 8/sqrt(2), layers.0.q_proj 5/2 (PEFT's own numbers)
    f = factors_from_state_dict(saved, config)
    scal = {k[len("base_model.model."):]: s for k, (_, _, s) in f.items()}
    assert scal == pytest.approx({"q_proj": 4.0, "v_proj": 8 / np.sqrt(2), "layers.0.q_proj": 2.5})


def test_in_memory_bad_input_is_named():
    rng = np.random.default_rng(0)
    good = {"m": (rng.standard_normal((2, 6)), rng.standard_normal((5, 2)), 1.0)}
    with pytest.raises(AdapterError, match="at least 2"):
        aggregate_factors({"a": good})
    with pytest.raises(AdapterError, match=r"client 'b', module 'm': A is \(2, 6\) and B is \(5, 3\)"):
        aggregate_factors({"a": good, "b": {"m": (good["m"][0], rng.standard_normal((5, 3)), 1.0)}})
    bad = good["m"][0].copy()
    bad[0, 0] = np.nan
    with pytest.raises(AdapterError, match="client 'b', module 'm', A: has 1 non-finite"):
        aggregate_factors({"a": good, "b": {"m": (bad, good["m"][1], 1.0)}})
    with pytest.raises(AdapterError, match="scaling must be a finite number > 0"):
        aggregate_factors({"a": good, "b": {"m": (good["m"][0], good["m"][1], -1.0)}})
    with pytest.raises(AdapterError, match="module set differs"):
        aggregate_factors({"a": good, "b": {"n": good["m"]}})
    with pytest.raises(AdapterError, match=r"\(out, in\) = \(5, 7\)"):
        aggregate_factors({"a": good, "b": {"m": (rng.standard_normal((2, 7)), good["m"][1], 1.0)}})
    with pytest.raises(AdapterError, match="not a LoRA factor"):
        factors_from_state_dict({"x.weight": np.zeros((2, 2))}, {"r": 2, "lora_alpha": 2})
    with pytest.raises(AdapterError, match="no lora_B"):
        factors_from_state_dict({"x.lora_A.weight": np.zeros((2, 2))}, {"r": 2, "lora_alpha": 2})
    with pytest.raises(ValueError, match="client_rule"):
        aggregate_factors({"a": good, "b": good}, client_rule="most")


def test_module_example_runs():
    import doctest

    from lowrank_fl.adapters import memory
    assert doctest.testmod(memory).failed == 0


@pytest.mark.parametrize("change,match", [({"use_dora": True}, r"use_dora=True \(DoRA\) is not supported"),
                                          ({"peft_type": "ADALORA"}, "peft_type is 'ADALORA'"),
                                          ({"init_lora_weights": "loftq"}, "rewrites the base weight"),
                                          ({"init_lora_weights": "pissa"}, "rewrites the base weight"),
                                          ({"r": "four"}, "field 'r' must be an integer >= 1, got 'four'"),
                                          # 0 would erase the update, a negative value flip it, silently
                                          ({"lora_alpha": 0}, r"'lora_alpha' must be a finite number > 0 .*got 0$"),
                                          ({"lora_alpha": -8}, r"'lora_alpha' must be a finite number > 0 .*got -8$"),
                                          ({"alpha_pattern": {"q_proj": 0.0}},
                                           "maps 'q_proj' to 0.0; expected a finite number > 0")])
def test_state_dict_config_refused_as_the_directory_path_refuses(src, tmp_path, change, match):
    """The same refusal, word for word after the name of the config, as read_client's."""
    from lowrank_fl.adapters.io import read_client
    sd, cfg = load_file(str(src[0] / "adapter_model.safetensors")), json.loads((src[0] / "adapter_config.json").read_text())
    bad = dict(cfg, **change)
    d = tmp_path / "c"
    d.mkdir()
    (d / "adapter_model.safetensors").write_bytes((src[0] / "adapter_model.safetensors").read_bytes())
    (d / "adapter_config.json").write_text(json.dumps(bad))
    with pytest.raises(AdapterError, match=match) as from_dir:
        read_client(d)
    with pytest.raises(AdapterError, match=match) as from_memory:
        factors_from_state_dict(sd, bad)
    assert str(from_memory.value) == "config" + str(from_dir.value)[len(str(d / "adapter_config.json")):]


def test_state_dict_config_may_be_a_lora_config_object():
    peft = pytest.importorskip("peft")
    rng = np.random.default_rng(1)
    sd = {"m.lora_A.weight": rng.standard_normal((4, 6)), "m.lora_B.weight": rng.standard_normal((5, 4))}
    cfg = peft.LoraConfig(r=4, lora_alpha=6, use_rslora=True)
    (A, B, s), = factors_from_state_dict(sd, cfg).values()
    assert s == 6 / 2 and np.array_equal(A, sd["m.lora_A.weight"])     # rsLoRA: alpha / sqrt(r)
    with pytest.raises(AdapterError, match=r"use_dora=True \(DoRA\)"):
        factors_from_state_dict(sd, peft.LoraConfig(r=4, use_dora=True))
    with pytest.raises(AdapterError, match="peft_type is 'ADALORA'"):
        factors_from_state_dict(sd, peft.AdaLoraConfig(total_step=10))
    with pytest.raises(AdapterError, match="rewrites the base weight"):
        factors_from_state_dict(sd, peft.LoraConfig(r=4, init_lora_weights="pissa"))
    with pytest.raises(AdapterError, match="a mapping or a peft LoraConfig"):
        factors_from_state_dict(sd, [("r", 4)])


def _one(seed):
    rng = np.random.default_rng(seed)
    return {"m.q_proj": (rng.standard_normal((2, 6)), rng.standard_normal((5, 2)), 1.0)}


@pytest.mark.parametrize("first, match", [
    (("", _one(0)), r"clients: client names must be strings usable as a directory name .*got ''"),
    (("a/b", _one(0)), r"clients: .* got 'a/b'"),
    ((7, _one(0)), r"clients: .* got 7"),
    (("a", {"m.q_proj": (np.ones((2, 6)) * 1j, np.ones((5, 2)), 1.0)}), "A: complex values"),
    (("a", {"m.q_proj": (np.ones((0, 6)), np.ones((5, 0)), 1.0)}), r"rank 0 \(A is \(0, 6\)\)"),
])
def test_in_memory_clients_are_checked_as_the_loaded_ones(first, match):
    from lowrank_fl.adapters import AdapterError
    with pytest.raises(AdapterError, match=match):
        aggregate_factors(dict([first, ("b", _one(1)), ("c", _one(2))]))


@pytest.mark.parametrize("kw, match", [
    (dict(output_dtype="int8"), r"output_dtype must be one of \['float32', 'float64'\]"),
    (dict(energy=1.5), r"energy must be a number in \(0, 1\]"),
    (dict(energy=0.0), r"energy must be a number in \(0, 1\]"),
])
def test_module_options_refuse_what_they_cannot_do(kw, match):
    with pytest.raises(ValueError, match=match):
        ModuleOptions(**kw)


def test_options_a_method_does_not_read_are_warned_about():
    with pytest.warns(UserWarning, match="byzantine=2 is ignored: only krum, multikrum, trimmed-mean"):
        ModuleOptions(method="clair", byzantine=2)
    clients = {"a": _one(0), "b": _one(1), "c": _one(2)}
    with pytest.warns(UserWarning, match=r"refine='paper' and shared_weights=0.5 ignored: .* 'fedavg' has none"):
        got = aggregate_factors(clients, ModuleOptions(method="fedavg"), refine="paper", shared_weights=0.5)
    plain = aggregate_factors(clients, ModuleOptions(method="fedavg"))
    for x, y in zip(got.outputs["aggregated"]["m.q_proj"][:2], plain.outputs["aggregated"]["m.q_proj"][:2]):
        np.testing.assert_array_equal(x, y)


def test_in_memory_names_need_only_be_directory_names():
    got = aggregate_factors({"site A": _one(0), "a": _one(1), "A": _one(2)}, ModuleOptions(method="fedavg"))
    assert got.summary["clients"] == ["site A", "a", "A"]
