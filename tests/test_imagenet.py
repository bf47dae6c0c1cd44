"""ImageNet-1k as people download it (image-net.org's three archives, Kaggle's copy, an extracted tree), on a
miniature set made by tests/imagenet_mini.py in the same formats; and the published protocol: train on all of
train/, report on val/, the last epoch's and the best epoch's score."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import imagenet_mini as mini
from attnlab.data.formats import imagenet_prepare
from attnlab.data.images.imagenet import ImageNetDataModule
from attnlab.data.formats.imagenet_archives import MARKER, STAGING, display_names, find_layout, read_devkit
from attnlab.data.formats.imagenet_prepare import prepare_imagenet
from attnlab.errors import UserError

TRAIN, VAL = 4 * len(mini.WNIDS), 2 * len(mini.WNIDS)


def _dm(root: Path, **kwargs) -> ImageNetDataModule:
    return ImageNetDataModule(root=str(root), num_classes=None, image_size=16, batch_size=4, **kwargs)


def _files(dataset) -> list[tuple[str, int]]:
    base, idx = (dataset.base, dataset.indices) if hasattr(dataset, "base") else (dataset, None)
    return [base.samples[i] for i in (idx if idx is not None else range(len(base)))]


def test_the_devkit_classes_are_its_leaves_and_its_ground_truth_lists_ids(tmp_path):
    """meta.mat's leaves (num_children == 0) are the classes, sorted by wnid; the ground truth's ILSVRC2012_IDs map
    through meta.mat, not as indices into the sorted wnids; repeated names are told apart."""
    root = mini.make_archives(tmp_path)
    kit = read_devkit(root / "ILSVRC2012_devkit_t12.tar.gz")
    assert kit.synsets == len(mini.LEAVES) + len(mini.INNER)
    assert [s.wnid for s in kit.classes] == mini.WNIDS and kit.expected_train == TRAIN
    assert kit.val_wnids() == mini.val_labels(2)
    by_index = [mini.WNIDS[i - 1] for i in kit.val_ids]  # reading the IDs as indices would mislabel
    assert by_index != kit.val_wnids()
    names = display_names([(s.wnid, s.words, s.parent_words) for s in kit.classes])
    assert dict(zip(mini.WNIDS, names)) == mini.NAMES
    assert display_names([("a", "Cardigan, Cardigan Welsh corgi", ""), ("b", "cardigan", "")]) == [
        "Cardigan (Cardigan Welsh corgi)", "cardigan (b)"]


def test_the_archives_are_prepared_once_and_their_bad_files_load(tmp_path, monkeypatch):
    """The three archives extracted on first use (setup), validation images sorted by the ground truth; the PNG
    named .JPEG and the CMYK JPEG decode to RGB; class names from the devkit; no test split carved from train/."""
    root = mini.make_archives(tmp_path / "imagenet")
    dm = _dm(root)
    assert dm.splits is None and dm.layout.kind == "archives"
    dm.prepare_data()
    dm.setup("fit")
    assert (root / MARKER).is_file() and not (root / STAGING).exists()
    assert len(dm.train_set) == TRAIN and len(dm.val_set) == VAL  # all of train/: nothing carved out
    assert dm.test_set is dm.val_set and dm.test_is_validation and dm.benchmark_split
    assert dm.info().class_names == [mini.NAMES[w] for w in mini.WNIDS] and dm.info().num_classes == 5
    truth = mini.val_labels(2)
    for path, label in _files(dm.val_set):
        n = int(Path(path).stem.rsplit("_", 1)[1])
        assert Path(path).parent.name == truth[n - 1] == mini.WNIDS[label]
    train_files = _files(dm.train_set)
    for bad in (mini.PNG_AS_JPEG, mini.CMYK):
        i = next(k for k, (p, _) in enumerate(train_files) if p.endswith(bad))
        x, y = dm.train_set[i]
        assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 16, 16) and mini.WNIDS[y] in bad
    # the prepared tree is read as it is from then on: a new data module finds it prepared
    again = _dm(root)
    assert again.layout.kind == "prepared" and len(again.splits["train"]) == TRAIN


def test_an_interrupted_preparation_is_resumed_never_half_used(tmp_path, monkeypatch):
    root = mini.make_archives(tmp_path)
    copies, real_copy = [], imagenet_prepare._copy

    def dies_after_some(src, dest):
        if len(copies) == 23:
            raise KeyboardInterrupt  # a kill part-way through the validation images
        copies.append(dest)
        real_copy(src, dest)

    monkeypatch.setattr(imagenet_prepare, "_copy", dies_after_some)
    with pytest.raises(KeyboardInterrupt):
        prepare_imagenet(root, workers=1, progress=False)
    assert not (root / MARKER).exists() and not (root / "train").exists() and (root / STAGING).is_dir()
    dm = _dm(root)  # what was extracted is not read: the next setup resumes
    assert dm.splits is None and dm.layout.kind == "archives"
    copies.clear()
    monkeypatch.setattr(imagenet_prepare, "_copy", lambda s, d: (copies.append(d), real_copy(s, d)))
    dm.setup("fit")
    assert len(copies) == TRAIN + VAL - 23  # the classes and files already whole were kept
    assert len(dm.train_set) == TRAIN and len(dm.val_set) == VAL and (root / MARKER).is_file()


def test_the_counts_are_checked_against_meta_mat(tmp_path):
    root = mini.make_archives(tmp_path, drop="n03126707_3.JPEG")
    with pytest.raises(UserError) as err:
        prepare_imagenet(root, progress=False)
    msg = str(err.value)
    assert "n03126707 (crane): 3 of 4 images" in msg and "download it again" in msg and f"{TRAIN:,}" in msg
    assert not (root / MARKER).exists() and not (root / "train").exists()
    (root / "ILSVRC2012_devkit_t12.tar.gz").unlink()
    with pytest.raises(UserError, match=r"holds ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar but not "
                                        r"ILSVRC2012_devkit_t12.tar.gz"):
        _dm(root)


def test_ranks_prepare_once_and_the_others_wait(tmp_path, monkeypatch):
    """Two processes of a job (local rank 0 and 1) on the same folder: rank 0 extracts under the lock, rank 1 waits
    for the marker and reads what rank 0 made; every file is written once."""
    root = mini.make_archives(tmp_path)
    copies, real_copy = [], imagenet_prepare._copy
    started = threading.Event()

    def slow(src, dest):
        started.set()
        copies.append(dest)
        real_copy(src, dest)
        threading.Event().wait(0.01)

    monkeypatch.setattr(imagenet_prepare, "_copy", slow)
    rank0 = threading.Thread(target=prepare_imagenet, args=(root,), kwargs={"progress": False})
    rank0.start()
    started.wait(10)
    monkeypatch.setenv("LOCAL_RANK", "1")
    dm = _dm(root)
    dm.setup("fit")
    rank0.join()
    assert len(dm.train_set) == TRAIN and len(copies) == TRAIN + VAL
    assert prepare_imagenet(root) == root and len(copies) == TRAIN + VAL  # prepared: nothing done again


def test_the_kaggle_layout_is_read_as_it_is(tmp_path, capsys):
    """Kaggle's copy: the validation labels from LOC_val_solution.csv, the names from LOC_synset_mapping.txt, its
    unlabelled test/ in no split; the preparation command has nothing to extract."""
    from attnlab.data.prepare import main

    root = mini.make_kaggle(tmp_path)
    dm = _dm(root)
    assert dm.layout.kind == "kaggle"
    dm.setup("fit")
    assert len(dm.train_set) == TRAIN and len(dm.val_set) == VAL and dm.test_set is dm.val_set
    files = [p for p, _ in _files(dm.train_set) + _files(dm.val_set)]
    assert not any("/test/" in p for p in files)
    truth = mini.val_labels(2)
    assert [mini.WNIDS[y] for _, y in _files(dm.val_set)] == truth
    assert dm.class_names[mini.WNIDS.index("n01440764")] == "tench"
    assert dm.class_names[mini.WNIDS.index("n03710721")] == "maillot (tank suit)"
    assert len(set(dm.class_names)) == 5
    main(["imagenet", str(root)])
    assert f"{TRAIN} training images in 5 classes, {VAL} validation images" in capsys.readouterr().out
    assert not (root / "train").exists()
    (root / "ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00000003.JPEG").unlink()
    with pytest.raises(UserError, match="lacks 1 of the 10 validation images .*ILSVRC2012_val_00000003.JPEG"):
        _dm(root).setup("fit")


def test_the_prepare_command_and_an_extracted_tree(tmp_path, capsys):
    """`python -m attnlab.data.prepare imagenet <dir> --out <dir>`; a tree extracted elsewhere is read with the
    names of a devkit beside it; loose validation images are refused with what to do."""
    from attnlab.data.prepare import main

    root = mini.make_archives(tmp_path / "downloads")
    main(["imagenet", str(root), "--out", str(tmp_path / "fast")])
    assert f"data.root={tmp_path / 'fast'}" in capsys.readouterr().out
    assert (tmp_path / "fast" / MARKER).is_file() and not (root / "train").exists()
    assert find_layout(root, tmp_path / "fast").kind == "prepared"
    tree = tmp_path / "tree"
    tree.mkdir()
    (tmp_path / "fast" / "train").rename(tree / "train")
    (tmp_path / "fast" / "val").rename(tree / "val")
    (root / "ILSVRC2012_devkit_t12.tar.gz").rename(tree / "ILSVRC2012_devkit_t12.tar.gz")
    dm = _dm(tree)
    assert dm.layout.kind == "tree" and dm.class_names[1] == "crane (wading bird)"
    for f in (tree / "val").rglob("*.JPEG"):
        f.rename(tree / "val" / f.name)
    for d in (tree / "val").iterdir():
        if d.is_dir():
            d.rmdir()
    with pytest.raises(UserError, match="holds the validation images loose"):
        _dm(tree)
    with pytest.raises(SystemExit) as exit_:
        main(["imagenet", str(tmp_path / "nothing")])
    assert exit_.value.code == 2 and "ImageNet-1k not found" in capsys.readouterr().err


def test_imagenet_runs_the_published_protocol(tmp_path, caplog):
    """data=imagenet on the archives as they come: prepared on first use, trained on all of train/, tested on val/;
    metrics.json holds the last and the best epoch's val/acc, and the summary says val/ is the reported set."""
    from attnlab.cli.training import train
    from conftest import FAST, compose_cfg

    root = mini.make_archives(tmp_path / "imagenet")
    cfg = compose_cfg(["data=imagenet", f"data.root={root}", "data.num_classes=null", "data.image_size=8",
                       "data.batch_size=4", "data.num_workers=0", "data.augment.auto_augment=null",
                       "trainer.max_epochs=2", *FAST], tmp_path)
    assert cfg.data.test_fraction == 0
    with caplog.at_level(logging.INFO, logger="attnlab"):
        train(cfg)
    metrics = json.loads(next(tmp_path.rglob("metrics.json")).read_text())
    assert metrics["reported_split"] == "val" and metrics["test_is_validation"] is True
    import pandas as pd

    curve = pd.read_csv(next(tmp_path.rglob("metrics.csv")))["val/acc"].dropna().tolist()
    assert len(curve) == 2 and metrics["val/acc_last"] == pytest.approx(curve[-1])
    assert metrics["val/acc_best"] == pytest.approx(max(curve))
    summary = caplog.text
    assert "the validation split is the reported set: ImageNet-1k's 10 validation images" in summary
    assert "val/acc_last is the last epoch's score, val/acc_best the best epoch's" in summary
    assert "not a held-out test score" not in summary
    ckpt = torch.load(next(tmp_path.rglob("last.ckpt")), map_location="cpu", weights_only=False)
    assert ckpt["hyper_parameters"]["class_names"][0] == "tench"


