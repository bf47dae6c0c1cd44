"""Sentence pairs as token arrays: flat memory-mapped ragged arrays, the dataset over them, padding, and the
batch sampler that buckets sentences of similar length."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from attnlab.utils.atomic import atomic_path


log = logging.getLogger("attnlab")


# ---- token arrays

class RaggedArray:
    """Variable-length token sequences as one flat memory-mapped array plus offsets."""

    def __init__(self, flat_path: Path, offsets_path: Path):
        self.flat_path, self.offsets = flat_path, np.load(offsets_path)
        self._flat: np.ndarray | None = None

    @property
    def flat(self) -> np.ndarray:
        if self._flat is None:
            self._flat = np.load(self.flat_path, mmap_mode="r")
        return self._flat

    def __getstate__(self):  # DataLoader workers map the file themselves
        return {**self.__dict__, "_flat": None}

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.flat[self.offsets[i] : self.offsets[i + 1]])


def write_ragged(seqs: Iterator[list[int]], out: Path, dtype) -> None:
    flat, offsets = [], [0]
    for s in seqs:
        flat.append(np.asarray(s, dtype=dtype))
        offsets.append(offsets[-1] + len(s))
    out.mkdir(parents=True, exist_ok=True)
    for name, arr in (("flat", np.concatenate(flat) if flat else np.zeros(0, dtype)),
                      ("offsets", np.asarray(offsets, dtype=np.int64))):
        with atomic_path(out / f"{name}.npy", suffix=".npy") as tmp:
            np.save(tmp, arr)


class ParallelSet(Dataset):
    def __init__(self, src: RaggedArray, tgt: RaggedArray, src_text: list[str] | None = None,
                 tgt_text: list[str] | None = None):
        self.src, self.tgt, self.src_text, self.tgt_text = src, tgt, src_text, tgt_text

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> dict:
        item = {"src": torch.from_numpy(self.src[i].astype(np.int64)),
                "tgt": torch.from_numpy(self.tgt[i].astype(np.int64))}
        if self.tgt_text is not None:
            item["ref"], item["src_text"] = self.tgt_text[i], self.src_text[i]
        return item

    def lengths(self) -> np.ndarray:
        return np.maximum(self.src.lengths(), self.tgt.lengths())


class PadCollator:
    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, items: list[dict]) -> dict[str, Any]:
        batch = {k: torch.nn.utils.rnn.pad_sequence([it[k] for it in items], batch_first=True,
                                                    padding_value=self.pad_id) for k in ("src", "tgt")}
        if "ref" in items[0]:
            batch["ref"] = [it["ref"] for it in items]
            batch["src_text"] = [it["src_text"] for it in items]
        return batch


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of sentences of similar length. Each epoch: shuffle, sort by length within pools of 100 batches,
    cut into batches of `batch_size` sentences (or of at most `max_tokens` padded tokens), shuffle the batches.
    Under DDP every rank takes every world_size-th batch (training: the same count on each rank). Without shuffle
    (evaluation) the batches are in length order."""

    def __init__(self, lengths: np.ndarray, batch_size: int, max_tokens: int | None = None, shuffle: bool = True,
                 seed: int = 0, num_replicas: int = 1, rank: int = 0):
        self.lengths, self.batch_size, self.max_tokens = np.asarray(lengths), int(batch_size), max_tokens
        self.shuffle, self.seed, self.epoch = shuffle, int(seed), 0
        self.num_replicas, self.rank = num_replicas, rank
        self._resume: tuple[int, int] | None = None
        self._plan: tuple[int, list[list[int]]] | None = None
        # training: the same number of steps every epoch (a token budget cuts a varying number of batches; the
        # epoch-0 count, as Lightning reads it once, minus a margin of 1%)
        n = len(self._batches())
        self._steps = (n - (n // 100 if max_tokens else 0)) // num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, skip: int) -> None:
        """Skip the first `skip` batches of `epoch` the next time it is iterated (a run resumed mid-epoch)."""
        self._resume = (int(epoch), int(skip))

    def _batches(self) -> list[list[int]]:
        """The epoch's batches (all ranks), computed once per epoch."""
        if self._plan is not None and self._plan[0] == self.epoch:
            return self._plan[1]
        rng = np.random.default_rng(self.seed + self.epoch)
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        pool = len(order) if not self.shuffle else self.batch_size * 100
        batches = []
        for p in range(0, len(order), pool):
            chunk = order[p : p + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(self._cut(chunk))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        elif len(batches) < self.num_replicas <= len(order):  # every rank must evaluate something (DDP)
            size = -(-len(order) // self.num_replicas)
            batches = [order[i : i + size].tolist() for i in range(0, len(order), size)]
        self._plan = (self.epoch, batches)
        return batches

    def _cut(self, idx: np.ndarray) -> list[list[int]]:
        if not self.max_tokens:
            return [idx[i : i + self.batch_size].tolist() for i in range(0, len(idx), self.batch_size)]
        out, cur, longest = [], [], 0
        for i in idx.tolist():
            n = int(self.lengths[i])
            if cur and max(longest, n) * (len(cur) + 1) > self.max_tokens:  # the budget replaces batch_size
                out.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, n)
        return out + ([cur] if cur else [])

    def __iter__(self):
        batches = self._batches()[self.rank :: self.num_replicas]
        batches = batches[: self._steps] if self.shuffle else batches
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] == self.epoch:
            batches = batches[resume[1]:]
        yield from batches

    def __len__(self) -> int:
        if not self.shuffle:  # evaluation: every batch once, on some rank
            return len(range(self.rank, len(self._batches()), self.num_replicas))
        return self._steps
