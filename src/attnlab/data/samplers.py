"""A shuffling sampler seeded by (seed, epoch), so a resumed run sees the same order as an uninterrupted one.

It draws the same permutation as torch's DistributedSampler(seed=seed) for that epoch, so a DDP run (each rank
taking every world_size-th index) sees the same samples in each global batch as a single process.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this at the start of every epoch
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n
