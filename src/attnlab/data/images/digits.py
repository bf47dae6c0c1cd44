"""scikit-learn's handwritten digits: 1,797 real 8x8 gray images (values 0-16), shipped with scikit-learn."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from attnlab.data.base import split_by_fraction
from attnlab.data.images.base import ImageDataModule
from attnlab.data.images.transforms import random_affine
from attnlab.types import Fraction


class DigitsDataModule(ImageDataModule):
    """Held in memory as normalized tensors at the native 8x8 (or resized to data.image_size).

    `augment` takes RandomAffine's degrees / translate / scale, drawn for each training image and applied to the
    whole batch at once on its device (small rotations, shifts and zooms are what keeps a ViT from memorizing 1,258
    training digits); `augment: null` turns it off.
    The split is fixed by `split_seed`, independent of the training seed. `folds`/`fold`: k-fold cross-validation
    over the training and validation digits (stratified, the run's seed); the test digits stay out.
    """

    def __init__(self, test_fraction: Fraction = 0.2, val_fraction: Fraction = 0.1, split_seed: int = 0,
                 **kwargs: Any):
        kwargs = {"num_classes": 10, "image_size": 8, "channels": 1,
                  "augment": {"degrees": 10, "translate": 0.1, "scale": (0.9, 1.1)}} | kwargs
        super().__init__(test_fraction=test_fraction, val_fraction=val_fraction, **kwargs)
        self.check_num_classes(10, "the digits dataset")
        self.class_names = [str(i) for i in range(10)]
        self.split_seed = split_seed

    def build_splits(self):
        images, targets = load_digits()
        x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
        x = (x - 0.5) / 0.5
        if self.image_size != 8:
            x = torch.nn.functional.interpolate(x, size=self.image_size, mode="bilinear", align_corners=False)
        if self.channels != 1:
            x = x.expand(-1, self.channels, -1, -1).contiguous()
        y = torch.tensor(targets, dtype=torch.long)
        test_idx, val_idx, train_idx = split_by_fraction(
            len(y), [self.test_fraction, self.val_fraction], self.split_seed)
        train_idx, val_idx = self.train_val(y.tolist(), train_idx, val_idx)
        return (TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx]),
                TensorDataset(x[test_idx], y[test_idx]))

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """While training, each digit of the batch rotated, shifted and zoomed by its own draw (`augment`), the
        background (-1) filling what comes in from outside."""
        if self.augment and self.trainer is not None and self.trainer.training:
            x, y = batch
            a = self.augment
            batch = [random_affine(x, a.get("degrees") or 0.0, a.get("translate") or 0.0, a.get("scale"), -1.0), y]
        return batch


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits as scikit-learn ships them: images (N, 8, 8) of 0-16 and their classes, read from its data file
    as its `load_digits` reads it, without importing scikit-learn (half a second of a run's start); through
    `load_digits` itself where the file is not where scikit-learn 1.x keeps it."""
    spec = importlib.util.find_spec("sklearn")  # found, not imported
    folders = spec.submodule_search_locations if spec is not None else None
    path = Path(folders[0]) / "datasets" / "data" / "digits.csv.gz" if folders else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as sklearn_digits

        digits = sklearn_digits()
        return digits.images, digits.target
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
