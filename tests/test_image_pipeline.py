"""Images travel to the device as uint8 and are normalized there (and randomly erased while training), as timm's own
training loader does: the loaders' batches are uint8, and the normalized batch is the one the float pipeline made."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform
from timm.data.random_erasing import RandomErasing

from attnlab.data.images.cifar import CIFARDataModule
from attnlab.data.images.digits import DigitsDataModule
from attnlab.data.images.imagefolder import ImageFolderDataModule
from attnlab.data.images.mnist import MNISTDataModule
from attnlab.data.synthetic import SyntheticImagesDataModule
from attnlab.data.images.transforms import BatchNormalizer, eval_transform, image_stats

IMAGENET_STATS = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def _photos(root: Path, classes=("cat", "dog"), n=6, size=(120, 100)) -> Path:
    """JPEGs of smooth random content, larger than the crop (the eval transform resizes and center-crops them)."""
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            small = rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)
            Image.fromarray(small).resize(size, Image.BICUBIC).save(root / c / f"{i}.jpg", quality=90)
    return root


def _folder(tmp_path, **kwargs):
    kwargs = {"image_size": 96, "batch_size": 4, "val_fraction": 0.25, "test_fraction": 0.0} | kwargs
    return ImageFolderDataModule(kind="images", root=str(_photos(tmp_path / "photos")), **kwargs)


def _old_eval_transform(dm):
    """The evaluation transform the loaders used before: timm's create_transform ending in ToTensor + Normalize."""
    mean, std = image_stats(dm.augment, dm.channels)
    return create_transform(input_size=(dm.channels, dm.image_size, dm.image_size), is_training=False, mean=mean,
                            std=std, crop_pct=1.0 if dm.image_size <= 64 else 0.875, interpolation="bicubic")


MODULES = {
    "imagefolder": lambda tmp, data: _folder(tmp, test_fraction=0.25, augment={"re_prob": 0.25, **IMAGENET_STATS}),
    "cifar10": lambda tmp, data: CIFARDataModule(kind="images", data_dir=str(data / "cifar10"), cache_dir=str(tmp),
                                                 batch_size=8),
    "mnist": lambda tmp, data: MNISTDataModule(kind="images", data_dir=str(data / "mnist"), batch_size=8),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_eval_batches_are_uint8_and_normalize_on_the_device_as_the_float_pipeline_did(tmp_path, small_data, name):
    dm = MODULES[name](tmp_path, small_data)
    dm.setup("fit")
    for split, loader in (("val", dm.val_dataloader()), ("test", dm.test_dataloader())):
        x, y = next(iter(loader))
        assert x.dtype == torch.uint8 and x.shape[1:] == (dm.channels, dm.image_size, dm.image_size)
        normalized, labels = dm.on_after_batch_transfer((x, y), 0)
        assert normalized.dtype == torch.float32 and labels is y
        old = copy.copy(dm.val_set if split == "val" else dm.test_set)
        old.transform = _old_eval_transform(dm)                     # the same images through the old pipeline
        expected = torch.stack([old[i][0] for i in range(len(x))])
        _, std = image_stats(dm.augment, dm.channels)
        assert torch.allclose(normalized, expected, atol=1e-5), (normalized - expected).abs().max()
        assert (normalized - expected).abs().max() < 0.5 / 255 / max(std)  # well inside uint8 rounding


def test_training_batches_are_uint8_and_erased_on_the_device_only_while_training(tmp_path):
    dm = _folder(tmp_path, augment={"scale": [0.5, 1.0], "hflip": 0.5, "re_prob": 1.0, "re_count": 2})
    dm.setup("fit")
    assert not any(isinstance(t, RandomErasing) for t in dm.train_set.transform.transforms)  # nothing in the worker
    x, y = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8
    erased = lambda b: (b == 0).flatten(1).any(1)  # noqa: E731  (mean 0.5: no pixel normalizes to exactly 0)
    dm.trainer = SimpleNamespace(training=False)
    assert not erased(dm.on_after_batch_transfer((x, y), 0)[0]).any()
    dm.trainer = SimpleNamespace(training=True)
    out = dm.on_after_batch_transfer((x.clone(), y), 0)[0]
    assert erased(out).all()  # re_prob=1: every image
    dm.trainer = SimpleNamespace(training=False)
    kept = ~(out == 0)
    assert torch.equal(out[kept], dm.on_after_batch_transfer(x, 0)[kept])  # the rest is the normalized image


def test_float_batches_pass_through_unchanged():
    dm = DigitsDataModule(kind="images", batch_size=8)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch[0].dtype == torch.float32
    out = dm.on_after_batch_transfer(batch, 0)
    assert out is batch
    user = (torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
    assert _folder_like().on_after_batch_transfer(user, 0) is user


@pytest.mark.parametrize("size", [(8, 8), (8, 10)])
def test_the_batched_affine_is_torchvisions_with_one_draw_per_image(size):
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    from attnlab.data.images.transforms import affine, random_affine

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, *size, generator=g)
    angle, zoom = torch.tensor([0.0, 90.0, -30.0, 12.0, 7.0]), torch.tensor([1.0, 1.0, 1.0, 1.1, 0.9])
    shift = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, -2.0], [1.0, 0.0], [2.0, 1.0]])
    out = affine(x, angle, shift, zoom, fill=-1.0)
    for i in range(5):
        ref = TF.affine(x[i], angle=float(angle[i]), translate=shift[i].tolist(), scale=float(zoom[i]),
                        shear=[0.0, 0.0], interpolation=InterpolationMode.NEAREST, fill=-1.0)
        assert torch.equal(out[i], ref), i
    assert torch.equal(random_affine(x), x)  # nothing asked: the batch as it was
    # each image its own rotation, shift and zoom: 64 different images of one 32 px image (at 8 px, nearest
    # neighbours map many small draws to the same pixels)
    torch.manual_seed(0)
    same = torch.randn(1, 2, 32, 32, generator=g).expand(64, -1, -1, -1)
    moved = random_affine(same, degrees=10, translate=0.1, scale=(0.9, 1.1), fill=-1.0)
    assert len({tuple(m.flatten().tolist()) for m in moved}) == 64


