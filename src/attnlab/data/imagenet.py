"""ImageNet-1k: an ImageFolder tree (<root>/train, <root>/val with one folder per class), or the Hugging Face
dataset (gated: accept its terms on the hub and log in once; it is then read from the local HF cache)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from attnlab.data.imagefolder import ImageFolderDataModule
from attnlab.data.images import ImageDataModule
from attnlab.errors import UserError

MISSING = (
    "ImageNet-1k not found at {root}. Either (a) put the ILSVRC2012 images there as train/<wnid>/*.JPEG and "
    "val/<wnid>/*.JPEG (the val images sorted into class folders, e.g. with the valprep.sh script), or point "
    "data.root (or paths.data_dir / ATTNLAB_DATA_DIR) at such a tree; or (b) use the Hugging Face copy with "
    "data.source=hf after accepting the terms of {hf_name} on the hub and running `huggingface-cli login` "
    "(about 150 GB is then downloaded into the HF cache on first use)."
)


class _HFImages(Dataset):
    def __init__(self, ds, transform):
        self.ds, self.transform = ds, transform

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        row = self.ds[i]
        return self.transform(row["image"].convert("RGB")), int(row["label"])


class ImageNetDataModule(ImageDataModule):
    def __init__(self, root: str = "data/imagenet", source: str = "folder", hf_name: str = "ILSVRC/imagenet-1k",
                 **kwargs: Any):
        super().__init__(**({"num_classes": 1000} | kwargs))
        self.root, self.source, self.hf_name = Path(root), source, hf_name
        if source == "folder":
            if not (self.root / "train").is_dir():
                raise UserError(MISSING.format(root=self.root, hf_name=hf_name))
            self._folder = ImageFolderDataModule(root=str(self.root), **kwargs)
            self.class_names = self._folder.class_names
        elif source != "hf":
            raise UserError(f"data.source={source} is not known: use folder or hf.")

    def build_splits(self):
        if self.source == "folder":
            return self._folder.build_splits()
        import datasets

        try:
            ds = datasets.load_dataset(self.hf_name)
        except Exception as e:
            raise UserError(MISSING.format(root=self.root, hf_name=self.hf_name) + f" (the hub said: {e})") from e
        self.class_names = ds["train"].features["label"].names
        val = _HFImages(ds["validation"], self.eval_transform())
        return _HFImages(ds["train"], self.train_transform()), val, val
