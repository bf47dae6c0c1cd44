"""The U-Net membrane recipe end to end: trains `experiment=unet_membrane` through train.py's code path and prints
steps, wall time, validation mIoU, pixel accuracy and Rand error (the ISBI 2012 challenge's score: the adapted Rand
error of the cells; 0 is perfect).

    OMP_NUM_THREADS=2 python benchmarks/unet_membrane.py [overrides ...]

Reads the slices from $ATTNLAB_DATA_DIR/isbi2012_em_membrane (default: ../shared/data); writes into a temporary
folder unless `--out DIR` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ATTNLAB_DATA_DIR", str(ROOT.parent / "shared" / "data"))

from attnlab.cli.training import train  # noqa: E402
from attnlab.config import compose_run  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None, help="run directory (default: a temporary folder)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.max_epochs=10")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "run"
        cfg = compose_run(["experiment=unet_membrane", "callbacks.progress_bar=null", "logger=csv",
                           "extras.print_config=false", *args.overrides], out, log_dir=out / "logs",
                          cache_dir=out.parent / "cache")
        start = time.perf_counter()
        train(cfg)
        elapsed = time.perf_counter() - start
        metrics = json.loads((out / "metrics.json").read_text())
        import pandas as pd
        import torch

        df = pd.read_csv(out / "csv" / "metrics.csv")
        val = df.dropna(subset=["val/miou"])[["epoch", "step", "val/miou", "val/pixel_acc", "val/rand_error"]]
        steps = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    print("\nvalidation by epoch:")
    print(val.to_string(index=False))
    print("\n| steps | wall time | val mIoU (last) | val mIoU (best) | pixel acc (last) | Rand error (last) "
          "| threads |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {steps} | {elapsed / 60:.1f} min | {val['val/miou'].iloc[-1]:.4f} | {metrics['val/miou_best']:.4f} | "
          f"{val['val/pixel_acc'].iloc[-1]:.4f} | {val['val/rand_error'].iloc[-1]:.4f} | "
          f"{os.environ.get('OMP_NUM_THREADS', 'all')} |")


if __name__ == "__main__":
    main()
