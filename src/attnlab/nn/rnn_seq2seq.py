"""Recurrent encoder-decoders, the models the Transformer replaced: LSTM / GRU / vanilla RNN cells, with no
attention (Sutskever et al. 2014; Cho et al. 2014: a fixed context vector fed at every step), additive attention
(Bahdanau et al. 2015) or multiplicative attention with input feeding (Luong et al. 2015).

Same decoding interface as nn/transformer_seq2seq.py: forward, start, step, reorder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.errors import SettingError
from attnlab.nn.layers import ConfigSplit
from attnlab.nn.registry import register_network

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}
ATTENTIONS = ("none", "bahdanau", "luong")


@dataclass
class RNNSeq2SeqConfig(ConfigSplit):
    src_vocab_size: int
    tgt_vocab_size: int
    pad_id: int = 0
    cell: str = "gru"                 # lstm | gru | rnn
    attention: str = "bahdanau"       # none | bahdanau | luong
    emb_dim: int = 256
    hidden: int = 512
    n_layer: int = 1
    bidirectional: bool = True        # encoder
    dropout: float = 0.5
    teacher_forcing: float = 1.0      # probability of feeding the true previous token while training


class Attention(nn.Module):
    """Bahdanau: score(h, e) = v . tanh(W h + U e);  Luong ("general"): score(h, e) = h . W e."""

    def __init__(self, kind: str, query_dim: int, key_dim: int):
        super().__init__()
        self.kind = kind
        if kind == "bahdanau":
            self.keys = nn.Linear(key_dim, query_dim, bias=False)
            self.query = nn.Linear(query_dim, query_dim)
            self.v = nn.Linear(query_dim, 1, bias=False)
        else:
            self.keys = nn.Linear(key_dim, query_dim, bias=False)

    def forward(self, h: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor):
        """h (B, H), keys (B, S, H) = self.keys(values) precomputed, values (B, S, He), mask (B, S) ->
        context (B, He), weights (B, S)."""
        if self.kind == "bahdanau":
            scores = self.v(torch.tanh(self.query(h)[:, None] + keys)).squeeze(-1)   # (B, S)
        else:
            scores = (keys @ h[:, :, None]).squeeze(-1)                                # (B, S)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)                # (B, S)
        return (weights[:, None] @ values).squeeze(1), weights                        # (B, He), (B, S)


@register_network("rnn_seq2seq", config=RNNSeq2SeqConfig)
class RNNSeq2Seq(nn.Module):

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        self.config = c = config
        if c.cell not in CELLS:
            raise SettingError(f"cell={c.cell} is not one of {', '.join(CELLS)}: pick one of those.")
        if c.attention not in ATTENTIONS:
            raise SettingError(f"attention={c.attention} is not one of {', '.join(ATTENTIONS)}: pick one of those.")
        rnn, H, dirs = CELLS[c.cell], c.hidden, 2 if c.bidirectional else 1
        inter = c.dropout if c.n_layer > 1 else 0.0
        self.lstm = c.cell == "lstm"
        self.drop = nn.Dropout(c.dropout)
        # encoder
        self.src_embed = nn.Embedding(c.src_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        self.encoder = rnn(c.emb_dim, H, c.n_layer, batch_first=True, dropout=inter, bidirectional=c.bidirectional)
        self.bridge = nn.Linear(dirs * H, H)  # final encoder states -> initial decoder state, per layer
        # decoder
        enc_dim = dirs * H
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        if c.attention == "luong":  # input feeding: the previous attentional state joins the input
            self.decoder = rnn(c.emb_dim + H, H, c.n_layer, batch_first=True, dropout=inter)
            self.attn = Attention("luong", H, enc_dim)
            self.combine = nn.Linear(enc_dim + H, H, bias=False)
            self.out = nn.Linear(H, c.tgt_vocab_size)
        else:  # the context (attended, or the fixed summary) joins the input and the output layer
            self.decoder = rnn(c.emb_dim + enc_dim, H, c.n_layer, batch_first=True, dropout=inter)
            self.attn = Attention("bahdanau", H, enc_dim) if c.attention == "bahdanau" else None
            self.out = nn.Linear(H + enc_dim + c.emb_dim, c.tgt_vocab_size)

    # ---- encoder
    def _final_states(self, h: torch.Tensor) -> torch.Tensor:
        """(layers * dirs, B, H) -> (layers, B, dirs * H): both directions of each layer side by side."""
        L, dirs = self.config.n_layer, 2 if self.config.bidirectional else 1
        return h.view(L, dirs, h.shape[1], h.shape[2]).permute(0, 2, 1, 3).reshape(L, h.shape[1], -1)

    def start(self, src: torch.Tensor) -> dict:
        mask = src != self.config.pad_id                                     # (B, S)
        lengths = mask.sum(1).clamp_min(1).cpu()
        emb = self.drop(self.src_embed(src))                                 # (B, S, E)
        packed = pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
        out, h = self.encoder(packed)
        enc, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])  # (B, S, dirs*H)
        h, cell = h if self.lstm else (h, None)
        summary = self._final_states(h)                                      # (L, B, dirs*H)
        state = {"enc": enc, "mask": mask, "h": torch.tanh(self.bridge(summary))}  # h: (L, B, H)
        if self.lstm:
            state["c"] = torch.tanh(self.bridge(self._final_states(cell)))
        if self.attn is not None:
            state["keys"] = self.attn.keys(enc)                              # (B, S, H), computed once
        if self.config.attention == "none":
            state["context"] = summary[-1]                                   # (B, dirs*H), Cho et al.
        if self.config.attention == "luong":
            state["feed"] = enc.new_zeros(src.shape[0], self.config.hidden)  # (B, H)
        return state

    # ---- decoder
    def step(self, tokens: torch.Tensor, state: dict, return_attn: bool = False):
        """tokens (B, 1) -> logits (B, V), attention over the source (B, S) (None without attention)."""
        emb = self.drop(self.tgt_embed(tokens[:, 0]))                        # (B, E)
        hidden = (state["h"], state["c"]) if self.lstm else state["h"]
        weights = None
        if self.config.attention == "luong":
            out, hidden = self.decoder(torch.cat([emb, state["feed"]], -1)[:, None], hidden)
            top = out[:, 0]                                                  # (B, H)
            context, weights = self.attn(top, state["keys"], state["enc"], state["mask"])
            attentional = torch.tanh(self.combine(torch.cat([context, top], -1)))  # (B, H)
            state["feed"] = attentional
            logits = self.out(self.drop(attentional))
        else:
            if self.attn is not None:  # Bahdanau: attend with the previous top-layer state
                context, weights = self.attn(state["h"][-1], state["keys"], state["enc"], state["mask"])
            else:
                context = state["context"]
            out, hidden = self.decoder(torch.cat([emb, context], -1)[:, None], hidden)
            logits = self.out(self.drop(torch.cat([out[:, 0], context, emb], -1)))
        state["h"], state["c"] = hidden if self.lstm else (hidden, None)
        return logits, (weights if return_attn else None)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); while training, each step feeds the model's own previous prediction
        instead of the true token with probability 1 - teacher_forcing."""
        state = self.start(src)
        tf = self.config.teacher_forcing if self.training else 1.0
        tokens, outputs = tgt_in[:, :1], []
        for t in range(tgt_in.shape[1]):
            logits, _ = self.step(tokens, state)
            outputs.append(logits)
            if t + 1 < tgt_in.shape[1]:
                use_truth = tf >= 1.0 or torch.rand(()).item() < tf
                tokens = tgt_in[:, t + 1 : t + 2] if use_truth else logits.argmax(-1, keepdim=True)
        return torch.stack(outputs, dim=1)                                   # (B, T, V)

    @staticmethod
    def reorder(state: dict, index: torch.Tensor, beams_only: bool = False) -> None:
        """Rows of the state by `index`; beams_only (a permutation within each sentence's beams) leaves what depends
        on the source alone (encoder outputs, keys, mask, context) as it is."""
        for key, value in state.items():
            if value is not None and (not beams_only or key in ("h", "c", "feed")):
                state[key] = value.index_select(1 if key in ("h", "c") else 0, index)
