"""Positional encodings: sinusoidal and learned tables added to the token embeddings; rotary (RoPE) applied to
queries and keys inside attention; ALiBi biases added to the attention scores. Positions start at `offset` (what a
KV cache already holds)."""

from __future__ import annotations

import math

import torch
from torch import nn

POSITIONAL = ("sinusoidal", "learned", "rope", "alibi")


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


class ALiBi(nn.Module):
    """Press et al.'s attention with linear biases: no position embedding; head h adds -m_h * |i - j| to the score
    of query i for key j, with slopes m_h a geometric sequence (1/2, 1/4, ... 1/256 for 8 heads)."""

    def __init__(self, n_head: int):
        super().__init__()
        self.register_buffer("slopes", torch.tensor(self.head_slopes(n_head)), persistent=False)  # (nh,)

    @staticmethod
    def head_slopes(n: int) -> list[float]:
        """The paper's slopes; for a head count that is not a power of 2, those of the next lower power of 2 and
        every other one of the next higher (as in its reference code)."""
        def geometric(k: int) -> list[float]:
            return [2 ** (-8 * (i + 1) / k) for i in range(k)]

        low = 2 ** math.floor(math.log2(n))
        return geometric(low) + geometric(2 * low)[0::2][: n - low]

    def bias(self, T: int, S: int, offset: int = 0) -> torch.Tensor:
        """(nh, T, S) biases of queries at positions offset..offset+T-1 for keys at 0..S-1."""
        q = torch.arange(offset, offset + T, device=self.slopes.device)[:, None]  # (T, 1)
        k = torch.arange(S, device=self.slopes.device)[None, :]                   # (1, S)
        return -self.slopes[:, None, None] * (q - k).abs()                        # (nh, T, S)
