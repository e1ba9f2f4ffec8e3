"""Config fields that change the loaded model, through PEFT both ways.

Clients saved by PEFT itself with rsLoRA, plain LoRA, and ``rank_pattern`` / ``alpha_pattern``
keys that PEFT's suffix rule applies to ``layers.1`` but not ``layers.11``; every client's ``ΔW``
reference is what PEFT loads (``scaling · B A`` of the PEFT model), and every output adapter must
load in PEFT to the aggregate computed from those references.
"""
import json
import zlib

import numpy as np
import pytest

peft = pytest.importorskip("peft")       # the [peft] extra; CI installs it
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from peft.utils.other import get_pattern_key  # noqa: E402  PEFT's own pattern rule

from lowrank_fl import clair  # noqa: E402
from lowrank_fl.adapters import load_adapters  # noqa: E402
from lowrank_fl.adapters.io import module_key, pattern_value  # noqa: E402
from lowrank_fl.cli import main  # noqa: E402

N_LAYERS = 12                      # layers.1 and layers.11 both exist
TRICKY = "1.self_attn.q_proj"      # PEFT: layer 1 only; an unanchored search also hits layer 11


def _base():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=N_LAYERS, num_attention_heads=2,
                                   num_key_value_heads=2, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(cfg).eval()


CLIENTS = [   # (LoraConfig keywords, contaminated)
    (dict(r=4, lora_alpha=8, use_rslora=True), False),               # first: the fedavg output's config
    (dict(r=4, lora_alpha=8), False),
    (dict(r=4, lora_alpha=8, rank_pattern={TRICKY: 2}, alpha_pattern={TRICKY: 3}), False),
    (dict(r=4, lora_alpha=16, use_rslora=True, alpha_pattern={"v_proj": 5}), False),
    (dict(r=4, lora_alpha=8), True),
]


def _make_client(k, kw, contaminated, path):
    """A PEFT adapter with non-zero B: benign clients share A up to small noise."""
    model = peft.get_peft_model(_base(), peft.LoraConfig(target_modules=["q_proj", "v_proj"],
                                                         lora_dropout=0.0, **kw))
    gen = torch.Generator().manual_seed(100 + k)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if hasattr(mod, "lora_A") and "default" in mod.lora_A:
                A = mod.lora_A["default"].weight
                common = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                shared = torch.randn(A.shape, generator=common, dtype=A.dtype)
                own = torch.randn(A.shape, generator=gen, dtype=A.dtype)
                A.copy_(own if contaminated else shared + 0.01 * own)
                B = mod.lora_B["default"].weight
                B.copy_(0.1 * torch.randn(B.shape, generator=gen, dtype=B.dtype))
    model.save_pretrained(str(path))


def _deltas(model) -> dict:
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            A = mod.lora_A["default"].weight.detach().double().numpy()
            B = mod.lora_B["default"].weight.detach().double().numpy()
            out[module_key(name)] = mod.scaling["default"] * B @ A
    return out


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfg_clients")
    dirs, refs = [], []
    for k, (kw, bad) in enumerate(CLIENTS):
        d = root / f"client{k}"
        _make_client(k, kw, bad, d)
        dirs.append(d)
        refs.append(_deltas(peft.PeftModel.from_pretrained(_base(), str(d))))
    return dirs, refs


def test_pattern_value_is_peft_rule():
    names = [f"base_model.model.model.layers.{i}.self_attn.{m}" for i in (1, 11, 21, 0)
             for m in ("q_proj", "v_proj")] + ["base_model.model.lm_head", "model.layers.1.mlp.up_proj"]
    patterns = [{TRICKY: 2}, {"layers.1.self_attn.q_proj": 3}, {"q_proj": 5, TRICKY: 7},
                {TRICKY: 7, "q_proj": 5}, {"layers.11.self_attn.v_proj": 9},
                {r"model\.layers\.1\..*": 6}, {"proj": 8}, {"up_proj": 4}, {}]
    for pats in patterns:
        for name in names:
            key = module_key(name)
            want = pats.get(get_pattern_key(pats.keys(), key), 16)
            assert pattern_value(pats, name, 16) == want, (pats, name)
    # the tricky key: layer 1 only
    assert pattern_value({TRICKY: 2}, "model.layers.1.self_attn.q_proj", 4) == 2
    assert pattern_value({TRICKY: 2}, "model.layers.11.self_attn.q_proj", 4) == 4