def test_ade20k_reports_its_validation_split(monkeypatch):
    """ADE20K's official evaluation split is its validation split: the test split, said with the results."""
    import datasets
    from PIL import Image

    from attnlab.data.segmentation.benchmarks import ADE20KDataModule
    from attnlab.protocols import data as data_hooks

    rows = [{"image": Image.new("RGB", (8, 8)), "annotation": Image.fromarray(np.ones((8, 8), np.uint8))}] * 3
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: {"train": rows, "validation": rows[:2]})
    dm = ADE20KDataModule(kind="segmentation", image_size=8, batch_size=1)
    dm.setup("fit")
    assert data_hooks.test_is_validation(dm) and dm.test_set is not None
    assert data_hooks.benchmark_split(dm) == "ADE20K's 2 validation images"


def test_the_swin_recipe_is_the_official_one(tmp_path):
    """experiment=swin_imagenet holds every `key=value` of the recipe table in docs/vision.md (the official Swin-T
    recipe line by line), and its augmentation reaches timm's transform and the erasing on the device as the recipe
    has it: RandAugment with the increasing ops at m9 +- 0.5, bicubic crops, erasing 0.25 in pixel mode."""
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from attnlab.data.images.transforms import BatchNormalizer, train_transform
    from conftest import ROOT, compose_cfg

    table = (ROOT / "docs" / "vision.md").read_text().split("### The Swin-T recipe")[1].split("**Fewer GPUs.**")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    settings = [kv for row in rows for kv in re.findall(r"`([\w.]+=[^`]*)`", row[2])]
    assert len(rows) == 18 and len(settings) >= 30
    cfg = compose_cfg(["experiment=swin_imagenet"], tmp_path)
    parser = OverridesParser.create()
    for setting in settings:
        key, value = setting.split("=", 1)
        actual = OmegaConf.select(cfg, key)
        actual = OmegaConf.to_container(actual) if OmegaConf.is_config(actual) else actual
        assert actual == parser.parse_override(setting).value(), f"{key}: {actual!r} in the config, {value} in the table"
    augment = OmegaConf.to_container(cfg.data.augment)
    shown = repr(train_transform(224, 3, augment))
    ops = re.findall(r"AugmentOp\(name=(\w+), p=0.5, m=9, mstd=0.5\)", shown)
    assert len(ops) == 15 and {"PosterizeIncreasing", "SolarizeIncreasing", "ContrastIncreasing"} <= set(ops), shown
    assert "scale=(0.08, 1.0)" in shown and "interpolation=bicubic" in shown and "RandomHorizontalFlip(p=0.5)" in shown
    erasing = BatchNormalizer.from_augment(augment, 3).erasing
    assert erasing == {"probability": 0.25, "mode": "pixel", "max_count": 1, "num_splits": 0}


