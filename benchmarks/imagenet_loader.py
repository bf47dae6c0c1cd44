"""The ImageNet training loader at its limit: images/s of attnlab's `data=imagenet` training loader against timm's own,
end to end into a trivial training step, on the same cores, alternated in one run; and decode-only images/s of the
same files.

    python benchmarks/imagenet_loader.py [--images 2000] [--workers 2] [--batch 64] [--rounds 4] [--root DIR]
    python benchmarks/imagenet_loader.py --images 2000 --rounds 8      # docs/benchmarks.md's table

The tree: `--images` JPEGs of 500x375 pixels, about 90 KiB each, of 1/f ("pink") noise in correlated colour channels,
whose size and decoding cost are close to a photo's (ImageNet's JPEGs average about 110 KiB and 470x390), in
`train/<wnid>/` folders of 10 classes. It is made once in `--root` (default: a folder under the system's temp dir).

Both loaders apply the Swin-T recipe's augmentation: RandomResizedCrop 224 (scale 0.08-1, bicubic), horizontal flip,
RandAugment `rand-m9-mstd0.5-inc1`, then on the batch after the transfer normalization and random erasing (0.25,
`pixel`). attnlab: `data=imagenet` built from the config, its training DataLoader, `on_after_batch_transfer` (what
Lightning calls), then the step. timm: `timm.data.create_loader` on torchvision's `ImageFolder` with
`create_transform(224, is_training=True, auto_augment=..., re_prob=0.25, re_mode="pixel", interpolation="bicubic",
use_prefetcher=True)` (uint8 batches, `fast_collate`) and its `PrefetchLoader` (normalization and erasing after the
transfer, here on the CPU). The step reads the batch once (a mean), the same on both sides. Each round runs one epoch
of each loader, attnlab first, timed from its first batch to its last (the workers are persistent and started before
the first round); the table gives each round's images/s and the CPU time per image of the main process and the
loader's workers together (all the work, wherever it runs; other processes on the machine slow the rate, not this),
the medians and the median of the rounds' ratios.

Then, per image in one process (one torch thread, as a loader worker), where each pipeline's time goes: decoding,
crop and resize, flip, RandAugment, the conversion to a tensor, both on the same files with the same draws.

Decode-only: the same files decoded whole to RGB arrays (Pillow's `Image.open(...).convert("RGB")`, and simplejpeg
where installed), in one process on one core, and through a DataLoader with the same workers as above.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from attnlab.utils.atomic import scratch_folder

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
AUTO_AUGMENT, RE_PROB, RE_MODE = "rand-m9-mstd0.5-inc1", 0.25, "pixel"


# ---- the tree
def pink_noise(rng: np.random.Generator, h: int = 375, w: int = 500) -> np.ndarray:
    """(h, w, 3) uint8: 1/f noise (amplitude falling as 1/frequency, as in photos), channels correlated."""
    fy, fx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx ** 2 + fy ** 2)
    f[0, 0] = 1.0
    chans = []
    for _ in range(3):
        spec = (rng.standard_normal(f.shape) + 1j * rng.standard_normal(f.shape)) / f
        spec[0, 0] = 0
        chans.append(np.fft.irfft2(spec, s=(h, w)))
    x = np.stack(chans, -1) @ np.array([[1, 0.8, 0.7], [0.8, 1, 0.8], [0.7, 0.8, 1]])
    x = (x - x.mean()) / x.std() * 50 + 120
    return np.clip(x, 0, 255).astype(np.uint8)


def make_tree(root: Path, n: int, classes: int = 10, size: tuple[int, int] = (375, 500), quality: int = 85) -> Path:
    """root/train/<wnid>/*.JPEG, made once (a file per image written last, so a partial tree is completed)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        path = root / "train" / f"n{i % classes:08d}" / f"img_{i:06d}.JPEG"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(pink_noise(rng, *size)).save(buf, "JPEG", quality=quality)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.replace(path)
    return root


def files_of(root: Path, n: int) -> list[Path]:
    return sorted((root / "train").rglob("*.JPEG"))[:n]


# ---- the loaders, each an iterable of (normalized images, labels) and a step
def attnlab_loader(root: Path, args):
    from attnlab.cli import builders
    from attnlab.config import compose_run

    out = scratch_folder("attnlab-loader-")
    # a train/ tree of its own images only: its validation split carved out on purpose (the loader times train/)
    cfg = compose_run(["data=imagenet", f"data.root={root}", "data.val_from_train=true", "data.num_classes=10",
                       f"data.batch_size={args.batch}",
                       f"data.num_workers={args.workers}", f"++data.augment.auto_augment={AUTO_AUGMENT}",
                       f"++data.augment.re_mode={RE_MODE}", f"++data.augment.re_prob={RE_PROB}",
                       "++data.augment.interpolation=bicubic", "extras.print_config=false"],
                      out, log_dir=out / "logs", cache_dir=out / "cache")
    dm = builders.build_datamodule(cfg.data)
    dm.setup("fit")
    loader = dm.train_dataloader()
    dm.trainer = SimpleNamespace(training=True)  # what on_after_batch_transfer reads: random erasing while training

    def batches(epoch: int):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            yield dm.on_after_batch_transfer(batch, 0)  # what Lightning calls once the batch is on the device

    return batches, loader


def timm_loader(root: Path, args):
    import torch
    from timm.data import create_loader
    from torchvision.datasets import ImageFolder

    loader = create_loader(ImageFolder(str(root / "train")), input_size=(3, 224, 224), batch_size=args.batch,
                           is_training=True, use_prefetcher=True, auto_augment=AUTO_AUGMENT, re_prob=RE_PROB,
                           re_mode=RE_MODE, interpolation="bicubic", mean=MEAN, std=STD, num_workers=args.workers,
                           device=torch.device("cpu"), persistent_workers=args.workers > 0)

    def batches(epoch: int):
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader

    return batches, loader.loader  # the DataLoader inside timm's PrefetchLoader


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds so far of these processes (all their threads), from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def pids_of(loader) -> list[int]:
    """This process and the loader's live (persistent) workers."""
    it = getattr(loader, "_iterator", None)
    return [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]


def timed_epoch(batches, epoch: int, loader=None) -> tuple[float, float]:
    """(images/s, CPU ms per image of this process and the loader's workers) from the first batch to the last of
    one epoch, each batch through the trivial step. The CPU time counts all the work wherever it runs and is not
    slowed by other processes as the rate is."""
    n, start, cpu0 = 0, None, 0.0
    for x, y in batches(epoch):
        float(x.float().mean())  # the training step: reads the batch once (already float: no copy)
        if start is None:  # the first batch waits for the workers' first: not steady state
            start, cpu0 = time.perf_counter(), cpu_seconds(pids_of(loader)) if loader is not None else 0.0
            continue
        n += x.shape[0]
    if start is None or not n:
        return float("nan"), float("nan")
    rate = n / (time.perf_counter() - start)
    cpu = (cpu_seconds(pids_of(loader)) - cpu0) / n * 1000 if loader is not None else float("nan")
    return rate, cpu


# ---- decode-only
def decoders() -> dict:
    """name -> (encoded bytes -> (H, W, 3) uint8 array): Pillow's, and simplejpeg's where installed."""
    from PIL import Image

    out = {"Pillow": lambda d: np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))}
    try:
        import simplejpeg

        out["simplejpeg"] = lambda d: simplejpeg.decode_jpeg(d, "RGB")
    except ImportError:
        pass
    return out


class _DecodeOnly:
    """The files decoded whole, each worth one number to the main process (no image crosses the queue)."""

    def __init__(self, paths, name):
        self.paths, self.name = paths, name

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return int(decoders()[self.name](f.read())[0, 0, 0])


def decode_rates(files: list[Path], workers: int, batch: int) -> dict[str, float]:
    """Images/s of decoding the files whole to RGB arrays, per decoder: in one process, and through a DataLoader
    with `workers` (this machine's limit for full-size decoding with those workers)."""
    import torch

    datas = [f.read_bytes() for f in files]
    rates = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for name, fn in decoders().items():
        start = time.perf_counter()
        for d in datas:
            fn(d)
        rates[f"{name}, 1 process"] = len(datas) / (time.perf_counter() - start)
        if workers:
            loader = torch.utils.data.DataLoader(_DecodeOnly([str(f) for f in files], name), batch_size=batch,
                                                 num_workers=workers, persistent_workers=True)
            for _ in loader:  # start the workers
                break
            rates[f"{name}, {workers} workers"] = timed_epoch(lambda epoch: ((x, x) for x in loader), 0)[0]
    torch.set_num_threads(threads)
    return rates


# ---- where a worker's time goes, per image
def stage_costs(files: list[Path], repeats: int = 3) -> dict[str, tuple[float, float]]:
    """stage -> (attnlab ms, timm ms) per image in one process (one torch thread, as in a loader worker), the two
    pipelines' stages timed alternately on the same files with the same draws."""
    import random

    import torch
    from PIL import Image

    from torchvision.transforms.functional import resized_crop

    from attnlab.data.images.file_transforms import EncodedImage, _to_chw
    from attnlab.data.images.transforms import train_transform

    torch.set_num_threads(1)
    tf = train_transform(224, 3, {"scale": [0.08, 1.0], "hflip": 0.5, "auto_augment": AUTO_AUGMENT,
                                  "interpolation": "bicubic", "mean": list(MEAN), "std": list(STD)})
    crop, (flip, augment, to_tensor) = tf.crop, tf.compose.transforms[1:]
    our_augment = tf.middle[1]  # timm's RandAugment; its geometric ops warped by OpenCV where installed
    totals: dict[str, list[float]] = {}

    def clock(stage: str, side: int, fn, *a):
        t = time.perf_counter()
        out = fn(*a)
        totals.setdefault(stage, [0.0, 0.0])[side] += time.perf_counter() - t
        return out

    def crop_params(w, h):
        return crop.get_params(torch.empty((), dtype=torch.uint8).expand(h, w), crop.scale, crop.ratio)

    for k in range(repeats):
        for i, f in enumerate(files):
            random.seed(k * len(files) + i)
            src, arr = clock("decode to an RGB array or image", 0,
                             lambda: ((e := EncodedImage(f.read_bytes())), e.decode()))
            img = clock("decode to an RGB array or image", 1, lambda: Image.open(f).convert("RGB"))
            i_, j, h, w = crop_params(*src.size)
            ours = clock("crop and resize to 224 (bicubic)", 0, tf._resized_crop, arr, i_, j, h, w, *src.size,
                         crop.interpolation)
            theirs = clock("crop and resize to 224 (bicubic)", 1, resized_crop, img, i_, j, h, w, [224, 224],
                           crop.interpolation)
            for side, im in ((0, ours), (1, theirs)):
                state = random.getstate(), np.random.get_state(), torch.get_rng_state()
                im = clock("flip", side, flip, im)
                im = clock("RandAugment (timm's draws; geometric ops by OpenCV or Pillow)", side,
                           our_augment if side == 0 else augment, im)
                random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(state[2])
                clock("to a uint8 tensor", side, _to_chw if side == 0 else to_tensor, im)
    n = repeats * len(files)
    return {k: (v[0] / n * 1000, v[1] / n * 1000) for k, v in totals.items()}


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return f"{model}, {os.cpu_count()} vCPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "attnlab-imagenet-like")
    args = p.parse_args()
    import PIL
    import timm
    import torch

    from attnlab.data.images import file_transforms
    from attnlab.data.images import warp_ops

    root = make_tree(args.root / str(args.images), args.images)
    files = files_of(root, args.images)
    sizes = [f.stat().st_size for f in files]
    print(f"{datetime.date.today()}; {machine()}; {len(files)} JPEGs 500x375, {np.mean(sizes) / 1024:.0f} KiB on "
          f"average; {args.workers} workers, batch {args.batch}; torch {torch.__version__}, timm {timm.__version__}, "
          f"Pillow {PIL.__version__}, attnlab's decoder {file_transforms.decoder()}, its geometric ops "
          f"{'OpenCV' if warp_ops.available() else 'Pillow'}", flush=True)
    ours, our_loader = attnlab_loader(root, args)
    theirs, their_loader = timm_loader(root, args)
    rows = []
    print("| round | attnlab images/s | timm images/s | ratio | attnlab CPU ms/image | timm CPU ms/image | ratio |\n"
          "|---|---:|---:|---:|---:|---:|---:|", flush=True)
    for r in range(args.rounds + 1):  # round 0 starts the persistent workers of both: not counted
        (a, ac), (t, tc) = timed_epoch(ours, r, our_loader), timed_epoch(theirs, r, their_loader)
        if r == 0 and args.rounds:
            continue
        rows.append((a, t, ac, tc))
        print(f"| {r} | {a:.1f} | {t:.1f} | {a / t:.3f} | {ac:.2f} | {tc:.2f} | {tc / ac:.3f} |", flush=True)
    med = [statistics.median(row[k] for row in rows) for k in range(4)]
    ratio = statistics.median(row[0] / row[1] for row in rows)
    cpu_ratio = statistics.median(row[3] / row[2] for row in rows)
    print(f"| median | {med[0]:.1f} | {med[1]:.1f} | **{ratio:.3f}** | {med[2]:.2f} | {med[3]:.2f} | "
          f"**{cpu_ratio:.3f}** |")
    print("(ratios: attnlab's images/s over timm's, and timm's CPU time per image over attnlab's; each the median of "
          "the rounds' ratios)")
    print("\n| stage, per image, one process | attnlab ms | timm ms |\n|---|---:|---:|")
    costs = stage_costs(files[:64], repeats=3 if len(files) >= 64 else 1)
    for stage, (a, t) in costs.items():
        print(f"| {stage} | {a:.3f} | {t:.3f} |")
    print(f"| all | {sum(a for a, _ in costs.values()):.3f} | {sum(t for _, t in costs.values()):.3f} |\n")
    for name, rate in decode_rates(files, args.workers, args.batch).items():
        print(f"decode-only ({name}): {rate:.1f} images/s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
