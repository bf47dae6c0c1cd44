"""scikit-learn's handwritten digits: 1,797 real 8x8 gray images (values 0-16), shipped with scikit-learn."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from attnlab.data.base import split_by_fraction
from attnlab.data.images import ImageDataModule


class DigitsDataModule(ImageDataModule):
    """Held in memory as normalized tensors at the native 8x8 (or resized to data.image_size)."""

    def __init__(self, test_fraction: float = 0.2, val_fraction: float = 0.1, **kwargs: Any):
        kwargs = {"num_classes": 10, "image_size": 8, "channels": 1} | kwargs
        super().__init__(test_fraction=test_fraction, val_fraction=val_fraction, **kwargs)
        self.check_num_classes(10, "the digits dataset")
        self.class_names = [str(i) for i in range(10)]

    def build_splits(self):
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
        x = (x - 0.5) / 0.5
        if self.image_size != 8:
            x = torch.nn.functional.interpolate(x, size=self.image_size, mode="bilinear", align_corners=False)
        if self.channels != 1:
            x = x.expand(-1, self.channels, -1, -1).contiguous()
        y = torch.tensor(digits.target, dtype=torch.long)
        test_idx, val_idx, train_idx = split_by_fraction(len(y), [self.test_fraction, self.val_fraction], self.seed)
        return tuple(TensorDataset(x[i], y[i]) for i in (train_idx, val_idx, test_idx))
