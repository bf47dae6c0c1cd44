"""Image transforms from timm, split as timm's own training loader splits them.

In the loader workers: decoding, create_transform's cropping and augmentation (RandAugment, flips, color jitter,
...), ending in a uint8 (C, H, W) tensor (`create_transform(..., use_prefetcher=True)`; image files are read by
file_transforms.py: the crop drawn before decoding, the same draws). On the device, once a batch is there
(`BatchNormalizer`, which the image data modules call from `on_after_batch_transfer`): the conversion to float, the
normalization (x / 255 - mean) / std, and in training timm's RandomErasing on the normalized batch, on one thread
where the device is the CPU. A batch then crosses pinned memory and PCIe as uint8, a quarter of the float32 bytes.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import create_transform
from timm.data.random_erasing import RandomErasing

_DEFAULT_MEAN, _DEFAULT_STD = (0.5,), (0.5,)
_DEVICE_SIDE = ("mean", "std", "crop_pct", "re_prob", "re_mode", "re_count", "re_num_splits")


def image_stats(augment: dict | None, channels: int) -> tuple[tuple, tuple]:
    """The normalization mean and std of `augment` (0.5 each when it names none), one per channel."""
    augment = augment or {}
    mean = tuple(augment.get("mean") or _DEFAULT_MEAN * channels)
    std = tuple(augment.get("std") or _DEFAULT_STD * channels)
    return mean[:channels] if channels == 1 else mean, std[:channels] if channels == 1 else std


def train_transform(image_size: int, channels: int, augment: dict[str, Any] | None):
    """timm's training pipeline up to a uint8 (C, H, W) tensor. `augment` takes create_transform's arguments: scale,
    ratio, hflip, vflip, color_jitter, auto_augment ("rand-m9-mstd0.5", "augmix-...", "trivialaugment"),
    interpolation; mean/std (RandAugment's fill color here, the normalization on the device) and re_prob, re_mode,
    re_count, re_num_splits (random erasing, on the device: `BatchNormalizer`)."""
    augment = dict(augment or {})
    if not augment:
        return eval_transform(image_size, channels, augment)
    mean, std = image_stats(augment, channels)
    augment = {k: v for k, v in augment.items() if k not in _DEVICE_SIDE}
    if channels == 1:  # RandAugment and color jitter assume RGB
        augment["auto_augment"], augment["color_jitter"] = None, None
    compose = create_transform(
        input_size=(channels, image_size, image_size), is_training=True, mean=mean, std=std, use_prefetcher=True,
        **({"interpolation": "bicubic"} | augment),
    )
    from attnlab.data.images.file_transforms import TrainFromFile

    return TrainFromFile(compose) if TrainFromFile.supports(compose) else compose


def eval_transform(image_size: int, channels: int, augment: dict[str, Any] | None, normalize: bool = False):
    """Resize + center crop (small images, <= 64 px, are not cropped) to a uint8 (C, H, W) tensor, JPEGs at least
    twice the resize size decoded at a reduced size (`EvalFromFile`); with `normalize` (prediction, outside a data
    module) to the normalized float32 tensor instead, the numbers `BatchNormalizer` gives on the device."""
    augment = dict(augment or {})
    mean, std = image_stats(augment, channels)
    crop_pct = augment.get("crop_pct") or (1.0 if image_size <= 64 else 0.875)
    compose = create_transform(
        input_size=(channels, image_size, image_size), is_training=False, mean=mean, std=std,
        crop_pct=crop_pct, interpolation=augment.get("interpolation", "bicubic"), use_prefetcher=not normalize,
    )
    from attnlab.data.images.file_transforms import EvalFromFile

    return EvalFromFile(compose)


class BatchNormalizer:
    """A uint8 (B, C, H, W) batch (or one (C, H, W) image) -> float32 (x / 255 - mean) / std on its device, as timm's
    PrefetchLoader does; with `train=True` then timm's RandomErasing (re_prob, re_mode, re_count, re_num_splits) on
    the normalized batch. A floating-point batch is returned as it is. The mean and std live on each device they
    meet, built once."""

    def __init__(self, mean, std, re_prob: float = 0.0, re_mode: str = "const", re_count: int = 1,
                 re_num_splits: int = 0):
        self.mean, self.std = tuple(255 * float(m) for m in mean), tuple(255 * float(s) for s in std)
        self.erasing = dict(probability=float(re_prob), mode=re_mode, max_count=int(re_count),
                            num_splits=int(re_num_splits)) if re_prob else None
        self._on: dict[torch.device, tuple] = {}

    @classmethod
    def from_augment(cls, augment: dict | None, channels: int) -> BatchNormalizer:
        augment = augment or {}
        mean, std = image_stats(augment, channels)
        erasing = {k: augment[k] for k in ("re_prob", "re_mode", "re_count", "re_num_splits") if augment.get(k)}
        return cls(mean, std, **erasing)

    def _state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, RandomErasing | None]:
        if device not in self._on:  # one host-to-device copy per device, on the first batch
            mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1).to(device)
            std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1).to(device)
            erase = RandomErasing(**self.erasing, device=device) if self.erasing else None
            self._on[device] = (mean, std, erase)
        return self._on[device]

    def __call__(self, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        if x.dtype != torch.uint8:
            return x
        mean, std, erase = self._state(x.device)
        with _one_thread(x.device.type == "cpu"):
            x = x.float().sub_(mean).div_(std)                               # (B, C, H, W) float32
            return erase(x) if train and erase is not None else x

    def __getstate__(self) -> dict:  # the per-device tensors stay in the process that built them
        return self.__dict__ | {"_on": {}}


@contextmanager
def _one_thread(on: bool):
    """Torch's ops on one thread inside: on CPUs the normalization (memory-bound passes) and the erased rectangles
    (copies too small to share out) gain little from an OpenMP team, whose threads wait for the cores the loader's
    workers hold: measured with 2 workers on 2 cores, 0.42 against 0.60 ms of CPU per image to normalize, 0.06
    against 0.6 to erase."""
    threads = torch.get_num_threads() if on else 1
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


def affine(x: torch.Tensor, angle: torch.Tensor, shift: torch.Tensor, zoom: torch.Tensor,
           fill: float = 0.0) -> torch.Tensor:
    """Each image of a (B, C, H, W) float batch rotated by its `angle` (B,) degrees counter-clockwise, zoomed by
    `zoom` (B,) about the centre and shifted by `shift` (B, 2) pixels (x, y), sampled with nearest neighbours and
    `fill` outside the image: torchvision's `affine` for a whole batch at once, with one set of numbers per image."""
    h, w = x.shape[-2:]
    a = torch.deg2rad(angle)
    cos, sin = torch.cos(a) / zoom, torch.sin(a) / zoom
    # affine_grid maps output coordinates (in [-1, 1]) to input ones: the inverse of shift . zoom . rotate
    inverse = torch.stack([torch.stack([cos, sin * h / w], -1), torch.stack([-sin * w / h, cos], -1)], 1)  # (B, 2, 2)
    offset = torch.stack([shift[:, 0] * 2 / w, shift[:, 1] * 2 / h], -1).unsqueeze(-1)                 # (B, 2, 1)
    theta = torch.cat([inverse, -(inverse @ offset)], -1).to(x.dtype)                                  # (B, 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)                                    # (B, H, W, 2)
    out = F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    # the nearest input pixel of each output one, as grid_sample rounds it: outside the image, `fill`
    pixel = torch.round(((grid + 1) * torch.tensor([w, h], dtype=grid.dtype, device=grid.device) - 1) / 2)
    inside = ((pixel >= 0) & (pixel <= torch.tensor([w - 1, h - 1], device=grid.device))).all(-1)       # (B, H, W)
    return torch.where(inside.unsqueeze(1), out, torch.full_like(out, fill))


def random_affine(x: torch.Tensor, degrees: float = 0.0, translate: float = 0.0, scale=None,
                  fill: float = 0.0) -> torch.Tensor:
    """torchvision's RandomAffine(degrees, (translate, translate), scale, fill=fill) with its own draw for each
    image of a (B, C, H, W) float batch, applied to the whole batch at once on its device (`affine`): per image in
    the loader, the transform cost a fifth of a small model's training step."""
    b, (h, w), dev = x.shape[0], x.shape[-2:], x.device
    angle = (torch.rand(b, device=dev) * 2 - 1) * degrees                                   # (B,) degrees
    side = torch.tensor([w, h], device=dev, dtype=torch.float32)
    shift = torch.round((torch.rand(b, 2, device=dev) * 2 - 1) * translate * side)          # (B, 2) whole pixels
    lo, hi = scale if scale else (1.0, 1.0)
    zoom = lo + torch.rand(b, device=dev) * (hi - lo)                                       # (B,)
    return affine(x, angle, shift, zoom, fill)
