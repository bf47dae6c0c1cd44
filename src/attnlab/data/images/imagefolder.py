"""Any class-per-folder image tree: root/{train,val,test}/<class>/* or root/<class>/* split by fraction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.data.base import split_by_fraction
from attnlab.data.images.device_decode import (DecodeAhead, DeviceDecoder, EncodedBatch, EncodedFile, check_decode,
                                        check_device, collate)
from attnlab.data.images.base import FileImages, ImageDataModule, Transformed, scan_class_folders
from attnlab.errors import UserError

SPLIT_NAMES = {"train": ("train", "training"), "val": ("val", "valid", "validation"), "test": ("test", "testing")}


def find_split_dirs(root: Path) -> dict[str, Path]:
    return {split: root / n for split, names in SPLIT_NAMES.items() for n in names if (root / n).is_dir()}


class ImageFolderDataModule(ImageDataModule):
    """`format: folder` reads the image files; `format: shards` the LitData shards that `python -m
    attnlab.data.prepare shards` made of them, at `root` (a folder or a URL: shard_loader.py). `decode: gpu` decodes
    the JPEG files on the GPU instead of in the loader workers (device_decode.py), `decode_ahead` training batches
    ahead of the step (0: each batch as the step takes it)."""

    def __init__(self, root: str = "data/images", format: str = "folder", decode: str = "cpu", decode_ahead: int = 2,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.root, self.format, self.shards = Path(root), format, None
        if format not in ("folder", "shards"):
            raise UserError(f"data.format={format} is not known: use folder (the image files) or shards (LitData "
                            "shards made by `python -m attnlab.data.prepare shards`).")
        check_decode(decode, self.augment, format, decode_ahead)
        self.decode, self.decode_ahead = decode, int(decode_ahead)
        self.device_decoder = DeviceDecoder(self.image_size, self.channels, self.augment) if decode == "gpu" else None
        if format == "shards":
            from attnlab.data.formats.shard_loader import ShardSplits

            self.shards, self.splits = ShardSplits(self, str(root)), {}
            return
        self.splits = self._scan()

    def _scan(self) -> dict[str, list[tuple[str, int]]]:
        if not self.root.is_dir():
            raise UserError(
                f"image folder {self.root} does not exist. Set data.root=/path/to/images holding "
                "<class>/<image> folders (or train/, val/, test/ each holding <class>/<image>)."
            )
        dirs = find_split_dirs(self.root)
        if "train" in dirs:
            classes, train = scan_class_folders(dirs["train"])
            splits = {"train": train}
            for split in ("val", "test"):
                if split in dirs:
                    split_classes, samples = scan_class_folders(dirs[split])
                    index = {c: classes.index(c) for c in split_classes if c in classes}
                    extra = sorted(set(split_classes) - set(classes))
                    if extra:
                        raise UserError(f"{dirs[split]} has classes missing from {dirs['train']}: {extra[:10]}.")
                    names = split_classes
                    splits[split] = [(p, index[names[i]]) for p, i in samples]
        else:
            classes, samples = scan_class_folders(self.root)
            splits = {"all": samples}
        if not classes or not splits.get("train", splits.get("all")):
            raise UserError(
                f"no images found under {self.root}: expected <class>/<image> folders with files ending in "
                ".jpg/.png/... (or train/<class>/<image>)."
            )
        if len(classes) == 1:
            raise UserError(f"{self.root} holds one class ({classes[0]}): a classifier needs two classes or more, "
                            "each a folder of its images.")
        self.check_num_classes(len(classes), str(self.root))
        self.class_names = classes
        return splits

    def images(self, samples: list[tuple[str, int]], transform=None) -> FileImages:
        """The files of `samples`; one that cannot be read has every file of every split checked, and those that
        cannot be read listed in the run folder."""
        if not hasattr(self, "_files"):
            self._files = [p for split in self.splits.values() for p, _ in split]
            self._file_sets: list[FileImages] = []
        self._file_sets.append(FileImages(samples, self.channels, transform, files=self._files))
        return self._file_sets[-1]

    def before_loader(self) -> None:
        """The files that cannot be read are listed in the run folder: the trainer's once one holds the data module,
        before that (the memory estimate's first batch) the Hydra run's. decode=gpu needs the trainer's device to be
        a GPU."""
        from attnlab.utils.media import hydra_run_dir, run_dir

        if self.device_decoder is not None and self.trainer is not None:
            check_device(self.trainer.strategy.root_device)

        report_dir = run_dir(self.trainer) if self.trainer is not None else hydra_run_dir()
        for images in getattr(self, "_file_sets", []):
            images.report_dir = report_dir

    def build_splits(self):
        """train/, val/ and test/ as given; a split without a folder of its own comes out of train/ (or out of a
        bare <class>/* tree) by data.val_fraction / data.test_fraction, so the test score is never measured on the
        data the best checkpoint was chosen on, unless data.test_fraction=0 asks for that (test_is_validation)."""
        if self.shards is not None:
            return self.shards.build_splits(self)
        tr, ev = self.train_transform(), self.eval_transform()
        has_val, has_test = "val" in self.splits, "test" in self.splits
        samples = list(self.splits.get("all") or self.splits["train"])
        test = None
        if has_val and self.folds and not has_test:  # folds divide the train folder; the val folder is the test set
            val_idx, train_idx = split_by_fraction(len(samples), [self.val_fraction], self.seed)
            test = self.images(self.splits["val"], ev)
        else:
            fractions = [0.0 if has_test else self.test_fraction, 0.0 if has_val else self.val_fraction]
            test_idx, val_idx, train_idx = split_by_fraction(len(samples), fractions, self.seed)
            if has_val:
                val_idx = list(range(len(samples), len(samples) + len(self.splits["val"])))
                samples += self.splits["val"]
            if has_test:
                test = self.images(self.splits["test"], ev)
            elif test_idx:
                test = Transformed(self.images(samples), test_idx, ev)
        train_idx, val_idx = self.train_val([label for _, label in samples], train_idx, val_idx)
        base = self.images(samples)
        train_set, val = Transformed(base, train_idx, tr), Transformed(base, val_idx, ev)
        if test is None:  # no test/ folder and data.test_fraction=0: the user's choice, said with the results
            test, self.test_is_validation = val, True
        return train_set, val, test

    def train_dataloader(self):
        if self.shards is not None:
            return self.shards.train_loader(self)
        loader = super().train_dataloader()
        if self.device_decoder is not None and self.decode_ahead and self.trainer is not None:
            self.decode_ahead_on(loader, self.trainer.strategy.root_device)
        return loader

    def decode_ahead_on(self, loader, device) -> None:
        """decode=gpu: the training loader's batches decoded and cropped on `device` ahead of the step."""
        loader.ahead = DecodeAhead(self.device_decoder, device, self.decode_ahead)

    # ---- decode=gpu: the workers read the files, the device decodes and crops them
    def train_transform(self):
        return EncodedFile() if self.device_decoder is not None else super().train_transform()

    def eval_transform(self):
        return EncodedFile() if self.device_decoder is not None else super().eval_transform()

    def collate_fn(self, train: bool):
        return collate if self.device_decoder is not None else super().collate_fn(train)

    def transfer_batch_to_device(self, batch: Any, device, dataloader_idx: int) -> Any:
        if self.device_decoder is not None and isinstance(batch, (tuple, list)) and isinstance(batch[0], EncodedBatch):
            images, *rest = batch                                                    # the JPEGs' bytes, labels
            return [self.device_decoder.to_device(images, device), *(t.to(device) for t in rest)]
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.device_decoder is not None and isinstance(batch, (tuple, list)) and \
                isinstance(batch[0], (list, EncodedBatch)):
            train = self.trainer is not None and self.trainer.training
            batch = [self.device_decoder(batch[0], train), *batch[1:]]                 # (B, C, S, S) uint8
        return super().on_after_batch_transfer(batch, dataloader_idx)
