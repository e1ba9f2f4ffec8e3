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
               str(out), "--quiet", "--tol", "1e-10", "--output", "merged", "--refine", "paper",
               "--client-rule", "per-module"])
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


@pytest.mark.parametrize("form", ["file-config, (B, A)", "LoraConfig, (A, B, scaling)"])
def test_save_adapter_rank_pattern_loads_in_peft(tmp_path, form):
    """Different ranks per module go through rank_pattern / alpha_pattern and load exactly."""
    from lowrank_fl.adapters.save import save_adapter

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
        factors[m] = (B, A) if form.endswith("(B, A)") else (A, B / 3.0, 3.0)
        want[m] = B @ A
    save_adapter(tmp_path / "out", cfg if form.startswith("file") else lcfg, factors)
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
        model = base()                         # seeds torch itself: each client's seed after it
        torch.manual_seed(10 + k)
        model = peft.get_peft_model(model, peft.LoraConfig(
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


# ------------------------------------------------------------------------------------------
# issue 17: configs PEFT really writes
def _train_steps(model, k, steps=3):
    gen = torch.Generator().manual_seed(k)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (8, 12), generator=gen)
        loss = model(input_ids=x, labels=(x + 1) % VOCAB).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


def _merged_delta(model):
    """What the adapter really does: merged weights minus the untouched base's, per module."""
    sd0 = _base().state_dict()
    sd = model.merge_and_unload().state_dict()
    return {f"base_model.model.{k[:-len('.weight')]}": (sd[k] - sd0[k]).double().numpy()
            for k in sd if k.endswith("proj.weight") and not torch.equal(sd[k], sd0[k])}


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_base_rewriting_adapters_refused_converted_ones_exact(tmp_path, capsys, init):
    """PiSSA / OLoRA as saved: refused (PEFT rewrites the base at load, so s B A is not the
    update). Converted by PEFT (path_initial_model_for_weight_conversion): plain LoRA, accepted,
    and the fedavg output applied to the original base equals the mean of the true updates."""
    raw, conv, truth = [], [], []
    for k in range(2):
        model = _base()                        # seeds torch itself: each client's seed after it
        torch.manual_seed(k)
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init))
        model.peft_config["default"].init_lora_weights = True     # PEFT's documented recipe
        model.save_pretrained(str(tmp_path / f"init{k}"))
        model.peft_config["default"].init_lora_weights = init
        _train_steps(model, k)
        model.save_pretrained(str(tmp_path / f"raw{k}"))
        model.save_pretrained(str(tmp_path / f"conv{k}"),
                              path_initial_model_for_weight_conversion=str(tmp_path / f"init{k}"))
        raw.append(tmp_path / f"raw{k}")
        conv.append(tmp_path / f"conv{k}")
        truth.append(_merged_delta(model))
    assert main(["adapters", "aggregate", *map(str, raw), "--method", "fedavg", "--out",
                 str(tmp_path / "bad"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"init_lora_weights={init!r}" in err[0] and "raw0" in err[0]
    assert "path_initial_model_for_weight_conversion" in err[0]
    assert not (tmp_path / "bad").exists()
    ad = load_adapters(conv)
    for m in ad.modules:
        f = ad.factors(m)
        for k in range(2):
            ref = truth[k][m]
            assert np.linalg.norm(f.delta(k) - ref) <= 1e-5 * np.linalg.norm(ref)
    out = tmp_path / "out"
    assert main(["adapters", "aggregate", *map(str, conv), "--method", "fedavg", "--out",
                 str(out), "--quiet"]) == 0
    got = _delta_from_peft(peft.PeftModel.from_pretrained(_base(), str(out / "aggregated")))
    for m in ad.modules:
        ref = (truth[0][m] + truth[1][m]) / 2
        assert np.linalg.norm(got[m] - ref) <= 1e-5 * np.linalg.norm(ref)


def test_output_config_describes_what_was_written(tmp_path):
    """Clients with gaussian init, rsLoRA, rank/alpha patterns and dropout: the outputs' config is
    plain LoRA with scaling 1 (init_lora_weights true, no rsLoRA, alpha = r per module), keeps
    target_modules / fan_in_fan_out / base model / task type, loads in PEFT, and its ΔW is the
    mean of PEFT's own input ΔW (fedavg) or clair.fit's refined update (clair)."""
    dirs, want = [], []
    lcfg = dict(r=4, lora_alpha=6, target_modules=["q_proj", "v_proj"], lora_dropout=0.1,
                init_lora_weights="gaussian", use_rslora=True,
                rank_pattern={r"layers\.1\.self_attn\.q_proj": 2},
                alpha_pattern={r"layers\.0\.self_attn\.v_proj": 3})
    for k in range(3):
        base = _base()                         # seeds torch itself: each client's seed after it
        torch.manual_seed(20 + k)
        model = peft.get_peft_model(base, peft.LoraConfig(**lcfg))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(std=0.1)
        want.append({n: mod.get_delta_weight("default").detach().double().numpy()
                     for n, mod in model.named_modules() if hasattr(mod, "get_delta_weight")
                     and "default" in getattr(mod, "lora_A", {})})
        model.save_pretrained(str(tmp_path / f"c{k}"))
        dirs.append(tmp_path / f"c{k}")
    src_cfg = json.loads((dirs[0] / "adapter_config.json").read_text())
    for method in ("fedavg", "clair"):
        out = tmp_path / method
        # merged: each client's adapter is (9) itself (the split layout: test_adapters_split.py)
        assert main(["adapters", "aggregate", *map(str, dirs), "--method", method, "--out",
                     str(out), "--quiet", "--tol", "1e-10", "--output", "merged", "--refine", "paper",
               "--client-rule", "per-module"]) == 0
        s = json.loads((out / "summary.json").read_text())
        for name in s["outputs"]:
            cfg = json.loads((out / name / "adapter_config.json").read_text())
            assert cfg["init_lora_weights"] is True and cfg["use_rslora"] is False
            assert cfg["lora_alpha"] == cfg["r"] and cfg["alpha_pattern"] == cfg["rank_pattern"]
            for key in ("target_modules", "fan_in_fan_out", "base_model_name_or_path",
                        "task_type", "peft_type", "bias"):
                assert cfg[key] == src_cfg[key], key
            got = _delta_from_peft(peft.PeftModel.from_pretrained(_base(), str(out / name)))
            assert set(got) == set(want[0])
            for m in got:
                if method == "fedavg":
                    ref = np.mean([w[m] for w in want], axis=0)
                else:
                    from lowrank_fl import clair

                    ms = s["modules"][m]
                    fit = clair.fit(np.stack([w[m] for w in want]), rank=ms["rank"],
                                    lam_L=ms["lam_L"], lam_S=ms["lam_S"], tol=1e-10)
                    assert list(fit.benign) == ms["benign"]
                    ref = fit.refined[s["clients"].index(name)]
                assert np.linalg.norm(got[m] - ref) <= 1e-5 * np.linalg.norm(ref), (method, m)


def test_embedding_lora_and_bin_refused_as_peft_writes_them(tmp_path, capsys):
    torch.manual_seed(0)
    model = peft.get_peft_model(_base(), peft.LoraConfig(
        r=2, target_modules=["embed_tokens", "q_proj"], init_lora_weights="gaussian"))
    model.save_pretrained(str(tmp_path / "emb0"))
    model.save_pretrained(str(tmp_path / "emb1"))
    assert main(["adapters", "aggregate", str(tmp_path / "emb0"), str(tmp_path / "emb1"),
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "embedding LoRA" in err[0] and "save_embedding_layers" in err[0]
    model = peft.get_peft_model(_base(), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    model.save_pretrained(str(tmp_path / "bin0"), safe_serialization=False)
    model.save_pretrained(str(tmp_path / "bin1"), safe_serialization=False)
    assert (tmp_path / "bin0" / "adapter_model.bin").is_file()
    assert main(["adapters", "aggregate", str(tmp_path / "bin0"), str(tmp_path / "bin1"),
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "safe_serialization=True" in err[0] and "bin0" in err[0]
    assert not (tmp_path / "o").exists()


def test_example_detects_the_contaminated_client(tmp_path):
    """examples/clair_on_peft_adapters.py checks its own detection and exits 1 when it is wrong."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, str(root / "examples" / "clair_on_peft_adapters.py"),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "detection is right: client4" in proc.stdout
    summary = json.loads((tmp_path / "clair" / "summary.json").read_text())
    assert all(m["benign"] == [True] * 4 + [False] for m in summary["modules"].values())
    # the client it loads takes part of the shared adapter: both are active in PEFT
    weights = {n: c["weight"] for n, c in summary["refinement"]["clients"].items()}
    best = max(weights, key=weights.get)
    assert weights[best] > 0 and f"{best}'s refined update (a_k = {weights[best]:.3f})" in proc.stdout
    assert "active adapters ['default', 'shared']" in proc.stdout
    # --help prints the usage and writes nothing (it was once taken for the working folder)
    helped = subprocess.run([sys.executable, str(root / "examples" / "clair_on_peft_adapters.py"), "--help"],
                            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path / "clair")
    assert helped.returncode == 0 and "usage:" in helped.stdout and "workdir" in helped.stdout
    assert not (tmp_path / "clair" / "--help").exists()
