"""data.decode=gpu against data.decode=cpu on one GPU machine: images/s of `data=imagenet`'s training batches reaching
the GPU, alone and feeding Swin-T's training step, alternated in one run. [GPU]

    python benchmarks/gpu_decode.py [--images 4096] [--workers 8] [--batch 128] [--rounds 3] [--out FILE]
    python benchmarks/gpu_decode.py --transfer-only [...]   # any machine: the workers' batches of bytes alone

The tree is benchmarks/imagenet_loader.py's: JPEGs of 500x375 pixels of 1/f noise, about 90 KiB each, like a photo's.
Both sides apply the same recipe, Swin-T's without what runs on PIL images only (RandAugment, which decode=gpu refuses):
RandomResizedCrop 224 (scale 0.08-1, bicubic), horizontal flip, then normalization and random erasing (0.25, `pixel`)
on the GPU. `cpu`: the loader workers decode, crop, flip and resize (Pillow), a uint8 batch crosses PCIe;
`gpu`: the workers read the files' bytes, the batch's JPEGs are decoded by nvJPEG onto the GPU in one call, cropped,
resized and flipped there, as the step takes each batch (`data.decode_ahead=0`); `gpu, 2 ahead`: the same, two
batches ahead of the step on a thread and a CUDA stream of their own (`data.decode_ahead=2`, the default). Each
timing is one epoch, from its first batch to its last, after a warm-up epoch; the loader's workers are persistent.
`loader`: each batch into a trivial step (its mean read once); `swin-t`: each batch into Swin-T's training step
(timm's swin_tiny_patch4_window7_224, bf16 autocast, channels-last, fused AdamW). `model`: Swin-T's step on one
batch already on the GPU, the rate the loader must keep up with.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from imagenet_loader import machine, make_tree  # noqa: E402  (the same ImageNet-like JPEGs)

RECIPE = {"scale": [0.08, 1.0], "hflip": 0.5, "auto_augment": None, "interpolation": "bicubic", "re_prob": 0.25,
          "re_mode": "pixel", "re_count": 1, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


# the sides: data.decode, data.decode_ahead
SIDES = {"cpu": ("cpu", 0), "gpu": ("gpu", 0), "gpu, 2 ahead": ("gpu", 2)}


def data_module(root: Path, side: str, args):
    from attnlab.data.images.imagefolder import ImageFolderDataModule

    decode, ahead = SIDES[side]
    dm = ImageFolderDataModule(root=str(root), decode=decode, decode_ahead=ahead, augment=RECIPE, image_size=224,
                               val_fraction=0.02, test_fraction=0.0, batch_size=args.batch, num_workers=args.workers,
                               pin_memory=True, seed=0)
    dm.setup("fit")
    loader = dm.train_dataloader()
    dm.trainer = SimpleNamespace(training=True)  # on_after_batch_transfer: training's crop and erasing
    device = torch.device("cuda")
    if ahead:
        dm.decode_ahead_on(loader, device)  # as train_dataloader() does under a trainer on a GPU

    def batches(epoch: int):
        loader.sampler.set_epoch(epoch)
        for batch in loader:  # as Lightning moves a batch: the data module's transfer, then on_after_batch_transfer
            yield dm.on_after_batch_transfer(dm.transfer_batch_to_device(batch, device, 0), 0)

    return batches


def swin_step(batch_size: int):
    import timm

    model = timm.create_model("swin_tiny_patch4_window7_224", num_classes=1000)
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y % 1000)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    x = torch.randn(batch_size, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch_size,), device="cuda")
    for _ in range(5):
        step(x, y)
    torch.cuda.synchronize()
    start, n = time.perf_counter(), 30
    for _ in range(n):
        step(x, y)
    torch.cuda.synchronize()
    return step, n * batch_size / (time.perf_counter() - start)


def same_as_on_the_cpu(root: Path, n: int = 32) -> float:
    """The mean absolute difference, in levels, of the evaluation crops of `n` files decoded by nvJPEG on the GPU
    and by libjpeg-turbo on the CPU (the same crop): the decoders' own rounding."""
    from attnlab.data.images.device_decode import DeviceDecoder, EncodedFile

    files = sorted((root / "train").rglob("*.JPEG"))[:n]
    decoder, encoded = DeviceDecoder(224, 3, RECIPE), [EncodedFile().from_path(str(f)) for f in files]
    on_gpu = decoder(decoder.to_device(encoded, torch.device("cuda")), train=False).cpu()
    on_cpu = decoder(decoder.to_device(encoded, torch.device("cpu")), train=False)
    return float((on_gpu.float() - on_cpu.float()).abs().mean())


