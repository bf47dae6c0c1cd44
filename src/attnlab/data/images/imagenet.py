"""ImageNet-1k as it comes (imagenet_archives.py): image-net.org's three archives (extracted once, imagenet_prepare.py),
Kaggle's copy, an extracted train/ val/ tree, or the Hugging Face dataset (gated: accept its terms on the hub and log
in once; it is then read from the local HF cache).

The published protocol: the model trains on all of train/ and is reported on val/, the official evaluation split
(data.test_fraction=0: no test split is carved out of train/; the test pass measures the best checkpoint on val/, and
the run's summary says that val/ is the reported set). Classes are indexed by sorted wnid and named from the devkit or
Kaggle's mapping ("tench", "crane (wading bird)"), which W&B tables and predict.py show."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from attnlab.data.images.imagefolder import ImageFolderDataModule
from attnlab.data.formats.imagenet_archives import (KAGGLE_VAL_CSV, MISSING, Layout, display_names, find_layout,
                                            read_kaggle_val)
from attnlab.data.images.base import IMAGE_EXTENSIONS, scan_class_folders
from attnlab.errors import UserError
from attnlab.types import Fraction

log = logging.getLogger("attnlab")


class _HFImages(Dataset):
    def __init__(self, ds, transform):
        self.ds, self.transform = ds, transform

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        row = self.ds[i]
        return self.transform(row["image"].convert("RGB")), int(row["label"])


class ImageNetDataModule(ImageFolderDataModule):
    """`root`: the folder holding one of the layouts (imagenet_archives.py); `prepared`: where the archives are
    extracted (default `root`); `source=hf`: the Hugging Face copy instead."""

    def __init__(self, root: str = "data/imagenet", source: str = "folder", hf_name: str = "ILSVRC/imagenet-1k",
                 prepared: str | None = None, test_fraction: Fraction = 0.0, val_from_train: bool = False,
                 **kwargs: Any):
        if source not in ("folder", "hf"):
            raise UserError(f"data.source={source} is not known: use folder or hf.")
        self.source, self.hf_name, self.val_from_train = source, hf_name, val_from_train
        self.prepared = Path(prepared) if prepared else None
        self.layout: Layout | None = None
        self.benchmark_split = ""  # the reported set, said with the results (cli/report.py)
        super().__init__(root=root, **({"num_classes": 1000} | kwargs), test_fraction=test_fraction)

    # ---- where the images are
    def _scan(self) -> dict[str, list[tuple[str, int]]] | None:
        if self.source == "hf":
            return {}
        self.layout = find_layout(self.root, self.prepared, self.hf_name)
        if self.layout.needs_preparation:
            return None  # prepare_data() extracts the archives, setup() reads what it made
        return self._read()

    def prepare_data(self) -> None:
        if self.splits is None:
            from attnlab.data.formats.imagenet_prepare import prepare_imagenet

            prepare_imagenet(self.root, self.layout.out)

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:  # local rank 0 prepares (again a no-op after prepare_data); the others wait for it
            from attnlab.data.formats.imagenet_prepare import prepare_imagenet, wait_for_preparation

            if os.environ.get("LOCAL_RANK", "0") == "0":
                prepare_imagenet(self.root, self.layout.out)
            else:
                wait_for_preparation(self.layout.out)
            self.layout = find_layout(self.root, self.prepared, self.hf_name)
            self.splits = self._read()
        super().setup(stage)

    def _read(self) -> dict[str, list[tuple[str, int]]]:
        lay = self.layout
        classes, train = scan_class_folders(lay.train)
        if not classes or not train:
            raise UserError(f"{lay.train} holds no class folders of images: expected train/<wnid>/*.JPEG.")
        missing = sorted(set(lay.names) - set(classes)) if lay.kind in ("kaggle", "prepared") else []
        if missing:
            raise UserError(f"{lay.train} has {len(classes):,} of the {len(lay.names):,} classes its class list "
                            f"names: no folder for {', '.join(missing[:10])}"
                            + (f" and {len(missing) - 10:,} more" if len(missing) > 10 else "")
                            + ". The copy is incomplete: fetch or extract it again.")
        splits = {"train": train}
        if lay.kind == "kaggle":
            splits["val"] = self._kaggle_val(classes)
        elif lay.val is not None:
            splits["val"] = self._val_tree(lay.val, classes)
        elif not self.val_from_train:
            raise UserError(
                f"{lay.out} has train/ but no val/: ImageNet-1k is reported on its 50,000 validation images, and a "
                "validation split carved out of train/ would report a number on training images. Put val/<wnid>/ "
                f"beside {lay.train} (or point data.root at the three archives, which attnlab extracts), or set "
                "data.val_from_train=true to carve data.val_fraction of train/ as the validation set on purpose.")
        self.check_num_classes(len(classes), str(lay.train))
        self.wnids = classes
        self.class_names = [lay.names.get(w, w) for w in classes]
        if "val" in splits:
            self.benchmark_split = f"ImageNet-1k's {len(splits['val']):,} validation images"
        log.info("ImageNet-1k (%s, %s): %d training images in %d classes, %d validation images", lay.kind, lay.out,
                 len(train), len(classes), len(splits.get("val", [])))
        return splits

    def _val_tree(self, val: Path, classes: list[str]) -> list[tuple[str, int]]:
        entries = list(val.iterdir())
        if not any(p.is_dir() for p in entries) and any(p.suffix.lower() in IMAGE_EXTENSIONS for p in entries):
            raise UserError(f"{val} holds the validation images loose, not sorted into class folders: put "
                            f"ILSVRC2012_img_val.tar and ILSVRC2012_devkit_t12.tar.gz (with ILSVRC2012_img_train.tar) "
                            f"in a folder and point data.root at it (attnlab extracts and sorts them), or sort them "
                            "into val/<wnid>/ with the devkit's ground truth.")
        val_classes, samples = scan_class_folders(val)
        extra = sorted(set(val_classes) - set(classes))
        if extra:
            raise UserError(f"{val} has classes missing from {self.layout.train}: {extra[:10]}.")
        index = {c: i for i, c in enumerate(classes)}
        return [(p, index[val_classes[i]]) for p, i in samples]

    def _kaggle_val(self, classes: list[str]) -> list[tuple[str, int]]:
        """Kaggle's validation images from LOC_val_solution.csv, each labelled by the first wnid of its row."""
        rows = read_kaggle_val(self.root / KAGGLE_VAL_CSV)
        index = {c: i for i, c in enumerate(classes)}
        unknown = sorted({w for _, w in rows if w not in index})
        if unknown:
            raise UserError(f"{self.root / KAGGLE_VAL_CSV} labels images with classes that {self.layout.train} has "
                            f"no folder for: {unknown[:10]}. The copy is incomplete: fetch it again.")
        present = set(os.listdir(self.layout.val)) if self.layout.val.is_dir() else set()
        absent = [f"{image}.JPEG" for image, _ in rows if f"{image}.JPEG" not in present]
        if absent or not rows:
            raise UserError(f"{self.layout.val} lacks {len(absent):,} of the {len(rows):,} validation images "
                            f"{KAGGLE_VAL_CSV} lists (e.g. {', '.join(absent[:3]) or 'all'}). The copy is "
                            "incomplete: fetch or unzip it again.")
        return [(str(self.layout.val / f"{image}.JPEG"), index[w]) for image, w in rows]

    def build_splits(self):
        if self.source == "folder":
            return super().build_splits()
        import datasets

        try:
            ds = datasets.load_dataset(self.hf_name)
        except Exception as e:
            raise UserError(MISSING.format(root=self.root, hf_name=self.hf_name, found="")
                            + f" (the hub said: {e})") from e
        names = ds["train"].features["label"].names
        self.class_names = display_names([(str(i), n, "") for i, n in enumerate(names)])
        val = _HFImages(ds["validation"], self.eval_transform())
        self.test_is_validation, self.benchmark_split = True, f"ImageNet-1k's {len(val):,} validation images"
        return _HFImages(ds["train"], self.train_transform()), val, val
