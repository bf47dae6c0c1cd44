"""Every GPU comparison in one run, one table: GPT-2 124M against nanoGPT's bench.py, ViT-B/16 and Swin-T against
timm's benchmark.py (bf16 on both sides), `trainer=ddp` against `trainer=gpu` on one card, and the image loader's
images/s per worker against what the card trains. Each pair is run `--repeats` times alternated (ours, theirs,
ours, ...) and the medians are compared.

    python benchmarks/gpu_check.py --nanogpt /tmp/nanoGPT --timm /tmp/pytorch-image-models [--out results.json]
    python benchmarks/gpu_check.py --tiny        # any machine: tiny models on CPU, the script's own check

benchmarks/gpu_check.sh wraps it for a GPU machine without a package index (wheels from ../shared/tools/gpu-wheels.sh).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

from attnlab.utils.atomic import scratch_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpt2_gpu  # noqa: E402
import vision_gpu  # noqa: E402


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def alternate(ours, theirs, repeats: int) -> tuple[list, list]:
    """ours(), theirs() alternated `repeats` times; theirs may be None (no reference given)."""
    a, b = [], []
    for _ in range(repeats):
        a.append(ours())
        if theirs is not None:
            b.append(theirs())
    return a, b


def run_dir() -> Path:
    return scratch_folder("attnlab_gpu_check_") / "run"


def gpt_row(args) -> dict:
    g = argparse.Namespace(batch_size=12, block_size=1024, steps=args.steps, window=10, tiny=args.tiny,
                           nanogpt=args.nanogpt, overrides=[])
    if args.tiny:
        g.block_size, g.batch_size, g.steps, g.window = 64, 4, 8, 2
    peak = args.peak
    ours, theirs = alternate(lambda: gpt2_gpu.attnlab_row(g, run_dir()),
                             (lambda: gpt2_gpu.nanogpt_row(g, peak)) if args.nanogpt and not args.tiny else None,
                             args.repeats)
    row = {"run": "GPT (1 layer, fp32, CPU)" if args.tiny else
           f"GPT-2 124M, batch {g.batch_size}x{g.block_size}, bf16, compile, fused AdamW",
           "unit": "tokens/s", "ours": median([r["tokens_per_s"] for r in ours]),
           "ours_all": [r["tokens_per_s"] for r in ours], "mfu": median([r["mfu"] or 0 for r in ours]),
           "reference": "nanoGPT bench.py", "goal": 1.0}
    if theirs:
        row |= {"theirs": median([r["tokens_per_s"] for r in theirs]),
                "theirs_all": [r["tokens_per_s"] for r in theirs],
                "theirs_mfu": median([r["mfu"] or 0 for r in theirs])}
    return row


def vision_args(args, batch: int) -> argparse.Namespace:
    v = argparse.Namespace(batch_size=batch, steps=args.steps, window=10, tiny=args.tiny, timm=args.timm,
                           precision="bf16", overrides=[])
    if args.tiny:
        v.batch_size, v.steps, v.window = 4, 8, 2
    return v


def vision_row(args, model: str) -> dict:
    v = vision_args(args, 128)
    name = "vit_tiny" if args.tiny else model
    ours, theirs = alternate(lambda: vision_gpu.attnlab_row(name, v, run_dir()),
                             (lambda: vision_gpu.timm_row(name, v)) if args.timm and not args.tiny else None,
                             args.repeats)
    row = {"run": f"{vision_gpu.MODELS[name]}, batch {v.batch_size}, {'fp32' if args.tiny else 'bf16'}",
           "unit": "images/s",
           "ours": median(ours), "ours_all": ours, "reference": "timm benchmark.py --bench train", "goal": 0.95}
    if theirs:
        row |= {"theirs": median(theirs), "theirs_all": theirs}
    return row


def ddp_row(args) -> dict:
    """trainer=ddp on one device against trainer=gpu (on CPU: ddp_cpu with 1 process against cpu)."""
    v = vision_args(args, 128)
    name = "vit_tiny" if args.tiny else "vit_base"
    single, ddp = (["trainer=cpu"], ["trainer=ddp_cpu", "trainer.devices=1"]) if args.tiny else \
        (["trainer=gpu"], ["trainer=ddp", "trainer.devices=1"])
    ours, theirs = alternate(lambda: vision_gpu.attnlab_row(name, v, run_dir(), ddp),
                             lambda: vision_gpu.attnlab_row(name, v, run_dir(), single), min(args.repeats, 2))
    return {"run": f"{vision_gpu.MODELS[name]} under {ddp[0]} on 1 device", "unit": "images/s", "ours": median(ours),
            "ours_all": ours, "theirs": median(theirs), "theirs_all": theirs, "reference": f"attnlab {single[0]}",
            "goal": 0.97}


def loader_row(args, rows: list[dict]) -> dict:
    per_worker, image = vision_gpu.loader_images_per_s(24 if args.tiny else args.images)
    sent, as_float = vision_gpu.batch_megabytes(image)
    fastest = max((r["ours"] for r in rows if r["unit"] == "images/s" and "under" not in r["run"]), default=0.0)
    cores = os.cpu_count() or 1
    return {"run": "ImageNet loader (JPEG decode + RandAugment + crop, uint8 out), one worker", "unit": "images/s",
            "ours": per_worker, "ours_all": [per_worker], "reference": None, "goal": None,
            "note": f"{math.ceil(fastest / per_worker) if per_worker else '?'} workers feed the fastest row above "
                    f"({fastest:,.0f} images/s; this machine has {cores} cores); a batch of 128 is {sent:.0f} MB of "
                    f"{image.dtype} (float32: {as_float:.0f} MB)"}


def table(rows: list[dict], device: str) -> str:
    lines = [f"GPU check on {device} ({date.today()}; {versions()})", "",
             "| run | attnlab | reference | ratio | goal |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        ours = f"{r['ours']:,.0f} {r['unit']}" + (f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") else "")
        if r.get("theirs"):
            ref = f"{r['reference']}: {r['theirs']:,.0f}" + (f", MFU {100 * r['theirs_mfu']:.1f}%"
                                                              if r.get("theirs_mfu") else "")
            ratio = f"{r['ours'] / r['theirs']:.3f}"
        else:
            ref, ratio = r.get("note") or "not run", "n/a"
        goal = f">= {r['goal']}" if r.get("goal") else ""
        lines.append(f"| {r['run']} | {ours} | {ref} | {ratio} | {goal} |")
    return "\n".join(lines)


def versions() -> str:
    import lightning
    import timm
    import torch

    return f"torch {torch.__version__}, lightning {lightning.__version__}, timm {timm.__version__}, " \
           f"Python {platform.python_version()}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout (its bench.py and model.py)")
    p.add_argument("--timm", type=Path, default=None, help="a checkout of the timm repository (its benchmark.py)")
    p.add_argument("--repeats", type=int, default=3, help="alternated runs of each side; medians are compared")
    p.add_argument("--steps", type=int, default=50, help="training steps per run")
    p.add_argument("--images", type=int, default=192, help="JPEGs for the loader measurement")
    p.add_argument("--only", nargs="+", default=["gpt", "vit_base", "swin", "ddp", "loader"],
                   choices=["gpt", "vit_base", "swin", "ddp", "loader"])
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    p.add_argument("--tiny", action="store_true", help="tiny models on CPU: checks the script, measures nothing")
    args = p.parse_args()
    import torch

    from attnlab.utils.flops import device_peak_flops

    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.cuda.get_device_name() if cuda else "CPU"
    args.peak = device_peak_flops(torch.device("cuda"), "bf16-mixed") if cuda else None
    if args.tiny:  # one small ViT stands for both vision rows
        args.repeats = min(args.repeats, 2)
        args.only = [name for name in args.only if name != "swin"]
    rows: list[dict] = []
    failed: list[str] = []
    steps = {"gpt": lambda: gpt_row(args), "vit_base": lambda: vision_row(args, "vit_base"),
             "swin": lambda: vision_row(args, "swin"), "ddp": lambda: ddp_row(args),
             "loader": lambda: loader_row(args, rows)}
    for name in args.only:
        start = time.perf_counter()
        try:
            rows.append(steps[name]())
        except (Exception, SystemExit) as e:  # one failing comparison must not cost the others
            print(f"{name} failed: {e}", flush=True)
            failed.append(name)
            continue
        print(f"{name}: {json.dumps(rows[-1])} ({time.perf_counter() - start:.0f} s)", flush=True)
        if args.out:
            args.out.write_text(json.dumps({"device": device, "versions": versions(), "rows": rows}, indent=1))
    print(table(rows, device))
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
