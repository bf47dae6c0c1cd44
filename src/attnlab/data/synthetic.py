"""Synthetic data of real shapes, for throughput benchmarks (timm's `benchmark.py` and nanoGPT's `bench.py
real_data=False` measure the same way): `data=synthetic_text` (random token windows of a given vocabulary, e.g.
GPT-2's padded 50304) and `data=synthetic_images` (ImageNet-shaped images and labels). Nothing is read, downloaded or
held per sample: a sample is a function of its index."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from attnlab.data.base import BaseDataModule
from attnlab.data.info import DataInfo
from attnlab.data.images.base import ImageDataModule
from attnlab.types import PositiveInt


class RandomWindows(Dataset):
    """(x, y) next-token windows of `block_size` random ids in [0, vocab_size), sample i seeded by (seed, i)."""

    def __init__(self, n: int, vocab_size: int, block_size: int, seed: int):
        self.n, self.vocab_size, self.T, self.seed = n, vocab_size, block_size, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
        chunk = torch.randint(self.vocab_size, (self.T + 1,), generator=g)  # (T + 1,)
        return chunk[:-1], chunk[1:]


class SyntheticTokensDataModule(BaseDataModule):
    def __init__(self, vocab_size: PositiveInt = 50304, block_size: PositiveInt = 1024, max_length: PositiveInt = 128,
                 train_samples: PositiveInt = 100_000, val_samples: PositiveInt = 256,
                 objective: Literal["causal"] = "causal", **kwargs: Any):
        super().__init__(**({"kind": "text"} | kwargs))
        self.vocab_size, self.block_size, self.objective = int(vocab_size), int(block_size), objective
        self.max_length = int(max_length)  # what a masked-LM config reads; the windows here are causal
        self.train_samples, self.val_samples = int(train_samples), int(val_samples)

    def info(self) -> DataInfo:
        return DataInfo(self.kind, objective=self.objective, vocab_size=self.vocab_size, block_size=self.block_size)

    def build_splits(self):
        val = RandomWindows(self.val_samples, self.vocab_size, self.block_size, self.seed + 1)
        return RandomWindows(self.train_samples, self.vocab_size, self.block_size, self.seed), val, val


class RandomImages(Dataset):
    """A bank of `bank` random uint8 images with random labels, sample i the (i mod bank)-th: the loader costs what
    copying a batch costs, as in timm's benchmark; the data module normalizes them on the device, as real images."""

    def __init__(self, n: int, channels: int, image_size: int, num_classes: int, seed: int, bank: int = 64):
        g = torch.Generator().manual_seed(seed)
        self.n = n
        self.images = torch.randint(0, 256, (bank, channels, image_size, image_size), generator=g,
                                    dtype=torch.uint8)  # (bank, C, H, W)
        self.labels = torch.randint(num_classes, (bank,), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        j = int(i) % len(self.images)
        return self.images[j], self.labels[j]


class SyntheticImagesDataModule(ImageDataModule):
    def __init__(self, train_samples: PositiveInt = 100_000, val_samples: PositiveInt = 256, **kwargs: Any):
        super().__init__(**({"num_classes": 1000, "augment": None} | kwargs))
        self.train_samples, self.val_samples = int(train_samples), int(val_samples)
        self.class_names = [str(i) for i in range(int(self.num_classes))]

    def build_splits(self):
        make = lambda n, seed: RandomImages(n, self.channels, self.image_size, int(self.num_classes), seed)  # noqa: E731
        val = make(self.val_samples, self.seed + 1)
        return make(self.train_samples, self.seed), val, val
