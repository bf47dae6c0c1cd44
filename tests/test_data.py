"""DataModules on scikit-learn's digits, on small CIFAR-10 / MNIST files in their real formats (tests/fixtures.py) and
on made-up folders; the offline CIFAR-10 / MNIST copies load with their documented sizes."""

from __future__ import annotations

import json

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.cli.app import user_message
from attnlab.data.images.cifar import CIFARDataModule
from attnlab.data.images.digits import DigitsDataModule
from attnlab.data.images.imagefolder import ImageFolderDataModule
from attnlab.data.images.imagenet import ImageNetDataModule
from attnlab.data.images.mnist import MNISTDataModule
from attnlab.errors import UserError
from conftest import real_data


def test_digits_splits_and_augmentation():
    dm = DigitsDataModule(kind="images", batch_size=32)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (1258, 180, 359)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 1, 8, 8) and y.dtype == torch.long
    assert -1.0 <= x.min() and x.max() <= 1.0
    dm.trainer = SimpleNamespace(training=True)  # augmented on the device, a fresh random affine each time
    assert not torch.equal(dm.on_after_batch_transfer((x, y), 0)[0], dm.on_after_batch_transfer((x, y), 0)[0])
    assert torch.equal(dm.val_set[0][0], dm.val_set[0][0])
    other = DigitsDataModule(kind="images", seed=7)
    other.setup()
    assert torch.equal(other.test_set.tensors[1], dm.test_set.tensors[1])  # split independent of the seed


def test_batch_larger_than_training_split_is_refused():
    dm = DigitsDataModule(kind="images", batch_size=5000)
    dm.setup()
    with pytest.raises(UserError, match=r"data.batch_size=5000 is larger than the training split \(1,258"):
        dm.train_dataloader()


def test_cifar10_from_png_zips_with_a_cache_outside_the_data(tmp_path, small_data):
    root = small_data / "cifar10"  # 20 training and 10 test PNGs per class, in zips as the offline copy
    dm = CIFARDataModule(kind="images", data_dir=str(root), cache_dir=str(tmp_path), batch_size=64,
                         augment={"scale": [0.8, 1.0], "hflip": 0.5})
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (180, 20, 100)
    assert dm.class_names[:3] == ["airplane", "automobile", "bird"] and dm.num_classes == 10
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 3, 32, 32) and 0 <= int(y.min()) and int(y.max()) <= 9
    _, y = next(iter(dm.test_dataloader()))
    assert len(y.unique()) >= 8  # the first test batch mixes classes, so limit_test_batches samples them all
    cached = list(tmp_path.rglob("*.npz"))
    assert len(cached) == 1 and not list(root.glob("*.npz"))  # cache in the project's cache dir only
    again = CIFARDataModule(kind="images", data_dir=str(root), cache_dir=str(tmp_path))
    again.setup()
    assert len(again.test_set) == 100 and list(tmp_path.rglob("*.npz")) == cached  # read from the cache


def test_cifar10_from_png_folders_equals_the_zips(tmp_path, small_data):
    from fixtures import make_cifar10

    folders = make_cifar10(tmp_path / "cifar10", as_zip=False)  # the same PNGs as <split>/<class>/*.png files
    assert not list(folders.glob("*.zip"))
    sets = []
    for root in (small_data / "cifar10", folders):
        dm = CIFARDataModule(kind="images", data_dir=str(root), cache_dir=str(tmp_path / "cache"))
        dm.setup()
        sets.append(dm)
    zipped, unzipped = sets
    assert unzipped.class_names == zipped.class_names
    assert np.array_equal(unzipped.test_set.images, zipped.test_set.images)
    assert np.array_equal(unzipped.test_set.labels, zipped.test_set.labels)


def test_mnist_offline_test_set_is_split(small_data):
    dm = MNISTDataModule(kind="images", data_dir=str(small_data / "mnist"), batch_size=16, test_fraction=0.2)
    dm.setup()  # only t10k-*.gz (300 digits), as in the offline copy: train / val / test carved out of it
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (210, 30, 60)
    x, _ = next(iter(dm.val_dataloader()))
    assert x.shape == (16, 1, 28, 28)


def test_mnist_plain_idx_files_with_a_train_set_use_the_official_split(tmp_path):
    from fixtures import make_mnist

    root = make_mnist(tmp_path / "mnist", n_test=50, n_train=100, gz=False)
    assert sorted(p.name for p in root.iterdir()) == ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                                                      "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    dm = MNISTDataModule(kind="images", data_dir=str(root), batch_size=10)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (90, 10, 50)  # val from train, the whole test
    x, y = next(iter(dm.test_dataloader()))
    assert x.shape == (10, 1, 28, 28) and y.dtype == torch.long


