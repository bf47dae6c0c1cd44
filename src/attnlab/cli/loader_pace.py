"""Whether the data loader or the model sets an image run's pace: the training loader's images/s alone (its
configured workers) against the model's images/s per step, and, where the loader is slower, by how much and what
helps."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass
class LoaderPace:
    loader_s: float  # images/s of the training loader alone
    model_s: float  # images/s of the training steps, waiting for data left out
    workers: int
    cpus: int
    decoder: str = ""
    files: bool = True  # the images are decoded from files or shards (not arrays in memory)
    shards: bool = False  # already read from shards (data.format=shards)
    warps: str = "opencv"  # what warps RandAugment's geometric ops: opencv, or pillow (data/images/warp_ops.py)

    @property
    def slower(self) -> float:
        """How many times slower the loader is than the model (< 1: it keeps up)."""
        return self.model_s / self.loader_s

    def line(self) -> str:
        """Preflight's loader line: the two rates, and what to do when the loader sets the pace."""
        rates = (f"{self.loader_s:,.1f} images/s from the training loader alone ({self.workers} worker"
                 f"{'s' if self.workers != 1 else ''}, data.num_workers) against {self.model_s:,.1f} images/s "
                 f"taken by the model (its steps, waiting for data left out)")
        if self.slower <= 1:
            return f"{rates}: the model sets the pace (the loader has {1 / self.slower:.1f}x its rate)"
        todo = []
        # the loader workers that would keep up, when the loader's rate grows with its workers (at least one)
        per_worker = self.loader_s / max(1, self.workers)
        needed = math.ceil(self.model_s / per_worker) if per_worker > 0 else None
        if needed and needed > self.workers:
            more = f"more workers: about {needed} would keep up (data.num_workers={needed}"
            todo.append(more + (f"; this machine has {self.cpus} CPUs, the training process takes one)"
                                if needed > self.cpus - 1 else ")"))
        if self.files and not self.shards:
            todo.append("shards: data.format=shards reads a few large files in sequence instead of one small file "
                        "per image")
        if self.files:
            todo.append("reduced-size decoding: JPEGs at least twice the crop are decoded at 1/2, 1/4 or 1/8 of "
                        "their size, so images stored with a shorter side near twice data.image_size or less decode "
                        "faster")
            missing = [what for what, gone in (
                ("simplejpeg: the same pixels, a third less decoding time", self.decoder == "pillow"),
                ("OpenCV: RandAugment's rotations, shears and translations in half the time", self.warps == "pillow"))
                if gone]
            if missing:
                todo.append(f"pip install 'attnlab[fast]' ({'; '.join(missing)})")
            todo.append("on a CUDA GPU, data.decode=gpu (the JPEGs decoded on the device with nvJPEG)")
        else:
            todo.append("lighter augmentation in the loader (data.augment)")
        return (f"{rates}: the loader sets the pace, {self.slower:.1f}x slower than the model. What helps: "
                + "; ".join(todo) + ".")


def time_loader(dm, batches: int) -> float | None:
    """Images/s of `dm`'s training loader alone: its workers started and their first batches let through, then
    `batches` more timed (fewer when the epoch is shorter). None when the epoch has too few batches."""
    loader = dm.train_dataloader()
    warmup = max(1, int(getattr(loader, "num_workers", 0) or 0))
    it = iter(loader)
    try:
        n, start = 0, None
        for k, batch in enumerate(it):
            if k == warmup - 1:
                start = time.perf_counter()
            elif k >= warmup:
                n += _samples(batch)
                if k >= warmup + batches - 1:
                    break
        return n / (time.perf_counter() - start) if start is not None and n else None
    finally:
        from attnlab.compat import shut_down_loader_workers

        shut_down_loader_workers(it)


def _samples(batch) -> int:
    """The images of a batch: the leading size of its first tensor (with decode=gpu, whose images come encoded,
    its labels')."""
    import torch

    parts = batch if isinstance(batch, (tuple, list)) else (batch,)
    first = next((p for p in parts if isinstance(p, torch.Tensor) and p.dim()), None)
    return int(first.shape[0]) if first is not None else 1


def pace(dm, model_s: float | None, batches: int) -> LoaderPace | None:
    """The loader's pace against the model's for an image data module (None for other data, or unmeasured)."""
    from attnlab.data.images.base import ImageDataModule

    if not isinstance(dm, ImageDataModule) or not model_s:
        return None
    rate = time_loader(dm, batches)
    if not rate:
        return None
    from attnlab.data.images import warp_ops
    from attnlab.data.images.file_transforms import decoder
    from attnlab.data.images.base import ArrayImages
    from attnlab.utils.cpus import usable_cpus

    ds = dm.train_set
    arrays = isinstance(ds, ArrayImages) or isinstance(getattr(ds, "base", None), ArrayImages)
    return LoaderPace(rate, model_s, int(dm.num_workers), usable_cpus(), decoder(), not arrays,
                      getattr(dm, "format", "folder") == "shards", "opencv" if warp_ops.available() else "pillow")
