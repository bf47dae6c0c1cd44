"""Pictures of segmentations: palette masks, overlays on the image, and image | truth | prediction grids."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image


def colorize(mask: np.ndarray, palette: Sequence[Sequence[int]], ignore_index: int = 255) -> np.ndarray:
    """(H, W) class indices -> uint8 RGB (H, W, 3); ignored pixels are gray."""
    lut = np.full((256, 3), 128, dtype=np.uint8)
    lut[: len(palette)] = np.asarray(palette, dtype=np.uint8)[:256]
    lut[ignore_index] = 128
    return lut[np.asarray(mask).clip(0, 255).astype(np.uint8)]


def palette_png(mask: np.ndarray, palette: Sequence[Sequence[int]]) -> Image.Image:
    """A mode P image: the pixel values are the class indices, shown in the palette's colours."""
    img = Image.fromarray(np.asarray(mask).astype(np.uint8), mode="P")
    flat = [v for c in palette for v in c][: 256 * 3]
    img.putpalette(flat + [0] * (256 * 3 - len(flat)))
    return img


def overlay(image: np.ndarray, mask: np.ndarray, palette: Sequence[Sequence[int]], alpha: float = 0.5,
            ignore_index: int = 255) -> np.ndarray:
    blend = (1 - alpha) * image.astype(np.float32) + alpha * colorize(mask, palette).astype(np.float32)
    blend[np.asarray(mask) == ignore_index] = image[np.asarray(mask) == ignore_index]
    return blend.round().astype(np.uint8)


def overlay_grid(rows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], palette: Sequence[Sequence[int]],
                 height: int = 256) -> np.ndarray:
    """One row per sample: image | ground truth over the image | prediction over the image, each `height` px high
    (media.panel_grid)."""
    from attnlab.utils.media import panel_grid

    return panel_grid([[image, overlay(image, truth, palette), overlay(image, pred, palette)]
                       for image, truth, pred in rows], height=height)
