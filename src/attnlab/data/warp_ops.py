"""timm's geometric augmentation ops (RandAugment's and AutoAugment's Rotate, ShearX/Y, TranslateX/Y) warped by
OpenCV instead of Pillow, where OpenCV is installed (`pip install attnlab[fast]`).

Pillow's generic affine transform samples bicubic pixel by pixel, about 2.5 ms on a 224x224 RGB image, where the
colour ops take 0.2-0.4 ms: a third of RandAugment's draws cost most of its time. OpenCV's `warpAffine` does the same
warp in about half that. The draws stay timm's: `with_fast_warps` copies the policy and wraps each geometric op's
function (`AugmentOp.aug_fn`), which still takes its arguments, its resampling and its fill colour from timm's code;
only the image it is given answers `transform(AFFINE)` and `rotate` with OpenCV, on the matrix Pillow would use
(pixel centres at +0.5 as Pillow's). The pixels differ from Pillow's by OpenCV's bicubic kernel (a = -0.75 against
Pillow's -0.5: under half a level on average) and a band of a pixel at the edges, which OpenCV blends with the fill
colour where Pillow cuts (tests/test_file_transforms.py bounds both).
"""

from __future__ import annotations

import copy
import math

import numpy as np
from PIL import Image

try:  # optional (attnlab[fast]): without it the ops are timm's, on Pillow
    import cv2
except ImportError:  # pragma: no cover - depends on the machine
    cv2 = None

GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
USE_OPENCV = True  # tests and the benchmark switch it off to measure Pillow alone
_threads_set = False


def available() -> bool:
    return cv2 is not None and USE_OPENCV


def with_fast_warps(transform):
    """`transform` itself, or, for a timm RandAugment or AutoAugment whose policy has geometric ops and where OpenCV is
    available, a copy whose geometric ops warp with OpenCV (the original is left as it is)."""
    if not available():
        return transform
    if hasattr(transform, "ops") and any(getattr(op, "name", None) in GEOMETRIC for op in transform.ops):
        fast = copy.copy(transform)
        fast.ops = [_fast_op(op) for op in transform.ops]
        return fast
    if hasattr(transform, "policy"):  # AutoAugment: sub-policies of ops
        fast = copy.copy(transform)
        fast.policy = [[_fast_op(op) for op in sub] for sub in transform.policy]
        return fast
    return transform


def _fast_op(op):
    if getattr(op, "name", None) not in GEOMETRIC:
        return op
    fast, aug_fn = copy.copy(op), op.aug_fn
    fast.aug_fn = lambda img, *args, **kwargs: _unwrap(aug_fn(_Warped(img), *args, **kwargs))
    return fast


def _unwrap(img):
    return img.img if isinstance(img, _Warped) else img


class _Warped:
    """An image as timm's geometric ops use it (`size`, `transform`, `rotate`), warped by OpenCV."""

    _INTERP = {Image.NEAREST: "INTER_NEAREST", Image.BILINEAR: "INTER_LINEAR", Image.BICUBIC: "INTER_CUBIC"}

    def __init__(self, img: Image.Image):
        self.img, self.size = img, img.size

    def transform(self, size, method, data, resample=Image.NEAREST, fillcolor=None, **kwargs):
        if method != Image.AFFINE or resample not in self._INTERP or self.img.mode not in ("RGB", "L") or kwargs:
            return self.img.transform(size, method, data, resample=resample, fillcolor=fillcolor, **kwargs)
        global _threads_set
        if not _threads_set:  # one thread: a loader's workers hold the cores
            cv2.setNumThreads(1)
            _threads_set = True
        a, b, c, d, e, f = data
        # Pillow samples the source at matrix x (x + 0.5, y + 0.5), a pixel's centre at +0.5; OpenCV at matrix x (x, y)
        matrix = np.array([[a, b, c + (a + b - 1) / 2], [d, e, f + (d + e - 1) / 2]], dtype=np.float64)
        fill = 0 if fillcolor is None else fillcolor
        out = cv2.warpAffine(np.asarray(self.img), matrix, tuple(size),
                             flags=getattr(cv2, self._INTERP[resample]) | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_CONSTANT, borderValue=fill)
        return Image.fromarray(out)

    def rotate(self, angle, resample=Image.NEAREST, expand=0, center=None, translate=None, fillcolor=None):
        """Pillow's `rotate` (the same matrix, about the centre), by `transform`."""
        if expand or center is not None or translate is not None or angle % 90.0 == 0:  # Pillow's exact transposes
            return self.img.rotate(angle, resample=resample, expand=expand, center=center, translate=translate,
                                   fillcolor=fillcolor)
        w, h = self.size
        cx, cy = w / 2, h / 2
        rad = -math.radians(angle % 360.0)
        a, b = round(math.cos(rad), 15), round(math.sin(rad), 15)
        d, e = -b, a
        return self.transform((w, h), Image.AFFINE, (a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy),
                              resample=resample, fillcolor=fillcolor)
