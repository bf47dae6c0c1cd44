"""The image transforms of files, with less work between the file and the uint8 tensor than decode-then-transform.

timm's training transform (`create_transform(..., is_training=True, use_prefetcher=True)`) decodes the whole JPEG,
copies it in `convert("RGB")`, crops it (another copy) and resizes the crop with Pillow, then runs the rest
(flips, RandAugment, ...) and ends in a permuted tensor view. `TrainFromFile` takes the same random draws in the
same order from the same generators, with timm's own objects, and does less:

- the crop is drawn from the file's header (`RandomResizedCropAndInterpolation.get_params`, timm's code), before
  decoding; where it is at least twice the output on both sides, the JPEG is decoded at 1/2, 1/4 or 1/8 of its size
  (libjpeg's DCT scaling, Pillow's `draft`), never below the crop's output size;
- decoding goes straight to an RGB array, with simplejpeg where it is installed (`pip install attnlab[fast]`: the
  same libjpeg-turbo, the same pixels, about a third less time than Pillow's `Image.open` + `convert`), else Pillow;
- the crop is resized from a view of the decoded array by torch's antialiased bicubic (or bilinear) resize of uint8
  images, which gives Pillow's result within rounding in half its time;
- everything after the crop (flips, RandAugment with its op table and magnitudes, color jitter) is timm's own
  transform objects, applied to the crop as timm applies them; where OpenCV is installed (attnlab[fast]), the
  geometric ops of RandAugment and AutoAugment warp with OpenCV on timm's arguments, in about half Pillow's time
  (data/images/warp_ops.py).

`EvalFromFile` decodes JPEGs at least twice the resize size at a reduced size (DCT scaling, still at least the resize
size), then applies timm's evaluation transform (resize, center crop): tests/test_file_transforms.py checks that the
predictions of a trained network do not change. A transform's `from_path(path, mode)` is what the file datasets call
(`FileImages`), `from_bytes(data, mode)` what the shards' loader calls; called on an image (`transform(img)`) it is
the timm transform it wraps.
"""

from __future__ import annotations

import io
import math
import random
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from attnlab.data.images.warp_ops import with_fast_warps

try:  # optional: the same decoder as Pillow's (libjpeg-turbo), straight to an array
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the machine
    simplejpeg = None

_TORCH_RESIZE = {"bicubic": "bicubic", "bilinear": "bilinear"}
USE_SIMPLEJPEG = True  # tests and the benchmark switch it off to measure Pillow alone


def decoder() -> str:
    """The JPEG decoder the file transforms use here."""
    return "simplejpeg" if simplejpeg is not None and USE_SIMPLEJPEG else "pillow"


class EncodedImage:
    """An image file's bytes: its size from the header, decoded whole or reduced by a power of two (JPEG only)."""

    def __init__(self, data: bytes, mode: str = "RGB"):
        self.data, self.mode = data, mode
        self.header = None  # simplejpeg's (height, width) where it can decode this file to `mode`
        if decoder() == "simplejpeg" and mode == "RGB" and self.data[:2] == b"\xff\xd8":
            try:
                h, w, colorspace, _ = simplejpeg.decode_jpeg_header(self.data)
                if colorspace.upper() not in ("CMYK", "YCCK"):
                    self.header = (int(h), int(w))
            except ValueError:  # not a JPEG simplejpeg reads: Pillow decides
                self.header = None
        self._image = None if self.header else Image.open(io.BytesIO(self.data))

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the full image."""
        return (self.header[1], self.header[0]) if self.header else self._image.size

    def can_reduce(self) -> bool:
        return self.header is not None or self._image.format == "JPEG"

    def decode(self, reduce: int = 1) -> np.ndarray:
        """The (H, W, C) uint8 array of the image, at 1/`reduce` of its size when `reduce` > 1 (JPEG only); at least
        ceil(side / reduce) on each side."""
        w, h = self.size
        if self.header:
            try:
                if reduce > 1:
                    return simplejpeg.decode_jpeg(self.data, "RGB", min_height=math.ceil(h / reduce),
                                                  min_width=math.ceil(w / reduce))
                return simplejpeg.decode_jpeg(self.data, "RGB")
            except ValueError:  # a file simplejpeg refuses (truncated, unusual): Pillow reads it or says why not
                self.header, self._image = None, Image.open(io.BytesIO(self.data))
        img = self._image
        if reduce > 1 and img.format == "JPEG":
            img.draft(self.mode, (math.ceil(w / reduce), math.ceil(h / reduce)))
        img = img.convert(self.mode)
        return np.asarray(img) if self.mode != "L" else np.asarray(img)[..., None]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _reduction(crop_w: int, crop_h: int, out_w: int, out_h: int) -> int:
    """The largest of 1, 2, 4, 8 that leaves the crop at least the output's size on both sides."""
    r = 1
    while r < 8 and crop_w >= 2 * r * out_w and crop_h >= 2 * r * out_h:
        r *= 2
    return r


