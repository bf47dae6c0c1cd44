"""scikit-learn's handwritten digits: 1,797 real 8x8 gray images (values 0-16), shipped with scikit-learn."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from attnlab.data.base import split_by_fraction
from attnlab.data.images import ImageDataModule
from attnlab.types import Fraction


class _Augmented(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform):
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.transform(self.x[i]), self.y[i]


class DigitsDataModule(ImageDataModule):
    """Held in memory as normalized tensors at the native 8x8 (or resized to data.image_size).

    `augment` takes RandomAffine's degrees / translate / scale, applied to each training image (small rotations,
    shifts and zooms are what keeps a ViT from memorizing 1,258 training digits); `augment: null` turns it off.
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
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
        x = (x - 0.5) / 0.5
        if self.image_size != 8:
            x = torch.nn.functional.interpolate(x, size=self.image_size, mode="bilinear", align_corners=False)
        if self.channels != 1:
            x = x.expand(-1, self.channels, -1, -1).contiguous()
        y = torch.tensor(digits.target, dtype=torch.long)
        test_idx, val_idx, train_idx = split_by_fraction(
            len(y), [self.test_fraction, self.val_fraction], self.split_seed)
        train_idx, val_idx = self.train_val(y.tolist(), train_idx, val_idx)
        val, test = TensorDataset(x[val_idx], y[val_idx]), TensorDataset(x[test_idx], y[test_idx])
        if not self.augment:
            return TensorDataset(x[train_idx], y[train_idx]), val, test
        from torchvision.transforms import v2

        a = self.augment
        t = a.get("translate", 0.0)
        affine = v2.RandomAffine(degrees=a.get("degrees", 0.0), translate=(t, t) if t else None,
                                 scale=tuple(a["scale"]) if a.get("scale") else None, fill=-1.0)
        return _Augmented(x[train_idx], y[train_idx], affine), val, test
