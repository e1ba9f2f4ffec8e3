"""Sets of LoRA adapters trained with PEFT on tiny transformers, with ground truth (contaminated
clients known): the benchmark on which the adapters' client-level detection is designed and tested.

A set is built in two steps, both deterministic given :class:`TrainedSetSettings` (seed included):

1. a tiny base model built offline with ``transformers`` — ``"llama"``: ``LlamaForCausalLM``
   (hidden 64, 2 layers, 4 query heads, 2 key/value heads: GQA, so ``k_proj``/``v_proj`` are
   32 × 64), LoRA on ``q_proj, k_proj, v_proj, o_proj``; ``"gpt2"``: ``GPT2LMHeadModel`` (n_embd 64,
   2 layers, ``Conv1D`` weights stored in × out), LoRA on ``attn.c_attn, attn.c_proj`` with
   ``fan_in_fan_out=True`` — pretrained on a mixture of fuzzy copying tasks
   (:mod:`lowrank_fl.nn.copying`, vocabulary 53, sequences of ``seq_len`` tokens) until it copies:
   with uniform letters (``exponent = 0``), batches of 64 and learning rate 1e-3 both bases pass
   80 % masked accuracy within 1000 steps and the default trains 1500
   (:func:`base_accuracy` reports it). Under S5's power law (``t = 1.1``) neither base learned
   to copy within 2000 steps (27 %: the most frequent letter), and adapters trained on a base that
   does not copy carry no copying rule to disagree on;
2. ``n_clients`` LoRA clients fine-tuned from the same LoRA initialization (PEFT's default: the
   same ``A``, ``B = 0``): benign clients learn fuzzy copying, with the same task
   (``heterogeneous=False``) or with small per-client variations of the power-law exponent and the
   segment length; the last ``n_contaminated`` clients learn a mismatched rule
   (:data:`lowrank_fl.nn.copying.CONTAMINATIONS`, cycled through ``contamination``).

A third family, ``"sec8"``, is CLAIR §8's clients (:meth:`TrainedSetSettings.for_base`): the
backbone of :mod:`lowrank_fl.nn.transformer` pretrained by S5's recipe
(:class:`lowrank_fl.nn.pretrain.PretrainSettings`: power-law letters ``t = 1.1``, loss on the
second copy, Adam, batch 64), clients fine-tuned by S5's LoRA recipe (rank 3, ``lora_alpha = 16``:
:class:`lowrank_fl.nn.clients.LoraSettings`' default reading, dropout 0.005, 2000 sequences in
batches of 50, Adam 1e-3) on §8's tasks (homogeneous ``t = 1.1, L = 16``; heterogeneous
``t ~ U[0.95, 1.6]``, ``L ~ U{10..26}``). S5 adapts the output layer too and §8 keeps it local:
the set's ``factors`` hold the eight attention projections (what the aggregators see) and
``local`` each client's ``lm_head`` factors, added to every method's model of that client.

The factors are returned in memory (``{client: {module: (A (r, in), B (out, r), scaling)}}``, the
input of :func:`lowrank_fl.adapters.aggregate_factors`), and cached as one safetensors file per
settings (the base model in another), as :mod:`lowrank_fl.nn.pretrain` caches its backbone.
One torch thread; a set of 10 clients takes seconds on one CPU core (about 20 s for "sec8").
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..adapters.memory import factors_from_state_dict
from ..validation import as_generator, check_int
from . import copying

__all__ = ["BASES", "TrainedSetSettings", "TrainedSet", "ClientTask", "build_base", "trained_set",
           "client_tasks", "model_with", "heldout_loss", "heldout_accuracy", "base_accuracy",
           "copying_threshold", "LETTERS"]

BASES = ("llama", "gpt2", "sec8")
_TARGETS = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj"], "gpt2": ["attn.c_attn", "attn.c_proj"],
            "sec8": ["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"]}
#: modules of a family that every method keeps local (§8: the output layer)
_LOCAL = {"sec8": ("lm_head",)}
#: the "sec8" family's defaults (S5's recipe; see the module docstring)
_SEC8 = {"exponent": 1.1, "length": 16, "seq_len": copying.T, "rank": 3, "lora_alpha": 16.0,
         "lora_dropout": 0.005, "steps": 40, "batch_size": 50, "lr": 1e-3, "pretrain_steps": 2500,
         "pretrain_lr": 1e-3, "base_seed": 1, "contamination": ("reverse", "shift", "upper")}
#: fields added after sets were cached: left out of the key at these values (old keys stay valid)
_KEYLESS_DEFAULTS = {"lora_dropout": 0.0, "benign_task": "fuzzy", "n_examples": 0, "label_noise": 0.0, "uneven": 1.0,
                     "letters": "all", "use_rslora": False}
LETTERS = ("all", "disjoint")
#: letters per group of the "disjoint" benign heterogeneity (52 letters: 6 groups, 4 left out)
_GROUP = 8


@dataclass(frozen=True)
class TrainedSetSettings:
    """What a trained adapter set is made of (every field enters the cache key).

    Family ``"sec8"`` (:meth:`for_base`) reads some fields differently: its heterogeneous benign
    tasks are §8.2's draws (``exponent``, ``length`` and ``spread`` then only set the common task
    of :func:`base_accuracy`), and its base is pretrained by
    :meth:`pretrain_settings` (S5's recipe: ``pretrain_steps``, ``pretrain_lr``, ``base_seed``;
    batch 64 and S5's mixture, whatever ``batch_size``, ``exponent`` and ``seq_len`` say).
    """

    base: str = "llama"
    n_clients: int = 10
    n_contaminated: int = 2
    #: mismatched rules of the contaminated clients, cycled ("sec8": reverse, shift, upper)
    contamination: tuple = ("shift", "clean", "reverse")
    #: benign clients: per-client exponent in ``exponent ± spread`` and length in ``length ± 1``
    #: ("sec8": §8.2's ``t ~ U[0.95, 1.6]``, ``L ~ U{10..26}``); False: all on (length, exponent)
    heterogeneous: bool = True
    spread: float = 0.15
    exponent: float = 0.0
    length: int = 6
    seq_len: int = 32
    rank: int = 4
    lora_alpha: float = 8.0
    pretrain_steps: int = 1500
    pretrain_lr: float = 1e-3
    steps: int = 30
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0
    #: the base model's seed (one pretrained base serves every set of the same base settings)
    base_seed: int = 0
    #: PEFT's ``lora_dropout`` of the clients (S5: 0.005)
    lora_dropout: float = 0.0
    #: the benign clients' rule (a kind of :func:`lowrank_fl.nn.copying.sample`: "fuzzy" copying, or
    #: e.g. "upper", a rule the copying base must learn); the contaminated rules must differ from it
    benign_task: str = "fuzzy"
    #: each client's training data: 0 = fresh sequences every step (a large data set); n > 0 = a
    #: fixed set of n sequences drawn once, batches of ``min(batch_size, n)`` drawn from it
    n_examples: int = 0
    #: probability that a training label (a token of the second occurrence) is a uniform letter
    label_noise: float = 0.0
    #: uneven training: each client trains as given, ``steps × uneven`` or with ``lr × uneven``
    #: (drawn per client, 1/3 each); 1 = every client alike
    uneven: float = 1.0
    #: segment letters: "all" 52, or "disjoint" groups of 8 letters per client (benign
    #: heterogeneity on the inputs: client k draws from group k mod 6)
    letters: str = "all"
    #: PEFT's rsLoRA scaling ``lora_alpha / sqrt(r)`` instead of ``lora_alpha / r``
    use_rslora: bool = False

    @classmethod
    def for_base(cls, base: str, **overrides) -> "TrainedSetSettings":
        """Settings of family ``base`` with its defaults: the class defaults for ``"llama"`` and
        ``"gpt2"``; S5's recipe for ``"sec8"`` (exponent 1.1, length 16, sequences of 64, rank 3,
        ``lora_alpha`` 16, dropout 0.005, 40 steps of 50 sequences at 1e-3, a backbone pretrained
        2500 steps at 1e-3 from seed 1, contaminated clients reverse / shift / upper), ``overrides``
        on top. Pretraining seed 1, not 0: under our recipe (loss on the second copy) seed 0 stays
        on the plateau (58 % masked accuracy at 2500 steps, below the 63 % copying threshold; an
        outside reading of S5 found 60 % at 5500), seed 1 copies (97 %)."""
        if base not in BASES:
            raise ValueError(f"base must be one of {BASES}, got {base!r}")
        return cls(**{**(_SEC8 if base == "sec8" else {}), "base": base, **overrides})

    def __post_init__(self):
        if self.base not in BASES:
            raise ValueError(f"base must be one of {BASES}, got {self.base!r}")
        check_int(self.n_clients, "n_clients", minimum=2)
        check_int(self.n_contaminated, "n_contaminated", minimum=0, maximum=self.n_clients - 1)
        kinds = ("fuzzy",) + copying.CONTAMINATIONS
        if isinstance(self.contamination, str) or not isinstance(self.contamination, (tuple, list)):
            raise ValueError(f"contamination must be a non-empty tuple of {kinds}, "
                             f"got {self.contamination!r}")
        object.__setattr__(self, "contamination", tuple(self.contamination))   # hashable (caches)
        bad = [c for c in self.contamination if c not in kinds]
        if bad or not self.contamination:
            raise ValueError(f"contamination must be a non-empty tuple of {kinds}, "
                             f"got {self.contamination!r}")
        check_int(self.length, "length", minimum=5)
        for name, low, high in (("lora_dropout", 0.0, 1.0), ("spread", 0.0, math.inf),
                                ("exponent", 0.0, math.inf), ("label_noise", 0.0, 1.0),
                                ("uneven", 1.0, math.inf)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v < high):
                raise ValueError(f"{name} must be a number in [{low:g}, {high:g}), got {v!r}")
        for name in ("lr", "pretrain_lr", "lora_alpha"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        # the "sec8" heterogeneous draws reach L = 26 (§8), the others length + 1; homogeneous: length
        longest = ((26 if self.base == "sec8" else self.length + 1) if self.heterogeneous else self.length)
        if not 2 * longest < self.seq_len:
            raise ValueError(f"seq_len must exceed {2 * longest} (twice the longest segment), "
                             f"got {self.seq_len}")
        for name in ("rank", "steps", "batch_size"):
            check_int(getattr(self, name), name, minimum=1)
        check_int(self.pretrain_steps, "pretrain_steps", minimum=0)
        check_int(self.n_examples, "n_examples", minimum=0)
        if self.benign_task not in ("fuzzy",) + copying.CONTAMINATIONS or self.benign_task in self.contamination:
            raise ValueError(f"benign_task must be 'fuzzy' or one of {copying.CONTAMINATIONS} that is not "
                             f"among contamination {self.contamination}, got {self.benign_task!r}")
        if self.letters not in LETTERS:
            raise ValueError(f"letters must be one of {LETTERS}, got {self.letters!r}")
        if not isinstance(self.use_rslora, bool):
            raise ValueError(f"use_rslora must be a bool, got {self.use_rslora!r}")

    def base_key(self) -> str:
        keys = ("base", "seq_len", "pretrain_steps", "pretrain_lr", "exponent", "length",
                "batch_size", "base_seed")
        return _digest({k: getattr(self, k) for k in keys})

    def key(self) -> str:
        fields = asdict(self)
        for name, old in _KEYLESS_DEFAULTS.items():
            if fields[name] == old:
                del fields[name]
        return _digest(fields)

    def pretrain_settings(self):
        """The "sec8" family's :class:`lowrank_fl.nn.pretrain.PretrainSettings` (S5's recipe)."""
        from .pretrain import PretrainSettings

        return PretrainSettings(steps=self.pretrain_steps, lr=self.pretrain_lr, seed=self.base_seed)


def _digest(d: dict) -> str:
    blob = json.dumps({**{k: list(v) if isinstance(v, tuple) else v for k, v in d.items()},
                       "torch": torch.__version__}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class ClientTask:
    """One client's copying task (:func:`lowrank_fl.nn.copying.sample` arguments)."""

    kind: str
    length: int
    exponent: float
    #: segment letter ids (None: all 52); training schedule factors of the client (uneven training)
    alphabet: tuple | None = None
    steps_factor: float = 1.0
    lr_factor: float = 1.0

    def sample(self, n: int, seq_len: int, *, seed, label_noise: float = 0.0) -> copying.CopyBatch:
        return copying.sample(n, length=self.length, exponent=self.exponent, kind=self.kind,
                              seq_len=seq_len, alphabet=self.alphabet, label_noise=label_noise,
                              seed=seed)


