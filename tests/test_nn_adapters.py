"""PEFT client training, the adapter loader (ΔW = scaling · B A), merged models and aggregation."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from lowrank_fl.clair.pipeline import fit  # noqa: E402
from lowrank_fl.nn import copying  # noqa: E402
from lowrank_fl.nn.aggregate import aggregate, load_deltas, load_factors, stack_deltas  # noqa: E402
from lowrank_fl.nn.clients import LoraSettings, TaskSpec, predict, train_client  # noqa: E402
from lowrank_fl.nn.pretrain import PretrainSettings, pretrained_backbone  # noqa: E402
from lowrank_fl.nn.sec8 import client_tasks, merged_model  # noqa: E402
from lowrank_fl.nn.transformer import ATTENTION_MODULES, OUTPUT_MODULE  # noqa: E402

TINY = LoraSettings(n_train=100)


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return pretrained_backbone(PretrainSettings(steps=3), cache_dir=tmp_path_factory.mktemp("bb"))


@pytest.fixture(scope="module")
def adapters(backbone, tmp_path_factory):
    root = tmp_path_factory.mktemp("ad")
    return [train_client(backbone, TaskSpec(length=8 + k), root / f"c{k}", settings=TINY, init_seed=5, seed=k)
            for k in range(3)]


def test_pretraining_is_deterministic_and_cached(tmp_path):
    s = PretrainSettings(steps=2, seed=3)
    a = pretrained_backbone(s, cache_dir=tmp_path)
    files = list(tmp_path.glob("copying-backbone-*.safetensors"))
    assert len(files) == 1 and s.key() in files[0].name
    b = pretrained_backbone(s, cache_dir=None)            # retrained in process
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    assert PretrainSettings(steps=2, seed=4).key() != s.key()


def test_adapter_directory_and_loader(adapters):
    d = adapters[0]
    cfg = json.loads((d / "adapter_config.json").read_text())
    assert cfg["r"] == 3 and cfg["lora_alpha"] / cfg["r"] == 16 and cfg["lora_dropout"] == 0.005
    from safetensors.numpy import load_file

    raw = load_file(str(d / "adapter_model.safetensors"))
    deltas = load_deltas(d)
    assert set(deltas) == set(ATTENTION_MODULES) | {OUTPUT_MODULE}
    key = "base_model.model.blocks.1.v_proj"
    A, B = raw[f"{key}.lora_A.weight"], raw[f"{key}.lora_B.weight"]
    assert A.shape == (3, 64) and B.shape == (64, 3)
    np.testing.assert_allclose(deltas["blocks.1.v_proj"], 16 * B.astype(float) @ A.astype(float), rtol=1e-12)
    assert deltas[OUTPUT_MODULE].shape == (53, 64)
    assert np.linalg.matrix_rank(deltas["blocks.0.q_proj"]) <= 3


def test_same_seed_A_init_on_every_client(adapters):
    from safetensors.numpy import load_file

    # one step of Adam moves A by at most ~lr per step: the initial A (same seed) dominates
    A = [load_file(str(d / "adapter_model.safetensors"))["base_model.model.blocks.0.k_proj.lora_A.weight"]
         for d in adapters]
    assert np.abs(A[0] - A[1]).max() < 5e-3 and np.abs(A[0]).max() > 0.05


def test_merged_model_equals_the_peft_model(backbone, adapters):
    from peft import PeftModel
    import copy

    peft_model = PeftModel.from_pretrained(copy.deepcopy(backbone), str(adapters[1])).eval()
    merged = merged_model(backbone, load_deltas(adapters[1]))
    batch = copying.sample(20, length=10, seed=0)
    x = torch.from_numpy(batch.tokens)
    with torch.no_grad():
        np.testing.assert_allclose(peft_model(x).numpy(), merged(x).numpy(), atol=2e-5)
    assert np.array_equal(predict(peft_model, batch), predict(merged, batch))


def test_aggregate_methods(adapters):
    factors = load_factors(adapters)
    stacks = stack_deltas(adapters, factors)
    truth = np.array([True, True, False])
    agg = aggregate(stacks, ATTENTION_MODULES, truth, lam_L=0.5, lam_S=0.4, tau=0.5, factors=factors)
    name = ATTENTION_MODULES[2]
    W = stacks[name]
    np.testing.assert_array_equal(agg.deltas["local"][name], W)
    np.testing.assert_allclose(agg.deltas["fedavg"][name], np.broadcast_to(W.mean(0), W.shape))
    np.testing.assert_allclose(agg.deltas["oracle"][name][:2], np.broadcast_to(W[:2].mean(0), (2, 64, 64)))
    np.testing.assert_array_equal(agg.deltas["oracle"][name][2], W[2])
    ref = fit(W, lam_L=0.5, lam_S=0.4, rank=3, alpha=0.5, tau=0.5)
    np.testing.assert_array_equal(agg.deltas["clair"][name], ref.refined)
    np.testing.assert_array_equal(agg.benign[name], ref.benign)
    # CLAIR with automatic tuning = the adapters package on the same factors; equal to clair.fit at
    # the λ and τ it chose, on the full 64 x 64 matrices
    from lowrank_fl.adapters.aggregate import ModuleOptions, aggregate_module

    auto = aggregate_module(factors[name], ModuleOptions(rank=3, output_dtype="float64"))
    np.testing.assert_array_equal(agg.benign_auto[name], auto.benign)
    ref = fit(W, lam_L=auto.lam_L, lam_S=auto.lam_S, rank=3, alpha=0.5, tau=auto.tau)
    np.testing.assert_allclose(agg.deltas["clair-auto"][name], ref.refined, atol=1e-6 * np.abs(W).max())
    with pytest.raises(ValueError, match="factors"):
        aggregate(stacks, ATTENTION_MODULES, truth, lam_L=0.5, lam_S=0.4, tau=0.5)
    for m in agg.deltas:                              # the output layer is never aggregated
        np.testing.assert_array_equal(agg.deltas[m][OUTPUT_MODULE], stacks[OUTPUT_MODULE])
    with pytest.raises(ValueError, match="methods"):
        aggregate(stacks, ATTENTION_MODULES, truth, lam_L=0.5, lam_S=0.4, tau=0.5, methods=("median",))


def test_client_tasks():
    hom = client_tasks("homogeneous", seed=0)
    assert [t.kind for t in hom] == ["fuzzy"] * 9 + ["reverse"]
    assert all(t.length == 16 and t.exponent == 1.1 for t in hom)
    het = client_tasks("heterogeneous", contamination="shift", seed=0)
    assert all(10 <= t.length <= 26 and 0.95 <= t.exponent <= 1.6 for t in het)
    assert len({t.length for t in het}) > 1 and het[-1].kind == "shift"
    with pytest.raises(ValueError, match="contamination"):
        client_tasks("homogeneous", contamination="nope", seed=0)


def test_next_token_loss_positions(backbone):
    from lowrank_fl.nn.pretrain import next_token_loss

    b = copying.sample(6, length=10, seed=1)
    x = torch.from_numpy(b.tokens)
    full = np.ones_like(b.tokens, dtype=bool)
    with torch.no_grad():
        assert torch.allclose(next_token_loss(backbone, x, full), next_token_loss(backbone, x))
        logits = backbone(x[:, :-1])
        P = copying.copy_positions(b)
        i, t = np.nonzero(P)
        ref = torch.nn.functional.cross_entropy(logits[i, t - 1], x[i, t])
        assert torch.allclose(next_token_loss(backbone, x, P), ref)


@pytest.mark.parametrize("heads,bias", [(1, False), (2, True)])
def test_backbone_is_causal(heads, bias):
    from lowrank_fl.nn.transformer import CopyingTransformer

    torch.manual_seed(0)
    m = CopyingTransformer(heads=heads, bias=bias).eval()
    x = torch.randint(0, 52, (2, 20))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 52
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.allclose(a[:, 10:], b[:, 10:])
    assert (m.blocks[0].q_proj.bias is not None) == bias
    with pytest.raises(ValueError, match="heads"):
        CopyingTransformer(heads=3)


def test_warmup_changes_the_recipe_and_its_key():
    from lowrank_fl.nn.pretrain import pretrain

    s = PretrainSettings(steps=1, warmup_steps=1, seed=2)
    assert s.key() != PretrainSettings(steps=2, seed=2).key() != PretrainSettings(steps=2, loss="all", seed=2).key()
    _, losses = pretrain(s)
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_copy_accuracy_is_the_masked_accuracy_on_the_pretraining_task(backbone):
    from lowrank_fl.nn.clients import accuracy
    from lowrank_fl.nn.pretrain import copy_accuracy

    s = PretrainSettings()
    b = copying.sample_mixture(60, lengths=s.lengths, exponent=s.exponent, seed=3)
    assert copy_accuracy(backbone, s, n=60, seed=3) == accuracy(backbone, b)
