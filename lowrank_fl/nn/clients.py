"""Local LoRA fine-tuning of one client with PEFT (CLAIR S5), saved as a real adapter directory.

S5: rank-3 LoRA on the eight attention projections and the output layer, the ``A`` factors
initialized from the same seed on every client (``init_seed``), only LoRA parameters trained,
2000 sequences, one epoch, batch 50, Adam at learning rate 1e-3, LoRA scale 16 and dropout 0.005.
"Scale 16" has two readings (:data:`ALPHA_READINGS`): PEFT's ``lora_alpha = 16`` (scaling
``16 / r``, ``alpha_reading="alpha"``, the default) or PEFT's scaling ``lora_alpha / r = 16``
(``lora_alpha = 16 r``, ``alpha_reading="scaling"``). The default is the reading under which the
paper's own τ = 0.5 behaves as §8.3 says (it finds the contaminated client in the homogeneous
regime; ``clair.sec8.detection`` reports both readings). The loss is on the second
copy's positions by default, as the backbone's pretraining (``LoraSettings.loss``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model

from ..validation import as_generator, check_int
from . import copying
from .pretrain import next_token_loss, seed_torch
from .transformer import ATTENTION_MODULES, OUTPUT_MODULE

__all__ = ["LoraSettings", "TaskSpec", "train_client", "fit_lora", "predict", "accuracy", "ALPHA_READINGS"]

#: readings of S5's "LoRA scale 16": PEFT's scaling ``lora_alpha / r`` equals the scale, or
#: PEFT's ``lora_alpha`` equals it
ALPHA_READINGS = ("scaling", "alpha")


@dataclass(frozen=True)
class LoraSettings:
    """Local fine-tuning recipe (S5 defaults)."""

    rank: int = 3
    scale: float = 16.0
    dropout: float = 0.005
    n_train: int = 2000
    epochs: int = 1
    batch_size: int = 50
    lr: float = 1e-3
    #: targets of the loss (:data:`lowrank_fl.nn.copying.LOSSES`), as the backbone's pretraining
    #: (:class:`lowrank_fl.nn.pretrain.PretrainSettings`): "copy" (default) or "all"
    loss: str = "copy"
    #: :data:`ALPHA_READINGS`: how ``scale`` becomes PEFT's ``lora_alpha``
    alpha_reading: str = "alpha"

    def __post_init__(self):
        if self.alpha_reading not in ALPHA_READINGS:
            raise ValueError(f"alpha_reading must be one of {ALPHA_READINGS}, got {self.alpha_reading!r}")

    @property
    def lora_alpha(self) -> float:
        """PEFT's ``lora_alpha`` under :attr:`alpha_reading` (scaling = ``lora_alpha / rank``)."""
        return self.scale * self.rank if self.alpha_reading == "scaling" else self.scale

    def config(self) -> LoraConfig:
        targets = [m.split(".")[-1] for m in ATTENTION_MODULES[:4]] + [OUTPUT_MODULE]
        return LoraConfig(r=self.rank, lora_alpha=self.lora_alpha, lora_dropout=self.dropout,
                          target_modules=targets, bias="none", init_lora_weights=True)


@dataclass(frozen=True)
class TaskSpec:
    """A client's copying task: segment length ``L``, exponent ``t``, kind and background tokens
    (see :func:`lowrank_fl.nn.copying.sample`)."""

    length: int = 16
    exponent: float = 1.1
    kind: str = "fuzzy"
    background: str = "power-law"

    def sample(self, n: int, *, seed) -> copying.CopyBatch:
        return copying.sample(n, length=self.length, exponent=self.exponent, kind=self.kind,
                              background=self.background, seed=seed)


def train_client(backbone, task: TaskSpec, out_dir, *, settings: LoraSettings = LoraSettings(),
                 init_seed: int, seed) -> Path:
    """Fine-tune a copy of ``backbone`` with LoRA on ``settings.n_train`` sequences of ``task``
    and write the adapter with PEFT's ``save_pretrained`` to ``out_dir``.

    ``init_seed`` seeds the LoRA initialization (the same on every client: equal ``A`` factors,
    ``B = 0``); ``seed`` the client's data and dropout. Returns ``out_dir``.
    """
    check_int(settings.n_train, "n_train", minimum=settings.batch_size)
    torch.set_num_threads(1)
    seed_torch(init_seed)
    model = get_peft_model(copy.deepcopy(backbone), settings.config())
    rng = as_generator(seed, "client-data")
    batch = task.sample(settings.n_train, seed=rng)
    fit_lora(model, batch, settings, rng)
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir), save_embedding_layers=False)
    return out_dir


def fit_lora(model, batch: copying.CopyBatch, settings: LoraSettings, rng) -> None:
    """Train a PEFT model's trainable (LoRA) parameters in place on ``batch``: ``settings.epochs``
    epochs of Adam in mini-batches of ``settings.batch_size`` (S5), the loss on
    ``settings.loss``'s positions; ``rng`` (a numpy Generator) draws the dropout seed and the
    orders."""
    data = torch.from_numpy(batch.tokens)
    n = data.shape[0]
    where = copying.loss_positions(batch, settings.loss)
    torch.manual_seed(int(rng.integers(2**31)))        # dropout stream of this client
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=settings.lr)
    model.train()
    for _ in range(settings.epochs):
        order = torch.from_numpy(rng.permutation(n))
        for start in range(0, n - settings.batch_size + 1, settings.batch_size):
            idx = order[start:start + settings.batch_size]
            loss = next_token_loss(model, data[idx], None if where is None else where[idx.numpy()])
            opt.zero_grad()
            loss.backward()
            opt.step()


@torch.no_grad()
def predict(model, batch: copying.CopyBatch, *, chunk: int = 250) -> np.ndarray:
    """``x̂_{i,t} = argmax_a p̂_t(a | x_{i,<t})`` as an int array (n, T); column 0 is unused (-1)."""
    model.eval()
    tokens = torch.from_numpy(batch.tokens)
    out = np.full(batch.tokens.shape, -1, dtype=np.int64)
    for s in range(0, tokens.shape[0], chunk):
        out[s:s + chunk, 1:] = model(tokens[s:s + chunk, :-1]).argmax(-1).numpy()
    return out


def accuracy(model, batch: copying.CopyBatch, *, metric: str = "paper") -> float:
    """``Acc_mask = 1 - Err_mask`` (§8.2) of ``model`` on ``batch``; ``metric`` as in
    :func:`lowrank_fl.nn.copying.mask`."""
    return 1.0 - copying.masked_error(predict(model, batch), batch, metric=metric)
