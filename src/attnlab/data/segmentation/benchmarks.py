"""Public segmentation benchmarks: ADE20K through the Hugging Face hub, Pascal VOC in torchvision's layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any


from attnlab.data.segmentation.transforms import IGNORE_INDEX
from attnlab.data.segmentation.datamodule import SegmentationDataModule, SegmentationPairs, file_pairs
from attnlab.errors import UserError


# ---- public benchmarks

ADE20K_CLASSES = [
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk", "rock",
    "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard", "chest of drawers",
    "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path", "stairs", "runway",
    "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge", "bookcase", "blind", "coffee table",
    "toilet", "flower", "book", "hill", "bench", "countertop", "stove", "palm", "kitchen island", "computer",
    "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus", "towel", "light", "truck", "tower", "chandelier",
    "awning", "streetlight", "booth", "television receiver", "airplane", "dirt track", "apparel", "pole", "land",
    "bannister", "escalator", "ottoman", "bottle", "buffet", "poster", "stage", "van", "ship", "fountain",
    "conveyer belt", "canopy", "washer", "plaything", "swimming pool", "stool", "barrel", "basket", "waterfall",
    "tent", "bag", "minibike", "cradle", "oven", "ball", "food", "step", "tank", "trade name", "microwave", "pot",
    "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture", "hood", "sconce", "vase",
    "traffic light", "tray", "ashcan", "fan", "pier", "crt screen", "plate", "monitor", "bulletin board", "shower",
    "radiator", "glass", "clock", "flag",
]

ADE20K_MISSING = (
    "ADE20K could not be loaded from the Hugging Face hub as {name} (config {config}, revision {revision}): {error}. "
    "data=ade20k is read through the hub: run once with network access (about 1 GB is then kept in the Hugging Face "
    "cache, ~/.cache/huggingface, and later runs work offline), or, with the images and index masks on disk, use "
    "data=seg_folder data.root=<folder with images/ and masks/>."
)


class ADE20KDataModule(SegmentationDataModule):
    """ADE20K / SceneParsing-150 from the Hugging Face hub (train 20,210, validation 2,000 images). Mask value 0
    ("other") is ignored and 1..150 become classes 0..149, as in the benchmark. The validation split is the
    benchmark's official evaluation split, the one published mIoU is reported on: it is also the test split, and
    the run's summary says it is the reported set."""

    test_is_validation = True
    benchmark_split = ""  # named once the splits are read

    def __init__(self, hf_name: str = "scene_parse_150", hf_config: str | None = "scene_parsing",
                 hf_revision: str | None = "refs/convert/parquet", **kwargs: Any):
        if kwargs.get("classes") is None:
            kwargs["classes"] = ADE20K_CLASSES
        if kwargs.get("label_map") is None:
            kwargs["label_map"] = {0: IGNORE_INDEX} | {k: k - 1 for k in range(1, 151)}
        super().__init__(**kwargs)
        self.hf_name, self.hf_config, self.hf_revision = hf_name, hf_config, hf_revision

    def _split(self, rows) -> SegmentationPairs:
        def load(i: int):
            row = rows[i]
            return row["image"], row["annotation"], f"{self.hf_name}[{i}].image", f"{self.hf_name}[{i}].annotation"

        return SegmentationPairs(len(rows), load, self.channels, self.labels, strict_channels=False)

    def datasets(self):
        import datasets

        try:
            ds = datasets.load_dataset(self.hf_name, self.hf_config, revision=self.hf_revision)
        except Exception as e:  # offline, not cached, hub errors: all end in the same advice
            raise UserError(ADE20K_MISSING.format(name=self.hf_name, config=self.hf_config,
                                                  revision=self.hf_revision, error=f"{type(e).__name__}: {e}")) from e
        val = self._split(ds["validation"])
        self.benchmark_split = f"ADE20K's {len(val):,} validation images"
        return self._split(ds["train"]), val, val


class VOCDataModule(SegmentationDataModule):
    """PASCAL VOC 2012 segmentation in its own layout: <root>/JPEGImages/<id>.jpg, <root>/<masks>/<id>.png (palette
    PNGs, 255 on object borders = ignored) and <root>/ImageSets/Segmentation/<list>.txt. The val list is also the
    test split. With SBD's extra masks (SegmentationClassAug, train_aug.txt) set masks and train_list."""

    def __init__(self, root: str = "data/VOCdevkit/VOC2012", masks: str = "SegmentationClass",
                 train_list: str = "train", val_list: str = "val", check_files: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.root, self.masks, self.check_files = Path(root), masks, check_files
        self.lists = {"train": train_list, "val": val_list}
        needed = [self.root / "JPEGImages", self.root / masks] + [self._list(name) for name in self.lists.values()]
        absent = [str(p) for p in needed if not p.exists()]
        if absent:
            raise UserError(
                f"PASCAL VOC 2012 not found at {self.root} (missing: {', '.join(absent)}). Extract VOCtrainval_11-May-"
                "2012.tar so that <data_dir>/VOCdevkit/VOC2012 holds JPEGImages/, SegmentationClass/ and ImageSets/"
                "Segmentation/ (torchvision.datasets.VOCSegmentation(<data_dir>, year='2012', download=True) fetches "
                "it), or point data.root at that folder."
            )

    def _list(self, name: str) -> Path:
        return self.root / "ImageSets" / "Segmentation" / f"{name}.txt"

    def _pairs(self, split: str) -> SegmentationPairs:
        ids = [line.strip() for line in self._list(self.lists[split]).read_text().splitlines() if line.strip()]
        pairs = [(self.root / "JPEGImages" / f"{i}.jpg", self.root / self.masks / f"{i}.png") for i in ids]
        absent = [str(p) for pair in pairs for p in pair if not p.is_file()]
        if absent:
            raise UserError(f"{len(absent)} files of {self._list(self.lists[split])} are missing, e.g. "
                            f"{', '.join(absent[:3])}: the VOC folder is incomplete; extract the archive again.")
        return file_pairs(pairs, self.channels, self.labels, check=self.check_files)

    def datasets(self):
        val = self._pairs("val")
        return self._pairs("train"), val, val
