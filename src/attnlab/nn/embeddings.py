"""Token + position embeddings shared by the language models and the seq2seq Transformer."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.nn.positional import POSITIONAL, ALiBi, LearnedPositional, RotaryEmbedding, SinusoidalPositional


class TokenPositionEmbedding(nn.Module):
    """idx (B, T) -> (B, T, C): token embedding plus an additive position table, or nothing additive for rope and
    alibi (then `self.rotary` or `self.alibi` is handed to the attention layers)."""

    def __init__(self, vocab_size: int, n_embd: int, max_len: int, positional: str = "learned",
                 n_head: int = 1, dropout: float = 0.0, scale: float = 1.0):
        super().__init__()
        if positional not in POSITIONAL:
            raise ValueError(f"positional '{positional}' is not one of {POSITIONAL}")
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.pos = {"learned": LearnedPositional, "sinusoidal": SinusoidalPositional}.get(positional)
        self.pos = self.pos(max_len, n_embd) if self.pos else None
        self.rotary = RotaryEmbedding(max_len, n_embd // n_head) if positional == "rope" else None
        self.alibi = ALiBi(n_head) if positional == "alibi" else None
        self.drop = nn.Dropout(dropout)
        self.max_len = max_len
        self.scale = scale  # Vaswani et al. multiply the token embedding by sqrt(n_embd)

    def forward(self, idx: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.wte(idx)                                   # (B, T, C)
        if self.scale != 1.0:
            x = x * self.scale
        if self.pos is not None:
            x = self.pos(x, offset)
        return self.drop(x)
