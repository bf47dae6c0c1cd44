"""The image files' transforms (data/images/file_transforms.py) give each sample timm's augmentation, not a cheaper one: the
same draws (crop scale and ratio, flips, RandAugment's ops and magnitudes) from the same generators, on nearly the same
pixels; a reduced-size decode for evaluation leaves a trained network's predictions as they were; the odd files of
ImageNet (CMYK, a PNG named .JPEG, grayscale) read as Pillow reads them."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.data.images import file_transforms
from attnlab.data.images import warp_ops
from attnlab.data.images.file_transforms import EvalFromFile, TrainFromFile
from attnlab.data.images.transforms import eval_transform, train_transform

SWIN = {"scale": [0.08, 1.0], "hflip": 0.5, "auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25,
        "re_mode": "pixel", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
DECODERS = ["pillow"] + (["simplejpeg"] if file_transforms.simplejpeg is not None else [])


def _photo(path: Path, size: tuple[int, int], seed: int, fmt: str = "JPEG", mode: str = "RGB") -> str:
    """Smooth random content (a small random image enlarged), as a photo compresses; (width, height)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (max(2, size[1] // 24), max(2, size[0] // 24), 3), dtype=np.uint8)
    img = Image.fromarray(small).resize(size, Image.BICUBIC)
    img = img.convert(mode) if mode != "RGB" else img
    img.save(path, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return str(path)


def _seed(s: int) -> None:
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def _states():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()


@pytest.fixture(params=DECODERS)
def decoder(request, monkeypatch):
    monkeypatch.setattr(file_transforms, "USE_SIMPLEJPEG", request.param == "simplejpeg")
    assert file_transforms.decoder() == request.param
    return request.param


def test_each_file_gets_timms_draws_and_nearly_timms_pixels(tmp_path, decoder):
    """With the generators seeded alike, timm's transform on the decoded image and `from_path` on the file draw the
    same numbers (the generators end in the same state: the crop, its interpolation, the flip, RandAugment's two
    ops, their probabilities and magnitudes) and give the same image within resampling rounding."""
    tf = train_transform(224, 3, SWIN)
    assert isinstance(tf, TrainFromFile)
    files = [_photo(tmp_path / f"{i}.jpg", size, i) for i, size in enumerate([(500, 375), (375, 500), (320, 240)])]
    diffs = []
    for s in range(16):
        path = files[s % len(files)]
        _seed(s)
        expected = tf.compose(Image.open(path).convert("RGB"))
        after_timm = _states()
        _seed(s)
        got = tf.from_path(path)
        assert _states()[0] == after_timm[0] and _states()[1] == after_timm[1]
        assert torch.equal(_states()[2], after_timm[2])
        assert got.shape == expected.shape == (3, 224, 224) and got.dtype == torch.uint8
        diffs.append((got.float() - expected.float()).abs().mean().item())
    # torch's antialiased resize against Pillow's: a level in a few pixels; RandAugment's thresholds (solarize,
    # posterize) may turn one into more
    assert np.median(diffs) < 0.25 and max(diffs) < 3, diffs


def test_the_augmentation_statistics_are_timms(tmp_path):
    """Many draws, recorded from both: crop area and aspect ratio, flips, RandAugment's ops and their arguments (from
    the magnitudes) are the same draws as timm's, and their statistics timm's (the ops are timm's own objects: the
    same table, probabilities and magnitudes)."""
    tf = train_transform(64, 3, SWIN)
    path = _photo(tmp_path / "a.jpg", (500, 375), 0)
    flip, ra = tf.middle
    assert type(flip).__name__ == "RandomHorizontalFlip" and flip.p == 0.5
    assert [op.name for op in ra.ops] == [op.name for op in tf.compose.transforms[2].ops]
    assert {op.magnitude for op in ra.ops} == {9} and {op.magnitude_std for op in ra.ops} == {0.5}

    def record(run):
        crops, flips, calls = [], [], []
        get_params, flip_forward = tf.crop.get_params, flip.forward
        originals = {op: op.aug_fn for op in [*ra.ops, *tf.compose.transforms[2].ops]}  # ours may be copies

        def spy_params(img, scale, ratio):
            crops.append(get_params(img, scale, ratio))
            return crops[-1]

        def spy_flip(img):
            out = flip_forward(img)
            flips.append(out is not img)
            return out

        def spy_op(fn, name):
            return lambda img, *a, **k: (calls.append((name, a)), fn(img, *a, **k))[1]

        tf.crop.get_params, flip.forward = spy_params, spy_flip
        for op in originals:
            op.aug_fn = spy_op(originals[op], op.name)
        try:
            _seed(1)
            for _ in range(300):
                run()
        finally:
            del tf.crop.get_params, flip.forward
            for op in originals:
                op.aug_fn = originals[op]
        return np.array(crops, dtype=float), flips, calls

    img = Image.open(path).convert("RGB")
    ours = record(lambda: tf.from_path(path))
    theirs = record(lambda: tf.compose(img))
    assert np.array_equal(ours[0], theirs[0]) and ours[1:] == theirs[1:]  # the very same draws, in order
    crops, flips, calls = ours
    area = crops[:, 2] * crops[:, 3] / (500 * 375)
    aspect = crops[:, 3] / crops[:, 2]
    assert 0.08 <= area.min() and area.max() <= 1.0 and 0.4 < area.mean() < 0.65
    assert 3 / 4 - 0.01 <= aspect.min() and aspect.max() <= 4 / 3 + 0.01
    assert 120 < sum(flips) < 180  # probability 0.5
    assert 200 < len(calls) < 400  # 2 ops a sample, each with probability 0.5: 300 expected
    assert len({name for name, _ in calls}) == 15
    degrees = [abs(a[0]) for name, a in calls if name == "Rotate"]  # magnitude 9 +- 0.5 of 10: 27 +- 1.5 degrees
    assert degrees and 22 < min(degrees) and max(degrees) < 30 + 1e-6 and 25.5 < np.mean(degrees) < 28.5


@pytest.mark.parametrize("size, reduce", [((1600, 1200), 4), ((1000, 750), 2), ((500, 375), 1)])
def test_a_crop_twice_the_output_is_decoded_at_a_reduced_size(tmp_path, size, reduce, monkeypatch):
    """A crop at least twice the output on both sides decodes the JPEG at 1/2, 1/4 or 1/8 of its size, never below
    the output's; the draws stay timm's and the image nearly timm's. (A square crop of the whole height: 1200 px
    -> 1/4, 300 px >= 224; 750 -> 1/2; 375 -> whole.)"""
    tf = train_transform(224, 3, SWIN | {"scale": [1.0, 1.0], "ratio": [1.0, 1.0], "auto_augment": None})
    path = _photo(tmp_path / "big.jpg", size, 3)
    seen = []
    decode = file_transforms.EncodedImage.decode

    def spy(self, r=1):
        seen.append(r)
        return decode(self, r)

    monkeypatch.setattr(file_transforms.EncodedImage, "decode", spy)
    _seed(0)
    expected = tf.compose(Image.open(path).convert("RGB"))
    _seed(0)
    got = tf.from_path(path)
    assert seen == [reduce]
    assert (got.float() - expected.float()).abs().mean() < 1.5


def _textures(root: Path, n: int, seed: int, size=(128, 96)) -> tuple[list[str], list[int]]:
    """Four classes of smooth random images told apart by their colour balance, with overlap."""
    rng = np.random.default_rng(seed)
    paths, labels = [], []
    tints = np.array([[1.1, 0.95, 0.95], [0.95, 1.1, 0.95], [0.95, 0.95, 1.1], [1.05, 1.05, 0.9]])
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        label = int(rng.integers(4))
        small = rng.integers(40, 215, (size[1] // 8, size[0] // 8, 3)).astype(float)
        small = np.clip(small * tints[label] * rng.uniform(0.85, 1.15, 3), 0, 255).astype(np.uint8)
        Image.fromarray(small).resize(size, Image.BICUBIC).save(root / f"{i}.jpg", quality=90)
        paths.append(str(root / f"{i}.jpg"))
        labels.append(label)
    return paths, labels


def test_reduced_size_decoding_for_evaluation_keeps_a_trained_networks_predictions(tmp_path):
    """JPEGs at least twice the evaluation size are decoded at half size before the resize and center crop: the
    eval tensors stay within a level or two of the full decode's, and a classifier trained on full-size decodes (a
    linear network on 8x8 pooled pixels, with errors to make) keeps its top-1 to 0.1 point on 1,000 images."""
    from sklearn.linear_model import LogisticRegression

    tf = eval_transform(32, 3, SWIN)
    assert isinstance(tf, EvalFromFile) and tf.resize_to == 32
    full = lambda p: tf.compose(Image.open(p).convert("RGB"))  # noqa: E731

    def features(paths, read):
        x = torch.stack([read(p) for p in paths]).float() / 255
        return x, torch.nn.functional.avg_pool2d(x, 4).flatten(1).numpy()

    train_paths, train_y = _textures(tmp_path / "train", 400, 0)
    test_paths, test_y = _textures(tmp_path / "test", 1000, 1)
    clf = LogisticRegression(max_iter=500).fit(features(train_paths, full)[1], train_y)
    (exact, f_exact), (reduced, f_reduced) = features(test_paths, full), features(test_paths, tf.from_path)
    assert (exact - reduced).abs().mean() * 255 < 2.0
    right = [int((clf.predict(f) == np.array(test_y)).sum()) for f in (f_exact, f_reduced)]
    assert 500 < right[0] < 1000, right  # a network with errors to make, not a separable toy
    assert abs(right[0] - right[1]) <= 1, right  # top-1 within 0.1 point
    assert (clf.predict(f_exact) != clf.predict(f_reduced)).sum() <= 10


@pytest.mark.parametrize("kind", ["cmyk", "png", "gray"])
def test_imagenets_odd_files_read_as_pillow_reads_them(tmp_path, kind, decoder):
    """A CMYK JPEG, a PNG named .JPEG and a grayscale JPEG give the image timm's transform gives from Pillow."""
    fmt, mode = {"cmyk": ("JPEG", "CMYK"), "png": ("PNG", "RGB"), "gray": ("JPEG", "L")}[kind]
    path = _photo(tmp_path / "odd.JPEG", (300, 240), 5, fmt, mode)
    for tf in (train_transform(64, 3, SWIN), eval_transform(64, 3, SWIN)):
        _seed(2)
        expected = tf.compose(Image.open(path).convert("RGB"))
        _seed(2)
        got = tf.from_path(path)
        assert (got.float() - expected.float()).abs().mean() < 1.0


def test_random_erasing_on_cpu_is_timms_on_one_thread():
    """On CPUs the batch's random erasing runs on one thread (its copies are too small to share out; an OpenMP team
    waiting for cores the workers hold cost 10x the CPU time): the same rectangles and values as timm's, and the
    thread count as it was."""
    from timm.data.random_erasing import RandomErasing

    from attnlab.data.images.transforms import BatchNormalizer

    norm = BatchNormalizer(SWIN["mean"], SWIN["std"], re_prob=0.5, re_mode="pixel")
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    threads = torch.get_num_threads()
    _seed(4)
    got = norm(x, train=True)
    assert torch.get_num_threads() == threads
    _seed(4)
    expected = RandomErasing(0.5, mode="pixel", device="cpu")(norm(x, train=False))
    assert torch.equal(got, expected)


def test_the_shards_bytes_give_what_the_file_gives(tmp_path):
    """`from_bytes` (the shards' loader hands the stored file's bytes) is `from_path` of the same file."""
    path = _photo(tmp_path / "a.jpg", (500, 375), 7)
    data = Path(path).read_bytes()
    for tf in (train_transform(64, 3, SWIN), eval_transform(64, 3, SWIN)):
        _seed(3)
        a = tf.from_path(path)
        _seed(3)
        assert torch.equal(tf.from_bytes(data), a)


@pytest.mark.skipif(not warp_ops.installed(), reason="OpenCV is not installed (attnlab[fast])")
@pytest.mark.parametrize("name", sorted(warp_ops.GEOMETRIC - {"TranslateX", "TranslateY"}))
def test_the_geometric_ops_warp_with_opencv_as_pillow_does(name):
    """Each geometric op of RandAugment (timm's AugmentOp, magnitude 9), once by timm on Pillow and once through
    data/images/warp_ops.py on OpenCV, from the same draws: the same generators' state after, the same fill colour where the
    warp leaves the image, and within half a level on average (OpenCV's bicubic kernel against Pillow's; a band of a
    pixel at the edges, blended with the fill where Pillow cuts)."""
    from timm.data.auto_augment import AugmentOp

    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).resize((224, 224), Image.BICUBIC)
    hparams = {"translate_pct": 0.45, "img_mean": (124, 116, 104), "interpolation": Image.BICUBIC}
    op = AugmentOp(name, prob=1.0, magnitude=9, hparams=hparams)
    fast = warp_ops.with_fast_warps(SimpleNamespace(ops=[op])).ops[0]
    assert fast is not op and fast.aug_fn is not op.aug_fn
    diffs = []
    for s in range(8):
        _seed(s)
        expected = np.asarray(op(img), dtype=float)
        after = _states()[:2]
        _seed(s)
        got = np.asarray(fast(img), dtype=float)
        assert _states()[:2] == after
        diff = np.abs(got - expected).max(axis=2)
        diffs.append(np.abs(got - expected).mean())
        filled = (expected == (124, 116, 104)).all(axis=2)
        assert (diff[filled] > 8).mean() < 0.05, name  # the fill where both leave the image
        inner = diff[4:-4, 4:-4]
        assert np.percentile(inner, 99) <= 8, name
    assert max(diffs) < 0.75, (name, diffs)


def test_without_opencv_the_ops_are_timms_own(monkeypatch):
    monkeypatch.setattr(warp_ops, "USE_OPENCV", False)
    tf = train_transform(224, 3, SWIN)
    assert tf.middle[1] is tf.compose.transforms[2]


@pytest.mark.skipif(not warp_ops.installed(), reason="OpenCV is not installed (attnlab[fast])")
def test_opencv_leaves_the_environment_as_it_was():
    """cv2's import prepends its folder to LD_LIBRARY_PATH, which the processes started afterwards would inherit."""
    import subprocess
    import sys

    check = ("import os; from attnlab.data.images import warp_ops; before = dict(os.environ); "
             "assert warp_ops.opencv().getNumThreads() == 1; assert dict(os.environ) == before, "
             "set(os.environ.items()) ^ set(before.items())")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
