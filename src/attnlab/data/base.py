"""Base DataModule: splits, loaders, and the checks every dataset needs."""

from __future__ import annotations

import logging

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from attnlab.data.info import DataInfo
from attnlab.data.samplers import EpochShuffleSampler, ResumableDataLoader
from attnlab.errors import UserError
from attnlab.types import NonNegativeInt, PositiveInt

log = logging.getLogger("attnlab")


def split_by_fraction(n: int, fractions: list[float], seed: int) -> list[list[int]]:
    """Deterministic random split of range(n): one index list per fraction, the rest last."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    out, start = [], 0
    for f in fractions:
        k = int(round(f * n))
        out.append(perm[start : start + k])
        start += k
    out.append(perm[start:])
    return out


def kfold(labels, folds: int, fold: int, seed: int) -> tuple[list[int], list[int]]:
    """(training, validation) indices of fold `fold` of `folds` stratified folds of `labels` (scikit-learn's
    StratifiedKFold, shuffled with `seed`): every class is spread evenly over the folds."""
    from collections import Counter

    import numpy as np
    from sklearn.model_selection import StratifiedKFold

    if folds < 2:
        raise UserError(f"data.folds={folds}: cross-validation needs at least 2 folds (data.folds=null turns it off).")
    if not 0 <= fold < folds:
        raise UserError(f"data.fold={fold} with data.folds={folds}: the folds are numbered 0 to {folds - 1}. Run them "
                        f"all with: python train.py -m data.folds={folds} data.fold='range({folds})'")
    counts = Counter(labels)
    label, smallest = min(counts.items(), key=lambda kv: kv[1])
    if smallest < folds:
        raise UserError(f"data.folds={folds}: class {label} has {smallest} example(s) in the training and validation "
                        f"data together, fewer than the folds, so the folds cannot each hold it (stratified). Use "
                        f"data.folds={max(2, smallest)} or fewer, or add examples of that class.")
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    train, val = list(splitter.split(np.zeros(len(labels)), list(labels)))[fold]
    return train.tolist(), val.tolist()


class BaseDataModule(L.LightningDataModule):
    """Subclasses implement `build_splits()` returning (train, val, test) datasets and may extend `meta`."""

    # set by a subclass whose test split is its validation split: train.py then runs no second pass over it
    test_is_validation = False

    def __init__(
        self,
        kind: str,
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt = 0,
        pin_memory: bool | None = None,
        seed: int = 42,
        eval_batch_size: PositiveInt | None = None,
    ):
        super().__init__()
        self.kind = kind
        self.batch_size, self.num_workers, self.seed = int(batch_size), int(num_workers), int(seed)
        from attnlab.utils.cpus import is_bound, usable_cpus

        if is_bound() and self.num_workers > usable_cpus() - 1:  # a SLURM task bound to its CPUs, taskset
            log.info("data.num_workers=%d: this process may run on %d CPUs (its affinity), so %d loader workers "
                     "(the training process takes one)", self.num_workers, usable_cpus(), max(0, usable_cpus() - 1))
            self.num_workers = max(0, usable_cpus() - 1)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    # ---- what the data tells the model, once it is set up: the one contract (attnlab.data.info)
    def info(self) -> DataInfo:
        """Sizes (num_classes, image_size, vocab_size, ...) and objects (tokenizers, class names) the task takes."""
        return DataInfo(self.kind)

    def build_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set, self.test_set = self.build_splits()

    # ---- loaders: one builder; a data module changes what it needs through the hooks below
    def train_sampler(self, ds: Dataset, batch_size: int, world: int, rank: int):
        """The training sampler: each epoch a new permutation, split across processes. A DistributedSampler, which
        Lightning leaves in place under DDP (its own wrapper would not pass set_epoch on)."""
        if batch_size > len(ds):
            raise UserError(
                f"data.batch_size={batch_size} is larger than the training split ({len(ds):,} samples). "
                f"Set data.batch_size to at most {len(ds)} (or use more data)."
            )
        return EpochShuffleSampler(len(ds), self.seed, num_replicas=world, rank=rank)

    def batch_sampler(self, ds: Dataset, train: bool, world: int, rank: int):
        """A sampler of whole batches (length bucketing) instead of batch_size; None: batches of batch_size."""
        return None

    def collate_fn(self, train: bool):
        return None

    def loader_generator(self) -> torch.Generator | None:
        """The training loader's own generator: creating an epoch's iterator then draws nothing from the global
        random state, which a resumed run restores (see ResumableDataLoader)."""
        return torch.Generator().manual_seed(self.seed)

    def before_loader(self) -> None:
        """Called before each DataLoader is built (the trainer, when there is one, holds the data module then)."""

    def _loader(self, ds: Dataset, train: bool) -> DataLoader:
        self.before_loader()
        bs = self.batch_size if train else self.eval_batch_size
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        common = dict(num_workers=self.num_workers, pin_memory=self.pin_memory,
                      persistent_workers=self.num_workers > 0, collate_fn=self.collate_fn(train))
        loader = ResumableDataLoader if train else DataLoader  # training saves its position in checkpoints
        batches = self.batch_sampler(ds, train, world, rank)
        if batches is not None:
            return loader(ds, batch_sampler=batches, **common)
        if not train:
            return DataLoader(ds, batch_size=bs, **common)
        return loader(ds, batch_size=bs, sampler=self.train_sampler(ds, bs, world, rank), drop_last=len(ds) > bs,
                      generator=self.loader_generator(), **common)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)


def subset(ds: Dataset, idx: list[int]) -> Subset:
    return Subset(ds, idx)