def test_digits_are_augmented_on_the_device_while_training_only():
    dm = DigitsDataModule(kind="images", batch_size=16)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.min() == -1  # the loader gives the digits as they are (background -1)
    dm.trainer = SimpleNamespace(training=True)
    out, labels = dm.on_after_batch_transfer((x, y), 0)
    assert labels is y and out.shape == x.shape and not torch.equal(out, x)
    assert ((out == -1) | torch.isin(out, x)).all()  # nearest neighbours: pixels of the digit, or the background
    dm.trainer = SimpleNamespace(training=False)
    assert dm.on_after_batch_transfer((x, y), 0)[0] is x


def _folder_like():
    from attnlab.data.images.base import ImageDataModule

    return ImageDataModule(num_classes=2, image_size=8, augment={"re_prob": 1.0})


def test_synthetic_images_are_a_uint8_bank():
    dm = SyntheticImagesDataModule(kind="images", image_size=16, num_classes=10, train_samples=32, val_samples=8,
                                   batch_size=8)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and x.shape == (8, 3, 16, 16) and y.max() < 10
    normalized = dm.on_after_batch_transfer((x, y), 0)[0]
    assert normalized.dtype == torch.float32 and -1 <= normalized.min() and normalized.max() <= 1


def test_prediction_normalizes_as_the_device_does():
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (90, 120, 3), dtype=np.uint8))
    augment = dict(IMAGENET_STATS)
    on_host = eval_transform(80, 3, augment, normalize=True)(img)
    on_device = BatchNormalizer.from_augment(augment, 3)(eval_transform(80, 3, augment)(img))
    assert on_host.dtype == on_device.dtype == torch.float32
    assert torch.allclose(on_host, on_device, atol=1e-5)


def test_the_memory_estimate_measures_the_step_on_the_normalized_batch(tmp_path):
    from attnlab.memory import sample_batch

    dm = _folder(tmp_path)
    dm.setup("fit")
    x, _ = sample_batch(dm)
    assert x.dtype == torch.float32 and x.shape == (4, 3, 96, 96)


class _Probe(L.LightningModule):
    """Records what each loop's step receives."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[tuple[str, torch.dtype, bool]] = []

    def _see(self, stage, batch):
        x = batch[0]
        self.seen.append((stage, x.dtype, bool((x == 0).flatten(1).any(1).all())))
        return self.w * x.float().mean()

    def training_step(self, batch, batch_idx):
        return self._see("train", batch)

    def validation_step(self, batch, batch_idx):
        self._see("val", batch)

    def test_step(self, batch, batch_idx):
        self._see("test", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_trainer_hands_every_loop_normalized_batches_and_erases_only_in_training(tmp_path):
    dm = _folder(tmp_path, image_size=32, test_fraction=0.25, augment={"re_prob": 1.0})
    probe = _Probe()
    trainer = L.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=1, limit_test_batches=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=1, default_root_dir=tmp_path)
    trainer.fit(probe, datamodule=dm)
    trainer.test(probe, datamodule=dm, verbose=False)
    stages = {stage for stage, _, _ in probe.seen}
    assert stages == {"train", "val", "test"}
    assert all(dtype == torch.float32 for _, dtype, _ in probe.seen)
    assert all(erased == (stage == "train") for stage, _, erased in probe.seen), probe.seen


def test_predict_py_gives_the_probabilities_of_the_device_normalized_batch(tmp_path):
    """predict.py applies the eval transform outside Lightning and normalizes on the host: the same numbers as a
    validation batch normalized on the device."""
    from attnlab.cli.builders import load_task
    from attnlab.checkpoints.resume import read_run_metadata
    from attnlab.cli.predict import predict
    from attnlab.cli.training import train
    from attnlab.data.images.base import FileImages, image_files
    from conftest import FAST, compose_cfg

    root = _photos(tmp_path / "photos")
    train(compose_cfg(["data=imagefolder", f"data.root={root}", "data.image_size=32", "data.batch_size=4",
                       "data.num_workers=0", "trainer.max_steps=2", "trainer.max_epochs=1",
                       "trainer.limit_val_batches=1", "test=false", "logger=csv", *FAST], tmp_path / "run"))
    ckpt = str(tmp_path / "run" / "checkpoints" / "last.ckpt")
    (tmp_path / "pred").mkdir()
    rows = predict(compose_cfg([f"ckpt_path={ckpt}", f"input={root / 'cat'}"], tmp_path / "pred",
                               config_name="predict"))
    meta = read_run_metadata(ckpt)
    model = load_task(ckpt, meta).eval()
    dm = ImageFolderDataModule(kind="images", root=str(root), image_size=32,
                               augment=dict(meta["config"]["data"]["augment"]))
    files = image_files(root / "cat")
    x = torch.stack([FileImages([(str(f), -1)], 3, dm.eval_transform())[0][0] for f in files])  # uint8
    with torch.inference_mode():
        probs = model(dm.on_after_batch_transfer(x, 0)).softmax(-1)
    names = model.hparams.class_names
    assert [r["file"] for r in rows] == [str(f) for f in files]
    for row, p in zip(rows, probs):
        for name, q in row["top"]:
            assert abs(q - float(p[names.index(name)])) < 1e-5