def test_the_offline_cifar10_and_mnist_copies_load_with_their_documented_sizes(tmp_path):
    dm = CIFARDataModule(kind="images", data_dir=str(real_data("cifar10")), cache_dir=str(tmp_path))
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (4500, 500, 10000)
    assert dm.class_names == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                              "truck"]
    dm = MNISTDataModule(kind="images", data_dir=str(real_data("mnist")), test_fraction=0.2)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (7000, 1000, 2000)


@pytest.mark.parametrize("make", [
    lambda d: MNISTDataModule(kind="images", data_dir=str(d)),
    lambda d: CIFARDataModule(kind="images", data_dir=str(d), cache_dir=str(d)),
])
def test_missing_files_say_what_and_where(tmp_path, make):
    with pytest.raises(UserError) as err:
        make(tmp_path / "nowhere").setup()
    msg = str(err.value)
    assert str(tmp_path / "nowhere") in msg and "ATTNLAB_DATA_DIR" in msg and "download=true" in msg


def test_imagenet_missing_says_how_to_get_it(tmp_path):
    with pytest.raises(UserError) as err:
        ImageNetDataModule(kind="images", root=str(tmp_path / "imagenet"))
    msg = str(err.value)
    assert "train/<wnid>/*.JPEG" in msg and "data.source=hf" in msg and str(tmp_path / "imagenet") in msg


def _make_tree(root: Path, classes=("cat", "dog"), n=6, size=12):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


def test_imagefolder_split_by_fraction_and_by_folders(tmp_path):
    _make_tree(tmp_path / "flat", n=10)
    dm = ImageFolderDataModule(kind="images", root=str(tmp_path / "flat"), image_size=8, batch_size=4,
                               val_fraction=0.2, test_fraction=0.1)
    assert dm.num_classes == 2 and dm.class_names == ["cat", "dog"]
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (14, 4, 2)
    assert next(iter(dm.train_dataloader()))[0].shape == (4, 3, 8, 8)

    for split in ("train", "val", "test"):
        _make_tree(tmp_path / "split" / split, n=3)
    dm = ImageFolderDataModule(kind="images", root=str(tmp_path / "split"), image_size=8, batch_size=2)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (6, 6, 6)


def _files(dataset) -> set[str]:
    """The image files of a split (a Transformed view of FileImages, or FileImages itself)."""
    base, indices = (dataset.base, dataset.indices) if hasattr(dataset, "base") else (dataset, None)
    return {base.samples[i][0] for i in (indices if indices is not None else range(len(base)))}


@pytest.mark.parametrize("folders", [("train",), ("train", "val"), ("train", "test")])
def test_imagefolder_without_a_test_or_val_folder_splits_it_from_train(folders, tmp_path):
    """A split without a folder of its own comes out of train/ by its fraction: the test images are never the
    validation images the best checkpoint is chosen on."""
    for split in folders:
        _make_tree(tmp_path / split, n=10)
    dm = ImageFolderDataModule(kind="images", root=str(tmp_path), image_size=8, batch_size=4, val_fraction=0.2,
                               test_fraction=0.1)
    dm.setup()
    train, val, test = (_files(s) for s in (dm.train_set, dm.val_set, dm.test_set))
    assert not (train & val) and not (train & test) and not (val & test) and not dm.test_is_validation
    for split, files in (("val", val), ("test", test)):
        if split in folders:
            assert all(f"/{split}/" in f for f in files) and len(files) == 20
        else:
            assert all("/train/" in f for f in files) and len(files) == {"val": 4, "test": 2}[split]
    assert len(train) == 20 - (0 if "val" in folders else 4) - (0 if "test" in folders else 2)