@dataclass(frozen=True, eq=False)
class TrainedSet:
    """A trained adapter set.

    factors : dict
        ``{client: {module: (A (r, in), B (out, r), scaling)}}``, float64, PEFT module names.
    contaminated : list
        Names of the clients trained on a mismatched rule (the ground truth).
    tasks : dict
        ``{client: ClientTask}``.
    settings : TrainedSetSettings
        What the set was built from.
    seconds : float
        Wall-clock seconds :func:`trained_set` took (reading the cache included).
    local : dict
        ``{client: {module: (A, B, scaling)}}`` of the modules every method keeps local (the
        "sec8" family's ``lm_head``); empty for the other families.
    """

    settings: TrainedSetSettings
    factors: dict
    contaminated: list
    tasks: dict
    seconds: float = field(default=0.0, compare=False)
    local: dict = field(default_factory=dict)

    @property
    def names(self) -> list:
        return list(self.factors)

    @property
    def benign(self) -> list:
        return [n for n in self.factors if n not in self.contaminated]


def client_tasks(s: TrainedSetSettings) -> dict:
    """``{client: ClientTask}``: benign clients first, the last ``n_contaminated`` mismatched."""
    rng = as_generator(s.seed, "trained-set-tasks")
    K, bad = s.n_clients, s.n_contaminated
    out = {}
    for k in range(K):
        if s.heterogeneous and s.base == "sec8":          # §8.2's heterogeneous draws
            length, exponent = int(rng.integers(10, 27)), round(float(rng.uniform(0.95, 1.6)), 3)
        elif s.heterogeneous:
            length = s.length + int(rng.integers(-1, 2))
            exponent = round(float(s.exponent + rng.uniform(-s.spread, s.spread)), 3)
        else:
            length, exponent = s.length, s.exponent
        kind = s.benign_task if k < K - bad else s.contamination[(k - (K - bad)) % len(s.contamination)]
        out[f"client{k:02d}"] = ClientTask(kind=kind, length=length, exponent=exponent)
    if s.letters == "disjoint":
        groups = 52 // _GROUP
        out = {n: replace(t, alphabet=tuple(range(_GROUP * (k % groups), _GROUP * (k % groups + 1))))
               for k, (n, t) in enumerate(out.items())}
    if s.uneven != 1.0:           # its own stream: the tasks above are those of even training
        pick = as_generator(s.seed, "trained-set-uneven").integers(0, 3, size=K)
        out = {n: replace(t, steps_factor=s.uneven if c == 1 else 1.0, lr_factor=s.uneven if c == 2 else 1.0)
               for (n, t), c in zip(out.items(), pick)}
    return out


