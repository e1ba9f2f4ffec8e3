"""The backbone of CLAIR S5: two self-attention blocks, hidden 64, one head per block, rotary
positional encoding, residual connections and layer norm, then an output layer over the 53 tokens.

Block ``b`` (pre-norm): ``x <- x + W_o softmax_causal(rope(W_q h) rope(W_k h)^T / sqrt(d)) W_v h``
with ``h = LayerNorm(x)``. S5 lists no MLP, so the blocks are attention-only (``mlp=True`` adds a
4d ReLU MLP per block); ``heads`` splits each block's attention into heads of width ``d / heads``
(S5: one head; rotary applied per head); ``bias=True`` gives the projections biases (S5 does
not say; LoRA adapts the weights only either way). ``final_norm=False`` drops the layer norm before
the output layer and ``dropout`` drops the attention branch's output before the residual sum
(training only): with ``bias=True``, ``final_norm=False``, ``dropout=0.1`` the model is Song, Xu &
Zhong's (2025) ``TFModel`` of their copying benchmark (``norm=True``, ``output_norm=False``,
``mlp=False``, ``pos="rotary"``), the "standard practice" S5 refers to. Module names follow the usual PEFT targets: ``blocks.{0,1}.{q,k,v,o}_proj``
(the eight attention projections, ``nn.Linear`` without bias, weight ``q × p = out × in``) and
``lm_head`` (the output layer).
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["CopyingTransformer", "ATTENTION_MODULES", "OUTPUT_MODULE", "rotary"]

ATTENTION_MODULES = tuple(f"blocks.{b}.{m}_proj" for b in range(2) for m in "qkvo")
OUTPUT_MODULE = "lm_head"


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary positional encoding of ``x`` (batch, T, d), d even (pairs (2i, 2i+1) rotated by
    ``t · base^{-2i/d}``)."""
    _, T, d = x.shape
    inv = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    ang = torch.arange(T, dtype=x.dtype)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, d: int, mlp: bool, heads: int = 1, bias: bool = False, dropout: float = 0.0):
        super().__init__()
        if d % (2 * heads):
            raise ValueError(f"heads must divide d / 2 = {d // 2}, got heads={heads}")
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d, bias=bias)
        self.k_proj = nn.Linear(d, d, bias=bias)
        self.v_proj = nn.Linear(d, d, bias=bias)
        self.o_proj = nn.Linear(d, d, bias=bias)
        self.mlp = (nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))
                    if mlp else None)
        self.scale = 1.0 / math.sqrt(d // heads)
        # Song et al.'s dropout1: on the attention branch, before the residual sum
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, T, d) → (batch·heads, T, d/heads)."""
        n, T, d = x.shape
        return x.reshape(n, T, self.heads, d // self.heads).transpose(1, 2).reshape(n * self.heads, T, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        q = rotary(self._split(self.q_proj(h)))
        k = rotary(self._split(self.k_proj(h)))
        v = self._split(self.v_proj(h))
        n, T, d = x.shape
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = (q @ k.transpose(1, 2)) * self.scale
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        o = (att @ v).reshape(n, self.heads, T, -1).transpose(1, 2).reshape(n, T, d)
        branch = self.o_proj(o)
        x = x + (self.dropout(branch) if self.dropout is not None else branch)
        if self.mlp is not None:
            x = x + self.mlp(x)
        return x


class CopyingTransformer(nn.Module):
    """Token ids (batch, T) → next-token logits (batch, T, vocab)."""

    def __init__(self, vocab: int = 53, d: int = 64, n_blocks: int = 2, mlp: bool = False, heads: int = 1,
                 bias: bool = False, final_norm: bool = True, dropout: float = 0.0):
        super().__init__()
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if n_blocks != 2:
            # ATTENTION_MODULES names two blocks; other depths are not part of the experiment
            raise ValueError(f"n_blocks must be 2 (S5's backbone), got {n_blocks}")
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, mlp, heads, bias, float(dropout)) for _ in range(n_blocks))
        self.ln_f = nn.LayerNorm(d) if final_norm else None
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x) if self.ln_f is not None else x)
