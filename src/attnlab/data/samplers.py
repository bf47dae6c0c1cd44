"""Training samplers and the DataLoader that resumes an epoch at the exact batch it was interrupted at.

`EpochShuffleSampler` is seeded by (seed, epoch), so a resumed run sees the same order as an uninterrupted one. It is
torch's DistributedSampler(shuffle=True, seed=seed) -- the same permutation for that epoch, each rank taking every
world_size-th index -- so a DDP run sees the same samples in each global batch as a single process, and Lightning
leaves it as it is in DDP instead of wrapping it.

`ResumableDataLoader` gives Lightning the `state_dict` / `load_state_dict` it stores with the fit loop in every
checkpoint (`loops.fit_loop.state_dict.combined_loader`): the epoch, the number of batches already taken from it, and
the random state of the process at that point (augmentation and dropout draw from it; Lightning does not save it).
On resume the sampler skips the batches already trained on -- by index, without loading them -- and the random state
is put back just before the first new batch is loaded, so the resumed run trains on the batches an uninterrupted run
would have, with the same augmentation.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

log = logging.getLogger("attnlab")


class ResumableSampler(Sampler[int]):
    """A sampler whose epoch order is a function of (seed, epoch) (`epoch_indices`), which can start one epoch
    part-way (`resume_at`)."""

    epoch: int = 0
    _resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this at the start of every epoch
        self.epoch = epoch

    def epoch_indices(self) -> Iterable[int]:
        raise NotImplementedError

    def resume_at(self, epoch: int, skip: int) -> None:
        """Skip the first `skip` indices of `epoch`, the next time that epoch is iterated."""
        self._resume = (int(epoch), int(skip))

    def __iter__(self):
        indices, resume, self._resume = self.epoch_indices(), self._resume, None
        if resume is not None and resume[0] == self.epoch:
            indices = itertools.islice(indices, resume[1], None)
        return iter(indices)


class EpochShuffleSampler(ResumableSampler, DistributedSampler):
    def __init__(self, n: int, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        DistributedSampler.__init__(self, range(n), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.n = n

    def epoch_indices(self) -> list[int]:
        return list(DistributedSampler.__iter__(self))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def rng_states() -> dict[str, Any]:
    kind, key, pos, has_gauss, gauss = np.random.get_state()  # as types torch.load(weights_only=True) reads
    states = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss,
                                                        gauss], "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    kind, key, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position Lightning saves in checkpoints and restores on resume (see the module doc).

    Exact with `num_workers=0`. With workers, the position is exact too, but workers draw their own random
    augmentation, which a fresh set of workers does not continue.
    """

    _batches = 0
    _pending: dict[str, Any] | None = None
    # a stage that runs ahead of the training step on a thread of its own (data.decode=gpu's DecodeAhead): given how
    # to start the epoch's iterator, it yields the batches the step takes, and a batch counts as the step takes it
    ahead: Callable[[Callable[[], Iterator]], Iterator] | None = None

    @property
    def _position(self):
        """What orders the epoch: a batch sampler that can resume by batches itself, else the sampler."""
        return self.batch_sampler if hasattr(self.batch_sampler, "resume_at") else self.sampler

    def __iter__(self):
        if self.ahead is not None:
            return self._counting(self.ahead(super().__iter__))
        return self._counting(super().__iter__())

    def _counting(self, it):
        pending, self._pending = self._pending, None
        self._batches = 0
        if pending is not None:
            if pending["epoch"] == getattr(self._position, "epoch", 0):
                self._batches = pending["batches"]
            if pending.get("rng") is not None:  # the state at the save point, put back before the next batch loads
                set_rng_states(pending["rng"])
        for batch in it:
            self._batches += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": getattr(self._position, "epoch", 0), "batches": self._batches, "rng": rng_states()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch, batches = int(state.get("epoch", 0)), int(state.get("batches", 0))
        self._pending = {"epoch": epoch, "batches": batches, "rng": state.get("rng")}
        if self._position is self.batch_sampler and batches and batches < len(self):  # skips whole batches itself
            self.batch_sampler.set_epoch(epoch)
            self.batch_sampler.resume_at(epoch, batches)
            return
        if not batches or not self.batch_size or batches >= len(self):  # at an epoch's start or end: nothing to skip
            return
        sampler = self.sampler
        if not isinstance(sampler, ResumableSampler):
            log.warning("resuming mid-epoch, but the training sampler (%s) cannot skip the %d batches already "
                        "trained on: the epoch restarts from its first batch", type(sampler).__name__, batches)
            self._pending["batches"] = 0
            return
        sampler.set_epoch(epoch)  # Lightning sets it only after creating the epoch's iterator
        sampler.resume_at(epoch, batches * self.batch_size)
