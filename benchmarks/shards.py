"""Shards against the image folder they were made from, on the same disk: files opened per epoch, time to the first
batch and images/s of the training loader from a cold page cache, alternated in one run.

    python benchmarks/shards.py [--images 3000] [--workers 2] [--batch 64] [--rounds 3] [--root DIR]

The tree: `--images` JPEGs of 500x375 pixels of 1/f noise, about 90 KiB each, like ImageNet's
(benchmarks/imagenet_loader.py's `make_tree`), in `train/<wnid>/` folders of 10 classes, made once in `--root`
(default: a folder under the system's temp dir); the shards: `python -m attnlab.data.prepare shards` of it (timed),
beside it. Each measurement is one epoch of `data=imagefolder`'s training loader (`data.format=folder`, then
`data.format=shards`) in a new process, after the files of both are evicted from the page cache
(`posix_fadvise(POSIX_FADV_DONTNEED)` on each file; a VM's host may still hold them in its own cache). Two
pipelines: `read`, each sample's file bytes read and nothing else (what the storage costs), and `train`, each
decoded by Pillow and given data=imagefolder's training transform at 224 px (RandAugment: what a CPU costs), the
same work for both (the folder's own reading through file_transforms.py is left out). Files opened: the
`openat` calls under the data's folder during one epoch of each (`strace -f`, untimed), loader workers included.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from imagenet_loader import make_tree  # noqa: E402  (the same ImageNet-like JPEGs)


def evict(folder: Path) -> int:
    """Drop every file under `folder` from the page cache. -> the number of files."""
    os.sync()  # dirty pages are not dropped
    n = 0
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            n += 1
    return n


class ReadOnly:
    """A transform that reads the encoded image and decodes nothing: its size in bytes."""

    def from_path(self, path, mode="RGB"):
        import torch

        with open(path, "rb") as f:
            return torch.tensor(len(f.read()))

    def from_bytes(self, data, mode="RGB"):
        import torch

        return torch.tensor(len(data))

    def __call__(self, img):
        raise TypeError("ReadOnly reads files or bytes only")


class Decoded:
    """The training transform of a decoded image, and nothing else (no `from_path`, no `from_bytes`)."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, img):
        return self.transform(img)


def data_module(kind: str, root: Path, args):
    from omegaconf import OmegaConf

    from attnlab.data.images.imagefolder import ImageFolderDataModule

    augment = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "data" / "imagefolder.yaml").augment)
    dm = ImageFolderDataModule(root=str(root / ("tree" if kind == "folder" else "shards")), format=kind,
                               val_fraction=0.05, test_fraction=0.0, image_size=224, batch_size=args.batch,
                               num_workers=args.workers, seed=0, augment=augment, pin_memory=False)
    if args.pipeline == "read":
        dm.train_transform = ReadOnly
    else:  # decoded by Pillow, then the timm transform, for both (not file_transforms' reading of files)
        transform = dm.train_transform()
        dm.train_transform = lambda: Decoded(transform)
    dm.setup()
    return dm


def one_epoch(kind: str, root: Path, args) -> dict:
    """One epoch of the training loader, timed from its creation."""
    dm = data_module(kind, root, args)
    start = time.perf_counter()
    batches = iter(dm.train_dataloader())
    images = len(next(batches)[1])
    first = time.perf_counter() - start
    for _, y in batches:
        images += len(y)
    whole = time.perf_counter() - start
    return {"first_batch_s": first, "images": images, "images_per_s": images / whole}


