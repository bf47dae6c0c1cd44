"""Image splits as LitData shards: the image files' bytes as they are (JPEG stays JPEG) in large chunk files with an
index, for clusters where reading a million small files per epoch from shared storage starves the GPUs.

`python -m attnlab.data.prepare shards <image tree> <out>` (`convert`) reads the splits exactly as `data=imagefolder`
(or `--data imagenet`: `data=imagenet`) would read that tree, and writes each with LitData's `optimize` into
`<out>/<split>/` (`index.json` and `chunk-*.bin`, each sample `(file bytes, class index)`), then `<out>/
attnlab_shards.json` last: the class names, the split sizes and how the splits were drawn. A folder without it is an
interrupted conversion, which a new one overwrites. Each split is written in a seeded random order: LitData shuffles
the order of the chunks and the items within a chunk (on parallel file systems only within a window of chunks), and
the tree's own order is by class. `data.format=shards data.root=<out>` reads them (shard_loader.py).
The format and what a reader checks of it: shard_format.py.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from attnlab.data.formats.shard_format import META, is_remote, litdata, read_json, split_dir
from attnlab.errors import UserError

log = logging.getLogger("attnlab")

# ---- conversion
def _read_sample(sample: tuple[str, int]) -> tuple[bytes, int]:
    """One sample of a shard: the file's bytes as they are, and its class index (run in LitData's workers)."""
    path, label = sample
    with open(path, "rb") as f:
        return f.read(), int(label)


def _samples(ds) -> list[tuple[str, int]]:
    """The (file, class index) samples of a split that an image data module built (FileImages, or a Transformed
    view of one)."""
    from attnlab.data.images.base import FileImages, Transformed

    if isinstance(ds, FileImages):
        return list(ds.samples)
    if isinstance(ds, Transformed) and isinstance(ds.base, FileImages):
        idx = ds.indices if ds.indices is not None else range(len(ds.base))
        return [ds.base.samples[i] for i in idx]
    raise UserError(f"this data's splits are not image files ({type(ds).__name__}), which the shard conversion "
                    "reads: convert a folder of images (data=imagefolder) or ImageNet's files.")


def source_module(data: str, src: Path, val_fraction: float | None, test_fraction: float | None, seed: int):
    """The data module that reads `src` as a run would (`data=imagefolder` or `data=imagenet`), set up."""
    from attnlab.data.images.imagefolder import ImageFolderDataModule
    from attnlab.data.images.imagenet import ImageNetDataModule

    cls = {"imagefolder": ImageFolderDataModule, "imagenet": ImageNetDataModule}[data]
    fractions = {k: v for k, v in (("val_fraction", val_fraction), ("test_fraction", test_fraction)) if v is not None}
    extra = {"num_classes": None} if data == "imagenet" else {}
    dm = cls(root=str(src), seed=seed, num_workers=0, **fractions, **extra)
    if getattr(dm, "source", "folder") != "folder":
        raise UserError("the shard conversion reads image files: data.source=hf is not a folder of images.")
    dm.prepare_data()
    dm.setup()
    return dm


def convert(src: Path, out: str, data: str = "imagefolder", val_fraction: float | None = None,
            test_fraction: float | None = None, seed: int = 42, chunk_bytes: str = "64MB",
            workers: int | None = None) -> dict:
    """Write the splits of the image tree `src` as LitData shards under `out` (see the module doc). -> the record."""
    ld = litdata()
    if is_remote(out):
        raise UserError(f"{out}: the conversion writes to a local or shared folder; copy that folder to object "
                        "storage afterwards (e.g. `aws s3 sync <out> s3://bucket/path`), and runs read it there "
                        "with data.root=s3://bucket/path.")
    if (Path(out) / META).is_file():
        raise UserError(f"{out} already holds converted shards ({META}): delete the folder, or write to another "
                        "one.")
    if Path(out).resolve() == Path(src).resolve():
        raise UserError(f"write the shards to another folder than the images ({src}).")
    dm = source_module(data, src, val_fraction, test_fraction, seed)
    train, val, test = dm.train_set, dm.val_set, dm.test_set
    splits = {"train": _samples(train), "val": _samples(val)}
    if test is not val:
        splits["test"] = _samples(test)
    import numpy as np

    from attnlab.utils.cpus import usable_cpus

    record: dict[str, Any] = {"format": "attnlab image shards (LitData)", "version": 1, "data": data,
                              "source": str(Path(src).resolve()), "class_names": list(dm.class_names),
                              "channels": int(dm.channels), "val_fraction": dm.val_fraction,
                              "test_fraction": dm.test_fraction, "seed": seed, "splits": {},
                              "test_is_validation": test is val,
                              "benchmark_split": getattr(dm, "benchmark_split", "") or "",
                              "litdata": ld.__version__}
    import multiprocessing

    # forked writers start at once; spawned ones import torch again (seconds each)
    start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    for offset, (split, samples) in enumerate(splits.items()):
        order = np.random.default_rng([seed, offset]).permutation(len(samples))  # the tree's order is by class
        ordered = [samples[i] for i in order]
        start, n_workers = time.perf_counter(), max(1, min(workers or usable_cpus(), len(ordered)))
        ld.optimize(fn=_read_sample, inputs=ordered, output_dir=split_dir(out, split), chunk_bytes=chunk_bytes,
                    num_workers=n_workers, reorder_files=False, keep_data_ordered=True, mode="overwrite",
                    verbose=False, start_method=start_method)
        index = read_json(split_dir(out, split), "index.json") or {}
        record["splits"][split] = {"samples": len(ordered), "chunks": len(index.get("chunks", []))}
        log.info("%s: %d images in %d chunks (%.0f s)", split, len(ordered), record["splits"][split]["chunks"],
                 time.perf_counter() - start)
    _write_meta(out, record)
    return record


def _write_meta(out: str, record: dict) -> None:
    from attnlab.utils.atomic import write_text

    write_text(Path(out) / META, json.dumps(record, indent=1) + "\n")


# ---- python -m attnlab.data.prepare shards
def add_command(sub) -> None:
    """The `shards` subcommand of `python -m attnlab.data.prepare` (an argparse subparsers object)."""
    p = sub.add_parser("shards", help="write an image folder's splits as LitData shards (data.format=shards)",
                       description="Write the splits of an image folder, as data=imagefolder (or data=imagenet) reads "
                                   "them, as LitData shards: the files' bytes as they are, in chunks of about "
                                   "--chunk-bytes, each split in a seeded random order. Then: data.format=shards "
                                   "data.root=<out>.")
    p.add_argument("src", type=Path, help="the image folder: <class>/<image> or {train,val,test}/<class>/<image> "
                                          "(with --data imagenet: what data=imagenet's data.root holds)")
    p.add_argument("out", help="the folder the shards go to (copy it to object storage afterwards if you like)")
    p.add_argument("--data", choices=("imagefolder", "imagenet"), default="imagefolder",
                   help="which data config reads src (default: imagefolder)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="of train/ into validation where src has no val/ folder (default: the data config's)")
    p.add_argument("--test-fraction", type=float, default=None,
                   help="of train/ into a test split where src has no test/ folder (default: the data config's)")
    p.add_argument("--seed", type=int, default=42, help="draws the splits and the order written (default: 42)")
    p.add_argument("--chunk-bytes", default="64MB", help="the size of a chunk file (default: 64MB)")
    p.add_argument("--workers", type=int, default=None, help="processes writing (default: one per CPU)")


def command(args) -> None:
    record = convert(args.src, args.out, data=args.data, val_fraction=args.val_fraction,
                     test_fraction=args.test_fraction, seed=args.seed, chunk_bytes=args.chunk_bytes,
                     workers=args.workers)
    counts = ", ".join(f"{split} {s['samples']:,} images in {s['chunks']:,} chunks"
                       for split, s in record["splits"].items())
    print(f"shards ready ({counts}): data={args.data} data.format=shards data.root={args.out}", flush=True)
