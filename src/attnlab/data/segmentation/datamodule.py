"""Semantic segmentation data: image/mask pairs, checked before training, with joint image/mask transforms.

A mask is a single-channel image (PIL mode L or P) holding one class index per pixel; 255 is ignored by the loss
and the metrics. `label_map` rewrites raw mask values into class indices (e.g. {0: 0, 255: 1} for binary masks
stored as black/white); any other value outside the class list is an error naming the file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from attnlab.data.base import BaseDataModule, split_by_fraction
from attnlab.data.images.base import IMAGE_EXTENSIONS
from attnlab.data.info import DataInfo
from attnlab.data.segmentation.transforms import IGNORE_INDEX, check_augment, eval_pair_transform, train_pair_transform
from attnlab.errors import UserError

_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}
_MASK_MODES = {"1", "L", "P"}


def default_palette(n: int) -> list[list[int]]:
    """The PASCAL VOC colour map: distinct colours from the bits of the class index (0 is black)."""
    palette = []
    for i in range(n):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        palette.append([r, g, b])
    return palette


def channels_of(mode: str) -> int:
    return 1 if mode in _GRAY_MODES else 3


def open_image(path: str | Path) -> Image.Image:
    try:
        img = Image.open(path)
        img.load()
        return img
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise UserError(f"cannot read image file {path}: {e}. The file is corrupt or not an image: "
                        "delete or replace it (with its image or mask partner), then rerun.") from None


class LabelMap:
    """Raw mask values (0..255) -> class indices, through a lookup table; values outside the class list fail."""

    def __init__(self, num_classes: int, label_map: dict | None = None, ignore_index: int = IGNORE_INDEX):
        self.num_classes, self.ignore_index = int(num_classes), ignore_index
        if not 0 < self.num_classes < ignore_index:
            raise UserError(f"{num_classes} classes: masks are 8-bit with {ignore_index} as the ignore index, "
                            f"so 1 to {ignore_index - 1} classes are possible. Check data.classes.")
        self.lut = np.full(256, -1, dtype=np.int64)  # -1: not a class
        self.lut[: min(256, self.num_classes)] = np.arange(min(256, self.num_classes))
        self.lut[ignore_index] = ignore_index
        for raw, cls in (label_map or {}).items():
            raw, cls = int(raw), int(cls)
            if not (0 <= cls < self.num_classes or cls == ignore_index):
                raise UserError(f"data.label_map maps {raw} to {cls}, which is neither a class index "
                                f"(0..{self.num_classes - 1}) nor the ignore index {ignore_index}: fix the map.")
            self.lut[raw] = cls
        self.label_map = label_map

    def __call__(self, raw: np.ndarray, where: str) -> np.ndarray:
        if raw.dtype != np.uint8:
            raw = raw.astype(np.int64)
            if raw.min() < 0 or raw.max() > 255:
                raise UserError(f"mask {where} holds values up to {raw.max()}: masks hold class indices 0-255 "
                                "(8-bit PNG, mode L or P). Re-save it as an 8-bit index image.")
        mask = self.lut[raw]
        if (mask < 0).any():
            bad = np.unique(raw[mask < 0])
            shown = ", ".join(str(v) for v in bad[:10]) + (" ..." if len(bad) > 10 else "")
            raise UserError(
                f"mask {where} holds values outside the class list: {shown} (the {self.num_classes} classes are "
                f"0..{self.num_classes - 1}, {self.ignore_index} is ignored, data.label_map={self.label_map}). "
                "Either list every class in data.classes, or map the raw values to classes with data.label_map "
                "(e.g. data.label_map='{0: 0, 255: 1}' for black/white masks)."
            )
        return mask


class SegmentationPairs(Dataset):
    """(image, mask) pairs from `load(i) -> (PIL image, PIL mask, image name, mask name)`, checked, mapped and
    transformed.

    Returns (float image (C, H, W), long mask (H, W)). `strict_channels` refuses a grayscale image where RGB is
    expected (and the reverse) instead of converting it.
    """

    def __init__(self, n: int, load: Callable[[int], tuple[Image.Image, Image.Image, str, str]], channels: int,
                 labels: LabelMap, transform: Callable | None = None, strict_channels: bool = True):
        self.n, self.load, self.channels, self.labels = n, load, int(channels), labels
        self.transform, self.strict_channels = transform, strict_channels

    def __len__(self) -> int:
        return self.n

    def with_transform(self, transform: Callable | None) -> SegmentationPairs:
        return SegmentationPairs(self.n, self.load, self.channels, self.labels, transform, self.strict_channels)

    def arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """uint8 image (H, W, C) and int64 class-index mask (H, W), checked."""
        image, mask, image_name, mask_name = self.load(i)
        check_pair(image, mask, image_name, mask_name, self.channels, self.strict_channels)
        arr = np.array(image.convert("L" if self.channels == 1 else "RGB"))
        raw = np.asarray(mask).astype(np.uint8) if mask.mode == "1" else np.asarray(mask)  # mode 1: bool 0/1
        return (arr[..., None] if arr.ndim == 2 else arr), self.labels(raw, mask_name)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.arrays(i)
        x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float() / 255.0  # (C, H, W)
        y = torch.from_numpy(mask)  # (H, W)
        return self.transform(x, y) if self.transform else (x, y)


def check_pair(image: Image.Image, mask: Image.Image, image_name: str, mask_name: str, channels: int,
               strict_channels: bool = True) -> None:
    """The checks a pair needs before training: single-channel mask, same size, expected number of channels."""
    if mask.mode not in _MASK_MODES:
        raise UserError(
            f"mask {mask_name} is a PIL mode {mask.mode} image: masks must be single-channel (mode L or P) with one "
            "class index per pixel. Convert colour-coded masks to index masks (one value per class) first."
        )
    if image.size != mask.size:
        raise UserError(
            f"image {image_name} and mask {mask_name} differ in size: image {image.size[0]}x{image.size[1]}, mask "
            f"{mask.size[0]}x{mask.size[1]} (width x height). A mask must be pixel-aligned with its image: "
            "re-export it at the image's size (resize with nearest-neighbour so labels stay exact)."
        )
    found = channels_of(image.mode)
    if strict_channels and found != channels:
        kind = "grayscale" if found == 1 else "colour (RGB)"
        raise UserError(
            f"image {image_name} is {kind} (PIL mode {image.mode}) but data.channels={channels}. "
            f"Set data.channels={found} if the dataset is " + ("grayscale" if found == 1 else "in colour")
            + ", or convert the images so they all have the same number of channels."
        )


class Repeated(Dataset):
    """`length` samples cycling through `base`: an epoch of more random crops than there are images."""

    def __init__(self, base: Dataset, length: int):
        self.base, self.length = base, int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.base[i % len(self.base)]


# ---- files on disk

def _files_by_stem(folder: Path, suffix: str = "") -> dict[str, Path]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."):
            stem = str(p.relative_to(folder).with_suffix(""))
            if suffix and stem.endswith(suffix):
                stem = stem[: -len(suffix)]
            out[stem] = p
    return out


def pair_files(image_dir: Path, mask_dir: Path, mask_suffix: str = "") -> list[tuple[Path, Path]]:
    """Images and masks matched by file name without extension (mask `a_mask.png` for `a.jpg` with a suffix)."""
    for d, what in ((image_dir, "images"), (mask_dir, "masks")):
        if not d.is_dir():
            raise UserError(f"{what} folder {d} does not exist. A segmentation folder holds images/ and masks/ "
                            "side by side (see conf/data/seg_folder.yaml); point data.root at it.")
    images, masks = _files_by_stem(image_dir), _files_by_stem(mask_dir, mask_suffix)
    if not images:
        raise UserError(f"no image files (*.png, *.jpg, ...) in {image_dir}.")
    lone_images, lone_masks = sorted(set(images) - set(masks)), sorted(set(masks) - set(images))
    if lone_images or lone_masks:
        def show(names: list[str]) -> str:
            return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")

        raise UserError(
            f"{len(images)} images in {image_dir} but {len(masks)} masks in {mask_dir}, and they do not pair up by "
            "file name: " + (f"images without a mask: {show(lone_images)}; " if lone_images else "")
            + (f"masks without an image: {show(lone_masks)}; " if lone_masks else "")
            + "each image needs a mask of the same name (any extension"
            + (f", with suffix '{mask_suffix}'" if mask_suffix else "")
            + "). Add the missing files or remove the extra ones."
        )
    return [(images[s], masks[s]) for s in sorted(images)]


def file_pairs(pairs: Sequence[tuple[Path, Path]], channels: int, labels: LabelMap, preload: bool = False,
               check: bool = True) -> SegmentationPairs:
    """A dataset of files. `check` reads every mask and every image header now (everything with `preload`), so
    that a bad pair is reported before training rather than in the middle of it."""
    pairs = list(pairs)
    cache: dict[int, tuple[Image.Image, Image.Image, str, str]] = {}

    def load(i: int):
        if i in cache:
            return cache[i]
        img_path, mask_path = pairs[i]
        item = (open_image(img_path), open_image(mask_path), str(img_path), str(mask_path))
        if preload:
            cache[i] = item
        return item

    ds = SegmentationPairs(len(pairs), load, channels, labels)
    if preload:
        for i in range(len(pairs)):
            ds.arrays(i)  # decodes, checks, and keeps every pair
    elif check:
        for img_path, mask_path in pairs:
            with Image.open(img_path) as img:
                mask = open_image(mask_path)
                check_pair(img, mask, str(img_path), str(mask_path), channels)
                labels(np.asarray(mask).astype(np.uint8) if mask.mode == "1" else np.asarray(mask), str(mask_path))
    return ds


# ---- DataModules

class SegmentationDataModule(BaseDataModule):
    """Subclasses implement `datasets()` -> (train, val, test) SegmentationPairs without transforms.

    `image_size` is the side of the training crops (and of the sliding window at evaluation); evaluation sees whole
    images, resized so the shorter side is `eval_resize` when set.
    """

    def __init__(
        self,
        kind: str = "segmentation",
        classes: list[str] | None = None,
        num_classes: int | None = None,
        image_size: int = 256,
        channels: int = 3,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        label_map: dict | None = None,
        palette: list[list[int]] | None = None,
        augment: dict[str, Any] | None = None,
        eval_resize: int | None = None,
        samples_per_epoch: int | None = None,
        **loader: Any,
    ):
        super().__init__(kind=kind, **loader)
        if classes is not None and num_classes is not None and len(classes) != int(num_classes):
            raise UserError(f"data.classes lists {len(classes)} classes but data.num_classes={num_classes}: "
                            f"remove data.num_classes (it follows data.classes) or make them agree.")
        if classes is None and num_classes is None:
            raise UserError("segmentation data needs its class list: set data.classes=[name0,name1,...] "
                            "(class i is mask value i).")
        self.class_names = list(classes) if classes is not None else [str(i) for i in range(int(num_classes))]
        self.num_classes = len(self.class_names)
        self.image_size, self.channels = int(image_size), int(channels)
        if self.channels not in (1, 3):
            raise UserError(f"data.channels={channels}: segmentation images are grayscale (1) or RGB (3).")
        self.mean = [float(v) for v in (mean or [0.5] * self.channels)]
        self.std = [float(v) for v in (std or [0.5] * self.channels)]
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise UserError(f"data.mean / data.std have {len(self.mean)} / {len(self.std)} values but "
                            f"data.channels={self.channels}: give one value per channel.")
        self.labels = LabelMap(self.num_classes, label_map)
        self.palette = [list(map(int, c)) for c in palette] if palette else default_palette(self.num_classes)
        if len(self.palette) < self.num_classes:
            raise UserError(f"data.palette has {len(self.palette)} colours for {self.num_classes} classes: "
                            "give one [r, g, b] per class, or remove it for the default colours.")
        self.augment = check_augment(augment)
        self.eval_resize, self.samples_per_epoch = eval_resize, samples_per_epoch

    def info(self) -> DataInfo:
        return DataInfo(self.kind, num_classes=self.num_classes, image_size=self.image_size, channels=self.channels,
                        class_names=self.class_names, palette=self.palette, mean=self.mean, std=self.std)

    def datasets(self) -> tuple[SegmentationPairs, SegmentationPairs, SegmentationPairs]:
        raise NotImplementedError

    def build_splits(self):
        train, val, test = self.datasets()
        evaluate = eval_pair_transform(self.mean, self.std, self.eval_resize)
        train = train.with_transform(train_pair_transform(self.image_size, self.mean, self.std, self.augment))
        if self.samples_per_epoch:
            train = Repeated(train, self.samples_per_epoch)
        return train, val.with_transform(evaluate), test.with_transform(evaluate)


class SegFolderDataModule(SegmentationDataModule):
    """root/images + root/masks split by val_fraction/test_fraction, or root/{train,val[,test]}/{images,masks}."""

    def __init__(self, root: str = "data/segmentation", images: str = "images", masks: str = "masks",
                 mask_suffix: str = "", val_fraction: float = 0.1, test_fraction: float = 0.0, split_seed: int = 0,
                 preload: bool = False, check_files: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.root, self.images, self.masks, self.mask_suffix = Path(root), images, masks, mask_suffix
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.preload, self.check_files = preload, check_files
        if not self.root.is_dir():
            raise UserError(f"data.root={self.root} does not exist. Give a folder holding {images}/ and {masks}/ "
                            f"(or train/ and val/, each holding {images}/ and {masks}/).")

    def _pairs(self, base: Path) -> list[tuple[Path, Path]]:
        return pair_files(base / self.images, base / self.masks, self.mask_suffix)

    def _dataset(self, pairs) -> SegmentationPairs:
        return file_pairs(pairs, self.channels, self.labels, self.preload, self.check_files)

    def datasets(self):
        if (self.root / "train").is_dir():
            train = self._pairs(self.root / "train")
            val = self._pairs(self.root / "val") if (self.root / "val").is_dir() else None
            test = self._pairs(self.root / "test") if (self.root / "test").is_dir() else val
            if val is None:
                raise UserError(f"{self.root} has train/ but no val/: add val/{self.images} and val/{self.masks}, "
                                f"or put all pairs in {self.root}/{self.images} and {self.root}/{self.masks} to "
                                "split them by data.val_fraction.")
        else:
            pairs = self._pairs(self.root)
            test_idx, val_idx, train_idx = split_by_fraction(
                len(pairs), [self.test_fraction, self.val_fraction], self.split_seed)
            if not val_idx or not train_idx:
                raise UserError(f"{len(pairs)} pairs in {self.root} leave no training or no validation pair with "
                                f"data.val_fraction={self.val_fraction}: add pairs or change the fraction.")
            train = [pairs[i] for i in sorted(train_idx)]
            val = [pairs[i] for i in sorted(val_idx)]
            test = [pairs[i] for i in sorted(test_idx)] or val
        self.test_is_validation = test is val  # no test/ folder, or data.test_fraction=0: said with the results
        return self._dataset(train), self._dataset(val), self._dataset(test)


class MembraneDataModule(SegFolderDataModule):
    """ISBI 2012 EM membranes: 30 slices image/<i>.png + label/<i>.png (255 cell, 0 membrane), split by slice
    index. The challenge's test stack has no public labels, so the test split is the validation slices."""

    def __init__(self, val_slices: Sequence[int] = (25, 26, 27, 28, 29), test_slices: Sequence[int] | None = None,
                 **kwargs: Any):
        kwargs = {"images": "image", "masks": "label", "channels": 1, "classes": ["membrane", "cell"],
                  "label_map": {0: 0, 255: 1}, "preload": True} | kwargs
        root = Path(kwargs.get("root", "data/isbi2012_em_membrane"))
        if not (root / kwargs["images"]).is_dir():
            raise UserError(f"ISBI 2012 membrane slices not found at {root}: expected {root}/image/<i>.png and "
                            f"{root}/label/<i>.png. Point data.root (or paths.data_dir / ATTNLAB_DATA_DIR) at the "
                            "folder holding isbi2012_em_membrane.")
        super().__init__(**kwargs)
        self.val_slices = [int(i) for i in val_slices]
        self.test_slices = [int(i) for i in (test_slices if test_slices is not None else val_slices)]
        # the challenge's test stack has no public labels: by default the test slices are the validation slices
        self.test_is_validation = sorted(self.test_slices) == sorted(self.val_slices)

    def datasets(self):
        pairs = {int(p[0].stem): p for p in self._pairs(self.root) if p[0].stem.isdigit()}
        missing = sorted(set(self.val_slices + self.test_slices) - set(pairs))
        if missing:
            raise UserError(f"slices {missing} of data.val_slices / data.test_slices are not in {self.root}: "
                            f"the slices are {min(pairs)}..{max(pairs)}.")
        train = [pairs[i] for i in sorted(pairs) if i not in self.val_slices and i not in self.test_slices]
        if not train:
            raise UserError("data.val_slices and data.test_slices leave no slice for training: shorten them.")
        return tuple(self._dataset([pairs[i] for i in idx]) for idx in
                     ([int(p[0].stem) for p in train], self.val_slices, self.test_slices))