def _to_chw(img: Image.Image) -> torch.Tensor:
    """timm's MaybePILToTensor: a (C, H, W) view of a copy of the image's (H, W, C) array."""
    arr = np.array(img)
    return torch.from_numpy(arr[..., None] if arr.ndim == 2 else arr).permute(2, 0, 1)


def _pil(arr: np.ndarray) -> Image.Image:
    return Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)


class _FromFile:
    """A torchvision Compose that also reads an encoded file itself (from_path, from_bytes); called on an image, the
    Compose as it is."""

    compose: Any

    @property
    def transforms(self):
        return self.compose.transforms

    def __call__(self, img):
        return self.compose(img)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.compose!r})"

    def from_path(self, path: str, mode: str = "RGB") -> torch.Tensor:
        return self.from_bytes(_read(path), mode)

    def from_bytes(self, data: bytes, mode: str = "RGB") -> torch.Tensor:
        raise NotImplementedError


class TrainFromFile(_FromFile):
    """timm's training transform (a Compose that starts with RandomResizedCropAndInterpolation and ends with
    MaybePILToTensor), reading the file itself: see the module's docstring."""

    def __init__(self, compose):
        self.compose = compose
        self.crop = compose.transforms[0]
        self.middle = [with_fast_warps(t) for t in compose.transforms[1:-1]]
        self.out_h, self.out_w = self.crop.size

    @staticmethod
    def supports(compose) -> bool:
        from timm.data.transforms import MaybePILToTensor, RandomResizedCropAndInterpolation

        ts = getattr(compose, "transforms", None)
        return bool(ts) and len(ts) >= 2 and isinstance(ts[0], RandomResizedCropAndInterpolation) \
            and isinstance(ts[-1], MaybePILToTensor)

    def from_bytes(self, data: bytes, mode: str = "RGB") -> torch.Tensor:
        """The transformed image of an encoded file's bytes (a file, or a sample of the shards)."""
        src = EncodedImage(data, mode)
        w, h = src.size
        # timm's draws, in timm's order: the crop (random), then the interpolation when it is random (random)
        i, j, ch, cw = self.crop.get_params(torch.empty((), dtype=torch.uint8).expand(h, w), self.crop.scale,
                                            self.crop.ratio)
        interp = self.crop.interpolation
        if isinstance(interp, (tuple, list)):
            interp = random.choice(interp)
        reduce = _reduction(cw, ch, self.out_w, self.out_h) if src.can_reduce() else 1
        arr = src.decode(reduce)
        img = self._resized_crop(arr, i, j, ch, cw, w, h, interp)
        for t in self.middle:
            img = t(img)
        return _to_chw(img) if isinstance(img, Image.Image) else img

    def _resized_crop(self, arr: np.ndarray, i: int, j: int, ch: int, cw: int, w: int, h: int, interp):
        rh, rw = arr.shape[:2]
        mode = _TORCH_RESIZE.get(getattr(interp, "value", None))
        if (rh, rw) == (h, w) and mode is not None:
            with warnings.catch_warnings():  # Pillow's arrays are read-only: this one is only read
                warnings.simplefilter("ignore", UserWarning)
                x = torch.from_numpy(arr)[i:i + ch, j:j + cw].permute(2, 0, 1).unsqueeze(0)
            # the crop copied channels-last first: the resize runs twice as fast, and its (H, W, C) result becomes
            # the Pillow image without a copy
            x = x.contiguous(memory_format=torch.channels_last)
            y = F.interpolate(x, size=(self.out_h, self.out_w), mode=mode, antialias=True, align_corners=False)
            out = y[0].permute(1, 2, 0)
            if out.is_contiguous() and out.shape[-1] == 3:
                return Image.frombuffer("RGB", (self.out_w, self.out_h), out.numpy(), "raw", "RGB", 0, 1)
            return _pil(out.numpy())
        # reduced decode (or a resampling torch has not): Pillow's resize of the crop's box, in the reduced image
        from torchvision.transforms.functional import pil_modes_mapping

        sx, sy = rw / w, rh / h
        box = (j * sx, i * sy, (j + cw) * sx, (i + ch) * sy)
        return _pil(arr).resize((self.out_w, self.out_h), pil_modes_mapping[interp], box=box)


class EvalFromFile(_FromFile):
    """timm's evaluation transform (Resize of the shorter side, CenterCrop, MaybePILToTensor), reading JPEGs at least
    twice the resize size at a reduced size (never below it)."""

    def __init__(self, compose):
        from torchvision.transforms import Resize

        self.compose = compose
        sizes = [t.size for t in getattr(compose, "transforms", ()) if isinstance(t, Resize)]
        size = sizes[0] if sizes else None  # the shorter side's size (an int), or (h, w) when it squashes
        self.resize_to = None if size is None else int(size) if isinstance(size, int) else min(size)

    def from_bytes(self, data: bytes, mode: str = "RGB") -> torch.Tensor:
        src = EncodedImage(data, mode)
        w, h = src.size
        reduce = _reduction(w, h, self.resize_to, self.resize_to) if self.resize_to and src.can_reduce() else 1
        return self.compose(_pil(src.decode(reduce)))