def test_clients_load_with_peft_scaling(clients):
    dirs, refs = clients
    ad = load_adapters(dirs)
    assert len(ad.modules) == 2 * N_LAYERS
    for m in ad.modules:
        f = ad.factors(m)
        name = module_key(m)
        for k in range(len(dirs)):
            ref = refs[k][name]
            assert np.linalg.norm(f.delta(k) - ref) <= 1e-6 * np.linalg.norm(ref), (m, k)
    # the pattern hit layer 1's q_proj of client 2 only, with its own alpha
    r1 = ad.ranks["base_model.model.model.layers.1.self_attn.q_proj"]
    r11 = ad.ranks["base_model.model.model.layers.11.self_attn.q_proj"]
    assert r1[2] == 2 and r11[2] == 4
    f = ad.factors("base_model.model.model.layers.1.self_attn.q_proj")
    assert f.scaling[2] == pytest.approx(3 / 2) and f.scaling[0] == pytest.approx(8 / 2)  # rsLoRA: 8/sqrt(4)
    assert f.scaling[1] == pytest.approx(2.0)


def test_fedavg_output_loads_in_peft_as_the_mean(clients, tmp_path):
    dirs, refs = clients
    out = tmp_path / "fedavg"
    assert main(["adapters", "aggregate", *map(str, dirs), "--method", "fedavg", "--out",
                 str(out), "--quiet"]) == 0
    got = _deltas(peft.PeftModel.from_pretrained(_base(), str(out / "aggregated")))
    assert set(got) == set(refs[0])
    for name in got:
        ref = np.mean([r[name] for r in refs], axis=0)
        assert np.linalg.norm(got[name] - ref) <= 1e-5 * np.linalg.norm(ref), name
    # the output's own config reads back the same ΔW in the library
    back = load_adapters([out / "aggregated", out / "aggregated"], names=["a", "b"])
    m = back.modules[0]
    ref = np.mean([r[module_key(m)] for r in refs], axis=0)
    assert np.linalg.norm(back.factors(m).delta(0) - ref) <= 1e-5 * np.linalg.norm(ref)


def test_clair_outputs_load_in_peft_as_the_refinement(clients, tmp_path):
    dirs, refs = clients
    out = tmp_path / "clair"
    # the paper's per-module sets (8), (7) on the raw contrasts and (9): clair.fit's refinement
    assert main(["adapters", "aggregate", *map(str, dirs), "--method", "clair", "--out",
                 str(out), "--quiet", "--tol", "1e-10", "--client-rule", "per-module",
                 "--output", "merged", "--refine", "paper", "--clip", "none"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    K = len(dirs)
    models = [_deltas(peft.PeftModel.from_pretrained(_base(), str(out / f"client{k}")))
              for k in range(K)]
    n_flagged = 0
    for m, s in summary["modules"].items():
        name = module_key(m)
        W = np.stack([r[name] for r in refs])
        fit = clair.fit(W, rank=s["rank"], lam_L=s["lam_L"], lam_S=s["lam_S"], tol=1e-10)
        assert list(fit.benign) == s["benign"]
        n_flagged += not s["benign"][K - 1]
        for k in range(K):
            ref = fit.refined[k]
            assert np.linalg.norm(models[k][name] - ref) <= 1e-5 * np.linalg.norm(ref), (m, k)
    assert n_flagged >= len(summary["modules"]) // 2     # the contaminated client is seen


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_clients_read_as_peft_loads_them(tmp_path, dtype):
    """Adapters saved by PEFT in bf16 / fp16: the library reads the ΔW PEFT loads (bf16 widened
    bit-exactly), with rsLoRA and plain scalings."""
    dirs, refs = [], []
    for k, kw in enumerate([dict(r=4, lora_alpha=8, use_rslora=True), dict(r=4, lora_alpha=8)]):
        model = peft.get_peft_model(_base(), peft.LoraConfig(target_modules=["q_proj"],
                                                             lora_dropout=0.0,
                                                             init_lora_weights=False, **kw))
        model.to(getattr(torch, dtype))
        d = tmp_path / f"c{k}"
        model.save_pretrained(str(d))
        dirs.append(d)
        refs.append(_deltas(peft.PeftModel.from_pretrained(_base(), str(d))))
    from safetensors import safe_open

    with safe_open(str(dirs[0] / "adapter_model.safetensors"), framework="pt") as fh:
        assert all(fh.get_tensor(key).dtype == getattr(torch, dtype) for key in fh.keys())
    ad = load_adapters(dirs)
    for m in ad.modules:
        f = ad.factors(m)
        for k in range(2):
            ref = refs[k][module_key(m)]
            assert np.linalg.norm(f.delta(k) - ref) <= 1e-12 * np.linalg.norm(ref), (m, k)