def build_base(s: TrainedSetSettings):
    """The untrained tiny base of ``s.base`` (seeded by ``s.base_seed``)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if s.base == "sec8":
        from .pretrain import build_backbone, seed_torch

        seed_torch(s.base_seed)
        return build_backbone(s.pretrain_settings())
    torch.manual_seed(int(s.base_seed))
    if s.base == "llama":
        cfg = LlamaConfig(vocab_size=copying.VOCAB, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=s.seq_len, tie_word_embeddings=False,
                          bos_token_id=None, eos_token_id=None, pad_token_id=copying.PAD)
        return LlamaForCausalLM(cfg)
    cfg = GPT2Config(vocab_size=copying.VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=s.seq_len,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                     eos_token_id=None, pad_token_id=copying.PAD)
    return GPT2LMHeadModel(cfg)


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token logits of a ``transformers`` model (``.logits``) or of the §8 backbone (a tensor)."""
    out = model(tokens)
    return out if isinstance(out, torch.Tensor) else out.logits


def _loss(model, batch: copying.CopyBatch) -> torch.Tensor:
    """Next-token cross-entropy on the second copy's positions (those the first copy determines)."""
    tok = torch.from_numpy(batch.tokens)
    keep = torch.from_numpy(copying.copy_positions(batch)[:, 1:])
    logits = _logits(model, tok[:, :-1])
    return torch.nn.functional.cross_entropy(logits[keep], tok[:, 1:][keep])


