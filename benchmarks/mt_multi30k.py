"""Multi30k de->en: the four classic models of the PyTorch seq2seq tutorials, trained with train.py, side by side.

    python benchmarks/mt_multi30k.py                       # all four, 10 epochs each (the reference budget)
    python benchmarks/mt_multi30k.py --only mt_transformer --epochs 1 --limit-train-batches 50   # a timing probe

Writes a markdown table (model, parameters, epochs, time per epoch, val/test BLEU, the tutorials' BLEU) to
--out and prints it. Time per epoch is the time between two epochs' validation results (training and greedy
validation decoding; with one epoch, the run's wall time), on whatever device train.py picks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = {"mt_lstm": 13.76, "mt_gru": 20.61, "mt_bahdanau": 28.30, "mt_transformer": 36.52}
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]")


def log_time(line: str) -> float | None:
    m = STAMP.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def unique_params(ckpt: Path) -> int:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    seen, n = set(), 0
    for k, v in state.items():
        if k.startswith("net.") and v.dtype.is_floating_point and v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            n += v.numel()
    return n


def run(experiment: str, args, out_dir: Path) -> dict:
    run_dir = (args.runs or out_dir) / experiment
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run: train.py would resume one found there
    cmd = [sys.executable, str(ROOT / "train.py"), f"experiment={experiment}", f"hydra.run.dir={run_dir}",
           f"trainer.max_epochs={args.epochs}", "extras.print_config=false", "callbacks.progress_bar=null",
           *args.overrides]
    if args.limit_train_batches:
        cmd.append(f"+trainer.limit_train_batches={args.limit_train_batches}")
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - start
    log = proc.stdout
    (run_dir.parent / f"{experiment}.log").write_text(log)
    if proc.returncode:
        print(log[-3000:])
        return {"experiment": experiment, "error": f"exit {proc.returncode}"}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # an epoch (training + validation) is the time between two validations' "val BLEU" lines
    stamps = [log_time(line) for line in log.splitlines() if "val BLEU" in line and log_time(line)]
    per_epoch = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else wall / args.epochs
    best = sorted((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    return {"experiment": experiment, "params": unique_params(best[-1] if best else run_dir / "checkpoints/last.ckpt"),
            "epochs": args.epochs, "s_per_epoch": per_epoch, "wall_s": wall,
            "val_bleu_best": metrics.get("val/bleu_best"), "test_bleu": metrics.get("test/bleu"),
            "test_ppl": metrics.get("test/ppl")}


def table(rows: list[dict], device: str) -> str:
    out = [f"Multi30k de->en test_2016_flickr, sacreBLEU (lowercased text), {device}", "",
           "| experiment | params | epochs | s / epoch | best val BLEU | test BLEU (beam 5) | tutorial BLEU |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['experiment']} | {r['error']} | | | | | {REFERENCE.get(r['experiment'], '')} |")
            continue
        out.append(f"| {r['experiment']} | {r['params'] / 1e6:.1f}M | {r['epochs']} | {r['s_per_epoch']:.1f} | "
                   f"{r['val_bleu_best']:.2f} | {r['test_bleu']:.2f} | {REFERENCE.get(r['experiment'], '')} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", default=list(REFERENCE))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--limit-train-batches", type=int, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "logs" / "benchmarks" / "mt_multi30k")
    p.add_argument("--runs", type=Path, default=None, help="where the run directories go (default: --out)")
    p.add_argument("overrides", nargs="*", help="extra train.py overrides for every run")
    args = p.parse_intermixed_args()
    out_dir = args.out if args.out.suffix != ".md" else args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    rows = []
    for experiment in args.only:
        rows.append(run(experiment, args, out_dir))
        text = table(rows, device)
        (out_dir / "table.md").write_text(text + "\n")
        (out_dir / "results.json").write_text(json.dumps(rows, indent=2))
        print(text, flush=True)


if __name__ == "__main__":
    main()
