"""Batched greedy and beam-search decoding for any seq2seq model with the `start` / `step` / `reorder`
interface (nn/transformer_seq2seq.py, nn/rnn_seq2seq.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.types import DecodeSettings  # noqa: F401 - the settings of decoding, declared with the other value types


def _ban(logits: torch.Tensor, banned: tuple[int, ...]) -> torch.Tensor:
    """Tokens an output must not contain (padding, BOS) get -inf, as in fairseq."""
    if not banned:
        return logits
    return logits.index_fill(-1, torch.tensor(banned, device=logits.device), float("-inf"))


@torch.no_grad()
def greedy(model, src: torch.Tensor, bos: int, eos: int, max_len: int, return_attn: bool = False,
           banned: tuple[int, ...] = ()) -> tuple[list[list[int]], list[torch.Tensor] | None]:
    """The most probable next token at each step (never one of `banned`). Returns the token ids of each sentence
    (without BOS/EOS), and with return_attn the attention of each output token over the source, (T_out, S) per
    sentence."""
    state = model.start(src)
    B = src.shape[0]
    ys = torch.full((B, 1), bos, dtype=torch.long, device=src.device)   # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    attns = []
    for _ in range(max_len):
        logits, attn = model.step(ys[:, -1:], state, return_attn)        # (B, V), (B, S)
        logits = _ban(logits, banned)
        nxt = logits.argmax(-1).masked_fill(done, eos)                   # (B,)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        if return_attn and attn is not None:
            attns.append(attn)
        done |= nxt == eos
        if done.all():
            break
    out, maps = [], [] if return_attn and attns else None  # None: the model has no attention to show
    for i, row in enumerate(ys[:, 1:].tolist()):
        n = row.index(eos) if eos in row else len(row)
        out.append(row[:n])
        if maps is not None:
            maps.append(torch.stack([a[i] for a in attns[: n + 1]]).cpu())  # the EOS step included
    return out, maps


@torch.no_grad()
def beam_search(model, src: torch.Tensor, bos: int, eos: int, max_len: int, beam_size: int = 5,
                length_penalty: float = 1.0, banned: tuple[int, ...] = ()) -> list[list[int]]:
    """Beam search as in fairseq: each step keeps the `beam_size` best continuations of every sentence; a
    continuation ending in EOS that ranks among them is finished, scored by log-probability / length**
    length_penalty (EOS counted), and a sentence is done once it has `beam_size` finished hypotheses. With
    beam_size=1 this is greedy decoding. Vectorized over sentences and beams. Returns the best hypothesis of each
    sentence (token ids without BOS/EOS)."""
    B, K, device = src.shape[0], beam_size, src.device
    rows = torch.arange(B, device=device)
    state = model.start(src)
    model.reorder(state, rows.repeat_interleave(K))
    tokens = torch.full((B * K, 1), bos, dtype=torch.long, device=device)   # (B*K, 1 + t)
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = float("-inf")                                         # all beams start as one
    fin_tokens = torch.full((B, K, max_len), eos, dtype=torch.long, device=device)
    fin_scores = torch.full((B, K), float("-inf"), device=device)         # normalized
    fin_count = torch.zeros(B, dtype=torch.long, device=device)
    for t in range(max_len):
        logits, _ = model.step(tokens[:, -1:], state)                     # (B*K, V)
        logp = F.log_softmax(_ban(logits.float(), banned), dim=-1)
        V = logp.shape[-1]
        cand = (scores.view(-1, 1) + logp).view(B, K * V)                 # (B, K*V)
        top, idx = cand.topk(2 * K, dim=1)                                # (B, 2K): at most K end in EOS
        beam, tok = idx // V, idx % V
        prev = tokens.view(B, K, -1)[rows[:, None], beam, 1:]             # (B, 2K, t) prefixes
        # finish: EOS candidates among the K best, while the sentence has room (and everything at the last step)
        ends = (tok == eos) & (torch.arange(2 * K, device=device) < K) & torch.isfinite(top)
        if t == max_len - 1:
            ends = torch.isfinite(top) & (torch.arange(2 * K, device=device) < K)
        slot = fin_count[:, None] + ends.long().cumsum(1) - 1              # (B, 2K) where each one goes
        ends &= slot < K
        if ends.any():
            b, j = ends.nonzero(as_tuple=True)
            length = t + 1 + (tok[b, j] != eos).long()                     # tokens with the EOS
            hyp = torch.cat([prev[b, j], tok[b, j, None]], dim=1)          # (n, t + 1), EOS last or not
            fin_tokens[b, slot[b, j], : t + 1] = hyp
            fin_scores[b, slot[b, j]] = top[b, j] / length.float() ** length_penalty
            fin_count += ends.sum(1)
        if bool((fin_count >= K).all()) or t == max_len - 1:
            break
        # continue with the K best candidates that do not end in EOS
        order = (torch.arange(2 * K, device=device) + 2 * K * (tok == eos).long()).argsort(dim=1)[:, :K]
        keep_beam, keep_tok = beam.gather(1, order), tok.gather(1, order)  # (B, K) each
        scores = top.gather(1, order)
        flat = (rows[:, None] * K + keep_beam).view(-1)                   # (B*K,)
        model.reorder(state, flat, beams_only=True)  # each sentence's beams stay among its own rows
        tokens = torch.cat([tokens.index_select(0, flat), keep_tok.view(-1, 1)], dim=1)
    best = fin_scores.argmax(1)                                           # (B,)
    out = []
    for row in fin_tokens[rows, best].tolist():
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


def decode(model, src: torch.Tensor, bos: int, eos: int, max_len: int, beam_size: int = 1,
           length_penalty: float = 1.0, banned: tuple[int, ...] = ()) -> list[list[int]]:
    if beam_size <= 1:
        return greedy(model, src, bos, eos, max_len, banned=banned)[0]
    return beam_search(model, src, bos, eos, max_len, beam_size, length_penalty, banned)