def _pretrained_base(s: TrainedSetSettings, cache_dir):
    if s.base == "sec8":                        # S5's pretraining, cached by its own settings
        from .pretrain import pretrained_backbone

        return pretrained_backbone(s.pretrain_settings(), cache_dir=cache_dir)
    path = None if cache_dir is None else Path(cache_dir) / f"trained-base-{s.base_key()}.safetensors"
    model = build_base(s)
    if path is not None and path.exists():
        model.load_state_dict(load_file(str(path)))
        return model.eval()
    opt = torch.optim.Adam(model.parameters(), lr=s.pretrain_lr)
    rng = as_generator(s.base_seed, "trained-set-pretrain")
    lengths = range(s.length - 1, s.length + 2)
    model.train()
    for _ in range(s.pretrain_steps):
        b = _mixture(s.batch_size, lengths, s.exponent, s.seq_len, rng)
        loss = _loss(model, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    if path is not None:
        _save(path, {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}, {})
    return model


#: pretrained bases kept in memory, by (what the base depends on, cache_dir); the last few only
_BASES: dict = {}
_MAX_BASES = 4


def _base_cached(s: TrainedSetSettings, cache_dir):
    """The pretrained base, kept in memory (callers deep-copy it before changing weights): keyed by
    what the base depends on, so the sets of every client seed on one base share it."""
    key = (s.pretrain_settings().key() if s.base == "sec8" else s.base_key(),
           None if cache_dir is None else str(cache_dir))
    if key not in _BASES:
        with torch.enable_grad():          # callers may hold no_grad (base_accuracy, model_with)
            model = _pretrained_base(s, cache_dir)
        while len(_BASES) >= _MAX_BASES:
            _BASES.pop(next(iter(_BASES)))
        _BASES[key] = model
    return _BASES[key]


def _mixture(n, lengths, exponent, seq_len, rng) -> copying.CopyBatch:
    lengths = list(lengths)
    pick = rng.integers(0, len(lengths), size=n)
    parts = [copying.sample(int((pick == i).sum()), length=L, exponent=exponent, seq_len=seq_len,
                            seed=rng) for i, L in enumerate(lengths) if (pick == i).any()]
    return copying.CopyBatch(*(np.concatenate(x) for x in zip(*parts)))


def _save(path: Path, tensors: dict, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)


def _lora_config(s: TrainedSetSettings):
    from peft import LoraConfig

    return LoraConfig(r=s.rank, lora_alpha=s.lora_alpha, target_modules=_TARGETS[s.base],
                      lora_dropout=float(s.lora_dropout), bias="none", fan_in_fan_out=s.base == "gpt2",
                      init_lora_weights=True, use_rslora=bool(s.use_rslora))


def _train_client(base, s: TrainedSetSettings, task: ClientTask, k: int) -> dict:
    import copy
    import warnings

    from peft import get_peft_model, get_peft_model_state_dict

    torch.manual_seed(int(s.seed))                 # the same LoRA initialization on every client
    with warnings.catch_warnings():
        # transformers 5 deprecates a name PEFT still calls, once per wrapped model: noise here
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(copy.deepcopy(base), _lora_config(s))
    rng = as_generator(np.random.SeedSequence(int(s.seed), spawn_key=(k,)), "trained-set-client")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=s.lr * task.lr_factor)
    data = (task.sample(s.n_examples, s.seq_len, seed=rng, label_noise=s.label_noise)
            if s.n_examples else None)
    model.train()
    for _ in range(int(round(s.steps * task.steps_factor))):
        if data is None:
            batch = task.sample(s.batch_size, s.seq_len, seed=rng, label_noise=s.label_noise)
        else:                      # a minibatch of the client's fixed examples
            idx = rng.choice(s.n_examples, size=min(s.batch_size, s.n_examples), replace=False)
            batch = copying.CopyBatch(*(x[idx] for x in data))
        loss = _loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sd = get_peft_model_state_dict(model, save_embedding_layers=False)
    return {key: v.detach().double().numpy() for key, v in sd.items()}


