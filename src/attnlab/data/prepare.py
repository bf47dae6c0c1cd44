"""`python -m attnlab.data.prepare <dataset> ...`: the one-time preparation of a dataset as it was downloaded, ahead of
the first run (a run does the same on first use, but a cluster job should not spend its GPUs' time on it).

`python -m attnlab.data.prepare imagenet <dir> [--out <dir>] [--workers N]`: image-net.org's three ILSVRC2012 files
in <dir> extracted into <out>/train/<wnid>/ and <out>/val/<wnid>/ (validation images sorted by the devkit's ground
truth), the counts checked against the devkit's; then `data=imagenet data.root=<out>`. Kaggle's copy and an extracted
tree need nothing: the command checks them and says what it found.

`python -m attnlab.data.prepare shards <image folder> <out> [--data imagenet]`: the splits of an image folder (or of
ImageNet as data=imagenet reads it) written as LitData shards (shards.py); then `data.format=shards data.root=<out>`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger("attnlab")


def imagenet(root: Path, out: Path | None, workers: int | None) -> None:
    from attnlab.data.images.imagenet import ImageNetDataModule
    from attnlab.data.formats.imagenet_prepare import prepare_imagenet

    dm = ImageNetDataModule(root=str(root), prepared=str(out) if out else None, num_classes=None)
    if dm.splits is None:
        prepare_imagenet(root, dm.layout.out, workers=workers)
        dm = ImageNetDataModule(root=str(root), prepared=str(out) if out else None, num_classes=None)
    elif dm.layout.kind != "prepared":
        log.info("%s holds ImageNet in the %s layout, which runs read as it is: nothing to extract", root,
                 dm.layout.kind)
    where = dm.layout.out if dm.layout.kind in ("prepared", "tree") else root
    print(f"ImageNet-1k ready: data=imagenet data.root={where} ({len(dm.splits['train']):,} training images in "
          f"{len(dm.class_names):,} classes, {len(dm.splits.get('val', [])):,} validation images)", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnlab.data.prepare",
                                     description="Prepare a dataset as downloaded for attnlab's data configs, once.")
    sub = parser.add_subparsers(dest="dataset", required=True)
    p = sub.add_parser("imagenet", help="extract the ILSVRC2012 archives (or check Kaggle's copy or a tree)")
    p.add_argument("root", type=Path, help="the folder holding ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and "
                                           "ILSVRC2012_devkit_t12.tar.gz (or Kaggle's copy, or train/ and val/)")
    p.add_argument("--out", type=Path, default=None, help="where train/ and val/ go (default: the same folder)")
    p.add_argument("--workers", type=int, default=None, help="classes extracted at once (default: up to 8)")
    from attnlab.data.formats import shards

    shards.add_command(sub)  # python -m attnlab.data.prepare shards <image folder> <out>
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from attnlab.errors import fail_before_hydra

    if args.dataset == "imagenet":
        fail_before_hydra(imagenet, args.root, args.out, args.workers)
    elif args.dataset == "shards":
        fail_before_hydra(shards.command, args)


if __name__ == "__main__":
    main()
