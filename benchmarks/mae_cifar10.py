"""MAE pretraining then fine-tuning vs. the same ViT from scratch on CIFAR-10, with the same fine-tuning budget.

Runs train.py three times, as a user would:

    1. experiment=mae_pretrain_cifar10                       (labels unused)
    2. experiment=mae_finetune_cifar10 model.init_from=<1>   (layer decay 0.75, lr 2e-3, no drop path)
    3. experiment=vit_scratch_cifar10                        (same ViT, data, schedule, epochs; lr 1e-3, drop path 0.1)

and writes a markdown table of validation and test accuracy (the 10,000 test images) and wall times.

    python benchmarks/mae_cifar10.py [--out DIR] [--pretrain-epochs N] [--finetune-epochs N]
        [--linear-probe] [overrides for every run ...]

The epochs default to the experiments' own (trainer.max_epochs in conf/experiment/mae_*_cifar10.yaml).

Reads $ATTNLAB_DATA_DIR/cifar10 (default: ../shared/data); writes the runs and mae_cifar10.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(name: str, out: Path, overrides: list[str]) -> tuple[dict, float]:
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resumed one
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}",
           "callbacks.progress_bar=null", "extras.print_config=false"]
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    elapsed = time.perf_counter() - start
    if rc:
        sys.exit(f"{name} failed (exit {rc}): see {out / f'{name}.log'}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    print(f"  {name}: {elapsed / 60:.1f} min, " + ", ".join(
        f"{k} {v:.4f}" for k, v in sorted(metrics.items()) if k.startswith(("val/", "test/acc"))), flush=True)
    return metrics, elapsed


def max_epochs(run_dir: Path) -> int:
    """trainer.max_epochs of a finished run, from the config.yaml it wrote."""
    from omegaconf import OmegaConf

    return int(OmegaConf.load(run_dir / "config.yaml").trainer.max_epochs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=ROOT / "logs" / "benchmarks" / "mae_cifar10")
    p.add_argument("--pretrain-epochs", type=int, default=None, help="default: the experiment's")
    p.add_argument("--finetune-epochs", type=int, default=None, help="default: the experiment's")
    p.add_argument("--linear-probe", action="store_true", help="also a linear probe of the pretrained encoder")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. seed=1")
    args = p.parse_intermixed_args()
    os.environ.setdefault("ATTNLAB_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["data.num_workers=0", *args.overrides]

    def epochs(n: int | None) -> list[str]:
        return [] if n is None else [f"trainer.max_epochs={n}"]

    ft = [*epochs(args.finetune_epochs), *common]
    pre, t_pre = run("pretrain", args.out, ["experiment=mae_pretrain_cifar10", *epochs(args.pretrain_epochs), *common])
    ckpt = args.out / "pretrain" / "checkpoints" / "last.ckpt"
    rows = [("MAE pretrain → fine-tune", "experiment=mae_finetune_cifar10", *run(
        "finetune", args.out, ["experiment=mae_finetune_cifar10", f"model.init_from={ckpt}", *ft]))]
    if args.linear_probe:
        rows.append(("MAE pretrain → linear probe", "... model.freeze_backbone=true optimizer.layer_decay=null",
                     *run("linear_probe", args.out, ["experiment=mae_finetune_cifar10", f"model.init_from={ckpt}",
                                                     "model.freeze_backbone=true", "optimizer.layer_decay=null",
                                                     "model.drop_path_rate=0", *ft])))
    rows.append(("from scratch", "experiment=vit_scratch_cifar10",
                 *run("scratch", args.out, ["experiment=vit_scratch_cifar10", *ft])))

    t_ft, mae_acc, scratch_acc = rows[0][3], rows[0][2]["test/acc"], rows[-1][2]["test/acc"]
    lines = [
        "CIFAR-10 subset (5,000 train images: 4,500 train / 500 val; 10,000 test), ViT 4 blocks x 128 dims, "
        f"4 px patches; {max_epochs(args.out / 'finetune')} fine-tuning epochs for every row; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'all')}.",
        "",
        f"MAE pretraining: {max_epochs(args.out / 'pretrain')} epochs, {t_pre / 60:.1f} min, "
        f"val/loss (masked-patch MSE, normalized pixels) {pre['val/loss']:.4f} (best {pre['val/loss_best']:.4f}). "
        f"Pretraining + fine-tuning: {(t_pre + t_ft) / 60:.1f} min, {100 * (mae_acc - scratch_acc):+.2f} points of "
        "test accuracy over the same fine-tuning from scratch.",
        "",
        "| initialization | command | val acc (best) | test acc | test acc5 | fine-tuning time |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, cmd, m, t in rows:
        lines.append(f"| {name} | `{cmd}` | {100 * m['val/acc_best']:.2f}% | {100 * m['test/acc']:.2f}% | "
                     f"{100 * m['test/acc5']:.2f}% | {t / 60:.1f} min |")
    table = "\n".join(lines)
    (args.out / "mae_cifar10.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
