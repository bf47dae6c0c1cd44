"""A GPT decoder (nanoGPT-style): token + position embeddings, causal Transformer blocks, tied LM head."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import UserError
from attnlab.nn.attention import KVCache
from attnlab.nn.embeddings import TokenPositionEmbedding
from attnlab.nn.registry import register_network
from attnlab.types import Fraction, PositiveInt
from attnlab.nn.layers import Block, StackAccounting, StackConfig, init_gpt2_, make_norm


@dataclass
class GPTConfig(StackConfig):
    block_size: PositiveInt = 256
    pad_vocab_multiple: PositiveInt = 1      # round the embedding table up (GPT-2: 50257 -> 50304) for faster matmuls

    @property
    def padded_vocab(self) -> int:
        m = max(1, int(self.pad_vocab_multiple))
        return math.ceil(self.vocab_size / m) * m

    @property
    def ffn_hidden(self) -> int:
        hidden = int(self.ffn_mult * self.n_embd)
        return int(2 * hidden / 3) if self.ffn == "swiglu" else hidden  # SwiGLU keeps the parameter count


def check_length(T: int, block_size: int, what: str = "model.block_size") -> None:
    if T > block_size:
        raise UserError(
            f"a sequence of {T} tokens is longer than the model's positional table ({what}={block_size}). "
            f"Set data.block_size (or data.max_length) to at most {block_size}, or build the model with "
            f"{what}={T} or more."
        )


@register_network("gpt", config=GPTConfig)
class GPT(StackAccounting, nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.embed = TokenPositionEmbedding(c.padded_vocab, c.n_embd, c.block_size, c.positional, c.n_head,
                                            c.dropout)
        self.blocks = nn.ModuleList(
            Block(c.n_embd, c.n_head, c.ffn_hidden, c.ffn, c.dropout, c.bias, c.norm, c.norm_position,
                  self.embed.rotary, alibi=self.embed.alibi, norm_eps=c.norm_eps)
            for _ in range(c.n_layer)
        )
        self.norm_f = make_norm(c.norm, c.n_embd, c.bias, c.norm_eps) if c.norm_position == "pre" else nn.Identity()
        self.lm_head = nn.Linear(c.n_embd, c.padded_vocab, bias=False)
        init_gpt2_(self, c.n_layer)
        if c.tie_weights:
            self.lm_head.weight = self.embed.wte.weight

    def forward(self, idx: torch.Tensor, caches: list[KVCache] | None = None) -> torch.Tensor:
        B, T = idx.shape
        offset = caches[0].length if caches else 0
        check_length(offset + T, self.config.block_size)
        x = self.embed(idx, offset)                                      # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, causal=True, cache=caches[i] if caches else None)
        return self.lm_head(self.norm_f(x))                              # (B, T, padded_vocab)

    def block_classes(self) -> set[type[nn.Module]]:
        """The repeated blocks (attnlab.protocols.BlockNetwork): FSDP units, activation checkpoints."""
        return {Block}

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx)                                               # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)

    # ---- sampling
    @torch.no_grad()
    def stream(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
               top_k: int | None = None, generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        """Yields each new token (B, 1). The KV cache holds the keys/values of the context, so each step runs
        the model on one token; past block_size tokens the context is cropped and recomputed (nanoGPT's rule)."""
        V, block = self.config.vocab_size, self.config.block_size
        caches = [KVCache() for _ in self.blocks]
        logits = self(idx[:, -block:], caches)[:, -1, :V]                # (B, V)
        for _ in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, generator)     # (B, 1)
            yield nxt
            idx = torch.cat([idx, nxt], dim=1)
            if caches[0].length >= block:                                # no room: recompute the cropped context
                caches = [KVCache() for _ in self.blocks]
                logits = self(idx[:, -block:], caches)[:, -1, :V]
            else:
                logits = self(nxt, caches)[:, -1, :V]

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """idx (B, T) -> (B, T + max_new_tokens)."""
        new = list(self.stream(idx, max_new_tokens, temperature, top_k, generator))
        return torch.cat([idx, *new], dim=1)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.config).items())


@dataclass
class GPTClassifierConfig(GPTConfig):
    num_classes: PositiveInt = 2
    classifier_dropout: Fraction | None = None  # before the head (None: dropout)


@register_network("gpt_classifier", config=GPTClassifierConfig)
class GPTClassifier(GPT):
    """input_ids, attention_mask (B, T; right padding) -> logits (B, num_classes): the final state of each text's
    last token, which under causal attention has read the whole text, through a linear head (as
    GPT2ForSequenceClassification, bias-free). Pairs arrive joined by the data; `token_type_ids` are not used."""

    regresses = True  # with num_classes=1, one score per text (GPT2ForSequenceClassification's regression)

    def __init__(self, config: GPTClassifierConfig):
        super().__init__(config)
        c = config
        del self.lm_head
        self.head_drop = nn.Dropout(c.dropout if c.classifier_dropout is None else c.classifier_dropout)
        self.classifier = nn.Linear(c.n_embd, c.num_classes, bias=False)  # GPT2ForSequenceClassification's `score`
        init_gpt2_(self.classifier, c.n_layer)

    def forward_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        check_length(input_ids.shape[1], self.config.block_size)
        x = self.embed(input_ids)                                        # (B, T, C)
        for block in self.blocks:
            x = block(x, causal=True)      # right padding: real tokens never attend to the pads after them
        x = self.norm_f(x)
        last = (attention_mask.sum(1) - 1 if attention_mask is not None
                else torch.full((x.shape[0],), x.shape[1] - 1, device=x.device)).long()
        return x[torch.arange(x.shape[0], device=x.device), last]       # (B, C)

    def forward_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head_drop(h))                        # (B, K)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(input_ids, attention_mask))

    def get_classifier(self) -> nn.Module:
        return self.classifier

    def group_matcher(self, coarse: bool = False) -> dict:
        return {"stem": r"^embed", "blocks": r"^blocks\.(\d+)"}


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, V) -> token ids (B, 1); temperature 0 is greedy."""
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(int(top_k), logits.size(-1))).values[:, [-1]]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