def trained_set(settings: TrainedSetSettings = TrainedSetSettings(), *, cache_dir=None) -> TrainedSet:
    """Build (or read from ``cache_dir``) the trained adapter set of ``settings`` (module
    docstring). ``cache_dir=None``: trained in process, nothing stored."""
    import time

    t0 = time.perf_counter()
    s = settings
    tasks = client_tasks(s)
    cfg = {"r": s.rank, "lora_alpha": s.lora_alpha, "use_rslora": bool(s.use_rslora)}
    path = None if cache_dir is None else Path(cache_dir) / f"trained-set-{s.key()}.safetensors"
    if path is not None and path.exists():
        flat = {k: v.double().numpy() for k, v in load_file(str(path)).items()}
        states = {name: {} for name in tasks}
        for key, v in flat.items():
            name, _, rest = key.partition("/")
            states[name][rest] = v
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)                       # deterministic and fast at this size
        try:
            base = _base_cached(s, cache_dir)
            states = {name: _train_client(base, s, task, k) for k, (name, task) in enumerate(tasks.items())}
        finally:
            torch.set_num_threads(threads)
        if path is not None:
            _save(path, {f"{n}/{key}": torch.from_numpy(v).float().contiguous()
                         for n, st in states.items() for key, v in st.items()},
                  {"settings": json.dumps({k: list(v) if isinstance(v, tuple) else v
                                           for k, v in asdict(s).items()})})
    # float32 is what PEFT trains and stores; widened to float64 after the round trip either way
    factors = {n: factors_from_state_dict({k: v.astype(np.float32).astype(np.float64) for k, v in st.items()}, cfg)
               for n, st in states.items()}
    keep = _LOCAL.get(s.base, ())
    local = {n: {m: f for m, f in fs.items() if m.split(".")[-1] in keep} for n, fs in factors.items()}
    factors = {n: {m: f for m, f in fs.items() if m.split(".")[-1] not in keep} for n, fs in factors.items()}
    bad = [n for n, t in tasks.items() if t.kind != s.benign_task]
    return TrainedSet(settings=s, factors=factors, contaminated=bad, tasks=tasks,
                      seconds=time.perf_counter() - t0, local=local if keep else {})


