"""ViT-B/16 and Swin-T training throughput on one GPU: attnlab's train.py against timm's own benchmark.py
(`--bench train`) for the same model, batch, precision and memory layout, on the same card, in one run; and the
ImageNet loader's images/s per worker on this CPU (JPEG decode + augmentation, to uint8), with the workers a GPU
needs, and the bytes of a batch on its way to the device.

    python benchmarks/vision_gpu.py --timm /tmp/pytorch-image-models [--models vit_base swin] [--batch-size 128]
    python benchmarks/vision_gpu.py --loader [--images 256]     # CPU: the loader alone, per worker
    python benchmarks/vision_gpu.py --tiny                       # any machine: a tiny ViT on CPU, the script's check

timm's benchmark.py is not in the timm wheel: give a checkout of the timm repository (fetched into /tmp, never into
this project). Both sides train on synthetic ImageNet-shaped batches (data=synthetic_images here, random tensors
there), bf16 autocast on both sides (timm --amp --amp-dtype bfloat16; train.py trainer.precision=bf16-mixed;
`--precision fp16` for float16), AdamW, channels-first. Goal: >= 0.95x timm.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnlab.utils.atomic import scratch_folder

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"vit_base": "vit_base_patch16_224", "swin": "swin_tiny_patch4_window7_224",
          "vit_tiny": "vit_tiny_patch16_224"}


PRECISION = {"bf16": ("bf16-mixed", "bfloat16"), "fp16": ("16-mixed", "float16")}  # train.py's, timm's --amp-dtype


def attnlab_row(model: str, args, out: Path, trainer: list[str] | None = None) -> float:
    size = (["trainer=cpu", "trainer.precision=32-true", "data.image_size=32",
             "data.num_workers=0"] if args.tiny else
            ["trainer=gpu", f"trainer.precision={PRECISION[args.precision][0]}", "data.num_workers=8"])
    cmd = [sys.executable, str(ROOT / "train.py"), f"model={model}", "data=synthetic_images",
           f"data.batch_size={args.batch_size}", "optimizer=adamw", "optimizer.lr=1e-4", "scheduler=constant",
           f"trainer.max_steps={args.steps}", "trainer.max_epochs=-1", "trainer.limit_val_batches=0",
           f"trainer.log_every_n_steps={args.window}", "test=false", "logger=csv", "callbacks.model_checkpoint=null",
           "callbacks.progress_bar=null", "extras.print_config=false", f"hydra.run.dir={out}", *size, *(trainer or []),
           *args.overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"train.py failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    rows = [r for r in csv.DictReader(open(out / "csv" / "metrics.csv")) if r.get("perf/samples_per_s")]
    return statistics.median(float(r["perf/samples_per_s"]) for r in (rows[2:] or rows))


def timm_row(model: str, args) -> float:
    cmd = [sys.executable, "benchmark.py", "--bench", "train", "--model", MODELS[model], "-b", str(args.batch_size),
           "--amp", "--amp-dtype", PRECISION[args.precision][1], "--opt", "adamw",
           "--num-bench-iter", str(args.steps), "--num-warm-iter", "10"]
    proc = subprocess.run(cmd, cwd=args.timm, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    m = re.findall(r'"train_samples_per_sec":\s*([\d.]+)', out)
    if proc.returncode or not m:
        sys.exit(f"timm's benchmark.py failed:\n{out[-3000:]}")
    return float(m[-1])


# ---- the loader alone: ImageNet-sized JPEGs, decode + the imagenet augmentation, one process
def make_jpegs(root: Path, n: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        small = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)  # smooth content compresses like a photo
        Image.fromarray(small).resize((500, 375), Image.BICUBIC).save(d / f"{i}.jpg", quality=90)


def loader_images_per_s(n: int):
    """(images/s of the training transform in one process, as one loader worker, the last image it made)."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from attnlab.config import CONF_DIR

    root = scratch_folder("attnlab_jpegs_")
    make_jpegs(root, n)
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose("train", overrides=["data=imagefolder", f"data.root={root}", "data.num_workers=0",
                                          "data.batch_size=32", "data.val_fraction=0.05", "data.test_fraction=0.05",
                                          "data.num_classes=null", "data.augment.auto_augment=rand-m9-mstd0.5",
                                          "data.augment.re_prob=0.25", "data.augment.scale=[0.08,1.0]"])
    dm = instantiate(cfg.data, _convert_="all")
    dm.setup("fit")
    ds = dm.train_set
    ds[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker, which runs torch on one thread
    try:
        start = time.perf_counter()
        for i in range(len(ds)):
            ds[i]
        return len(ds) / (time.perf_counter() - start), ds[0][0]
    finally:
        torch.set_num_threads(threads)


def batch_megabytes(image, batch_size: int = 128) -> tuple[float, float]:
    """What a batch of these images moves through pinned memory and PCIe: as the loader gives it, and as float32."""
    return batch_size * image.numel() * image.element_size() / 1e6, batch_size * image.numel() * 4 / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timm", type=Path, default=None, help="a checkout of the timm repository (its benchmark.py)")
    p.add_argument("--models", nargs="+", default=["vit_base", "swin"], choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--precision", choices=sorted(PRECISION), default="bf16", help="autocast dtype, both sides")
    p.add_argument("--loader", action="store_true", help="the ImageNet loader alone on this CPU, per worker")
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--tiny", action="store_true", help="a tiny ViT on CPU: checks the script, measures nothing")
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args()
    os.environ.setdefault("ATTNLAB_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    if args.loader:
        rate, image = loader_images_per_s(args.images)
        print(f"ImageNet loader (500x375 JPEG decode, RandomResizedCrop 224, flip, RandAugment m9, to {image.dtype}; "
              f"normalization and random erasing on the device), one worker on this CPU: {rate:.1f} images/s")
        sent, as_float = batch_megabytes(image, args.batch_size)
        print(f"  a batch of {args.batch_size} {tuple(image.shape)} images to the device: {sent:.1f} MB "
              f"(float32: {as_float:.1f} MB)")
        for name, need in (("ViT-B/16 on an RTX 3090 (timm, AMP)", 391), ("Swin-T on an RTX 3090 (timm, AMP)", 647),
                           ("ResNet-50 on an A100 (timm train.py)", 1923)):
            print(f"  {name}: {need} images/s -> data.num_workers >= {math.ceil(need / rate)}")
        return
    if args.tiny:
        args.models, args.batch_size, args.steps, args.window = ["vit_tiny"], 4, 8, 2
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.tiny else "CPU"
    print(f"training images/s on {name}, batch {args.batch_size}")
    for model in args.models:
        ours = attnlab_row(model, args, scratch_folder("attnlab_vision_") / "run")
        line = f"  {model} ({MODELS[model]}): attnlab {ours:,.1f}"
        if args.timm and not args.tiny:
            ref = timm_row(model, args)
            line += f", timm benchmark.py {ref:,.1f}, ratio {ours / ref:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