def decode_and_crop_times(root: Path, batch: int, repeats: int = 10) -> dict[str, float]:
    """Milliseconds per batch of decode=gpu's two parts on the GPU, each synchronized: nvJPEG's decode of `batch`
    files, and the training crops of the decoded batch; and the host's time to issue the crops' kernels."""
    from attnlab.data.images.device_decode import DeviceDecoder, EncodedFile

    files = sorted((root / "train").rglob("*.JPEG"))[:batch]
    decoder, encoded = DeviceDecoder(224, 3, RECIPE), [EncodedFile().from_path(str(f)) for f in files]
    device, times = torch.device("cuda"), {"decode": [], "crop": [], "crop, host": []}
    for _ in range(repeats + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        decoded = decoder.to_device(encoded, device)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        decoder.train_batch(decoded)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        for name, ms in (("decode", t1 - t0), ("crop", t3 - t1), ("crop, host", t2 - t1)):
            times[name].append(1000 * ms)
    return {name: statistics.median(v[2:]) for name, v in times.items()}


def transfer_rates(root: Path, args) -> dict[str, list[float]]:
    """decode=gpu's training loader without a GPU: images/s of the workers' batches (each file read, its header
    parsed) reaching the step, the JPEGs' bytes in one tensor per batch (EncodedBatch) against one tensor per image;
    alternated, one epoch each after a warm-up epoch."""
    from attnlab.data.images.device_decode import collate
    from attnlab.data.images.imagefolder import ImageFolderDataModule

    def per_image(samples):
        images, labels = zip(*samples)
        return list(images), torch.tensor(labels)

    loaders = {}
    for name, fn in (("one tensor per batch", collate), ("one tensor per image", per_image)):
        dm = ImageFolderDataModule(root=str(root), decode="gpu", augment=RECIPE, image_size=224, val_fraction=0.02,
                                   test_fraction=0.0, batch_size=args.batch, num_workers=args.workers, seed=0)
        dm.collate_fn = lambda train, fn=fn: fn
        dm.setup("fit")
        loaders[name] = dm.train_dataloader()
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for r in range(args.rounds + 1):
        for name in (list(loaders) if r % 2 == 0 else list(reversed(loaders))):
            loaders[name].sampler.set_epoch(r)
            images, start = 0, time.perf_counter()
            for _, labels in loaders[name]:
                images += len(labels)
            if r:
                rates[name].append(images / (time.perf_counter() - start))
    return rates


def timed_epoch(batches, epoch: int, step) -> float:
    images, start = 0, None
    for x, y in batches(epoch):
        if start is None:
            torch.cuda.synchronize()
            start = time.perf_counter()
        else:
            images += len(y)
        if step is None:
            x.float().mean().item()
        else:
            step(x, y)
    torch.cuda.synchronize()
    return images / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "attnlab-imagenet-like")
    p.add_argument("--out", type=Path, default=None, help="also write the numbers here (JSON)")
    p.add_argument("--transfer-only", action="store_true",
                   help="without a GPU: the workers' batches of JPEG bytes reaching the step, one tensor per batch "
                        "against one per image")
    args = p.parse_args()
    if args.transfer_only:
        rates = transfer_rates(make_tree(args.root, args.images), args)
        print(f"{args.images} JPEGs, {args.workers} workers, batch {args.batch}, {args.rounds} rounds alternated; "
              f"{machine()}")
        for name, r in rates.items():
            print(f"| {name} | {statistics.median(r):,.0f} ({', '.join(f'{v:,.0f}' for v in r)}) |")
        return
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu_decode.py needs a CUDA GPU (it measures nvJPEG's decoding)")
    root = make_tree(args.root, args.images)
    diff = same_as_on_the_cpu(root)
    print(f"nvJPEG against libjpeg-turbo, the same evaluation crops: {diff:.2f} levels apart on average")
    parts = decode_and_crop_times(root, args.batch)
    print(f"decode=gpu, one batch of {args.batch}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in parts.items()))
    sides = {side: data_module(root, side, args) for side in SIDES}
    step, model_rate = swin_step(args.batch)
    rates: dict[str, dict[str, list[float]]] = {d: {"loader": [], "swin-t": []} for d in sides}
    for side, batches in sides.items():  # warm-up: the workers started, cuDNN and nvJPEG initialized
        timed_epoch(batches, 0, step)
    for r in range(args.rounds):
        for side in (list(SIDES) if r % 2 == 0 else list(reversed(SIDES))):
            for kind in ("loader", "swin-t"):
                rates[side][kind].append(timed_epoch(sides[side], 1 + r, None if kind == "loader" else step))
    gpu = torch.cuda.get_device_name()
    print(f"\n{args.images} JPEGs (500x375), {args.workers} workers, batch {args.batch}, {args.rounds} rounds "
          f"alternated; {gpu}, {machine()}; Swin-T's step alone: {model_rate:.0f} images/s")
    print("| data.decode, decode_ahead | loader, images/s | feeding Swin-T, images/s | Swin-T kept fed |")
    print("|---|---:|---:|---|")
    for decode, r in rates.items():
        loader, fed = statistics.median(r["loader"]), statistics.median(r["swin-t"])
        print(f"| {decode} | {loader:,.0f} ({', '.join(f'{v:,.0f}' for v in r['loader'])}) | {fed:,.0f} "
              f"({', '.join(f'{v:,.0f}' for v in r['swin-t'])}) | {'yes' if fed >= 0.95 * model_rate else 'no'} "
              f"({fed / model_rate:.0%}) |")
    ratio = statistics.median(g / c for g, c in zip(rates["gpu"]["loader"], rates["cpu"]["loader"]))
    print(f"gpu / cpu, loader alone, median of the rounds' ratios: {ratio:.2f}")
    fed = statistics.median(g / c for g, c in zip(rates["gpu, 2 ahead"]["swin-t"], rates["cpu"]["swin-t"]))
    print(f"gpu 2 ahead / cpu, feeding Swin-T, median of the rounds' ratios: {fed:.2f}")
    if args.out:
        args.out.write_text(json.dumps({"gpu": gpu, "machine": machine(), "model_images_per_s": model_rate,
                                        "gpu_vs_cpu_decode_levels": diff, "batch_ms": parts,
                                        "rates": rates, "ratio": ratio, "fed_ratio": fed, "args": {k: str(v) for k, v in
                                                                               vars(args).items()}}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