@torch.no_grad()
def model_with(tset: TrainedSet, factors: dict, *, cache_dir=None):
    """The set's pretrained base with ``ΔW = scaling · B A`` of ``factors`` (``{module: (A, B,
    scaling)}``, PEFT module names) added to its weights (GPT-2's ``Conv1D`` stores ``W^T``).
    :func:`heldout_loss` adds a client's ``tset.local`` modules to ``factors``."""
    import copy

    base = copy.deepcopy(_base_cached(tset.settings, None if cache_dir is None else str(cache_dir)))
    mods = dict(base.named_modules())
    prefix = "base_model.model."
    if factors and all(name in tset.factors for name in factors):
        raise ValueError("factors must be one client's {module: (A, B, scaling)}, got the whole set's "
                         "{client: {module: ...}}: pass tset.factors[client]")
    for name, value in factors.items():
        key = name[len(prefix):] if name.startswith(prefix) else name
        if key not in mods:
            raise ValueError(f"factors: module {name!r} is not in the {tset.settings.base} base")
        if not (isinstance(value, (tuple, list)) and len(value) == 3):
            raise ValueError(f"factors[{name!r}] must be (A, B, scaling), got {type(value).__name__}")
        A, B, scaling = np.asarray(value[0], float), np.asarray(value[1], float), float(value[2])
        w = mods[key].weight
        shape = tuple(w.T.shape if tset.settings.base == "gpt2" else w.shape)   # (out, in)
        if A.ndim != 2 or B.ndim != 2 or B.shape[1] != A.shape[0] or (B.shape[0], A.shape[1]) != shape:
            raise ValueError(f"factors[{name!r}]: A {A.shape} and B {B.shape} do not make the module's "
                             f"out x in = {shape[0]} x {shape[1]} (A r x in, B out x r)")
        dW = torch.from_numpy(scaling * (B @ A)).float()
        w += dW.T if tset.settings.base == "gpt2" else dW
    return base.eval()


