"""Masked-LM pretraining on SST-2's own sentences then fine-tuning, vs. the same BERT from scratch, on GLUE SST-2.

Runs train.py as a user would, with the same fine-tuning budget (optimizer steps) and seed for every row:

    1. experiment=bert_sst2_finetune model.init_from=null             (from scratch)
    2. experiment=bert_sst2_mlm, then experiment=bert_sst2_finetune   (task-adaptive pretraining, then fine-tuning)
    3. (2)'s encoder, linear probe (model.freeze_backbone=true)

for each --seeds, and writes a markdown table of validation and test accuracy (test: the 872 sentences of GLUE's
labelled dev set) and wall times, with the mean over seeds.

    python benchmarks/bert_sst2.py [--out DIR] [--seeds 1 2 3] [--mlm-steps 4000] [--steps 2000] [overrides ...]

Reads $ATTNLAB_DATA_DIR/sst2 (default: ../shared/data); writes the runs and bert_sst2.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from mae_cifar10 import run  # noqa: E402  (one way to run train.py from a benchmark)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=ROOT / "logs" / "benchmarks" / "bert_sst2")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--mlm-steps", type=int, default=4000)
    p.add_argument("--steps", type=int, default=2000, help="fine-tuning optimizer steps, every row")
    p.add_argument("--no-probe", action="store_true", help="leave out the linear probe")
    p.add_argument("--pretrain-each-seed", action="store_true",
                   help="one masked-LM run per seed (default: the first seed's pretraining serves every seed)")
    p.add_argument("--keep", action="store_true", help="reuse the finished runs (metrics.json) under --out")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = p.parse_intermixed_args()
    os.environ.setdefault("ATTNLAB_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["data.num_workers=0", "logger=csv", *args.overrides]
    rows: dict[str, list[tuple[dict, float]]] = {"from scratch": [], "MLM → fine-tune": [], "MLM → linear probe": []}
    mlm_times, mlm_metrics = [], []

    def run_once(name: str, overrides: list[str]) -> tuple[dict, float]:
        done = args.out / name / "metrics.json"
        if args.keep and done.exists() and (args.out / f"{name}.time").exists():
            return json.loads(done.read_text()), float((args.out / f"{name}.time").read_text())
        metrics, elapsed = run(name, args.out, overrides)
        (args.out / f"{name}.time").write_text(f"{elapsed:.1f}\n")
        return metrics, elapsed

    for seed in args.seeds:
        s = [f"seed={seed}", *common]
        ft = ["experiment=bert_sst2_finetune", f"trainer.max_steps={args.steps}", *s]
        rows["from scratch"].append(run_once(f"scratch_s{seed}", [*ft, "model.init_from=null"]))
        mlm_seed = seed if args.pretrain_each_seed else args.seeds[0]
        if args.pretrain_each_seed or seed == args.seeds[0]:
            m, t = run_once(f"mlm_s{mlm_seed}", ["experiment=bert_sst2_mlm", f"trainer.max_steps={args.mlm_steps}",
                                                 f"seed={mlm_seed}", *common])
            mlm_metrics.append(m)
            mlm_times.append(t)
        ckpt = args.out / f"mlm_s{mlm_seed}" / "checkpoints" / "last.ckpt"
        rows["MLM → fine-tune"].append(run_once(f"finetune_s{seed}", [*ft, f"model.init_from={ckpt}"]))
        if not args.no_probe:
            rows["MLM → linear probe"].append(run_once(f"probe_s{seed}", [
                *ft, f"model.init_from={ckpt}", "model.freeze_backbone=true", "optimizer.layer_decay=null",
                "optimizer.lr=1e-3"]))

    def pct(xs: list[float]) -> str:
        return " / ".join(f"{100 * x:.2f}" for x in xs) + f" (mean **{100 * statistics.mean(xs):.2f}**)"

    lines = [
        f"GLUE SST-2: train 60,614 phrases, validation 6,735, test 872 sentences; BERT 4 layers x 256 dims, "
        f"{args.steps} fine-tuning steps of batch 32 for every row; seeds {', '.join(map(str, args.seeds))}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'all')}.",
        "",
        f"Masked-LM pretraining on SST-2's training sentences "
        f"({'one run per seed' if args.pretrain_each_seed else f'one run, seed {args.seeds[0]}, for every seed'}): "
        f"{args.mlm_steps} steps, "
        f"{statistics.mean(mlm_times) / 60:.1f} min, val masked-token accuracy "
        f"{pct([m['val/acc'] for m in mlm_metrics])}%.",
        "",
        "| initialization | test acc % (per seed) | val acc % (best, mean) | test F1 (mean) | fine-tuning time |",
        "|---|---|---:|---:|---:|",
    ]
    for name, results in rows.items():
        if results:
            ms, ts = [m for m, _ in results], [t for _, t in results]
            lines.append(f"| {name} | {pct([m['test/acc'] for m in ms])} | "
                         f"{100 * statistics.mean(m['val/acc_best'] for m in ms):.2f} | "
                         f"{statistics.mean(m['test/f1'] for m in ms):.4f} | {statistics.mean(ts) / 60:.1f} min |")
    table = "\n".join(lines)
    (args.out / "bert_sst2.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
