"""A BERT-style bidirectional encoder with a masked-language-model head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.embeddings import TokenPositionEmbedding
from attnlab.nn.registry import register_network
from attnlab.nn.gpt import check_length
from attnlab.types import Fraction, MultipleOf, PositiveInt
from attnlab.nn.layers import Block, StackAccounting, StackConfig, init_gpt2_, make_norm


@dataclass
class BertConfig(StackConfig):
    max_length: PositiveInt = 128
    n_layer: PositiveInt = 4
    n_head: PositiveInt = 4
    n_embd: Annotated[PositiveInt, MultipleOf("n_head")] = 256
    dropout: Fraction = 0.1
    bias: bool = True
    norm_position: Literal["pre", "post"] = "post"  # post (BERT) | pre


@register_network("bert", config=BertConfig)
class BertMLM(StackAccounting, nn.Module):
    """input_ids (B, T), attention_mask (B, T; 1 = token, 0 = padding) -> logits (B, T, vocab_size)."""

    context_length = "max_length"

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = c = config
        self.embed = TokenPositionEmbedding(c.vocab_size, c.n_embd, c.max_length, c.positional, c.n_head, 0.0)
        self.embed_norm = make_norm(c.norm, c.n_embd, c.bias)
        self.drop = nn.Dropout(c.dropout)
        hidden = int(c.ffn_mult * c.n_embd)
        self.blocks = nn.ModuleList(
            Block(c.n_embd, c.n_head, hidden, c.ffn, c.dropout, c.bias, c.norm, c.norm_position, self.embed.rotary,
                  alibi=self.embed.alibi)
            for _ in range(c.n_layer)
        )
        self.norm_f = make_norm(c.norm, c.n_embd, c.bias) if c.norm_position == "pre" else nn.Identity()
        # MLM head: transform (dense + gelu + norm), then a decoder tied to the token embedding, with its own bias
        self.head_dense = nn.Linear(c.n_embd, c.n_embd)
        self.head_norm = make_norm(c.norm, c.n_embd, c.bias)
        self.decoder = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.decoder_bias = nn.Parameter(torch.zeros(c.vocab_size))
        init_gpt2_(self, c.n_layer)
        if c.tie_weights:
            self.decoder.weight = self.embed.wte.weight

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_length(input_ids.shape[1], self.config.max_length, "model.max_length")
        x = self.drop(self.embed_norm(self.embed(input_ids)))             # (B, T, C)
        pad = attention_mask.bool() if attention_mask is not None else None
        for block in self.blocks:
            x = block(x, key_padding_mask=pad)
        return self.norm_f(x)                                              # (B, T, C)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encode(input_ids, attention_mask)
        h = self.head_norm(F.gelu(self.head_dense(h)))                     # (B, T, C)
        return self.decoder(h) + self.decoder_bias                         # (B, T, V)
