"""Transformer layers: norms, feed-forward networks, and the block (self-attention, optional
cross-attention, feed-forward) with pre- or post-norm residuals."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.errors import SettingError
from attnlab.nn.positional import POSITIONAL, ALiBi, RotaryEmbedding
from attnlab.types import Fraction, MultipleOf, PositiveFloat, PositiveInt

NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
FFNS = ("relu", "gelu", "gelu_tanh", "swiglu")  # gelu_tanh: the tanh approximation (GPT-2's "gelu_new")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(kind: str, dim: int, bias: bool = True, eps: float | None = None) -> nn.Module:
    """eps None: each norm's usual one (LayerNorm 1e-5, RMSNorm 1e-6; BERT's weights want 1e-12)."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=bias, eps=1e-5 if eps is None else eps)
    if kind == "rmsnorm":
        return RMSNorm(dim, 1e-6 if eps is None else eps)
    raise ValueError(f"norm '{kind}' is not one of {NORMS}")


class FeedForward(nn.Module):
    """Position-wise MLP: relu / gelu / gelu_tanh (n_embd -> hidden -> n_embd) or SwiGLU (silu(x W1) * x W3, then
    W2)."""

    def __init__(self, n_embd: int, hidden: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if activation not in FFNS:
            raise ValueError(f"ffn '{activation}' is not one of {FFNS}")
        self.activation = activation
        self.fc = nn.Linear(n_embd, 2 * hidden if activation == "swiglu" else hidden, bias=bias)
        self.proj = nn.Linear(hidden, n_embd, bias=bias)
        self.proj.residual_scaled = True
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)                                          # (B, T, hidden) or (B, T, 2*hidden)
        if self.activation == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.activation in ("gelu", "gelu_tanh"):
            h = F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        else:
            h = F.relu(h)
        return self.dropout(self.proj(h))                       # (B, T, C)


class Block(nn.Module):
    """pre-norm:  x = x + attn(norm(x)); x = x + ffn(norm(x))      (GPT-2)
    post-norm: x = norm(x + attn(x));   x = norm(x + ffn(x))       (original Transformer, BERT)
    With `cross=True` a cross-attention sub-layer over `context` sits between the two (decoder of a seq2seq)."""

    def __init__(self, n_embd: int, n_head: int, ffn_hidden: int, ffn: str = "gelu", dropout: float = 0.0,
                 bias: bool = True, norm: str = "layernorm", norm_position: str = "pre",
                 rotary: RotaryEmbedding | None = None, cross: bool = False, alibi: ALiBi | None = None,
                 norm_eps: float | None = None):
        super().__init__()
        if norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm position '{norm_position}' is not one of {NORM_POSITIONS}")
        self.pre = norm_position == "pre"
        self.norm1 = make_norm(norm, n_embd, bias, norm_eps)
        self.attn = MultiHeadAttention(n_embd, n_head, dropout, bias, rotary, alibi=alibi)
        self.cross_attn = MultiHeadAttention(n_embd, n_head, dropout, bias, cross=True) if cross else None
        self.norm_cross = make_norm(norm, n_embd, bias, norm_eps) if cross else None
        self.norm2 = make_norm(norm, n_embd, bias, norm_eps)
        self.ffn = FeedForward(n_embd, ffn_hidden, ffn, dropout, bias)

    def _sublayer(self, x: torch.Tensor, norm: nn.Module, fn) -> torch.Tensor:
        return x + fn(norm(x)) if self.pre else norm(x + fn(x))

    def forward(self, x: torch.Tensor, causal: bool = False, key_padding_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, context: torch.Tensor | None = None,
                context_padding_mask: torch.Tensor | None = None, cross_cache: KVCache | None = None) -> torch.Tensor:
        x = self._sublayer(x, self.norm1, lambda h: self.attn(h, causal=causal, key_padding_mask=key_padding_mask,
                                                              cache=cache))
        if self.cross_attn is not None:
            x = self._sublayer(x, self.norm_cross, lambda h: self.cross_attn(
                h, context, key_padding_mask=context_padding_mask, cache=cross_cache))
        return self._sublayer(x, self.norm2, self.ffn)          # (B, T, C)


def init_gpt2_(module: nn.Module, n_layer: int, std: float = 0.02) -> None:
    """GPT-2 initialization: N(0, 0.02) weights, zero biases, residual projections scaled by 1/sqrt(2 n_layer)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            s = std / (2 * n_layer) ** 0.5 if getattr(m, "residual_scaled", False) else std
            nn.init.normal_(m.weight, mean=0.0, std=s)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)


class ConfigSplit:
    """A dataclass mixin: `split(kwargs)` takes the keys the dataclass knows and leaves the rest."""

    @classmethod
    def split(cls, kwargs: dict):
        """(the config built from the keys it knows, the other keys)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if k in names}), {k: v for k, v in kwargs.items()
                                                                        if k not in names}


@dataclass
class StackConfig(ConfigSplit):
    """Settings every Transformer stack shares (the GPT decoder, the BERT encoder)."""

    vocab_size: PositiveInt
    n_layer: PositiveInt = 6
    n_head: PositiveInt = 6
    n_embd: Annotated[PositiveInt, MultipleOf("n_head")] = 384
    dropout: Fraction = 0.0
    bias: bool = False
    positional: Literal["learned", "sinusoidal", "rope", "alibi"] = "learned"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    norm_eps: PositiveFloat | None = None   # None: the norm's usual eps (LayerNorm 1e-5); BERT's weights: 1e-12
    ffn: Literal["relu", "gelu", "gelu_tanh", "swiglu"] = "gelu"
    ffn_mult: PositiveFloat = 4.0
    tie_weights: bool = True

    def __post_init__(self):
        check_choices(self)


def check_choices(c) -> None:
    """The settings of a Transformer config `c` (positional, norm, ...) that must fit together, checked at once."""
    for key, choices in (("positional", POSITIONAL), ("norm", NORMS), ("norm_position", NORM_POSITIONS),
                         ("ffn", FFNS)):
        if getattr(c, key) not in choices:
            raise SettingError(f"{key}={getattr(c, key)} is not one of {', '.join(choices)}: pick one of those.")
    if c.n_embd % c.n_head:
        raise SettingError(f"n_embd={c.n_embd} does not split into n_head={c.n_head} heads: choose n_embd a "
                           f"multiple of n_head (e.g. n_embd={c.n_head * 64}).")
    if c.positional == "rope" and (c.n_embd // c.n_head) % 2:
        raise SettingError(f"positional=rope rotates pairs of channels, but the head dimension "
                           f"{c.n_embd // c.n_head} (n_embd / n_head) is odd: make it even.")


class StackAccounting:
    """Parameter and FLOP bookkeeping of a Transformer stack with `self.config` (StackConfig) and `self.embed`
    (TokenPositionEmbedding); `context_length` is the config field giving the default sequence length."""

    context_length: str = "block_size"

    def no_weight_decay(self) -> set[str]:
        return {n for n, _ in self.named_parameters() if n.startswith("embed.pos.")}

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, counted once when tied; without the position table (nanoGPT's count) by default."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.embed.pos is not None:
            n -= sum(p.numel() for p in self.embed.pos.parameters())
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token: 6N for the weights plus 12 L H Q T for attention
        (PaLM appendix B, as in nanoGPT's MFU estimate)."""
        c = self.config
        T = seq_len or getattr(c, self.context_length)
        n = self.num_params()
        if not c.tie_weights:  # the input embedding is a lookup, not a matmul
            n -= self.embed.wte.weight.numel()
        return 6 * n + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * T

