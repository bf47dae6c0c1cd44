"""Segmentation metrics beyond the confusion matrix: the Rand error over objects (connected components), as the
ISBI 2012 challenge scores membrane segmentations."""

from __future__ import annotations

import numpy as np
import torch
from torchmetrics import Metric


def adapted_rand_error(true: np.ndarray, pred: np.ndarray) -> float:
    """Foreground-restricted Rand error (Arganda-Carreras et al. 2015; scikit-image's `adapted_rand_error`) of two
    label images (H, W) of objects: 0 is background in `true` and its pixels are left out; in `pred` 0 is one more
    segment. 1 - the F-score of the Rand split and merge scores: 0 is perfect, splits and merges both raise it."""
    keep = true > 0
    t, p = true[keep].astype(np.int64), pred[keep].astype(np.int64)
    n = t.size
    if n == 0:
        return 0.0
    _, joint = np.unique(t * (int(p.max()) + 1) + p, return_counts=True)  # the contingency table's nonzero cells
    sum_joint = float((joint.astype(np.float64) ** 2).sum() - n)
    sum_true = float((np.bincount(t).astype(np.float64) ** 2).sum() - n)
    sum_pred = float((np.bincount(p).astype(np.float64) ** 2).sum() - n)
    if sum_true <= 0 or sum_pred <= 0:  # only single-pixel objects on one side: no pair to agree on
        return 0.0 if sum_true == sum_pred else 1.0
    precision, recall = sum_joint / sum_pred, sum_joint / sum_true
    return 1.0 - 2 * precision * recall / max(precision + recall, 1e-12)


class RandError(Metric):
    """Mean over images of the adapted Rand error of the objects of class `object_class`: the connected components
    (4-connected) of that class in the truth and in the prediction; pixels ignored in the truth (`ignore_index`)
    are left out. For membranes the objects are the cells that the membranes separate."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, object_class: int, ignore_index: int = 255, **kwargs):
        super().__init__(**kwargs)
        self.object_class, self.ignore_index = int(object_class), int(ignore_index)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """pred, target: (B, H, W) class indices."""
        from scipy import ndimage

        for p, t in zip(pred.cpu().numpy(), target.cpu().numpy()):
            labelled = t != self.ignore_index
            true_objects, _ = ndimage.label((t == self.object_class) & labelled)
            pred_objects, _ = ndimage.label(p == self.object_class)
            self.total += adapted_rand_error(true_objects, pred_objects)
            self.count += 1

    def compute(self) -> torch.Tensor:
        return (self.total / self.count.clamp_min(1)).float()