def test_the_hugging_face_copy_reports_its_validation_split(monkeypatch, tmp_path):
    """data.source=hf: the validation split is the test split and the reported set; repeated names told apart."""
    import datasets
    from PIL import Image

    class Split(list):
        features = {"label": type("ClassLabel", (), {"names": ["tench, Tinca tinca", "crane", "crane"]})()}

    rows = Split({"image": Image.new("RGB", (12, 12)), "label": i % 3} for i in range(6))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: {"train": rows, "validation": Split(rows[:3])})
    dm = ImageNetDataModule(root=str(tmp_path / "nowhere"), source="hf", num_classes=3, image_size=8, batch_size=2)
    dm.setup("fit")
    assert dm.test_set is dm.val_set and dm.test_is_validation
    assert dm.benchmark_split == "ImageNet-1k's 3 validation images"
    assert dm.info().class_names == ["tench", "crane (1)", "crane (2)"]
    x, y = dm.train_set[0]
    assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 8, 8) and y == 0


def test_a_preparation_stopped_between_its_renames_is_never_read_as_a_tree(tmp_path, capsys):
    """Killed after train/ was moved into place and before val/: the output folder holds train/ and the staging
    folder. Pointed at it, attnlab says how to resume; pointed at the archives, it resumes."""
    from attnlab.data.prepare import main

    root, out = mini.make_archives(tmp_path / "downloads"), tmp_path / "out"
    prepare_imagenet(root, out, workers=1, progress=False)
    (out / MARKER).unlink()
    (out / STAGING).mkdir()
    (out / STAGING / "moving").write_text("")
    (out / "val").rename(out / STAGING / "val")
    with pytest.raises(UserError, match=r"stopped before it finished .* data\.prepared="):
        find_layout(out)
    with pytest.raises(SystemExit) as exit_:
        main(["imagenet", str(out)])
    assert exit_.value.code == 2 and "stopped before it finished" in capsys.readouterr().err
    dm = _dm(root, prepared=str(out))
    assert dm.layout.kind == "archives"
    dm.setup("fit")
    assert len(dm.train_set) == TRAIN and len(dm.val_set) == VAL and (out / MARKER).is_file()


def test_a_tree_without_val_is_refused_unless_the_carve_out_is_asked_for(tmp_path):
    root, out = mini.make_archives(tmp_path / "downloads"), tmp_path / "out"
    prepare_imagenet(root, out, workers=1, progress=False)
    tree = tmp_path / "tree"
    tree.mkdir()
    (out / "train").rename(tree / "train")
    with pytest.raises(UserError, match=r"has train/ but no val/.*data\.val_from_train=true"):
        _dm(tree)
    dm = _dm(tree, val_from_train=True, val_fraction=0.25)
    dm.setup("fit")
    assert len(dm.val_set) == TRAIN // 4 and len(dm.train_set) == TRAIN - TRAIN // 4
