"""Per-pixel loss weights of the U-Net paper (Ronneberger et al. 2015, eq. 2): the pixels of the thin borders
between two objects that nearly touch weigh more, so the network learns to keep the objects apart,

    w(x) = w_c(x) + w0 exp(-(d1(x) + d2(x))² / 2σ²),

where d1 and d2 are the distances to the nearest and the second nearest object (a connected component of the
object class: the cells of ISBI 2012) and w_c balances the class frequencies."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from attnlab.errors import UserError

BORDER_KEYS = {"objects": "the class whose connected components are the objects (index or name)",
               "w0": "the border term's height (10 in the paper)",
               "sigma": "its width in pixels (5 in the paper)",
               "balance": "add w_c: every class present in the crop weighs as much in total (true in the paper)"}


def check_border_weight(setting: Mapping | None, class_names: list[str]) -> dict[str, Any] | None:
    """model.border_weight with every key known and `objects` as a class index."""
    if setting is None:
        return None
    keys = ", ".join(f"{k} ({v})" for k, v in BORDER_KEYS.items())
    example = "{objects: cell, w0: 10, sigma: 5, balance: true}"
    if not isinstance(setting, Mapping) or set(setting) - set(BORDER_KEYS) or "objects" not in setting:
        raise UserError(f"model.border_weight={setting}: give {example}, the keys being {keys}; or null for the "
                        "plain cross-entropy.")
    s = {"w0": 10.0, "sigma": 5.0, "balance": True} | dict(setting)
    obj = s["objects"]
    if isinstance(obj, str) and obj in class_names:
        s["objects"] = class_names.index(obj)
    elif not (isinstance(obj, int) and 0 <= obj < len(class_names)):
        raise UserError(f"model.border_weight.objects={obj} is not a class: give an index 0..{len(class_names) - 1} "
                        f"or a name of data.classes ({', '.join(class_names)}).")
    try:
        w0, sigma = float(s["w0"]), float(s["sigma"])
    except (TypeError, ValueError):
        w0 = sigma = math.nan
    if not (w0 >= 0 and sigma > 0):  # NaN fails both
        raise UserError(f"model.border_weight: w0={s['w0']} and sigma={s['sigma']} must be numbers >= 0 and > 0 (the "
                        "paper: w0 10, sigma 5 pixels).")
    return s | {"w0": w0, "sigma": sigma, "balance": bool(s["balance"])}


def border_weights(mask: np.ndarray, objects: int, w0: float = 10.0, sigma: float = 5.0, balance: bool = True,
                   ignore_index: int = 255) -> np.ndarray:
    """(H, W) class indices -> (H, W) float32 weights: 0 on ignored pixels; w_c (or 1) elsewhere, plus the border
    term on the pixels between objects (not on the objects themselves)."""
    from scipy import ndimage

    labelled = mask != ignore_index
    if balance:
        classes, counts = np.unique(mask[labelled], return_counts=True)
        lut = np.zeros(256, np.float32)
        lut[classes] = counts.sum() / (len(classes) * counts)  # mean weight 1 over the labelled pixels
        w = np.where(labelled, lut[np.clip(mask, 0, 255)], 0).astype(np.float32)
    else:
        w = labelled.astype(np.float32)
    found, n = ndimage.label((mask == objects) & labelled)
    if n < 2 or not w0:
        return w
    # only objects within `reach` of a pixel can give it a term above w0 / 1000: each object's distances are
    # computed in its bounding box widened by that much
    reach = math.ceil(sigma * math.sqrt(2 * math.log(1000)))
    d1 = np.full(mask.shape, np.inf, np.float32)  # distance to the nearest object
    d2 = np.full(mask.shape, np.inf, np.float32)  # to the second nearest
    for i, box in enumerate(ndimage.find_objects(found), start=1):
        win = tuple(slice(max(0, s.start - reach), min(size, s.stop + reach)) for s, size in zip(box, mask.shape))
        dist = ndimage.distance_transform_edt(found[win] != i).astype(np.float32)
        near, second = d1[win], d2[win]  # views into d1, d2
        np.minimum(second, np.maximum(near, dist), out=second)
        np.minimum(near, dist, out=near)
    between = labelled & (found == 0) & np.isfinite(d2)
    w[between] += w0 * np.exp(-((d1[between] + d2[between]) ** 2) / (2 * sigma**2))
    return w
