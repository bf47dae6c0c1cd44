"""A BERT-style bidirectional encoder, with a masked-language-model head (`BertMLM`, pretraining) or a pooler and a
classification head (`BertClassifier`, sentence and sentence-pair classification). Both share the encoder's
parameter names, so a pretraining checkpoint's encoder loads into the classifier as it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.embeddings import TokenPositionEmbedding
from attnlab.nn.gpt import check_length
from attnlab.nn.layers import Block, StackAccounting, StackConfig, init_gpt2_, make_norm
from attnlab.nn.registry import register_network
from attnlab.types import Fraction, MultipleOf, NonNegativeInt, PositiveInt


@dataclass
class BertConfig(StackConfig):
    max_length: PositiveInt = 128
    n_layer: PositiveInt = 4
    n_head: PositiveInt = 4
    n_embd: Annotated[PositiveInt, MultipleOf("n_head")] = 256
    dropout: Fraction = 0.1
    bias: bool = True
    norm_position: Literal["pre", "post"] = "post"  # post (BERT) | pre
    type_vocab_size: NonNegativeInt = 0   # segment (token type) embeddings, segment 0 where none are given


@dataclass
class BertClassifierConfig(BertConfig):
    num_classes: PositiveInt = 2
    type_vocab_size: NonNegativeInt = 2   # segment embeddings for sentence pairs (0: none)
    classifier_dropout: Fraction | None = None  # before the head (None: dropout)


class BertEncoder(StackAccounting, nn.Module):
    """The encoder: token (+ segment) + position embeddings, a norm, and bidirectional Transformer blocks."""

    context_length = "max_length"

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = c = config
        self.embed = TokenPositionEmbedding(c.vocab_size, c.n_embd, c.max_length, c.positional, c.n_head, 0.0)
        # segment embeddings start at zero: an encoder pretrained without them computes what it did
        self.segment = nn.Embedding(c.type_vocab_size, c.n_embd) if c.type_vocab_size else None
        self.embed_norm = make_norm(c.norm, c.n_embd, c.bias, c.norm_eps)
        self.drop = nn.Dropout(c.dropout)
        hidden = int(c.ffn_mult * c.n_embd)
        self.blocks = nn.ModuleList(
            Block(c.n_embd, c.n_head, hidden, c.ffn, c.dropout, c.bias, c.norm, c.norm_position, self.embed.rotary,
                  alibi=self.embed.alibi, norm_eps=c.norm_eps)
            for _ in range(c.n_layer)
        )
        self.norm_f = make_norm(c.norm, c.n_embd, c.bias, c.norm_eps) if c.norm_position == "pre" else nn.Identity()

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        check_length(input_ids.shape[1], self.config.max_length, "model.max_length")
        x = self.embed(input_ids)                                          # (B, T, C)
        if self.segment is not None:  # no token_type_ids: every token in segment 0 (as in BERT)
            x = x + (self.segment(token_type_ids) if token_type_ids is not None else self.segment.weight[0])
        x = self.drop(self.embed_norm(x))
        pad = attention_mask.bool() if attention_mask is not None else None
        for block in self.blocks:
            x = block(x, key_padding_mask=pad)
        return self.norm_f(x)                                              # (B, T, C)

    def block_classes(self) -> set[type[nn.Module]]:
        """The repeated blocks (attnlab.protocols.BlockNetwork): FSDP units, activation checkpoints."""
        return {Block}

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's hook for layer-wise lr decay: embeddings first, then one group per block, the heads last."""
        return {"stem": r"^embed|^segment|^embed_norm", "blocks": r"^blocks\.(\d+)"}


@register_network("bert", config=BertConfig)
class BertMLM(BertEncoder):
    """input_ids (B, T), attention_mask (B, T; 1 = token, 0 = padding) -> logits (B, T, vocab_size); with
    `positions`, only those positions' logits (N, vocab_size): the masked ones of a pretraining batch, which spares
    the vocabulary projection at the other 85% of the tokens. `positions` is a (B, T) bool mask or (N,) indices into
    the flattened (B * T) states (no wait for the device to count them)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        c = config
        # MLM head: transform (dense + gelu + norm), then a decoder tied to the token embedding, with its own bias
        self.head_dense = nn.Linear(c.n_embd, c.n_embd)
        self.head_norm = make_norm(c.norm, c.n_embd, c.bias, c.norm_eps)
        self.decoder = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.decoder_bias = nn.Parameter(torch.zeros(c.vocab_size))
        init_gpt2_(self, c.n_layer)
        if c.tie_weights:
            self.decoder.weight = self.embed.wte.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encode(input_ids, attention_mask)                         # (B, T, C)
        c = self.config
        if positions is not None:
            h = h[positions] if positions.dtype == torch.bool else h.flatten(0, 1)[positions]  # (N, C)
        h = self.head_norm(F.gelu(self.head_dense(h), approximate="tanh" if c.ffn == "gelu_tanh" else "none"))
        return self.decoder(h) + self.decoder_bias                         # (B, T, V) or (N, V)


@register_network("bert_classifier", config=BertClassifierConfig)
class BertClassifier(BertEncoder):
    """input_ids, attention_mask, token_type_ids (B, T) -> logits (B, num_classes): the [CLS] (first) position's
    state through BERT's pooler (dense + tanh) and a linear head."""

    regresses = True  # with num_classes=1, one score per text (BertForSequenceClassification's regression)

    def __init__(self, config: BertClassifierConfig):
        super().__init__(config)
        c = config
        self.pooler = nn.Linear(c.n_embd, c.n_embd)
        self.head_drop = nn.Dropout(c.dropout if c.classifier_dropout is None else c.classifier_dropout)
        self.classifier = nn.Linear(c.n_embd, c.num_classes)
        init_gpt2_(self, c.n_layer)
        if self.segment is not None:
            nn.init.zeros_(self.segment.weight)

    def forward_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.encode(input_ids, attention_mask, token_type_ids)     # (B, T, C)

    def forward_head(self, h: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.pooler(h[:, 0]))                          # (B, C)
        return self.classifier(self.head_drop(pooled))                     # (B, K)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(input_ids, attention_mask, token_type_ids))

    def get_classifier(self) -> nn.Module:
        """What a linear probe trains (timm's hook, for model.freeze_backbone): the pooler and the head."""
        return nn.ModuleList([self.pooler, self.classifier])
