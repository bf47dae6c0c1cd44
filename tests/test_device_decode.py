"""data.decode=gpu (attnlab/data/images/device_decode.py) on the CPU: the workers' bytes, the decode onto the batch's device
(torchvision's, nvJPEG on a GPU, libjpeg-turbo here), timm's crop draws, the evaluation crop against the CPU path's,
and the refusals. The GPU itself is measured by benchmarks/gpu_decode.py (docs/benchmarks.md)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from attnlab.data.images.device_decode import DeviceDecoder, EncodedFile, check_decode, check_device, collate
from attnlab.data.images.imagefolder import ImageFolderDataModule
from attnlab.data.images.transforms import BatchNormalizer, eval_transform
from attnlab.errors import UserError
from test_file_transforms import _photo

AUGMENT = {"scale": [0.08, 1.0], "hflip": 0.5, "auto_augment": None, "re_prob": 0.25, "re_mode": "pixel",
           "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def test_the_workers_pass_a_jpegs_bytes_and_decode_what_nvjpeg_would_not(tmp_path):
    """An RGB JPEG goes as its bytes; a PNG named .JPEG and a CMYK JPEG (ImageNet has both) are decoded by Pillow
    in the worker, to RGB; a grayscale JPEG goes as its bytes for channels: 1."""
    encoded = EncodedFile()
    jpeg = _photo(tmp_path / "a.JPEG", (500, 375), 1)
    assert torch.equal(encoded.from_path(jpeg), torch.frombuffer(bytearray(Path(jpeg).read_bytes()), dtype=torch.uint8))
    for name, fmt, mode in (("png.JPEG", "PNG", "RGB"), ("cmyk.JPEG", "JPEG", "CMYK")):
        path = _photo(tmp_path / name, (300, 240), 2, fmt, mode)
        got = encoded.from_path(path)
        assert got.shape == (3, 240, 300) and got.dtype == torch.uint8
        assert torch.equal(got, torch.from_numpy(__import__("numpy").asarray(Image.open(path).convert("RGB")))
                           .permute(2, 0, 1))
    gray = _photo(tmp_path / "gray.JPEG", (300, 240), 3, "JPEG", "L")
    assert encoded.from_path(gray, "L").dim() == 1 and encoded.from_path(gray, "RGB").shape == (3, 240, 300)


def test_a_batch_is_decoded_onto_its_device_and_cropped_as_the_cpu_path_crops(tmp_path):
    """The evaluation crop of the device path (the shorter side to 256, the centre 224) is the CPU path's (Pillow's
    bicubic) to within a level on average; a training batch is (B, 3, 224, 224) uint8, normalized and erased after
    as every image batch is."""
    paths = [_photo(tmp_path / f"{i}.JPEG", size, i) for i, size in enumerate([(500, 375), (375, 500), (640, 427)])]
    png = _photo(tmp_path / "png.JPEG", (320, 300), 9, "PNG")
    images, labels = collate([(EncodedFile().from_path(p), i) for i, p in enumerate([*paths, png])])
    decoder = DeviceDecoder(224, 3, AUGMENT)
    on_device = decoder.to_device(images, torch.device("cpu"))
    assert [tuple(x.shape) for x in on_device] == [(3, 375, 500), (3, 500, 375), (3, 427, 640), (3, 300, 320)]
    batch = decoder(on_device, train=False)
    assert batch.shape == (4, 3, 224, 224) and batch.dtype == torch.uint8
    cpu_path = eval_transform(224, 3, AUGMENT)
    for got, path in zip(batch, [*paths, png]):
        expected = cpu_path.compose(Image.open(path).convert("RGB"))
        assert (got.float() - expected.float()).abs().mean() < 1.0
    random.seed(0)
    train = decoder(images, train=True)  # still encoded: decoded where they are
    assert train.shape == (4, 3, 224, 224) and train.dtype == torch.uint8
    normalized = BatchNormalizer.from_augment(AUGMENT, 3)(train, train=True)
    assert normalized.dtype == torch.float32 and normalized.shape == train.shape


def test_the_training_crop_is_timms_draw_and_the_flip_half_the_time():
    """The crop boxes are those timm's RandomResizedCropAndInterpolation draws from the same random state; the
    flip comes about half the time (augment.hflip=0.5), never with hflip=0."""
    from timm.data.transforms import RandomResizedCropAndInterpolation

    decoder = DeviceDecoder(224, 3, AUGMENT)
    timm_crop = RandomResizedCropAndInterpolation(224, scale=(0.08, 1.0))
    for h, w in ((375, 500), (500, 375), (100, 900)):
        random.seed(h)
        ours = [decoder.crop_box(h, w) for _ in range(50)]
        random.seed(h)
        theirs = [timm_crop.get_params(Image.new("RGB", (w, h)), timm_crop.scale, timm_crop.ratio) for _ in range(50)]
        assert ours == theirs
    x = torch.arange(3 * 8 * 8, dtype=torch.uint8).view(3, 8, 8)
    small = DeviceDecoder(8, 3, AUGMENT | {"scale": [1.0, 1.0], "ratio": [1.0, 1.0]})
    torch.manual_seed(0)
    flipped = sum(torch.equal(small.train_crop(x), x.flip(-1)) for _ in range(400))
    assert 160 < flipped < 240
    batch = small.train_batch([x] * 400)  # the batch's draws: about half of its images flipped
    assert 160 < sum(torch.equal(b, x.flip(-1)) for b in batch) < 240
    assert all(torch.equal(b, x) or torch.equal(b, x.flip(-1)) for b in batch)
    never = DeviceDecoder(8, 3, AUGMENT | {"scale": [1.0, 1.0], "ratio": [1.0, 1.0], "hflip": 0})
    assert all(torch.equal(never.train_crop(x), x) for _ in range(20))


@pytest.mark.parametrize("decode, augment, data_format, says", [
    ("nvjpeg", {}, "folder", "data.decode=nvjpeg is not known"),
    ("gpu", {}, "shards", "data.format=shards is decoded in the loader workers: set data.decode=cpu"),
    ("gpu", {"auto_augment": "rand-m9-mstd0.5-inc1"}, "folder", "Set data.augment.auto_augment=null"),
    ("gpu", {"auto_augment": "rand-m9", "color_jitter": 0.4}, "folder",
     "data.augment.auto_augment=null data.augment.color_jitter=null to train without them"),
])
def test_what_decode_gpu_cannot_do_is_refused_in_one_paragraph(decode, augment, data_format, says):
    with pytest.raises(UserError) as e:
        check_decode(decode, augment, data_format)
    assert says in str(e.value) and "\n" not in str(e.value)
    check_decode("gpu", {"auto_augment": None, "color_jitter": 0}, "folder")  # nothing on PIL images: accepted


def test_decode_gpu_on_a_run_without_a_gpu_is_refused_before_its_loaders(tmp_path):
    for i in range(2):
        for c in ("a", "b"):
            (tmp_path / "train" / c).mkdir(parents=True, exist_ok=True)
            _photo(tmp_path / "train" / c / f"{i}.JPEG", (64, 48), i)
    with pytest.raises(UserError, match="data.decode=gpu decodes the JPEGs with nvJPEG on a CUDA GPU"):
        check_device(torch.device("cpu"))
    dm = ImageFolderDataModule(root=str(tmp_path), decode="gpu", augment=AUGMENT, image_size=32, batch_size=2,
                               num_workers=0)
    assert isinstance(dm.train_transform(), EncodedFile) and dm.collate_fn(True) is collate
    dm.trainer = type("T", (), {"strategy": type("S", (), {"root_device": torch.device("cpu")})()})()
    with pytest.raises(UserError, match="set data.decode=cpu"):
        dm.before_loader()


def _tree(root: Path, per_class: int = 6) -> Path:
    for i in range(per_class):
        for c in ("a", "b"):
            (root / "train" / c).mkdir(parents=True, exist_ok=True)
            _photo(root / "train" / c / f"{i}.JPEG", (64, 48), i + (c == "b") * 100)
    return root


def _ahead_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "attnlab-decode-ahead"]


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_decoded_ahead_reach_the_step_in_order_and_count_as_the_step_takes_them(tmp_path, workers):
    """data.decode_ahead=2: the training batches come decoded and cropped, (B, 3, S, S) uint8 with their labels, in
    the sampler's order (the same labels as each batch decoded as the step takes it); the loader's saved position
    is the batches the step took, not the ones decoded ahead; an epoch left part-way stops its thread, and the next
    epoch starts again from its first batch."""
    dm = ImageFolderDataModule(root=str(_tree(tmp_path)), decode="gpu", decode_ahead=2, augment=AUGMENT,
                               image_size=32, batch_size=2, num_workers=workers, val_fraction=0.0, test_fraction=0.0)
    dm.setup("fit")
    inline = [labels.tolist() for _, labels in dm.train_dataloader()]
    loader = dm.train_dataloader()
    dm.decode_ahead_on(loader, torch.device("cpu"))
    taken = []
    for x, labels in loader:
        assert x.shape == (2, 3, 32, 32) and x.dtype == torch.uint8
        taken.append(labels.tolist())
    assert taken == inline and len(taken) == 6
    for n, (x, labels) in enumerate(loader):
        if n == 1:
            break
    time.sleep(0.5)  # the thread has filled its queue: 2 batches ahead of the 2 taken
    assert loader.state_dict()["batches"] == 2
    again = [labels.tolist() for _, labels in loader]  # the thread of the epoch left part-way stopped first
    assert again == inline and not _ahead_threads()
    loader.load_state_dict({"epoch": 0, "batches": 2, "rng": None})  # a run resumed after its second batch
    assert [labels.tolist() for _, labels in loader] == inline[2:]


def test_an_error_while_decoding_ahead_reaches_the_step_and_the_thread_ends(tmp_path, monkeypatch):
    dm = ImageFolderDataModule(root=str(_tree(tmp_path)), decode="gpu", augment=AUGMENT, image_size=32, batch_size=2,
                               num_workers=0, val_fraction=0.0, test_fraction=0.0)
    dm.setup("fit")
    loader = dm.train_dataloader()
    dm.decode_ahead_on(loader, torch.device("cpu"))
    decoded, to_device = [], dm.device_decoder.to_device

    def third_fails(images, device):
        if len(decoded) == 2:
            raise ValueError("a broken batch")
        decoded.append(1)
        return to_device(images, device)

    monkeypatch.setattr(dm.device_decoder, "to_device", third_fails)
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(ValueError, match="a broken batch"):
        next(it)
    assert not _ahead_threads()


def test_decode_ahead_is_a_number_of_batches():
    with pytest.raises(UserError, match=r"data.decode_ahead=-1 is not a number of batches") as e:
        check_decode("gpu", {}, "folder", -1)
    assert "\n" not in str(e.value)
    check_decode("gpu", {}, "folder", 0)


class _Files(torch.utils.data.Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return EncodedFile().from_path(self.paths[i]), i


def test_a_batch_crosses_from_the_workers_as_one_tensor_of_jpeg_bytes_and_its_decoded_images(tmp_path):
    """The workers' batch: the JPEGs' bytes one after another in one tensor, their lengths, and a PNG named .JPEG
    decoded in the worker at its position; on the other side of a worker process, each image's bytes or pixels
    as they were."""
    paths = [_photo(tmp_path / "a.JPEG", (64, 48), 1), _photo(tmp_path / "png.JPEG", (40, 30), 2, "PNG"),
             _photo(tmp_path / "b.JPEG", (50, 60), 3)]
    sizes = [Path(p).stat().st_size for p in paths]
    loader = torch.utils.data.DataLoader(_Files(paths), batch_size=3, num_workers=1, collate_fn=collate)
    (images, labels), = list(loader)
    assert labels.tolist() == [0, 1, 2] and len(images) == 3
    assert images.data.shape == (sizes[0] + sizes[2],) and images.lengths == [sizes[0], 0, sizes[2]]
    got = images.images()
    assert bytes(got[0].numpy()) == Path(paths[0]).read_bytes() and bytes(got[2].numpy()) == Path(paths[2]).read_bytes()
    assert got[1].shape == (3, 30, 40) and got[1].dtype == torch.uint8
    decoded = DeviceDecoder(32, 3, AUGMENT).to_device(images, torch.device("cpu"))
    assert [tuple(x.shape) for x in decoded] == [(3, 48, 64), (3, 30, 40), (3, 60, 50)]
