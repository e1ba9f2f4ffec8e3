"""lowrank_fl.flower.peft_io: a PEFT client's adapter into and out of the message contract, against
PEFT's own get_peft_model_state_dict / set_peft_model_state_dict; the PEFT ClientApp template in
Flower's simulation (tiny config, one round)."""
import copy
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")
torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from flwr.app import RecordDict  # noqa: E402
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict  # noqa: E402

from lowrank_fl.adapters import AdapterError  # noqa: E402
from lowrank_fl.flower import (adapter_factors, adapter_record, factors_from_content,  # noqa: E402
                               factors_record, load_adapter, lora_layers)

ROOT = Path(__file__).resolve().parent.parent


def _base(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(cfg)


def _peft(config, seed=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(_base(seed), config)
    torch.manual_seed(seed + 1)
    for name, p in model.named_parameters():          # B = 0 at init: make both factors non-trivial
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model


CFG = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], lora_dropout=0.0,
                 rank_pattern={"o_proj": 2}, alpha_pattern={"v_proj": 3}, use_rslora=True)


def _delta(factors):
    return {m: s * np.asarray(B, float) @ np.asarray(A, float) for m, (A, B, s) in factors.items()}


def _model_delta(model, adapter="default"):
    """Each module's s·B·A straight from the model's LoRA layers (PEFT's own scaling)."""
    out = {}
    for m, layer in lora_layers(model, adapter).items():
        A = layer.lora_A[adapter].weight.detach().double().numpy()
        B = layer.lora_B[adapter].weight.detach().double().numpy()
        out[m] = float(layer.scaling[adapter]) * B @ A
    return out


def test_reply_is_peft_state_dict_exactly():
    model = _peft(CFG)
    arrays, cfg = adapter_record(model, client_id="partition-0003")
    ref = get_peft_model_state_dict(model)
    assert set(arrays) == set(ref)
    for k, v in ref.items():
        assert np.array_equal(arrays[k].numpy(), v.detach().numpy()), k
    assert (cfg["r"], cfg["lora_alpha"], cfg["use_rslora"], cfg["client-id"]) == (4, 8.0, True, "partition-0003")
    # the server reads what the model computes: scalings from patterns and rsLoRA included
    got = _delta(adapter_factors(model))
    want = _model_delta(model)
    assert set(got) == set(want)
    for m in want:
        np.testing.assert_allclose(got[m], want[m], rtol=1e-12, atol=1e-15)
    o = next(m for m in want if m.endswith("o_proj"))
    assert lora_layers(model)[o].lora_A["default"].weight.shape[0] == 2


def test_received_with_the_models_own_config_is_pefts_load():
    """Same ranks and scaling: load_adapter writes exactly what set_peft_model_state_dict does."""
    donor, ours, theirs = _peft(CFG, seed=5), _peft(CFG), _peft(CFG)
    state = get_peft_model_state_dict(donor)
    factors = factors_from_content(RecordDict({"l": adapter_record(donor)[0], "c": adapter_record(donor)[1]}),
                                   arrays_key="l", config_key="c")
    load_adapter(ours, factors)
    set_peft_model_state_dict(theirs, state)
    a, b = get_peft_model_state_dict(ours), get_peft_model_state_dict(theirs)
    for k in b:
        assert torch.equal(a[k], b[k]), k


