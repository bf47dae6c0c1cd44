"""Image splits read from LitData shards (`data.format=shards`, written by shards.py): the training split streamed,
the evaluation splits read by index.

Training: LitData's `StreamingDataset` + `StreamingDataLoader` (`ShardLoader`). Each epoch, the chunks are put in an
order drawn from (data.seed, epoch) and split among the ranks x workers, every one reading its own part; the items
within a chunk are shuffled too (on NFS, Lustre and GPFS, LitData keeps each worker on a run of chunks and shuffles
within a window of them: the shards were written in a random order for that). Every rank gets the same number of
whole batches: an epoch leaves out `N mod (world_size x batch_size)` of the N training samples (fewer than one
global batch), each epoch others. The epoch is the run's (`trainer.current_epoch`), so the order is a function of
the seed and the epoch, as the folder's `EpochShuffleSampler` is, and a resumed run sees the epochs it would have.

The loader's state, saved with the fit loop in every checkpoint, is LitData's (samples yielded, epoch, the data's
settings: plain ints, strings and lists) plus the random state of the process, as `ResumableDataLoader` saves it:
`torch.load(weights_only=True)` reads it. A run resumed mid-epoch with the same number of processes, workers and
batch size continues with exactly the samples the epoch had left; with another, the interrupted epoch restarts from
its first batch for the batches it had left (Lightning ends the epoch at its count), and the log says so. The
workers are started afresh each epoch (not persistent): a worker's dataset takes the epoch and the resumed position
when it starts.

Evaluation (and the memory estimate's first batch): `ShardImages`, a map-style view of a split by sample index, read
in the order the split was written, which the usual samplers split among processes as for the image folder.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable
from typing import Any

from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from attnlab.data.samplers import rng_states, set_rng_states
from attnlab.data.formats.shard_format import litdata, read_meta, safe_serializers, split_dir
from attnlab.errors import UserError

litdata()  # noqa: E402  (LitData's version check off before its first import)
from litdata import StreamingDataLoader, StreamingDataset  # noqa: E402

log = logging.getLogger("attnlab")


class Decode:
    """(file bytes, class index) -> (transform(image), class index), in the loader's workers. A transform that reads
    encoded images itself (`from_bytes(data, mode)`) is given the bytes."""

    def __init__(self, transform: Callable | None, mode: str, where: str):
        self.transform, self.mode, self.where = transform, mode, where

    def __call__(self, item: tuple[bytes, int]):
        data, label = item
        try:
            if hasattr(self.transform, "from_bytes"):
                return self.transform.from_bytes(data, self.mode), int(label)
            with Image.open(io.BytesIO(data)) as img:
                img = img.convert(self.mode)
        except (UnidentifiedImageError, OSError, SyntaxError) as e:
            raise UserError(f"an image of the shards of {self.where} cannot be decoded ({e}): its file was stored as "
                            "it was, so it was already corrupt in the image folder. Delete or replace it there and "
                            "convert the folder again.") from None
        return (self.transform(img) if self.transform is not None else img), int(label)


def streaming_dataset(path: str, **kwargs: Any) -> StreamingDataset:
    """LitData's dataset of a split, its serializers that unpickle refused. Each sample is deserialized alone
    (`batch_decode=0`: LitData's window of 256 rows would be deserialized again for each sample drawn from it in a
    shuffled order, about 10x slower), and the items of a chunk take a full permutation (`item_shuffle_window=0`)."""
    return StreamingDataset(path, serializers=safe_serializers(), batch_decode=0, item_shuffle_window=0, **kwargs)


class ShardImages(Dataset):
    """A split of the shards by sample index (in the order it was written): (transform(image), class index)."""

    def __init__(self, path: str, size: int, transform: Callable | None, mode: str = "RGB"):
        self.path, self.size, self.decode = path, int(size), Decode(transform, mode, path)
        self._ds: StreamingDataset | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        if self._ds is None or self._pid != os.getpid():  # one reader per process (loader workers included)
            self._ds, self._pid = streaming_dataset(self.path), os.getpid()
        if not 0 <= i < self.size:
            raise IndexError(i)
        return self.decode(self._ds[int(i)])

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_ds": None, "_pid": -1}


class ShardLoader(StreamingDataLoader):
    """LitData's loader, its epoch the run's and its state with the random state of the process (module doc)."""

    def __init__(self, dataset: StreamingDataset, *args: Any, epoch: Callable[[], int | None] = lambda: None,
                 **kwargs: Any):
        super().__init__(dataset, *args, **kwargs)
        self._run_epoch = epoch
        self._pending_rng: dict | None = None

    def __iter__(self):
        if not self.restore:
            epoch = self._run_epoch()
            if epoch is not None:
                self.current_epoch = epoch  # LitData counts epochs from 1: its __iter__ adds one
        pending, self._pending_rng = self._pending_rng, None
        batches = super().__iter__()
        if pending is not None:  # the state at the save point, put back before the next batch loads
            set_rng_states(pending)
        yield from batches

    def topology(self) -> tuple[int, int, int]:
        return self.dataset.distributed_env.world_size, self.num_workers or 1, int(self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"rng": rng_states()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("dataset") or {}
        was = (saved.get("world_size"), saved.get("num_workers"), saved.get("batch_size"))
        if was != self.topology():
            names = ("processes", "loader workers", "batch size")
            changed = ", ".join(f"{n} {a} -> {b}" for n, a, b in zip(names, was, self.topology()) if a != b)
            log.warning("resuming with another layout of the training data than the checkpoint's (%s): LitData's "
                        "position holds only for the layout it was saved with, so the shards' interrupted epoch "
                        "restarts from its first batch, for the batches it had left; in that epoch some samples are "
                        "seen twice and others not", changed)
            return
        saved = dict(saved)
        if (saved.get("input_dir_path"), saved.get("input_dir_url")) != (self.dataset.input_dir.path,
                                                                          self.dataset.input_dir.url):
            log.info("the shards are read from %s now, %s when the checkpoint was written",
                     self.dataset.input_dir.url or self.dataset.input_dir.path,
                     saved.get("input_dir_url") or saved.get("input_dir_path"))
            saved["input_dir_path"], saved["input_dir_url"] = self.dataset.input_dir.path, self.dataset.input_dir.url
        super().load_state_dict(dict(state) | {"dataset": saved})
        self._pending_rng = state.get("rng")


def train_loader(path: str, size: int, transform: Callable | None, *, batch_size: int, num_workers: int, seed: int,
                 mode: str = "RGB", world: int = 1, rank: int = 0, nodes: int = 1,
                 epoch: Callable[[], int | None] = lambda: None, collate_fn: Callable | None = None,
                 **loader: Any) -> ShardLoader:
    """The training loader of the split at `path` (`size` samples) for process `rank` of `world`."""
    if batch_size * world > size:
        raise UserError(f"data.batch_size={batch_size} x {world} process(es) is more than the {size:,} training "
                        f"samples of the shards at {path}: lower data.batch_size to at most {size // world}.")
    ds = streaming_dataset(path, shuffle=True, seed=seed, transform=Decode(transform, mode, path))
    env = ds.distributed_env
    if (env.world_size, env.global_rank) != (world, rank):  # the trainer's view (LitData reads torch.distributed)
        ds.distributed_env = type(env)(world_size=world, global_rank=rank, num_nodes=nodes)
    import torch
    from torch.utils.data import default_collate

    # its own generator: creating an epoch's iterator draws nothing from the random state a resume puts back
    loader.setdefault("generator", torch.Generator().manual_seed(seed))
    return ShardLoader(ds, batch_size=batch_size, num_workers=num_workers, drop_last=world > 1 or size > batch_size,
                       persistent_workers=False, collate_fn=collate_fn or default_collate, epoch=epoch, **loader)


class ShardSplits:
    """What an image data module (`format: shards`) reads from a shard folder: its classes, its splits, the training
    loader."""

    def __init__(self, dm, root: str):
        self.root, self.meta = str(root), read_meta(str(root))
        if dm.folds:
            raise UserError("data.folds with data.format=shards: the shards hold the splits they were converted "
                            "with; k-fold cross-validation draws its folds from the image folder (data.format="
                            "folder).")
        names = list(self.meta["class_names"])
        dm.check_num_classes(len(names), self.root)
        dm.class_names = names
        drawn = {"val_fraction": dm.val_fraction, "test_fraction": dm.test_fraction, "seed": dm.seed}
        differ = {k: (v, self.meta.get(k)) for k, v in drawn.items() if self.meta.get(k) != v}
        if differ:
            log.info("data.format=shards: the splits are those of the conversion (%s); %s do not change them",
                     ", ".join(f"{k}={b}" for k, (_, b) in differ.items()),
                     ", ".join(f"data.{k}={a}" for k, (a, _) in differ.items()))

    def size(self, split: str) -> int:
        return int(self.meta["splits"][split]["samples"])

    def build_splits(self, dm):
        mode = "L" if dm.channels == 1 else "RGB"
        tr, ev = dm.train_transform(), dm.eval_transform()
        train = ShardImages(split_dir(self.root, "train"), self.size("train"), tr, mode)
        val = ShardImages(split_dir(self.root, "val"), self.size("val"), ev, mode)
        test = ShardImages(split_dir(self.root, "test"), self.size("test"), ev, mode) \
            if "test" in self.meta["splits"] else val
        dm.test_is_validation = test is val
        if self.meta.get("benchmark_split") and hasattr(dm, "benchmark_split"):
            dm.benchmark_split = self.meta["benchmark_split"]
        return train, val, test

    def train_loader(self, dm) -> ShardLoader:
        dm.before_loader()
        trainer = dm.trainer
        world, rank, nodes = (trainer.world_size, trainer.global_rank, trainer.num_nodes) if trainer else (1, 0, 1)
        return train_loader(split_dir(self.root, "train"), self.size("train"), dm.train_transform(),
                            batch_size=dm.batch_size, num_workers=dm.num_workers, seed=dm.seed,
                            mode="L" if dm.channels == 1 else "RGB", world=world, rank=rank, nodes=nodes,
                            epoch=lambda: dm.trainer.current_epoch if dm.trainer is not None else None,
                            collate_fn=dm.collate_fn(True), pin_memory=dm.pin_memory,
                            generator=dm.loader_generator())
