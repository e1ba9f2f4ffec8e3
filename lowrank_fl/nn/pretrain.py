"""Backbone pretraining of CLAIR S5, deterministic and cached as safetensors keyed by its settings.

S5: Adam, 5500 steps, learning rate 1e-3, batch 64, on a balanced mixture of fuzzy-copying tasks
with ``L in {5..15}`` and power-law exponent 1.1, autoregressive next-token loss (on the second
copy's positions by default, ``loss="all"`` for every position: see :class:`PretrainSettings`). :class:`PretrainSettings` holds these numbers (smaller scales change ``steps``); its
``kind`` / ``exponent`` options give the diagnostic task (clean copying, ``exponent=0`` for uniform
letters) on which a 2-block attention-only model must learn induction-head copying quickly, and
:func:`copy_accuracy` measures whether a backbone copies (masked accuracy on its own pretraining
task). Given
the settings (seed included) the weights are identical across runs: one torch thread, the
initialization from ``torch.manual_seed`` and the batches from a numpy ``Generator``.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..validation import as_generator, check_int
from . import copying
from .transformer import CopyingTransformer

__all__ = ["PretrainSettings", "pretrain", "pretrained_backbone", "next_token_loss", "seed_torch",
           "copy_accuracy", "build_backbone", "pretrained_checkpoints", "OPTIMIZERS", "RECIPES"]

#: pretraining optimizers: S5's Adam, or AdamW as Song, Xu & Zhong's copying code runs it
OPTIMIZERS = ("adam", "adamw")
#: named recipes of :meth:`PretrainSettings.recipe`
RECIPES = ("ours", "song")


@dataclass(frozen=True)
class PretrainSettings:
    """Pretraining recipe (S5 defaults); ``seed`` fixes initialization and data."""

    steps: int = 5500
    lr: float = 1e-3
    batch_size: int = 64
    lengths: tuple = tuple(range(5, 16))
    exponent: float = 1.1
    kind: str = "fuzzy"
    #: background tokens of fuzzy copying (:func:`lowrank_fl.nn.copying.sample`)
    background: str = "power-law"
    d: int = 64
    mlp: bool = False
    heads: int = 1
    bias: bool = False
    #: the targets of the loss (:data:`lowrank_fl.nn.copying.LOSSES`). S5 says "autoregressive" without
    #: naming the positions; with the loss on every position ("all") the 1-head attention-only model
    #: stays at the unigram solution (27 % masked accuracy after 6000 steps: an induction head costs
    #: loss on the ~90 % background positions), on the second copy ("copy", default) it learns to
    #: copy in ~2000 steps
    loss: str = "copy"
    #: steps of clean copying with uniform letters before the ``steps`` of the task above (not in
    #: S5; 0 = the paper's recipe): a curriculum that lets the induction-head circuit form first
    warmup_steps: int = 0
    #: no layer norm before the output layer when False (Song et al.'s ``output_norm=False``)
    final_norm: bool = True
    #: dropout on each attention branch before the residual sum, training only (Song et al.: 0.1)
    dropout: float = 0.0
    #: :data:`OPTIMIZERS`; ``betas``, ``eps``, ``weight_decay`` are passed to it
    optimizer: str = "adam"
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    #: the first steps at a third of ``lr`` (torch's ``ConstantLR`` default, which Song et al.'s
    #: "constant" schedule uses: 5 steps); 0 = constant from the start
    lr_warmup_steps: int = 0
    seed: int = 0

    @classmethod
    def recipe(cls, name: str = "ours", **overrides) -> "PretrainSettings":
        """A named recipe (:data:`RECIPES`), with ``overrides`` on top.

        ``"ours"``: the defaults above (S5's numbers, loss on the second copy, final layer norm,
        no biases). ``"song"``: the model and optimizer of Song, Xu & Zhong's copying code
        (``synthetic-experiments/``, the "standard practice" S5 points to): biases on every
        linear, attention-branch dropout 0.1, no final layer norm, AdamW (0.9, 0.98), eps 1e-9,
        weight decay 5e-4, constant lr 1e-3 after torch's 5 ``ConstantLR`` steps, the loss on
        every position; S5's steps (5500), batch (64) and task mixture are kept.
        """
        if name not in RECIPES:
            raise ValueError(f"recipe name must be one of {RECIPES}, got {name!r}")
        base = {} if name == "ours" else dict(
            bias=True, dropout=0.1, final_norm=False, optimizer="adamw", betas=(0.9, 0.98), eps=1e-9,
            weight_decay=5e-4, lr_warmup_steps=5, loss="all")
        return cls(**{**base, **overrides})

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if len(tuple(self.betas)) != 2:
            raise ValueError(f"betas must be a pair, got {self.betas!r}")

    def key(self) -> str:
        """Hex digest of the settings (and the torch version): the cache file's name."""
        fields = asdict(self)
        # fields at their historical defaults are left out, so backbones cached before those
        # fields existed keep their key
        for name, old in _KEYLESS_DEFAULTS.items():
            if fields[name] == old:
                del fields[name]
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
        blob = json.dumps({**fields, "torch": torch.__version__}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


_KEYLESS_DEFAULTS = {"final_norm": True, "dropout": 0.0, "optimizer": "adam", "betas": (0.9, 0.999),
                     "eps": 1e-8, "weight_decay": 0.0, "lr_warmup_steps": 0}


def build_backbone(settings: PretrainSettings) -> CopyingTransformer:
    """An untrained :class:`CopyingTransformer` with the architecture ``settings`` name."""
    return CopyingTransformer(d=settings.d, mlp=settings.mlp, heads=settings.heads, bias=settings.bias,
                              final_norm=settings.final_norm, dropout=settings.dropout)


def _optimizer(model, settings: PretrainSettings):
    cls = torch.optim.Adam if settings.optimizer == "adam" else torch.optim.AdamW
    opt = cls(model.parameters(), lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps,
              weight_decay=settings.weight_decay)
    sched = (torch.optim.lr_scheduler.ConstantLR(opt, factor=1 / 3, total_iters=settings.lr_warmup_steps)
             if settings.lr_warmup_steps else None)
    return opt, sched


def seed_torch(seed: int) -> torch.Generator:
    """Seed torch's global generator (module initialization, dropout) and return a local one."""
    torch.manual_seed(int(seed))
    return torch.Generator().manual_seed(int(seed))


def next_token_loss(model, tokens: torch.Tensor, positions=None) -> torch.Tensor:
    """Mean cross-entropy of predicting ``tokens[:, t]`` from ``tokens[:, :t]`` for every t >= 1,
    or only where ``positions`` (bool (n, T), column 0 unused) is true."""
    logits = model(tokens[:, :-1])
    target = tokens[:, 1:]
    if positions is not None:
        keep = torch.as_tensor(np.asarray(positions)[:, 1:])
        return torch.nn.functional.cross_entropy(logits[keep], target[keep])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def pretrain(settings: PretrainSettings = PretrainSettings(), *, checkpoints=(),
             callback=None) -> tuple[CopyingTransformer, list]:
    """Train the backbone from scratch (``warmup_steps`` of clean uniform copying, then ``steps`` of
    the settings' task); returns the model (eval mode) and the loss per step.

    ``callback(step, model)`` is called (model in eval mode, no gradient) after ``step`` steps of
    the task for every ``step`` in ``checkpoints`` (ints in ``1..steps``): the model it sees is the
    one ``pretrain(replace(settings, steps=step))`` returns, bit for bit (evaluation draws nothing
    from torch's generator).
    """
    check_int(settings.steps, "steps", minimum=0)
    checkpoints = sorted({check_int(c, "checkpoints", minimum=1, maximum=settings.steps) for c in checkpoints})
    if checkpoints and callback is None:
        raise ValueError("checkpoints need a callback(step, model)")
    check_int(settings.warmup_steps, "warmup_steps", minimum=0)
    torch.set_num_threads(1)
    seed_torch(settings.seed)
    check_int(settings.lr_warmup_steps, "lr_warmup_steps", minimum=0)
    model = build_backbone(settings)
    opt, sched = _optimizer(model, settings)
    rng = as_generator(settings.seed, "pretrain-data")
    losses = []
    model.train()
    for step in range(settings.warmup_steps + settings.steps):
        warm = step < settings.warmup_steps
        b = copying.sample_mixture(settings.batch_size, lengths=settings.lengths,
                                   exponent=0.0 if warm else settings.exponent,
                                   kind="clean" if warm else settings.kind,
                                   background=settings.background, seed=rng)
        loss = next_token_loss(model, torch.from_numpy(b.tokens),
                               copying.loss_positions(b, "all" if warm else settings.loss))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
        done = step + 1 - settings.warmup_steps
        if checkpoints and done == checkpoints[0]:
            checkpoints.pop(0)
            model.eval()
            with torch.no_grad():
                callback(done, model)
            model.train()
    return model.eval(), losses


def pretrained_backbone(settings: PretrainSettings = PretrainSettings(), *, cache_dir=None) -> CopyingTransformer:
    """The pretrained backbone, from ``cache_dir/copying-backbone-<key>.safetensors`` when present
    (otherwise trained, then written there). ``cache_dir=None``: trained in process, not stored.
    """
    path = None
    if cache_dir is not None:
        path = _cache_path(settings, cache_dir)
        if path.exists():
            model = build_backbone(settings)
            model.load_state_dict(load_file(str(path)))
            return model.eval()
    model, losses = pretrain(settings)
    if path is not None:
        _store(model, settings, path, losses)
    return model


def _cache_path(settings: PretrainSettings, cache_dir) -> Path:
    return Path(cache_dir) / f"copying-backbone-{settings.key()}.safetensors"


def _store(model, settings: PretrainSettings, path: Path, losses) -> None:
    """Write ``model``'s weights to ``path`` (staged, then renamed), with the settings as metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    meta = {k: json.dumps(v if not isinstance(v, tuple) else list(v)) for k, v in asdict(settings).items()}
    meta["final_loss"] = json.dumps(float(np.mean(losses[-50:])) if len(losses) else None)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp), metadata=meta)
    tmp.replace(path)


def pretrained_checkpoints(settings: PretrainSettings, checkpoints, *, cache_dir=None) -> dict:
    """``{step: backbone}``: for each step of ``checkpoints`` (ints in ``1..settings.steps``) the
    model :func:`pretrained_backbone` gives for ``replace(settings, steps=step)``, from one training
    run (the checkpoints of one run are those of the shorter runs, bit for bit). Each checkpoint is
    cached under its own settings' key in ``cache_dir``; when all are there nothing is trained.
    """
    steps = sorted({check_int(c, "checkpoints", minimum=1, maximum=settings.steps) for c in checkpoints})
    if not steps:
        raise ValueError("checkpoints must name at least one step")
    at = {c: replace(settings, steps=c) for c in steps}
    if cache_dir is not None and all(_cache_path(s, cache_dir).exists() for s in at.values()):
        return {c: pretrained_backbone(s, cache_dir=cache_dir) for c, s in at.items()}
    out = {}

    def keep(step, model):
        out[step] = copy.deepcopy(model).eval()

    _, losses = pretrain(replace(settings, steps=steps[-1]), checkpoints=steps, callback=keep)
    if cache_dir is not None:
        for c, s in at.items():
            _store(out[c], s, _cache_path(s, cache_dir), losses[:settings.warmup_steps + c])
    return out


def copy_accuracy(model, settings: PretrainSettings = PretrainSettings(), *, n: int = 500, seed=None,
                  metric: str = "paper") -> float:
    """Masked next-token accuracy (§8.2, positions ``m+3 .. m+L-1`` of the second copy; ``metric``
    as in :func:`lowrank_fl.nn.copying.mask`) of ``model`` on ``n`` fresh sequences of its
    pretraining task (``settings``' mixture, kind and exponent).

    The baseline check of the §8 experiment: a backbone that has not learned to copy scores about
    the share of the most frequent letter (27 % at ``t = 1.1``), one that copies far above it.
    """
    b = copying.sample_mixture(check_int(n, "n", minimum=1), lengths=settings.lengths,
                               exponent=settings.exponent, kind=settings.kind,
                               background=settings.background, seed=seed)
    model.eval()
    pred = np.full(b.tokens.shape, -1, dtype=np.int64)
    with torch.no_grad():
        pred[:, 1:] = model(torch.from_numpy(b.tokens[:, :-1])).argmax(-1).numpy()
    return 1.0 - copying.masked_error(pred, b, metric=metric)
