"""The samples language models train on, drawn from token arrays: causal windows (GPT) and packed, dynamically
masked sequences (BERT)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from attnlab.data.samplers import ResumableSampler
from attnlab.data.text.token_arrays import TokenArray


log = logging.getLogger("attnlab")


# ---- causal LM: windows

class Windows(Dataset):
    """(x, y) = (tokens[s : s+T], tokens[s+1 : s+T+1]) as int64 tensors of shape (T,).
    Without `starts`, index i is the start itself (any of the len(tokens) - T starts)."""

    def __init__(self, tokens: TokenArray, block_size: int, starts: np.ndarray | None = None):
        self.tokens, self.T, self.starts = tokens, int(block_size), starts

    def __len__(self) -> int:
        return len(self.starts) if self.starts is not None else len(self.tokens) - self.T

    def __getitem__(self, i: int):
        s = int(self.starts[i]) if self.starts is not None else int(i)
        chunk = torch.from_numpy(self.tokens.read(s, s + self.T + 1).astype(np.int64))  # (T + 1,)
        return chunk[:-1], chunk[1:]


class RandomStarts(ResumableSampler, DistributedSampler):
    """`num_samples` window starts per epoch drawn uniformly with replacement (nanoGPT's get_batch), seeded by
    (seed, epoch): a resumed run draws what an uninterrupted one would have, from the batch it stopped at.

    Under DDP each rank takes every num_replicas-th draw (the epoch's draws rounded up to a multiple of
    num_replicas), like EpochShuffleSampler; as a DistributedSampler, Lightning leaves it unwrapped, so a
    resumed run skips inside it."""

    def __init__(self, n: int, num_samples: int, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        DistributedSampler.__init__(self, range(num_samples), num_replicas=num_replicas, rank=rank, shuffle=False,
                                    seed=seed)  # self.num_samples: this rank's share; self.total_size: all ranks'
        self.n = n

    CHUNK = 1 << 16  # draws per rank made at a time: memory independent of the epoch's length

    def epoch_indices(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        for a in range(0, self.total_size, self.CHUNK):  # the same draws for any number of ranks
            draws = torch.randint(self.n, (min(self.CHUNK, self.total_size - a),), generator=g)
            yield from draws[(self.rank - a) % self.num_replicas :: self.num_replicas].tolist()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def fixed_starts(n_tokens: int, block_size: int, seed: int) -> np.ndarray:
    """Non-overlapping window starts covering the split, in a fixed random order."""
    starts = np.arange(0, n_tokens - block_size, block_size)
    return np.random.default_rng(seed).permutation(starts)


# ---- masked LM: packed sequences and dynamic masking

def pack_spans(doc_ends: np.ndarray, start: int, end: int, length: int) -> np.ndarray:
    """Group consecutive documents (lines) of tokens [start, end) into spans of at most `length` tokens, cutting
    only documents longer than `length`. Returns (N, 2) [a, b) offsets relative to `start`."""
    ends = doc_ends[(doc_ends > start) & (doc_ends < end)] - start
    ends = np.append(ends, end - start)
    spans, a, prev = [], 0, 0
    for e in ends.tolist():
        if e - a > length and prev > a:
            spans.append((a, prev))
            a = prev
        while e - a > length:
            spans.append((a, a + length))
            a += length
        prev = e
    if prev > a:
        spans.append((a, prev))
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


class PackedSequences(Dataset):
    """[CLS] tokens[a:b] [SEP] as an int64 tensor of at most max_length ids."""

    def __init__(self, tokens: TokenArray, spans: np.ndarray, cls_id: int, sep_id: int):
        self.tokens, self.spans, self.cls, self.sep = tokens, spans, cls_id, sep_id

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> torch.Tensor:
        a, b = self.spans[i]
        body = torch.from_numpy(self.tokens.read(int(a), int(b)).astype(np.int64))
        return torch.cat([torch.tensor([self.cls]), body, torch.tensor([self.sep])])


class MaskingCollator:
    """Pads a list of sequences to the longest and masks them (BERT): each real, non-special token is chosen with
    probability `prob`; chosen tokens become [MASK] (80%), a random token (10%) or stay (10%). `labels` holds the
    original id at chosen positions and -100 elsewhere. With `seed`, the masks depend only on the batch (for
    repeatable validation); without, they come from torch's global generator (fresh every batch).

    Shapes come in few sizes, as HF's `pad_to_multiple_of`: the length is padded to a multiple of `pad_to_multiple_of`
    (at most `max_length`), and the chosen positions are also given as `masked_positions` (N,), indices into the
    flattened (B * T) batch in row-major order, with their `masked_labels` (N,), padded to a multiple of
    `targets_multiple_of` with position 0 and label -100. The model projects only those N states onto the
    vocabulary; with sizes that change every step, the allocator's heap fragments (a masked LM's memory grew 1.5x
    over 150 steps) and a compiled step recompiles, and finding the positions on the device waits for it."""

    def __init__(self, pad_id: int, mask_id: int, special_ids: list[int], vocab_size: int, prob: float = 0.15,
                 seed: int | None = None, pad_to_multiple_of: int = 8, targets_multiple_of: int = 64,
                 max_length: int | None = None):
        self.pad_id, self.mask_id, self.vocab_size, self.prob, self.seed = pad_id, mask_id, vocab_size, prob, seed
        self.special_ids = torch.tensor(sorted(set(special_ids)))
        self.pad_to, self.targets_to, self.max_length = pad_to_multiple_of, targets_multiple_of, max_length

    def __call__(self, seqs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        B, T = len(seqs), _round_up(max(len(s) for s in seqs), self.pad_to)
        T = max(min(T, self.max_length or T), max(len(s) for s in seqs))
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        attn = torch.zeros(B, T, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)], attn[i, : len(s)] = s, 1
        g = None
        if self.seed is not None:
            g = torch.Generator().manual_seed(self.seed + int(ids[:, :8].sum()) * 7919 + B * T)
        input_ids, labels = mask_tokens(ids, attn.bool() & ~torch.isin(ids, self.special_ids), self.mask_id,
                                        self.vocab_size, self.prob, g)
        positions = (labels != -100).flatten().nonzero().squeeze(1)            # (N,)
        n = _round_up(len(positions), self.targets_to)
        masked_positions = torch.zeros(n, dtype=torch.long)
        masked_labels = torch.full((n,), -100, dtype=torch.long)
        masked_positions[: len(positions)], masked_labels[: len(positions)] = positions, labels.flatten()[positions]
        return {"input_ids": input_ids, "attention_mask": attn, "labels": labels,
                "masked_positions": masked_positions, "masked_labels": masked_labels}


def _round_up(n: int, multiple: int | None) -> int:
    return -(-n // multiple) * multiple if multiple and multiple > 1 else n


def mask_tokens(ids: torch.Tensor, candidates: torch.Tensor, mask_id: int, vocab_size: int, prob: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, T), candidates (B, T) bool -> (masked input ids, labels), both (B, T)."""
    chosen = (torch.rand(ids.shape, generator=generator) < prob) & candidates
    if not chosen.any() and candidates.any():  # never a batch without a target
        flat = candidates.flatten().nonzero().squeeze(1)
        chosen.view(-1)[flat[torch.randint(len(flat), (1,), generator=generator)]] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    to_mask = chosen & (roll < 0.8)
    to_random = chosen & (roll >= 0.8) & (roll < 0.9)
    out = ids.masked_fill(to_mask, mask_id)
    random_ids = torch.randint(vocab_size, ids.shape, generator=generator)
    out = torch.where(to_random, random_ids, out)
    return out, labels
