"""Image transforms from timm: create_transform for training (RandAugment, random erasing, ...) and evaluation."""

from __future__ import annotations

from typing import Any

from timm.data import create_transform

_DEFAULT_MEAN, _DEFAULT_STD = (0.5,), (0.5,)


def _stats(augment: dict, channels: int) -> tuple[tuple, tuple]:
    mean = tuple(augment.get("mean") or _DEFAULT_MEAN * channels)
    std = tuple(augment.get("std") or _DEFAULT_STD * channels)
    return mean[:channels] if channels == 1 else mean, std[:channels] if channels == 1 else std


def train_transform(image_size: int, channels: int, augment: dict[str, Any] | None):
    """timm's training pipeline. `augment` takes create_transform's arguments: scale, ratio, hflip, vflip,
    color_jitter, auto_augment ("rand-m9-mstd0.5", "augmix-...", "trivialaugment"), re_prob, interpolation."""
    augment = dict(augment or {})
    if not augment:
        return eval_transform(image_size, channels, augment)
    mean, std = _stats(augment, channels)
    augment.pop("mean", None), augment.pop("std", None), augment.pop("crop_pct", None)
    if channels == 1:  # RandAugment and color jitter assume RGB
        augment["auto_augment"], augment["color_jitter"] = None, None
    return create_transform(
        input_size=(channels, image_size, image_size), is_training=True, mean=mean, std=std,
        **({"interpolation": "bicubic"} | augment),
    )


def eval_transform(image_size: int, channels: int, augment: dict[str, Any] | None):
    """Resize + center crop + normalize; small images (<= 64 px) are not cropped."""
    augment = dict(augment or {})
    mean, std = _stats(augment, channels)
    crop_pct = augment.get("crop_pct") or (1.0 if image_size <= 64 else 0.875)
    return create_transform(
        input_size=(channels, image_size, image_size), is_training=False, mean=mean, std=std,
        crop_pct=crop_pct, interpolation=augment.get("interpolation", "bicubic"),
    )
