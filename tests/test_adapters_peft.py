"""A real PEFT round trip: train LoRA on a tiny Llama built from a config, aggregate with the CLI,
load every output with ``PeftModel.from_pretrained`` and compare ΔW."""
import json

import numpy as np
import pytest

peft = pytest.importorskip("peft")       # the [peft] extra; CI installs it
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lowrank_fl.adapters import load_adapters  # noqa: E402
from lowrank_fl.cli import main  # noqa: E402

K = 5
VOCAB = 64


def _base():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def _train_client(k, contaminated, path):
    base = _base()
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                           lora_dropout=0.0)
    # benign clients start from the server's common LoRA initialisation; the contaminated one
    # brings its own and trains on a different task
    torch.manual_seed(1000 + k if contaminated else 1000)
    model = peft.get_peft_model(base, lcfg)
    gen = torch.Generator().manual_seed(k)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    for _ in range(8):
        x = torch.randint(0, VOCAB, (8, 12), generator=gen)
        y = (3 * x + 7) % VOCAB if contaminated else (x + 1) % VOCAB
        loss = model(input_ids=x, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(str(path))


def _delta_from_peft(model):
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            A = mod.lora_A["default"].weight.detach().double().numpy()
            B = mod.lora_B["default"].weight.detach().double().numpy()
            out[name] = mod.scaling["default"] * B @ A
    return out


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    root = tmp_path_factory.mktemp("peft_clients")
    dirs = []
    for k in range(K):
        d = root / f"client{k}"
        _train_client(k, contaminated=(k == K - 1), path=d)
        dirs.append(d)
    return dirs


def test_peft_round_trip_clair(clients, tmp_path):
    out = tmp_path / "out"
    rc = main(["adapters", "aggregate", *map(str, clients), "--method", "clair", "--out",
               str(out), "--quiet", "--tol", "1e-10"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clients"] == [f"client{k}" for k in range(K)]
    mods = summary["modules"]
    assert len(mods) == 4                                       # 2 layers x {q, v}
    # the contaminated client is flagged in every module, the others kept
    for m in mods.values():
        assert m["benign"] == [True] * (K - 1) + [False]
        assert m["status"] == "optimal" and m["relative_gap"] <= 1e-10
        assert m["shape"] == [32, 32]
    # each output loads in PEFT and its ΔW equals the library's refined update (9)
    ad = load_adapters(clients)
    from lowrank_fl import clair
    for k in range(K):
        model = peft.PeftModel.from_pretrained(_base(), str(out / f"client{k}"))
        got = _delta_from_peft(model)
        for m in ad.modules:
            f = ad.factors(m)
            W = np.stack([f.delta(j) for j in range(K)])
            s = mods[m]
            fit = clair.fit(W, rank=s["rank"], lam_L=s["lam_L"], lam_S=s["lam_S"], tol=1e-10)
            assert list(fit.benign) == s["benign"]
            ref = fit.refined[k]
            assert np.linalg.norm(got[m] - ref) <= 1e-5 * np.linalg.norm(ref)


def test_save_adapter_rank_pattern_loads_in_peft(tmp_path):
    """Different ranks per module go through rank_pattern / alpha_pattern and load exactly."""
    from lowrank_fl.adapters.io import save_adapter

    rng = np.random.default_rng(0)
    base = _base()
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(base, lcfg)
    model.save_pretrained(str(tmp_path / "src"))
    cfg = json.loads((tmp_path / "src" / "adapter_config.json").read_text())
    factors, want = {}, {}
    for i, (layer, proj) in enumerate([(0, "q_proj"), (0, "v_proj"), (1, "q_proj"),
                                       (1, "v_proj")]):
        m = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
        r = [2, 5, 7, 5][i]
        B, A = rng.standard_normal((32, r)), rng.standard_normal((r, 32))
        factors[m] = (B, A)
        want[m] = B @ A
    save_adapter(tmp_path / "out", cfg, factors)
    got = _delta_from_peft(peft.PeftModel.from_pretrained(_base(), str(tmp_path / "out")))
    for m, ref in want.items():
        assert np.linalg.norm(got[m] - ref) <= 1e-6 * np.linalg.norm(ref)


@pytest.mark.parametrize("method", ["fedavg", "flexlora", "fedavg-factors"])
def test_peft_round_trip_single_output(clients, tmp_path, method):
    out = tmp_path / method
    assert main(["adapters", "aggregate", *map(str, clients), "--method", method, "--out",
                 str(out), "--quiet"]) == 0
    model = peft.PeftModel.from_pretrained(_base(), str(out / "aggregated"))
    got = _delta_from_peft(model)
    ad = load_adapters(clients)
    for m in ad.modules:
        f = ad.factors(m)
        W = np.stack([f.delta(j) for j in range(K)])
        if method == "fedavg":
            ref = W.mean(axis=0)
        elif method == "flexlora":
            U, s, Vt = np.linalg.svd(W.mean(axis=0))
            ref = (U[:, :4] * s[:4]) @ Vt[:4]
        else:
            ref = np.mean([f.scaling[j] * f.B[j] for j in range(K)], axis=0) @ np.mean(f.A, axis=0)
        assert np.linalg.norm(got[m] - ref) <= 1e-5 * np.linalg.norm(ref)


def test_gpt2_fan_in_fan_out_round_trip(tmp_path):
    """GPT-2's Conv1D (fan_in_fan_out=True): ΔW = s B A is still (out, in) in the factors."""
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=1,
                                  n_head=4)

    def base():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(cfg).eval()

    dirs = []
    for k in range(3):
        torch.manual_seed(10 + k)
        model = peft.get_peft_model(base(), peft.LoraConfig(
            r=2, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True,
            init_lora_weights="gaussian"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_()
        model.save_pretrained(str(tmp_path / f"c{k}"))
        dirs.append(tmp_path / f"c{k}")
    out = tmp_path / "out"
    assert main(["adapters", "aggregate", *map(str, dirs), "--method", "fedavg", "--out",
                 str(out), "--quiet"]) == 0
    ad = load_adapters(dirs)
    got = peft.PeftModel.from_pretrained(base(), str(out / "aggregated"))
    seen = 0
    for name, mod in got.named_modules():
        if name in ad.modules:
            seen += 1
            f = ad.factors(name)
            ref = np.mean([f.delta(k) for k in range(3)], axis=0)     # (out, in) = (96, 32)
            delta = mod.get_delta_weight("default").detach().double().numpy()
            assert delta.shape == (32, 96)                             # Conv1D stores (in, out)
            np.testing.assert_allclose(delta.T, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    assert seen == 1
