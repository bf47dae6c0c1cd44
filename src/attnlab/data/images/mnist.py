"""MNIST from its IDX files (train-images-idx3-ubyte.gz, t10k-..., plain or gzipped), read with numpy."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.base import split_by_fraction
from attnlab.data.images.base import ArrayImages, ImageDataModule, Transformed
from attnlab.errors import UserError

log = logging.getLogger(__name__)

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(root: Path, stem: str) -> Path | None:
    raw = root / "MNIST" / "raw"
    for cand in (root / f"{stem}.gz", root / stem, raw / f"{stem}.gz", raw / stem):
        if cand.exists():
            return cand
    return None


class MNISTDataModule(ImageDataModule):
    """Uses the official train/test split when both are present. With only the test set (as in small offline
    copies), train/val/test are carved out of it by val_fraction/test_fraction, and a notice says so."""

    def __init__(self, data_dir: str = "data/mnist", download: bool = False, **kwargs: Any):
        kwargs = {"num_classes": 10, "image_size": 28, "channels": 1} | kwargs
        super().__init__(**kwargs)
        self.data_dir, self.download = Path(data_dir), download
        self.check_num_classes(10, "MNIST")
        self.class_names = [str(i) for i in range(10)]

    def prepare_data(self) -> None:
        if self.download and _find(self.data_dir, FILES["train"][0]) is None:
            from torchvision.datasets import MNIST

            MNIST(str(self.data_dir), train=True, download=True)
            MNIST(str(self.data_dir), train=False, download=True)

    def _load(self, split: str):
        img, lab = (_find(self.data_dir, s) for s in FILES[split])
        return None if img is None or lab is None else (read_idx(img), read_idx(lab))

    def build_splits(self):
        train, test = self._load("train"), self._load("test")
        if test is None:
            raise UserError(
                f"MNIST files not found in {self.data_dir}: expected t10k-images-idx3-ubyte.gz and "
                "t10k-labels-idx1-ubyte.gz (and train-*.gz). Put them there, point paths.data_dir (or "
                "ATTNLAB_DATA_DIR) at the folder holding mnist/, or set data.download=true when online."
            )
        tr, ev = self.train_transform(), self.eval_transform()
        if train is None:
            log.warning("MNIST: only the test set is in %s; train/val/test are carved out of its 10,000 images "
                        "(val_fraction=%s, test_fraction=%s)", self.data_dir, self.val_fraction, self.test_fraction)
            images, labels = test
            test_idx, val_idx, train_idx = split_by_fraction(len(labels), [self.test_fraction, self.val_fraction],
                                                             self.seed)
            train_idx, val_idx = self.train_val(labels, train_idx, val_idx)
            base = ArrayImages(images, labels)
            return Transformed(base, train_idx, tr), Transformed(base, val_idx, ev), Transformed(base, test_idx, ev)
        val_idx, train_idx = split_by_fraction(len(train[1]), [self.val_fraction], self.seed)
        train_idx, val_idx = self.train_val(train[1], train_idx, val_idx)
        base = ArrayImages(*train)
        return Transformed(base, train_idx, tr), Transformed(base, val_idx, ev), ArrayImages(*test, transform=ev)