@torch.no_grad()
def heldout_loss(tset: TrainedSet, client: str, factors: dict, *, n: int = 256, cache_dir=None,
                 seed=0) -> float:
    """Held-out next-token loss (copy positions) of :func:`model_with` ``factors`` (e.g. an
    aggregator's output for ``client``) on ``n`` fresh sequences of ``client``'s task (the same
    sequences for every ``factors``). The client's ``tset.local`` modules (the "sec8" family's
    ``lm_head``, kept local by every method) are added; a module in ``factors`` overrides them."""
    if client not in tset.tasks:
        raise ValueError(f"client must be one of {tset.names}, got {client!r}")
    rng = as_generator(np.random.SeedSequence(int(seed), spawn_key=(tset.names.index(client),)),
                       "trained-set-heldout")
    batch = tset.tasks[client].sample(n, tset.settings.seq_len, seed=rng)
    factors = {**tset.local.get(client, {}), **factors}
    return float(_loss(model_with(tset, factors, cache_dir=cache_dir), batch))


def copying_threshold(exponent: float) -> float:
    """Masked accuracy (%) at which a base *copies*: the midpoint between the most frequent
    letter's share under ``P(X = a) ∝ a^{-exponent}`` (what a base that has not learned to copy
    predicts) and a perfect copier's 100 % (51 % for uniform letters)."""
    p = np.arange(1, 53, dtype=np.float64) ** (-float(exponent))
    return float((100 * p[0] / p.sum() + 100) / 2)


@torch.no_grad()
def base_accuracy(settings: TrainedSetSettings, *, n: int = 500, cache_dir=None, seed=0) -> float:
    """Masked next-token accuracy (%, §8.2's positions ``m+3 .. m+L-1`` of the second copy) of the
    pretrained base (no adapter) on ``n`` fresh sequences of the common benign task (``exponent``,
    ``length``: the homogeneous task; "sec8": t = 1.1, L = 16): the baseline check of the
    benchmark (compare :func:`copying_threshold`)."""
    model = _base_cached(settings, None if cache_dir is None else str(cache_dir))
    batch = ClientTask("fuzzy", settings.length, settings.exponent).sample(
        n, settings.seq_len, seed=as_generator(seed, "trained-set-base-accuracy"))
    tok = torch.from_numpy(batch.tokens)
    pred = np.full(batch.tokens.shape, -1, dtype=np.int64)
    pred[:, 1:] = _logits(model, tok[:, :-1]).argmax(-1).numpy()
    return 100 * (1 - copying.masked_error(pred, batch))


@torch.no_grad()
def heldout_accuracy(tset: TrainedSet, client: str, factors: dict, *, n: int = 256, cache_dir=None,
                     seed=0) -> float:
    """Masked next-token accuracy (fraction, §8.2's positions) of :func:`model_with` ``factors`` on
    ``n`` fresh, noise-free sequences of ``client``'s task (the same sequences as
    :func:`heldout_loss` with the same ``seed``). The client's ``tset.local`` modules are added."""
    if client not in tset.tasks:
        raise ValueError(f"client must be one of {tset.names}, got {client!r}")
    rng = as_generator(np.random.SeedSequence(int(seed), spawn_key=(tset.names.index(client),)),
                       "trained-set-heldout")
    batch = tset.tasks[client].sample(n, tset.settings.seq_len, seed=rng)
    model = model_with(tset, {**tset.local.get(client, {}), **factors}, cache_dir=cache_dir)
    tok = torch.from_numpy(batch.tokens)
    pred = np.full(batch.tokens.shape, -1, dtype=np.int64)
    pred[:, 1:] = _logits(model, tok[:, :-1]).argmax(-1).numpy()
    return 1.0 - copying.masked_error(pred, batch)