def child(kind: str, args, strace: Path | None = None) -> dict:
    argv = [sys.executable, __file__, "--child", kind, "--root", str(args.root), "--workers", str(args.workers),
            "--batch", str(args.batch), "--pipeline", args.pipeline]
    if strace is not None:  # stopping at the traced calls alone where the kernel filters them (seccomp-bpf)
        argv = ["strace", "-f", "-qq", *_seccomp(), "-e", "trace=openat,open", "-o", str(strace), *argv]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{kind} ({args.pipeline}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@functools.cache
def _seccomp() -> list[str]:
    probe = subprocess.run(["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-o", os.devnull, "true"],
                           capture_output=True)
    return ["--seccomp-bpf"] if probe.returncode == 0 else []


def opens(kind: str, args) -> int | None:
    """openat calls under the data's folder in one epoch (strace), the setup's included."""
    if shutil.which("strace") is None:
        return None
    folder = args.root / ("tree" if kind == "folder" else "shards")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "strace.log"
        child(kind, args, strace=log)
        return sum(1 for line in log.read_text(errors="replace").splitlines()
                   if str(folder) in line and "ENOENT" not in line and "O_DIRECTORY" not in line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "attnlab_shards_benchmark")
    p.add_argument("--pipelines", nargs="+", default=["read", "train"], choices=["read", "train"])
    p.add_argument("--out", type=Path, default=None, help="also write the numbers here (JSON)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--pipeline", default="read", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_epoch(args.child, args.root, args)))
        return

    tree = make_tree(args.root / "tree", args.images)
    files = sorted((tree / "train").rglob("*.JPEG"))
    if len(files) != args.images:
        raise SystemExit(f"{tree} holds {len(files)} images, not --images {args.images}: use another --root")
    size = sum(f.stat().st_size for f in files)
    shards = args.root / "shards"
    conversion = None
    if not (shards / "attnlab_shards.json").is_file():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "attnlab.data.prepare", "shards", str(tree), str(shards),
                        "--val-fraction", "0.05", "--test-fraction", "0", "--seed", "0", "--workers",
                        str(max(1, args.workers))], check=True, cwd=ROOT)
        conversion = time.perf_counter() - start
    chunks = sorted((shards / "train").glob("*.bin"))
    print(f"{len(files):,} JPEGs, {size / len(files) / 1024:.0f} KiB each on average; shards: "
          f"{len(chunks)} training chunks of {sum(c.stat().st_size for c in chunks) / len(chunks) / 2**20:.0f} MiB"
          + (f"; conversion {conversion:.0f} s ({len(files) / conversion:.0f} images/s, start-up included)"
             if conversion else ""), flush=True)

    results: dict = {"images": len(files), "mean_kib": size / len(files) / 1024, "chunks": len(chunks),
                     "conversion_s": conversion, "workers": args.workers, "batch": args.batch, "pipelines": {}}
    for pipeline in args.pipelines:
        args.pipeline = pipeline
        runs: dict[str, list[dict]] = {"folder": [], "shards": []}
        for r in range(args.rounds):
            for kind in (("folder", "shards") if r % 2 == 0 else ("shards", "folder")):
                evict(args.root)
                runs[kind].append(child(kind, args))
        row = {kind: {"opens": opens(kind, args),
                      "first_batch_s": statistics.median(m["first_batch_s"] for m in ms),
                      "images_per_s": statistics.median(m["images_per_s"] for m in ms),
                      "rounds": ms} for kind, ms in runs.items()}
        row["ratio"] = statistics.median(s["images_per_s"] / f["images_per_s"]
                                         for f, s in zip(runs["folder"], runs["shards"]))
        results["pipelines"][pipeline] = row
        print(f"\n{pipeline}: {args.workers} workers, batch {args.batch}, {args.rounds} rounds alternated, cold cache")
        print("| | files opened per epoch | first batch (s) | images/s |")
        print("|---|---:|---:|---:|")
        for kind in ("folder", "shards"):
            k = row[kind]
            print(f"| {kind} | {k['opens'] if k['opens'] is not None else 'n/a'} | {k['first_batch_s']:.2f} | "
                  f"{k['images_per_s']:.0f} |")
        print(f"shards / folder, median of the rounds' ratios: {row['ratio']:.2f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
