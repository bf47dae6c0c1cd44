"""Positional encodings: sinusoidal and learned tables added to the token embeddings, and rotary (RoPE)
applied to queries and keys inside attention. Positions start at `offset` (what a KV cache already holds)."""

from __future__ import annotations

import math

import torch
from torch import nn

POSITIONAL = ("sinusoidal", "learned", "rope")


class SinusoidalPositional(nn.Module):
    """Vaswani et al.'s fixed sin/cos table, (max_len, n_embd), added to the input."""

    def __init__(self, max_len: int, n_embd: int):
        super().__init__()
        pos = torch.arange(max_len).unsqueeze(1)                                   # (L, 1)
        div = torch.exp(torch.arange(0, n_embd, 2) * (-math.log(10000.0) / n_embd))  # (C/2,)
        table = torch.zeros(max_len, n_embd)
        table[:, 0::2] = torch.sin(pos * div)
        table[:, 1::2] = torch.cos(pos * div)[:, : n_embd // 2]
        self.register_buffer("table", table, persistent=False)
        self.max_len = max_len

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        T = x.shape[1]
        return x + self.table[offset : offset + T].to(x.dtype)                     # (B, T, C)


class LearnedPositional(nn.Module):
    """A trained table of position embeddings (GPT-2, BERT)."""

    def __init__(self, max_len: int, n_embd: int):
        super().__init__()
        self.wpe = nn.Embedding(max_len, n_embd)
        self.max_len = max_len

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        pos = torch.arange(offset, offset + x.shape[1], device=x.device)          # (T,)
        return x + self.wpe(pos)                                                   # (B, T, C)


class RotaryEmbedding(nn.Module):
    """Su et al.'s rotary embedding: rotates pairs of channels of q and k by position-dependent angles, so
    their dot product depends on the relative position. Applied per attention layer to (B, nh, T, hd)."""

    def __init__(self, max_len: int, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)  # (hd/2,)
        angles = torch.outer(torch.arange(max_len).float(), inv_freq)              # (L, hd/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.max_len = max_len

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        T = x.shape[-2]
        cos = self.cos[offset : offset + T].to(x.dtype)                            # (T, hd/2)
        sin = self.sin[offset : offset + T].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]                                        # (B, nh, T, hd/2) each
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)      # (B, nh, T, hd/2, 2)
        return out.flatten(-2)                                                     # (B, nh, T, hd)
