"""Joint image/mask transforms for segmentation. Every geometric step is applied to both with the same random
parameters; masks are resized with nearest-neighbour interpolation (labels stay exact) and padded with the ignore
index. Images are float tensors (C, H, W), masks long tensors (H, W). Randomness comes from torch's RNG, so the
DataLoader's per-worker seeding applies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from attnlab.errors import UserError

IGNORE_INDEX = 255
Pair = tuple[torch.Tensor, torch.Tensor]


def _resize(image: torch.Tensor, mask: torch.Tensor, size: tuple[int, int]) -> Pair:
    image = TF.resize(image, list(size), interpolation=InterpolationMode.BILINEAR, antialias=True)
    mask = TF.resize(mask[None], list(size), interpolation=InterpolationMode.NEAREST_EXACT)[0]
    return image, mask


def _uniform(lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand(()))


class Compose:
    def __init__(self, steps: Sequence):
        self.steps = list(steps)

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        for step in self.steps:
            image, mask = step(image, mask)
        return image, mask


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        return (image - self.mean) / self.std, mask


class RandomScale:
    """Rescale the pair by a factor drawn from [lo, hi] (scale jitter), keeping the aspect ratio."""

    def __init__(self, lo: float, hi: float):
        self.lo, self.hi = float(lo), float(hi)

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        s = _uniform(self.lo, self.hi)
        h, w = mask.shape
        return _resize(image, mask, (max(1, round(h * s)), max(1, round(w * s))))


class ResizeShorter:
    """Resize so the shorter side is `size` (evaluation of datasets with images of many sizes)."""

    def __init__(self, size: int):
        self.size = int(size)

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        h, w = mask.shape
        s = self.size / min(h, w)
        return _resize(image, mask, (round(h * s), round(w * s)))


class RandomCrop:
    """A random size x size window; smaller pairs are padded first (image with 0, mask with the ignore index)."""

    def __init__(self, size: int, ignore_index: int = IGNORE_INDEX):
        self.size, self.ignore_index = int(size), ignore_index

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        image, mask = pad_to(image, mask, self.size, self.ignore_index)
        h, w = mask.shape
        top = int(torch.randint(0, h - self.size + 1, ()))
        left = int(torch.randint(0, w - self.size + 1, ()))
        return (image[:, top:top + self.size, left:left + self.size],
                mask[top:top + self.size, left:left + self.size])


class CenterCrop:
    """The central size x size window."""

    def __init__(self, size: int):
        self.size = int(size)

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        h, w = mask.shape
        top, left = (h - self.size) // 2, (w - self.size) // 2
        return (image[:, top:top + self.size, left:left + self.size],
                mask[top:top + self.size, left:left + self.size])


class RandomResizedCrop:
    """A random window of `scale` x the area and `ratio` aspect, resized to size x size (Inception-style)."""

    def __init__(self, size: int, scale: Sequence[float] = (0.25, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3)):
        self.size, self.scale, self.ratio = int(size), tuple(scale), tuple(ratio)

    def params(self, h: int, w: int) -> tuple[int, int, int, int]:
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            area = h * w * _uniform(*self.scale)
            aspect = math.exp(_uniform(*log_ratio))
            cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                top, left = int(torch.randint(0, h - ch + 1, ())), int(torch.randint(0, w - cw + 1, ()))
                return top, left, ch, cw
        side = min(h, w)  # fallback: the central square
        return (h - side) // 2, (w - side) // 2, side, side

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        top, left, ch, cw = self.params(*mask.shape)
        image, mask = image[:, top:top + ch, left:left + cw], mask[top:top + ch, left:left + cw]
        return _resize(image, mask, (self.size, self.size))


class RandomFlip:
    """Flip along `dim` (-1: horizontal, -2: vertical) with probability p."""

    def __init__(self, p: float, dim: int = -1):
        self.p, self.dim = float(p), dim

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        if self.p and float(torch.rand(())) < self.p:
            return image.flip(self.dim), mask.flip(self.dim)
        return image, mask


class RandomElastic:
    """Elastic deformation as in the U-Net paper (Ronneberger et al. 2015): displacement vectors drawn on a coarse
    grid x grid of points with `std` pixels' standard deviation, upsampled bicubically into a smooth per-pixel field
    and applied to both (image bilinear, mask nearest: labels stay exact). Pixels pulled from outside the image are 0
    in the image and the ignore index in the mask. Applied with probability p."""

    def __init__(self, p: float = 0.5, std: float = 10.0, grid: int = 3, ignore_index: int = IGNORE_INDEX):
        self.p, self.std, self.grid, self.ignore_index = float(p), float(std), int(grid), ignore_index

    def displacement(self, h: int, w: int) -> torch.Tensor:
        """(1, H, W, 2) in torchvision's units: x, y offsets where 2 is the image's width, height."""
        coarse = torch.randn(1, 2, self.grid, self.grid) * self.std  # (1, 2, g, g) pixels
        field = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=True)[0]  # (2, H, W) pixels
        return torch.stack([field[0] * 2 / w, field[1] * 2 / h], dim=-1)[None]

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> Pair:
        if not self.p or float(torch.rand(())) >= self.p:
            return image, mask
        d = self.displacement(*mask.shape)
        return (TF.elastic_image(image, d, interpolation=InterpolationMode.BILINEAR, fill=0.0),
                TF.elastic_mask(mask, d, fill=self.ignore_index))


def pad_to(image: torch.Tensor, mask: torch.Tensor, size: int, ignore_index: int = IGNORE_INDEX) -> Pair:
    """Pad bottom/right to at least size x size."""
    h, w = mask.shape
    ph, pw = max(0, size - h), max(0, size - w)
    if ph or pw:
        image = F.pad(image, (0, pw, 0, ph), value=0.0)
        mask = F.pad(mask, (0, pw, 0, ph), value=ignore_index)
    return image, mask


AUGMENT_KEYS = {"resize": "shorter side before everything", "elastic": "{p, std, grid}: elastic deformation",
                "scale": "[lo, hi] scale jitter", "crop": "random | resized", "hflip": "probability",
                "vflip": "probability"}
ELASTIC_KEYS = ("p", "std", "grid")


def check_augment(augment: dict[str, Any] | None) -> dict[str, Any]:
    """data.augment with every key known (a misspelt one would silently do nothing)."""
    a = dict(augment or {})
    unknown = sorted(set(a) - set(AUGMENT_KEYS))
    if unknown:
        known = ", ".join(f"{k} ({v})" for k, v in AUGMENT_KEYS.items())
        raise UserError(f"data.augment.{unknown[0]} is not a segmentation augmentation: the keys are {known}.")
    if a.get("crop", "random") not in ("random", "resized"):
        raise UserError(f"data.augment.crop={a['crop']}: use random (a crop of data.image_size after "
                        "scale jitter) or resized (a random area resized to data.image_size).")
    elastic = a.get("elastic")
    if elastic is not None and not isinstance(elastic, Mapping) or set(elastic or {}) - set(ELASTIC_KEYS):
        raise UserError(f"data.augment.elastic={elastic}: give {{p: 0.5, std: 10, grid: 3}} (probability, "
                        "standard deviation in pixels of the displacements on a grid x grid of points), or null.")
    if elastic:
        a["elastic"] = dict(elastic)
    return a


def train_pair_transform(size: int, mean: Sequence[float], std: Sequence[float],
                         augment: dict[str, Any] | None) -> Compose:
    """`augment`: resize (shorter side, first), elastic (a deformation: probability p, std pixels on a grid x grid
    of points; of a crop with a margin of 3 std, then its centre), scale [lo, hi] (jitter before the crop, or the
    area range of crop=resized), crop random | resized, hflip / vflip probabilities. With augment=null: a plain
    random crop."""
    a = dict(augment or {})
    steps: list = [Normalize(mean, std)] + ([ResizeShorter(a["resize"])] if a.get("resize") else [])
    elastic = RandomElastic(**a["elastic"]) if a.get("elastic") else None
    if a.get("crop", "random") == "resized":
        steps += [RandomResizedCrop(size, scale=a.get("scale") or (0.25, 1.0))] + ([elastic] if elastic else [])
    else:
        if a.get("scale"):
            steps.append(RandomScale(*a["scale"]))
        if elastic:  # deform a crop with a margin the displacements reach into, then keep its centre
            margin = math.ceil(3 * elastic.std)
            steps += [RandomCrop(size + 2 * margin), elastic, CenterCrop(size)]
        else:
            steps.append(RandomCrop(size))
    steps += [RandomFlip(a.get("hflip", 0.0), -1), RandomFlip(a.get("vflip", 0.0), -2)]
    return Compose(steps)


def eval_pair_transform(mean: Sequence[float], std: Sequence[float], resize: int | None = None) -> Compose:
    return Compose([Normalize(mean, std)] + ([ResizeShorter(resize)] if resize else []))
