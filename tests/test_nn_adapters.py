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
    # S5's "scale 16" read as lora_alpha = 16 (the default reading): scaling 16/3
    assert cfg["r"] == 3 and cfg["lora_alpha"] == 16 and cfg["lora_dropout"] == 0.005
    from safetensors.numpy import load_file

    raw = load_file(str(d / "adapter_model.safetensors"))
    deltas = load_deltas(d)
    assert set(deltas) == set(ATTENTION_MODULES) | {OUTPUT_MODULE}
    key = "base_model.model.blocks.1.v_proj"
    A, B = raw[f"{key}.lora_A.weight"], raw[f"{key}.lora_B.weight"]
    assert A.shape == (3, 64) and B.shape == (64, 3)
    np.testing.assert_allclose(deltas["blocks.1.v_proj"], 16 / 3 * B.astype(float) @ A.astype(float), rtol=1e-12)
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


def _song_forward(model, tokens):
    """Song, Xu & Zhong's ``TFModel.forward`` (synthetic-experiments/model.py: rotary through
    complex numbers, pre-attention layer norm, residual, no MLP, no output norm), transcribed
    line by line on the weights of our :class:`CopyingTransformer`."""
    def freqs_cis(dim, end, theta=10000.0):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].double() / dim))
        t = torch.arange(end).double()
        f = torch.outer(t, freqs)
        return torch.polar(torch.ones_like(f), f)

    def rotary(xq, xk, fc):
        xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
        fc = fc.view(1, xq_.shape[1], 1, xq_.shape[-1])
        return torch.view_as_real(xq_ * fc).flatten(3), torch.view_as_real(xk_ * fc).flatten(3)

    x = model.embed(tokens)
    T = x.size(1)
    mask = torch.tril(torch.ones(T, T)).unsqueeze(0).unsqueeze(0)
    for blk in model.blocks:
        out = blk.ln(x)
        n, _, d = out.shape
        Q = blk.q_proj(out).view(n, T, 1, d).transpose(1, 2)
        K = blk.k_proj(out).view(n, T, 1, d).transpose(1, 2)
        V = blk.v_proj(out).view(n, T, 1, d).transpose(1, 2)
        Qr, Kr = rotary(Q.transpose(1, 2), K.transpose(1, 2), freqs_cis(d, 2 * T)[:T])
        Q, K = Qr.transpose(1, 2), Kr.transpose(1, 2)
        scores = (Q @ K.transpose(-2, -1) / np.sqrt(d)).masked_fill(mask == 0, -1e9)
        att = torch.softmax(scores, dim=-1) @ V
        x = x + blk.o_proj(att.transpose(1, 2).contiguous().view(n, T, d))
    return model.lm_head(x)


def test_song_recipe_matches_a_transcription_of_their_forward_pass():
    from lowrank_fl.nn.pretrain import build_backbone
    settings = PretrainSettings.recipe("song")
    assert (settings.bias, settings.final_norm, settings.dropout, settings.optimizer, settings.loss) == \
        (True, False, 0.1, "adamw", "all")
    torch.manual_seed(0)
    model = build_backbone(settings).double().eval()
    assert model.ln_f is None and model.blocks[0].q_proj.bias is not None
    with torch.no_grad():
        for prm in model.parameters():                  # biases away from their zero init
            prm.add_(0.1 * torch.randn_like(prm))
        tokens = torch.from_numpy(copying.sample(4, length=10, seed=0).tokens)
        ours, theirs = model(tokens), _song_forward(model, tokens)
    assert torch.allclose(ours, theirs, atol=1e-10, rtol=0)
    # our default recipe is another model: final layer norm, no biases
    ref = build_backbone(PretrainSettings()).double().eval()
    assert ref.ln_f is not None and ref.blocks[0].q_proj.bias is None