def test_received_refined_adapter_goes_in_exactly():
    """What the server sends (scaling 1, lower ranks): ΔW kept to float32 precision, padded ranks
    leave B A unchanged, the forward pass equals the base with ΔW merged."""
    model = _peft(CFG)
    rng = np.random.default_rng(0)
    layers = lora_layers(model)
    sent = {}
    for m, layer in layers.items():
        r = layer.lora_A["default"].weight.shape[0]
        out_f, in_f = layer.lora_B["default"].weight.shape[0], layer.lora_A["default"].weight.shape[1]
        rho = max(1, r - 1)
        sent[m] = (rng.standard_normal((rho, in_f)), 0.1 * rng.standard_normal((out_f, rho)), 1.0)
    arrays, cfg = factors_record(sent, adapter="refined")
    received = factors_from_content(RecordDict({"arrays": arrays, "lora_config": cfg}), arrays_key="arrays")
    ranks = load_adapter(model, received)
    assert ranks == {m: A.shape[0] for m, (A, _, _) in sent.items()}
    got, want = _model_delta(model), _delta(sent)
    for m in want:
        np.testing.assert_allclose(got[m], want[m], rtol=0, atol=1e-6 * np.abs(want[m]).max())
    # the forward pass: the PeftModel against the base with ΔW added to its weights
    merged = _base()
    with torch.no_grad():
        for m, d in want.items():
            mod = merged.get_submodule(m[len("base_model.model."):])
            mod.weight += torch.from_numpy(d).float()
    x = torch.randint(1, 40, (3, 16))
    with torch.no_grad():
        np.testing.assert_allclose(model(input_ids=x).logits.numpy(), merged(input_ids=x).logits.numpy(),
                                   atol=2e-5)
    # and back: the reply carries the same ΔW
    back = _delta(adapter_factors(model))
    for m in want:
        np.testing.assert_allclose(back[m], want[m], rtol=0, atol=1e-6 * np.abs(want[m]).max())


def test_larger_ranks_and_mismatches_are_refused_or_get_their_own_adapter():
    model = _peft(LoraConfig(r=2, lora_alpha=2, target_modules=["q_proj", "v_proj"]))
    rng = np.random.default_rng(1)
    layers = lora_layers(model)
    big = {m: (rng.standard_normal((5, l.lora_A["default"].weight.shape[1])),
               rng.standard_normal((l.lora_B["default"].weight.shape[0], 5)), 0.5) for m, l in layers.items()}
    first = sorted(big)[0]
    with pytest.raises(AdapterError, match=rf"module '{first}': received rank 5 exceeds adapter 'default'"):
        load_adapter(model, dict(sorted(big.items())))
    # under a new adapter name: created with the received ranks, exact, the active adapter unchanged
    assert load_adapter(model, big, adapter_name="received") == {m: 5 for m in big}
    assert model.active_adapter == "default"
    got, want = _model_delta(model, "received"), _delta(big)
    for m in want:
        np.testing.assert_allclose(got[m], want[m], rtol=0, atol=1e-5 * np.abs(want[m]).max())
    A, B, s = big[first]
    with pytest.raises(AdapterError, match=rf"module '{first}' is {B.shape[0]} x 7 \(out x in\) in the received"):
        load_adapter(model, {**big, first: (A[:1, :7], B[:, :1], s)})
    with pytest.raises(AdapterError, match="received modules differ from the model's"):
        load_adapter(model, {first: big[first]})
    with pytest.raises(TypeError, match="model must be a peft PeftModel"):
        load_adapter(_base(), big)
    with pytest.raises(AdapterError, match="no adapter 'other'"):
        adapter_record(model, adapter_name="other")


@pytest.mark.slow
def test_the_peft_client_template_runs_on_the_simulation_engine(tmp_path):
    """examples/flower_clair with the PEFT ClientApp, 3 clients, one round, tiny sizes: every
    client replies a PEFT adapter, the server aggregates them (rank cut to the clients' rank) and
    each client loads what it received into its PeftModel and evaluates it."""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    sets = ["n_clients=3", "contaminated=1", "rounds=2", "n_train=100", "n_val=50", "n_test=50", "rank=2"]
    proc = subprocess.run(["bash", str(ROOT / "examples" / "flower_clair" / "run.sh"), str(out), "--client", "peft",
                           *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["rank_out"] == 2
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    for r in summary["rounds"]:
        assert r["participants"] == [0, 1, 2] and r["failures"] == r["missing"] == 0
        assert set(r["accuracy"]) == {"0", "1", "2"}
        assert all(0 <= a["after"] <= 1 for a in r["accuracy"].values())
    # round 2: each client compared the adapter it received with its own (keep-better)
    train = summary["rounds"][1]["train_metrics"]
    assert 0 <= train["kept-received"] <= 1 and np.isfinite(train["val-loss-received"])
    assert "partition-id" not in summary["rounds"][1]["train_metrics"]
