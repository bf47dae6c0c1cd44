"""Image classification data: datasets over arrays or files, and the DataModule base of every image dataset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from attnlab.data.base import BaseDataModule, kfold
from attnlab.data.info import DataInfo
from attnlab.data.images.transforms import BatchNormalizer, eval_transform, train_transform
from attnlab.errors import UserError
from attnlab.types import Fraction, PositiveInt

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


class ArrayImages(Dataset):
    """Images held in memory as uint8 arrays (N, H, W) or (N, H, W, C)."""

    def __init__(self, images: np.ndarray, labels: Sequence[int], transform: Callable | None = None):
        self.images, self.labels, self.transform = images, np.asarray(labels, dtype=np.int64), transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = Image.fromarray(self.images[i])
        return (self.transform(img) if self.transform else img), int(self.labels[i])


class FileImages(Dataset):
    """Images read from files. When one cannot be decoded, every file of the data set (`files`: by default this
    split's) is checked, and the error names all that cannot be read, listed in full in `report_dir` (the run
    folder) where there are several."""

    def __init__(self, samples: Sequence[tuple[str, int]], channels: int = 3, transform: Callable | None = None,
                 files: Sequence[str] | None = None, report_dir: str | Path | None = None):
        self.samples, self.mode, self.transform = list(samples), "L" if channels == 1 else "RGB", transform
        self.files, self.report_dir = files, report_dir

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, i: int, transform: Callable | None = None):
        """Image i decoded; with a `transform` that reads files itself (`from_path`: file_transforms.py), what it
        makes of the file."""
        path = self.samples[i][0]
        try:
            if transform is not None and hasattr(transform, "from_path"):
                return transform.from_path(path, self.mode)
            img = _decode(path, self.mode)
        except (UnidentifiedImageError, OSError, SyntaxError) as e:
            files = self.files if self.files is not None else [p for p, _ in self.samples]
            raise unreadable_images_error(files, self.mode, self.report_dir, (path, e)) from None
        return transform(img) if transform is not None else img

    def __getitem__(self, i: int):
        return self.load(i, self.transform), self.samples[i][1]


def _decode(path: str | Path, mode: str) -> Image.Image:
    with Image.open(path) as img:
        return img.convert(mode)


def unreadable_images(paths: Sequence[str], mode: str) -> list[tuple[str, str]]:
    """(file, why) for each of `paths` that Pillow cannot decode, in order; decoded on a few threads (Pillow
    releases the GIL), a chunk at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def why(path: str) -> str | None:
        try:
            _decode(path, mode)
        except (UnidentifiedImageError, OSError, SyntaxError) as e:
            return f"{type(e).__name__}: {e}"
        return None

    bad = []
    from attnlab.utils.cpus import usable_cpus

    with ThreadPoolExecutor(max_workers=min(8, usable_cpus())) as pool:
        for start in range(0, len(paths), 4096):
            chunk = paths[start:start + 4096]
            bad += [(p, w) for p, w in zip(chunk, pool.map(why, chunk)) if w is not None]
    return bad


def unreadable_images_error(paths: Sequence[str], mode: str, report_dir: str | Path | None,
                            first: tuple[str, BaseException]) -> UserError:
    """The paragraph for image files that cannot be read, all of `paths` checked in one pass: the first 10 and the
    count, the full list (with each reason) in <report_dir>/unreadable_images.txt."""
    bad = unreadable_images(paths, mode) or [(first[0], str(first[1]))]
    if len(bad) == 1:
        path = bad[0][0]
        reason = first[1] if path == first[0] else bad[0][1]
        return UserError(f"cannot read image file {path}: {reason}. The file is corrupt or not an image: delete or "
                         f"replace it, then rerun (the other {len(paths) - 1:,} image files can be read).")
    listed = ""
    if report_dir is not None:
        from attnlab.utils.atomic import write_text

        report = Path(report_dir) / "unreadable_images.txt"
        report.parent.mkdir(parents=True, exist_ok=True)
        write_text(report, "".join(f"{p}\t{w}\n" for p, w in bad))
        listed = f" All {len(bad):,} are listed in {report} (one a line: the file, a tab, the reason)."
    shown = ", ".join(p for p, _ in bad[:10]) + (f" and {len(bad) - 10:,} more" if len(bad) > 10 else "")
    return UserError(f"cannot read {len(bad):,} of the {len(paths):,} image files: {shown}. Each is corrupt or not "
                     f"an image: delete or replace them, then rerun.{listed}")


class Transformed(Dataset):
    """A view of a dataset of (PIL image, label) with a transform applied."""

    def __init__(self, base: Dataset, indices: Sequence[int] | None, transform: Callable):
        self.base, self.indices, self.transform = base, indices, transform

    def __len__(self) -> int:
        return len(self.indices) if self.indices is not None else len(self.base)

    def __getitem__(self, i: int):
        i = self.indices[i] if self.indices is not None else i
        if isinstance(self.base, FileImages) and self.base.transform is None:  # the file read by the transform
            return self.base.load(i, self.transform), self.base.samples[i][1]
        img, y = self.base[i]
        return self.transform(img), y


