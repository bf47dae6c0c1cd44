"""The Transformer encoder-decoder (Vaswani et al., 2017) for translation, on attnlab's attention blocks.

Interface shared with the RNN seq2seq models (what the task and `nn/decoding.py` rely on):
    forward(src, tgt_in) -> logits (B, T, V)                       teacher-forced training
    start(src) -> state                                            encode once
    step(tokens (N, 1), state, return_attn) -> (logits (N, V), attention (N, S) or None)
    reorder(state, index, beams_only)                              beams: keep/duplicate batch rows
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from torch import nn

from attnlab.errors import SettingError, UserError
from attnlab.nn.attention import KVCache
from attnlab.nn.embeddings import TokenPositionEmbedding
from attnlab.nn.registry import register_network
from attnlab.nn.layers import Block, ConfigSplit, check_choices, make_norm
from attnlab.types import Fraction, MultipleOf, NonNegativeInt, PositiveInt


@dataclass
class TransformerSeq2SeqConfig(ConfigSplit):
    src_vocab_size: PositiveInt
    tgt_vocab_size: PositiveInt
    pad_id: NonNegativeInt = 0
    n_layer: PositiveInt = 6                  # encoder layers
    n_dec_layer: PositiveInt | None = None    # decoder layers (default: n_layer)
    n_head: PositiveInt = 8
    n_embd: Annotated[PositiveInt, MultipleOf("n_head")] = 512
    ffn_hidden: PositiveInt = 2048
    ffn: Literal["relu", "gelu", "swiglu"] = "relu"
    dropout: Fraction = 0.1
    bias: bool = True
    positional: Literal["sinusoidal", "learned", "rope", "alibi"] = "sinusoidal"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "post"  # post (the paper) | pre (more stable for deep stacks)
    max_len: PositiveInt = 256                # positional table; longer inputs are refused
    share_embeddings: bool = False    # one table for source and target (needs a joint vocabulary)
    tie_output: bool = True           # output projection = target embedding (the paper's weight sharing)
    alignment_layer: int = -1         # which decoder layer's cross-attention `step(return_attn=True)` returns
    alignment_head: int | None = None  # one head, or None for the mean over heads


@register_network("transformer_seq2seq", config=TransformerSeq2SeqConfig)
class TransformerSeq2Seq(nn.Module):

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__()
        self.config = c = config
        check_choices(c)
        n_dec = c.n_dec_layer or c.n_layer
        if not -n_dec <= c.alignment_layer < n_dec:
            raise SettingError(f"alignment_layer={c.alignment_layer}, but the decoder has {n_dec} layers: give one "
                               f"of -{n_dec}..{n_dec - 1} (-1, the last, is the default).")
        if c.alignment_head is not None and not 0 <= c.alignment_head < c.n_head:
            raise SettingError(f"alignment_head={c.alignment_head}, but there are {c.n_head} heads: give one of "
                               f"0..{c.n_head - 1}, or null for their mean.")
        if c.share_embeddings and c.src_vocab_size != c.tgt_vocab_size:
            raise SettingError(
                f"share_embeddings=true needs one vocabulary for both languages, but the source has "
                f"{c.src_vocab_size} tokens and the target {c.tgt_vocab_size}. Use a joint vocabulary (data.joint_vocab"
                "=true in a run) or share_embeddings=false."
            )
        emb = dict(n_embd=c.n_embd, max_len=c.max_len, positional=c.positional, n_head=c.n_head,
                   dropout=c.dropout, scale=math.sqrt(c.n_embd))
        self.src_embed = TokenPositionEmbedding(c.src_vocab_size, **emb)
        self.tgt_embed = TokenPositionEmbedding(c.tgt_vocab_size, **emb)
        if c.share_embeddings:
            self.tgt_embed.wte = self.src_embed.wte
        layer = dict(n_embd=c.n_embd, n_head=c.n_head, ffn_hidden=c.ffn_hidden, ffn=c.ffn, dropout=c.dropout,
                     bias=c.bias, norm=c.norm, norm_position=c.norm_position)
        enc, dec = self.src_embed, self.tgt_embed
        self.encoder = nn.ModuleList(Block(**layer, rotary=enc.rotary, alibi=enc.alibi) for _ in range(c.n_layer))
        self.decoder = nn.ModuleList(Block(**layer, rotary=dec.rotary, alibi=dec.alibi, cross=True)
                                     for _ in range(c.n_dec_layer or c.n_layer))
        pre = c.norm_position == "pre"  # pre-norm stacks end with a norm; post-norm blocks already end in one
        self.enc_norm = make_norm(c.norm, c.n_embd, c.bias) if pre else nn.Identity()
        self.dec_norm = make_norm(c.norm, c.n_embd, c.bias) if pre else nn.Identity()
        self.out_proj = nn.Linear(c.n_embd, c.tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_output:
            self.out_proj.weight = self.tgt_embed.wte.weight

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):  # scaled by sqrt(C) on the way in: unit variance after scaling
                nn.init.normal_(m.weight, std=self.config.n_embd**-0.5)

    def block_classes(self) -> set[type[nn.Module]]:
        """The repeated blocks (attnlab.protocols.BlockNetwork): FSDP units, activation checkpoints."""
        return {Block}

    def no_weight_decay(self) -> set[str]:
        return {n for n, _ in self.named_parameters() if ".pos." in n}

    def _check_length(self, T: int, what: str) -> None:
        if T > self.config.max_len:
            raise UserError(
                f"a {what} sequence of {T} tokens is longer than the model's positional table "
                f"(model.max_len={self.config.max_len}). Lower data.max_length to at most {self.config.max_len} "
                f"(longer sentences are then truncated) or set model.max_len>={T}."
            )

    # ---- the two stacks
    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src (B, S) -> memory (B, S, C), and the source mask (B, S), True at real tokens."""
        self._check_length(src.shape[1], "source")
        src_mask = src != self.config.pad_id
        x = self.src_embed(src)                                           # (B, S, C)
        for block in self.encoder:
            x = block(x, key_padding_mask=src_mask)
        return self.enc_norm(x), src_mask

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               caches: list[KVCache] | None = None, cross_caches: list[KVCache] | None = None) -> torch.Tensor:
        """tgt (B, T) -> logits (B, T, V); causal over the target, cross-attending to the memory."""
        offset = caches[0].length if caches else 0
        self._check_length(offset + tgt.shape[1], "target")
        y = self.tgt_embed(tgt, offset)                                   # (B, T, C)
        for i, block in enumerate(self.decoder):
            y = block(y, causal=True, cache=caches[i] if caches else None, context=memory,
                      context_padding_mask=src_mask, cross_cache=cross_caches[i] if cross_caches else None)
        return self.out_proj(self.dec_norm(y))                           # (B, T, V)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)

    # ---- incremental decoding (greedy / beam search)
    def start(self, src: torch.Tensor) -> dict:
        memory, src_mask = self.encode(src)
        n = len(self.decoder)
        return {"memory": memory, "src_mask": src_mask, "caches": [KVCache() for _ in range(n)],
                "cross": [KVCache() for _ in range(n)]}

    def step(self, tokens: torch.Tensor, state: dict, return_attn: bool = False):
        """tokens (N, 1): the last token of each hypothesis -> next-token logits (N, V), cross-attention (N, S)."""
        cross = self.decoder[self.config.alignment_layer].cross_attn
        cross.record_weights = return_attn
        try:
            logits = self.decode(tokens, state["memory"], state["src_mask"], state["caches"], state["cross"])
        finally:
            cross.record_weights = False
        attn = None
        if return_attn:
            w = cross.last_weights[:, :, -1, :]                            # (N, nh, S)
            h = self.config.alignment_head
            attn = w.mean(1) if h is None else w[:, int(h)]               # (N, S)
        return logits[:, -1], attn

    @staticmethod
    def reorder(state: dict, index: torch.Tensor, beams_only: bool = False) -> None:
        """Rows of the state by `index`. beams_only: the index only permutes the beams of each sentence, so what
        depends on the source alone (memory, mask, cross-attention keys/values) stays as it is."""
        per_source = () if beams_only else (*state["cross"],)
        if not beams_only:
            state["memory"] = state["memory"].index_select(0, index)
            state["src_mask"] = state["src_mask"].index_select(0, index)
        for cache in (*state["caches"], *per_source):
            if cache.k is not None:
                cache.k, cache.v = cache.k.index_select(0, index), cache.v.index_select(0, index)
