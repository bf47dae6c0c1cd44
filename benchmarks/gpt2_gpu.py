"""GPT-2 124M training throughput on one GPU: attnlab's train.py against nanoGPT's bench.py, the same model, batch
and settings (block 1024, bf16-mixed, torch.compile, flash SDPA, fused AdamW, synthetic tokens), on the same card,
in one run.

    python benchmarks/gpt2_gpu.py --nanogpt /tmp/nanoGPT [--batch-size 12] [--steps 60]
    python benchmarks/gpt2_gpu.py --tiny         # any machine: a 1-layer model on CPU, the script's own check

nanoGPT's bench.py (real_data=False) comes from a nanoGPT checkout given by path (fetched into /tmp, never into this
project); its MFU is reported against an A100's 312 TFLOP/s whatever the card, so both MFUs here are recomputed
against the card's dense bf16 peak (attnlab.utils.flops). Prints tokens/s, ms/iteration and MFU of each and the
ratio attnlab / nanoGPT (goal: >= 1.0).
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
from pathlib import Path

from attnlab.utils.atomic import scratch_folder

ROOT = Path(__file__).resolve().parents[1]
NANOGPT_A100_PEAK = 312e12  # what nanoGPT's estimate_mfu divides by


def attnlab_row(args, out: Path) -> dict:
    size = (["model.n_layer=1", "model.n_head=2", "model.n_embd=64", "data.vocab_size=512", "trainer=cpu",
             "trainer.precision=32-true", "model.compile=false"] if args.tiny else
            ["trainer=gpu", "trainer.precision=bf16-mixed", "model.compile=true", "+optimizer.fused=true"])
    cmd = [sys.executable, str(ROOT / "train.py"), "model=gpt2_small", "data=synthetic_text",
           f"data.block_size={args.block_size}", f"data.batch_size={args.batch_size}", "data.num_workers=2",
           "optimizer.lr=1e-4", "optimizer.betas=[0.9,0.95]", "optimizer.weight_decay=0.01", "scheduler=constant",
           f"trainer.max_steps={args.steps}", "trainer.max_epochs=-1", "trainer.limit_val_batches=0",
           f"trainer.log_every_n_steps={args.window}", "test=false", "logger=csv", "model.num_samples=0",
           "callbacks.model_checkpoint=null", "callbacks.progress_bar=null", "extras.print_config=false",
           f"hydra.run.dir={out}", *size, *args.overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"train.py failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    rows = [r for r in csv.DictReader(open(out / "csv" / "metrics.csv")) if r.get("perf/tokens_per_s")]
    steady = rows[2:] or rows  # the first windows hold torch.compile's compilation and the allocator's warm-up
    tps = statistics.median(float(r["perf/tokens_per_s"]) for r in steady)
    mfu = [float(r["perf/mfu"]) for r in steady if r.get("perf/mfu")]
    return {"tokens_per_s": tps, "ms_per_iter": 1000 * args.batch_size * args.block_size / tps,
            "mfu": statistics.median(mfu) if mfu else None}


def nanogpt_row(args, peak: float | None) -> dict:
    cmd = [sys.executable, "bench.py", f"--batch_size={args.batch_size}", f"--block_size={args.block_size}",
           "--real_data=False", "--compile=True", "--bias=True", "--dtype=bfloat16", "--profile=False"]
    proc = subprocess.run(cmd, cwd=args.nanogpt, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    m = re.findall(r"time per iteration: ([\d.]+)ms, MFU: ([\d.]+)%", out)
    if proc.returncode or not m:
        sys.exit(f"nanoGPT's bench.py failed:\n{out[-3000:]}")
    ms, mfu_a100 = float(m[-1][0]), float(m[-1][1]) / 100
    return {"tokens_per_s": args.batch_size * args.block_size / (ms / 1000), "ms_per_iter": ms,
            "mfu": mfu_a100 * NANOGPT_A100_PEAK / peak if peak else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout (its bench.py)")
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--window", type=int, default=10, help="steps per throughput reading")
    p.add_argument("--tiny", action="store_true", help="a 1-layer model on CPU: checks the script, measures nothing")
    p.add_argument("overrides", nargs="*", help="more Hydra overrides for train.py")
    args = p.parse_intermixed_args()
    if args.tiny:
        args.block_size, args.batch_size, args.steps, args.window = 64, 4, 8, 2
    import torch

    from attnlab.utils.flops import device_peak_flops

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    peak = device_peak_flops(device, "bf16-mixed") if device.type == "cuda" else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rows = {"attnlab": attnlab_row(args, scratch_folder("attnlab_gpt2_") / "run")}
    if args.nanogpt and not args.tiny:
        rows["nanoGPT bench.py"] = nanogpt_row(args, peak)
    print(f"GPT-2 124M{' (tiny)' if args.tiny else ''} on {name}: batch {args.batch_size} x {args.block_size} tokens")
    print(f"{'':18} {'tokens/s':>10} {'ms/iter':>9} {'MFU':>7}")
    for label, r in rows.items():
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{label:18} {r['tokens_per_s']:10,.0f} {r['ms_per_iter']:9.1f} {mfu:>7}")
    if len(rows) == 2:
        ratio = rows["attnlab"]["tokens_per_s"] / rows["nanoGPT bench.py"]["tokens_per_s"]
        print(f"attnlab / nanoGPT tokens/s: {ratio:.3f}")


if __name__ == "__main__":
    main()