def test_imagefolder_test_as_validation_is_the_users_choice_and_said_with_the_results(tmp_path):
    """data.test_fraction=0 without a test/ folder: the test split is the validation split (test_is_validation),
    and the run's results say so where it prints and writes them."""
    from conftest import run_here

    _make_tree(tmp_path / "images" / "train", n=10)
    dm = ImageFolderDataModule(kind="images", root=str(tmp_path / "images"), image_size=8, batch_size=4,
                               test_fraction=0)
    dm.setup()
    assert dm.test_is_validation and _files(dm.test_set) == _files(dm.val_set)
    out = run_here("train.py", "data=imagefolder", f"data.root={tmp_path / 'images'}", "data.test_fraction=0",
                   "data.image_size=8", "data.batch_size=4", "trainer.max_epochs=1", "data.num_workers=0",
                   env={"ATTNLAB_LOG_DIR": str(tmp_path / "logs")}, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "test/* are measured on the validation split" in out.stdout
    metrics = json.loads(next((tmp_path / "logs").rglob("metrics.json")).read_text())
    assert "test/acc" in metrics and metrics["test_is_validation"] is True, metrics


def test_imagefolder_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        ImageFolderDataModule(kind="images", root=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no images found"):
        ImageFolderDataModule(kind="images", root=str(tmp_path / "empty"))
    (tmp_path / "empty" / "cat").mkdir()
    with pytest.raises(UserError, match=r"class folder .*empty/cat holds no images"):
        ImageFolderDataModule(kind="images", root=str(tmp_path / "empty"))
    _make_tree(tmp_path / "three", classes=("a", "b", "c"), n=2)
    with pytest.raises(UserError, match="data.num_classes=5 but .* has 3 classes"):
        ImageFolderDataModule(kind="images", root=str(tmp_path / "three"), num_classes=5)


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_image_is_named(tmp_path, workers):
    _make_tree(tmp_path / "imgs", n=4)
    bad = tmp_path / "imgs" / "cat" / "broken.png"
    bad.write_bytes(b"this is not a png")
    dm = ImageFolderDataModule(kind="images", root=str(tmp_path / "imgs"), image_size=8, batch_size=3,
                               val_fraction=0.0, test_fraction=0.0, num_workers=workers)
    dm.setup()
    with pytest.raises(Exception) as err:
        for _ in dm.train_dataloader():
            pass
    msg = user_message(err.value)
    assert msg.startswith(f"cannot read image file {bad}") and "Original Traceback" not in msg


@pytest.mark.parametrize("workers", [0, 1])
def test_every_unreadable_image_is_named_in_one_pass_and_listed_in_the_run_folder(tmp_path, capsys, workers):
    from attnlab.cli.app import run_app
    from attnlab.cli.training import train
    from conftest import FAST, compose_cfg

    root = tmp_path / "images"
    _make_tree(root, n=10)
    bad = []
    for c, n in (("cat", 8), ("dog", 4)):
        for i in range(n):
            path = root / c / f"broken_{i:02d}.png"
            if i % 2:  # the first half of a real image: its header reads, its pixels do not
                Image.fromarray(np.random.default_rng(i).integers(0, 255, (12, 12, 3), np.uint8)).save(path)
                path.write_bytes(path.read_bytes()[:200])
            else:
                path.write_bytes(b"this is not a png")
            bad.append(str(path))
    run = tmp_path / "run"
    cfg = compose_cfg(["data=imagefolder", f"data.root={root}", "data.image_size=8", "data.batch_size=4",
                       f"data.num_workers={workers}", "trainer.max_epochs=1", *FAST], run)
    with pytest.raises(SystemExit) as stop:
        run_app(train, cfg)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    listing = run / "unreadable_images.txt"
    assert (f"attnlab: error: cannot read 12 of the 32 image files: {', '.join(bad[:10])} and 2 more. Each is corrupt "
            f"or not an image: delete or replace them, then rerun. All 12 are listed in {listing}") in err, err
    lines = listing.read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == bad
    assert "truncated" in lines[1] and "cannot identify image file" in lines[0]


def test_randaugment_policies_of_the_configs_run_on_many_images():
    """The configs' RandAugment policies and DeiT's / MAE's fine-tuning policy (`rand-m9-mstd0.5-inc1`) run on many
    images: timm's increasing posterize asks Pillow for 0 bits at top magnitude, which Pillow 13 refuses (pillow<13)."""
    from timm.data import create_transform

    from attnlab.config import CONF_DIR

    policies = set()
    for path in list((CONF_DIR / "data").glob("*.yaml")) + list((CONF_DIR / "experiment").glob("*.yaml")):
        text = path.read_text()
        policies |= {w.strip("'\",") for w in text.split() if w.strip("'\",").startswith("rand-")}
    assert policies
    policies.add("rand-m9-mstd0.5-inc1")
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    for policy in policies:
        t = create_transform(32, is_training=True, auto_augment=policy)
        for _ in range(2000):
            t(img)


def test_the_digits_are_scikit_learns_own_read_without_importing_it():
    """The file read as scikit-learn's load_digits reads it: the same images and classes, and no scikit-learn module
    imported by a run on the digits (a new process: half a second of every start)."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits as sklearn_digits

    from attnlab.data.images.digits import load_digits

    images, targets = load_digits()
    theirs = sklearn_digits()
    assert images.shape == (1797, 8, 8) and (images == theirs.images).all() and (targets == theirs.target).all()
    code = ("import sys; from attnlab.data.images.digits import DigitsDataModule as D; d = D(); d.setup('fit'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