def image_files(input_path: str | Path | None, skip_suffix: str | None = None) -> list[Path]:
    """The images named by predict.py's `input=`: one file, or every image under a folder (sorted)."""
    if not input_path:
        raise UserError("predict.py needs input=<image file or folder of images>.")
    src = Path(input_path)
    if not src.exists():
        raise UserError(f"input={src} does not exist: give an image file or a folder of images.")
    files = [src] if src.is_file() else sorted(
        p for p in src.rglob("*")
        if p.suffix.lower() in IMAGE_EXTENSIONS and not (skip_suffix and p.stem.endswith(skip_suffix)))
    if not files:
        raise UserError(f"no image files (*.png, *.jpg, ...) under {src}.")
    return files


def scan_class_folders(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """root/<class>/<image files> -> (sorted class names, [(path, class index)]); a class folder without images is
    refused."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    samples = []
    for idx, name in enumerate(classes):
        found = [(str(path), idx) for path in sorted((root / name).rglob("*"))
                 if path.suffix.lower() in IMAGE_EXTENSIONS]
        if not found:
            raise UserError(f"class folder {root / name} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}): "
                            "put the class's images in it, or remove the folder.")
        samples += found
    return classes, samples


class ImageDataModule(BaseDataModule):
    """Images + integer labels. `info()` gives num_classes, image_size and channels to the model.

    The loaders deliver images as uint8 (B, C, H, W) (`train_transform`, `eval_transform`); once a batch is on the
    device, `on_after_batch_transfer` normalizes it with `augment`'s mean and std, and while training erases random
    rectangles (`augment.re_prob`, `re_mode`, `re_count`), as timm's own training loader does. A data module whose
    images are already float tensors (the digits, a user's dataset) passes them through unchanged."""

    def __init__(
        self,
        kind: str = "images",
        num_classes: PositiveInt | None = None,
        image_size: PositiveInt = 224,
        channels: PositiveInt = 3,
        augment: dict[str, Any] | None = None,
        val_fraction: Fraction = 0.1,
        test_fraction: Fraction = 0.1,
        folds: PositiveInt | None = None,
        fold: int = 0,
        **loader: Any,
    ):
        super().__init__(kind=kind, **loader)
        # not logged: Lightning would refuse `num_classes: null` here beside the number the task got from the data;
        # the loggers get the run's resolved config, which holds the data's settings with what was found
        self.save_hyperparameters(logger=False)
        self.num_classes, self.image_size, self.channels = num_classes, int(image_size), int(channels)
        self.augment = dict(augment or {})
        if val_fraction + test_fraction >= 1:
            raise UserError(f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} leave no "
                            "training images (they must sum to less than 1): lower them, e.g. 0.1 each.")
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.folds, self.fold = folds, int(fold)
        self.class_names: list[str] | None = None
        self.normalizer = BatchNormalizer.from_augment(self.augment, self.channels)

    def train_val(self, labels: Sequence[int], train_idx: Sequence[int], val_idx: Sequence[int]):
        """(training, validation) indices: the fraction split as given, or with `data.folds=K data.fold=i` fold i
        of K stratified folds of training + validation together (the run's seed; the test split stays out)."""
        if not self.folds:
            return list(train_idx), list(val_idx)
        pool = [int(i) for i in val_idx] + [int(i) for i in train_idx]
        train, val = kfold([int(labels[i]) for i in pool], int(self.folds), self.fold, self.seed)
        return [pool[i] for i in train], [pool[i] for i in val]

    def info(self) -> DataInfo:
        return DataInfo(self.kind, num_classes=self.num_classes, image_size=self.image_size, channels=self.channels,
                        class_names=self.class_names or None)

    def check_num_classes(self, found: int, where: str) -> None:
        if self.num_classes is not None and int(self.num_classes) != found:
            raise UserError(
                f"data.num_classes={self.num_classes} but {where} has {found} classes. "
                f"Remove the override or set data.num_classes={found}."
            )
        self.num_classes = found

    def train_transform(self):
        return train_transform(self.image_size, self.channels, self.augment)

    def eval_transform(self):
        return eval_transform(self.image_size, self.channels, self.augment)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """(uint8 images, labels) on the device -> (normalized float32 images, labels); random erasing while
        training. Lightning calls it for every loop's batches (training, validation, test, prediction)."""
        train = self.trainer is not None and self.trainer.training
        if isinstance(batch, torch.Tensor):
            return self.normalizer(batch, train)
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            x = self.normalizer(batch[0], train)
            if x is not batch[0]:
                return [x, *batch[1:]] if isinstance(batch, list) else (x, *batch[1:])
        return batch
