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
import importlib.util
import math
import os

import numpy as np
from PIL import Image

GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
USE_OPENCV = True  # tests and the benchmark switch it off to measure Pillow alone
_cv2 = None


def installed() -> bool:
    """OpenCV is installed (optional: attnlab[fast]); without it the ops are timm's, on Pillow."""
    return importlib.util.find_spec("cv2") is not None


def available() -> bool:
    return USE_OPENCV and installed()


def opencv():
    """cv2, imported on first use (in a loader's worker), on one thread (the workers hold the cores), and leaving
    the environment as it was: its import prepends its own folder to LD_LIBRARY_PATH, which every process started
    afterwards would inherit."""
    global _cv2
    if _cv2 is None:
        before = os.environ.get("LD_LIBRARY_PATH")
        import cv2

        if before is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = before
        cv2.setNumThreads(1)
        _cv2 = cv2
    return _cv2


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
        cv2 = opencv()
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
