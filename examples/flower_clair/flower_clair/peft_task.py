"""The PEFT template's model and data: a tiny Hugging Face Llama built from a config (no
download; replace :func:`build_base` by ``AutoModelForCausalLM.from_pretrained(...)`` for a real
model), PEFT LoRA on its attention projections, each client's copying task of the example
(:mod:`lowrank_fl.nn.copying`)."""
from __future__ import annotations

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from lowrank_fl.nn import copying

from .task import Settings

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def build_base(settings: Settings) -> LlamaForCausalLM:
    """The same tiny Llama on every client (seeded): 2 layers, hidden 32, grouped-query attention."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(int(settings.seed))
    cfg = LlamaConfig(vocab_size=copying.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=copying.T,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=copying.PAD)
    return LlamaForCausalLM(cfg)


def peft_model(settings: Settings):
    """The base with a rank-``settings.rank`` LoRA adapter ``"default"`` (the same initialization on
    every client: the seed)."""
    torch.set_num_threads(1)
    base = build_base(settings)
    torch.manual_seed(int(settings.seed) + 1)
    cfg = LoraConfig(r=settings.rank, lora_alpha=2 * settings.rank, target_modules=TARGETS, lora_dropout=0.0,
                     bias="none", init_lora_weights=True)
    return get_peft_model(base, cfg)


def data(settings: Settings, partition: int, split: str, server_round: int = 0) -> copying.CopyBatch:
    """A client's ``split`` ("train": ``n_train`` sequences per round, "val": ``n_val``, "test":
    ``n_test``) of its own copying task."""
    n = {"train": settings.n_train, "val": settings.n_val, "test": settings.n_test}[split]
    salt = {"train": server_round, "val": 98, "test": 99}[split]
    return settings.task(partition).sample(n, seed=np.random.default_rng([settings.seed, partition, salt, 7]))


def loss(model, batch: copying.CopyBatch) -> torch.Tensor:
    """Next-token cross-entropy on the second copy's positions."""
    tok = torch.from_numpy(batch.tokens)
    keep = torch.from_numpy(copying.copy_positions(batch)[:, 1:])
    logits = model(input_ids=tok[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits[keep], tok[:, 1:][keep])


def train(model, settings: Settings, partition: int, server_round: int) -> float:
    """``epochs`` of Adam on the trainable (LoRA) parameters, batches of 50; the last loss."""
    batch = data(settings, partition, "train", server_round)
    tok = batch.tokens
    rng = np.random.default_rng([settings.seed, partition, server_round, 3])
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=settings.lr)
    model.train()
    last = float("nan")
    for _ in range(settings.epochs):
        order = rng.permutation(len(tok))
        for start in range(0, len(tok) - 49, 50):
            part = copying.CopyBatch(*(np.asarray(x)[order[start:start + 50]] for x in batch))
            value = loss(model, part)
            opt.zero_grad()
            value.backward()
            opt.step()
            last = float(value)
    model.eval()
    return last


@torch.no_grad()
def accuracy(model, batch: copying.CopyBatch) -> float:
    """Masked accuracy (§8.2) of the model's greedy next-token predictions."""
    model.eval()
    tok = torch.from_numpy(batch.tokens)
    pred = np.full(batch.tokens.shape, -1, dtype=np.int64)
    pred[:, 1:] = model(input_ids=tok[:, :-1]).logits.argmax(-1).numpy()
    return 1.0 - copying.masked_error(pred, batch)


@torch.no_grad()
def val_loss(model, settings: Settings, partition: int) -> float:
    model.eval()
    return float(loss(model, data(settings, partition, "val")))