def test_song_dropout_acts_in_training_only():
    from lowrank_fl.nn.pretrain import build_backbone
    torch.manual_seed(1)
    model = build_backbone(PretrainSettings.recipe("song"))
    tokens = torch.from_numpy(copying.sample(2, length=8, seed=1).tokens)
    with torch.no_grad():
        model.eval()
        a, b = model(tokens), model(tokens)
        model.train()
        c = model(tokens)
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_recipe_optimizer_and_cache_key():
    import hashlib
    import json
    from dataclasses import asdict

    from lowrank_fl.nn.pretrain import _optimizer, build_backbone
    s = PretrainSettings.recipe("song", steps=7)
    opt, sched = _optimizer(build_backbone(s), s)
    assert isinstance(opt, torch.optim.AdamW)
    g = opt.param_groups[0]
    assert g["betas"] == (0.9, 0.98) and g["eps"] == 1e-9 and g["weight_decay"] == 5e-4
    assert np.isclose(g["lr"], 1e-3 / 3)                  # torch's ConstantLR default for 5 steps
    for _ in range(5):
        opt.step()
        sched.step()
    assert np.isclose(opt.param_groups[0]["lr"], 1e-3)
    d = PretrainSettings()
    opt, sched = _optimizer(build_backbone(d), d)
    assert type(opt) is torch.optim.Adam and sched is None and opt.param_groups[0]["lr"] == 1e-3
    # the default recipe keeps the cache key it had before the options existed
    old = {k: v for k, v in asdict(d).items() if k not in
           ("final_norm", "dropout", "optimizer", "betas", "eps", "weight_decay", "lr_warmup_steps")}
    blob = json.dumps({**old, "lengths": list(d.lengths), "torch": torch.__version__}, sort_keys=True)
    assert d.key() == hashlib.sha256(blob.encode()).hexdigest()[:20]
    assert s.key() != PretrainSettings(steps=7).key()
    with pytest.raises(ValueError, match="recipe"):
        PretrainSettings.recipe("theirs")
    with pytest.raises(ValueError, match="optimizer"):
        PretrainSettings(optimizer="sgd")


def test_lora_alpha_readings_give_peft_scalings():
    from peft import get_peft_model

    from lowrank_fl.nn.pretrain import build_backbone
    for reading, scaling in (("scaling", 16.0), ("alpha", 16.0 / 3)):
        s = LoraSettings(alpha_reading=reading)
        peft_model = get_peft_model(build_backbone(PretrainSettings()), s.config())
        q = dict(peft_model.named_modules())["base_model.model.blocks.0.q_proj"]
        assert np.isclose(q.scaling["default"], scaling)
    with pytest.raises(ValueError, match="alpha_reading"):
        LoraSettings(alpha_reading="both")


def test_checkpoints_of_one_run_are_the_shorter_runs(tmp_path, monkeypatch):
    from dataclasses import replace

    from lowrank_fl.nn import pretrain as P

    # Song's recipe: dropout and the ConstantLR warm-up, so evaluation at a checkpoint must not
    # disturb torch's generator or the schedule
    s = PretrainSettings.recipe("song", steps=6, batch_size=8, seed=2)
    ckpt = P.pretrained_checkpoints(s, (6, 2, 5), cache_dir=tmp_path)
    assert list(ckpt) == [2, 5, 6]
    for c, model in ckpt.items():
        alone = pretrained_backbone(replace(s, steps=c), cache_dir=None)
        for (k, v), w in zip(model.state_dict().items(), alone.state_dict().values()):
            assert torch.equal(v, w), (c, k)
        assert (tmp_path / f"copying-backbone-{replace(s, steps=c).key()}.safetensors").exists()
    assert not torch.equal(ckpt[2].state_dict()["lm_head.weight"], ckpt[6].state_dict()["lm_head.weight"])

    def no_training(*a, **k):
        raise AssertionError("trained although every checkpoint is cached")

    monkeypatch.setattr(P, "pretrain", no_training)
    again = P.pretrained_checkpoints(s, (2, 6), cache_dir=tmp_path)
    assert torch.equal(again[6].state_dict()["lm_head.weight"], ckpt[6].state_dict()["lm_head.weight"])
    with pytest.raises(ValueError, match="checkpoints"):
        P.pretrained_checkpoints(s, (7,), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="checkpoints"):
        P.pretrained_checkpoints(s, (), cache_dir=tmp_path)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="callback"):
        P.pretrain(s, checkpoints=(2,))
