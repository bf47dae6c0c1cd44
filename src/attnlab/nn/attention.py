"""Multi-head attention on `F.scaled_dot_product_attention`: self- or cross-attention, causal and padding
masks, rotary positions or ALiBi biases, and a key/value cache for incremental decoding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.positional import ALiBi, RotaryEmbedding


class KVCache:
    """Keys and values of the positions seen so far, one per attention layer: (B, n_head, T_seen, head_dim)."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class MultiHeadAttention(nn.Module):
    """Self-attention (`forward(x)`), or with `cross=True` attention from x to a context (`forward(x, context)`).

    Masks: `causal=True` lets position t see positions <= t (offset by what the cache holds);
    `key_padding_mask` (B, S) is True where a key is real, False where it is padding.
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 rotary: RotaryEmbedding | None = None, cross: bool = False, alibi: ALiBi | None = None):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not a multiple of n_head={n_head}")
        self.n_head, self.head_dim = n_head, n_embd // n_head
        self.cross = cross
        if cross:  # queries from x, keys and values from the context
            self.q_proj = nn.Linear(n_embd, n_embd, bias=bias)
            self.kv_proj = nn.Linear(n_embd, 2 * n_embd, bias=bias)
        else:  # one matmul for q, k, v
            self.qkv_proj = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.out_proj.residual_scaled = True  # GPT-2 init: std / sqrt(2 * n_layer)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)
        self.rotary = rotary
        self.alibi = None if cross else alibi  # a bias by distance: only between positions of one sequence
        self.record_weights = False  # keep the attention weights of the last call in `last_weights`
        self.last_weights: torch.Tensor | None = None

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, C = t.shape
        return t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, causal: bool = False,
                key_padding_mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """With a cache, self-attention appends this call's keys/values to it; cross-attention fills it with the
        context's keys/values on the first call and reuses them afterwards (the context does not change)."""
        B, T, C = x.shape
        past = 0
        if self.cross:
            q = self._heads(self.q_proj(x))                           # (B, nh, T, hd)
            if cache is not None and cache.length:
                k, v = cache.k, cache.v                               # (B, nh, S, hd) each
            else:
                if context is None:
                    raise ValueError("cross-attention needs a context")
                k, v = (self._heads(t) for t in self.kv_proj(context).split(C, dim=2))  # (B, nh, S, hd) each
                if cache is not None:
                    cache.append(k, v)
        else:
            q, k, v = (self._heads(t) for t in self.qkv_proj(x).split(C, dim=2))   # (B, nh, T, hd) each
            past = cache.length if cache is not None else 0
            if self.rotary is not None:
                q, k = self.rotary(q, past), self.rotary(k, past)
            if cache is not None:
                k, v = cache.append(k, v)                             # (B, nh, past + T, hd)
        S = k.shape[2]

        mask = None
        if key_padding_mask is not None:
            mask = key_padding_mask[:, None, None, :].bool()          # (B, 1, 1, S)
        # plain causal attention over its own keys goes to SDPA's is_causal flag: no (T, S) mask is built, and the
        # fused kernels keep memory linear in T
        causal_flag = causal and key_padding_mask is None and self.alibi is None and not self.record_weights \
            and S == T
        if causal and T > 1 and not causal_flag:
            # query t (absolute position past + t) sees keys <= past + t
            allowed = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)  # (T, S)
            mask = allowed if mask is None else mask & allowed
        if self.alibi is not None:  # a float mask: the biases, -inf where a key may not be seen
            bias = self.alibi.bias(T, S, past).to(q.dtype)[None]      # (1, nh, T, S)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        if self.record_weights:  # explicit softmax, to keep the weights (alignment plots); same result as SDPA
            att = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5     # (B, nh, T, S)
            if mask is not None:
                att = att + mask if mask.is_floating_point() else att.masked_fill(~mask, float("-inf"))
            att = att.softmax(dim=-1)
            self.last_weights = att.detach()
            y = F.dropout(att, self.dropout, self.training) @ v       # (B, nh, T, hd)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v,
                attn_mask=mask,
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=causal_flag and T > 1,
            )                                                         # (B, nh, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, C)              # (B, T, C)
        return self.resid_dropout(self.out_proj(y))
