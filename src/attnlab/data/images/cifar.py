"""CIFAR-10 / CIFAR-100 from torchvision's pickled batches, or from PNGs laid out <split>/<class>/*.png
(in folders or zip archives). Decoded PNGs are cached as one .npz under paths.cache_dir."""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from attnlab.data.base import split_by_fraction
from attnlab.data.images.base import ArrayImages, ImageDataModule, Transformed, scan_class_folders
from attnlab.errors import UserError
from attnlab.utils.atomic import atomic_path

log = logging.getLogger(__name__)

_PICKLED = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels",
                "batches.meta", "label_names"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", "meta", "fine_label_names"),
}


CIFAR_BATCH = "a CIFAR python batch (numpy arrays, lists, dicts, strings and bytes)"


def _unpickle(path: Path) -> dict:
    """A batch of torchvision's CIFAR download: a pickle of numpy arrays and plain values, read through attnlab's
    restricted unpickler (checkpoints/safe_pickle.py), so that a file swapped into the data folder cannot run code."""
    from attnlab.checkpoints.safe_pickle import UnsafeGlobal, load, numpy_globals

    try:
        found = load(path, numpy_globals(), CIFAR_BATCH, encoding="latin1")
    except UnsafeGlobal as e:
        raise UserError(f"{path} is not a CIFAR batch: it asks for {e.name}, which {CIFAR_BATCH} never holds, and "
                        "loading it could run code; nothing of it was run. Replace the folder with torchvision's "
                        "download (data.download=true) or `make data`.") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise UserError(f"{path} cannot be read as a CIFAR batch ({type(e).__name__}: {e}): the file is damaged or "
                        "of another kind. Replace the folder with torchvision's download (data.download=true) or "
                        "`make data`.") from None
    if not isinstance(found, dict):
        raise UserError(f"{path} holds a {type(found).__name__}, not a CIFAR batch (a dict of arrays and labels). "
                        "Replace the folder with torchvision's download (data.download=true) or `make data`.")
    return found


def _load_pickled(root: Path, variant: str):
    folder, train_files, test_files, label_key, meta_file, names_key = _PICKLED[variant]
    base = root / folder
    if not base.is_dir():
        return None

    def load(files):
        parts = [_unpickle(base / f) for f in files]
        x = np.concatenate([p["data"] for p in parts]).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(x), np.concatenate([p[label_key] for p in parts])

    names = _unpickle(base / meta_file)[names_key]
    return names, load(train_files), load(test_files)


def _png_sources(root: Path) -> list[Path]:
    return sorted(root.glob("*.zip")) + [p for p in (root / "train", root / "test") if p.is_dir()]


def _decode_pngs(sources: list[Path]):
    """-> class names, {split: (images uint8 (N,32,32,3), labels)} from zips/folders of <split>/<class>/*.png."""
    found: dict[str, list[tuple[str, bytes | str]]] = {}
    for src in sources:
        if src.suffix == ".zip":
            with zipfile.ZipFile(src) as zf:
                for name in zf.namelist():
                    parts = name.split("/")
                    if len(parts) == 3 and parts[2].lower().endswith(".png"):
                        found.setdefault(parts[0], []).append((parts[1], zf.read(name)))
        else:
            _, samples = scan_class_folders(src)
            for path, _ in samples:
                found.setdefault(src.name, []).append((Path(path).parent.name, path))
    classes = sorted({c for items in found.values() for c, _ in items})
    splits = {}
    for split, items in found.items():
        imgs = np.stack([np.asarray(Image.open(io.BytesIO(b) if isinstance(b, bytes) else b).convert("RGB"))
                         for _, b in items])
        splits[split] = (imgs, np.array([classes.index(c) for c, _ in items], dtype=np.int64))
    return classes, splits


class CIFARDataModule(ImageDataModule):
    def __init__(self, variant: str = "cifar10", data_dir: str = "data/cifar10", cache_dir: str = ".cache/attnlab",
                 download: bool = False, **kwargs: Any):
        if variant not in _PICKLED:
            raise UserError(f"data.variant={variant} is not a CIFAR variant: use cifar10 or cifar100.")
        n = 10 if variant == "cifar10" else 100
        super().__init__(**({"num_classes": n, "image_size": 32, "channels": 3} | kwargs))
        self.check_num_classes(n, variant)
        self.variant, self.data_dir, self.cache_dir, self.download = variant, Path(data_dir), Path(cache_dir), download

    def prepare_data(self) -> None:
        if self.download and _load_pickled(self.data_dir, self.variant) is None and not _png_sources(self.data_dir):
            from torchvision.datasets import CIFAR10, CIFAR100

            cls = CIFAR10 if self.variant == "cifar10" else CIFAR100
            for train in (True, False):
                cls(str(self.data_dir), train=train, download=True)

    def _arrays(self):
        pickled = _load_pickled(self.data_dir, self.variant)
        if pickled is not None:
            names, train, test = pickled
            return names, train, test
        sources = _png_sources(self.data_dir)
        if not sources:
            raise UserError(
                f"{self.variant} not found in {self.data_dir}: expected torchvision's "
                f"{_PICKLED[self.variant][0]}/ folder, or PNGs as <split>/<class>/*.png in zips or folders. "
                f"Put the files there, point paths.data_dir (or ATTNLAB_DATA_DIR) at the folder holding "
                f"{self.data_dir.name}/, or set data.download=true when online."
            )
        key = hashlib.sha1(repr([(str(s), s.stat().st_size, s.stat().st_mtime) for s in sources]).encode())
        cache = self.cache_dir / "cifar" / f"{self.variant}-{key.hexdigest()[:12]}.npz"
        if cache.exists():
            z = np.load(cache, allow_pickle=False)
            splits = {s: (z[f"{s}_x"], z[f"{s}_y"]) for s in ("train", "test") if f"{s}_x" in z}
            names = list(z["classes"])
        else:
            log.info("decoding %s PNGs from %s (cached in %s)", self.variant, self.data_dir, cache)
            names, splits = _decode_pngs(sources)
            cache.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(cache, suffix=".npz") as tmp:
                np.savez(tmp, classes=np.array(names), **{f"{s}_{k}": v for s, (x, y) in splits.items()
                                                          for k, v in (("x", x), ("y", y))})
        if "train" not in splits or "test" not in splits:
            raise UserError(f"{self.data_dir} holds splits {sorted(splits)}; both 'train' and 'test' are needed.")
        return names, splits["train"], splits["test"]

    def build_splits(self):
        names, (x_train, y_train), (x_test, y_test) = self._arrays()
        self.check_num_classes(len(names), str(self.data_dir))
        self.class_names = [str(n) for n in names]
        val_idx, train_idx = split_by_fraction(len(y_train), [self.val_fraction], self.seed)
        train_idx, val_idx = self.train_val(y_train, train_idx, val_idx)
        base = ArrayImages(x_train, y_train)
        # PNG folders list the test set class by class: a fixed shuffle makes limit_test_batches a fair sample
        order = np.random.default_rng(0).permutation(len(y_test))
        return (Transformed(base, train_idx, self.train_transform()), Transformed(base, val_idx, self.eval_transform()),
                ArrayImages(x_test[order], y_test[order], transform=self.eval_transform()))
