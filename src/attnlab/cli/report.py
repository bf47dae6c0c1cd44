"""What a training run leaves behind: metrics.json, the summary in the log, and a sweep's results.csv row."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger("attnlab")


def optimized_value(plan, metrics: dict[str, float]) -> float | None:
    """The run's `optimized_metric` from `metrics` (the value returned to sweepers); None when it is missing or
    NaN."""
    value = metrics.get(plan.run.optimized_metric or "")
    return None if value is None or math.isnan(value) else value


def add_best_of_monitor(plan, metrics: dict[str, float], trainer) -> None:
    """Add `<monitor>_best`, the best score the checkpoint callback saw, where the LightningModule logs only
    `<monitor>` (a user's own)."""
    key = f"{plan.model.monitor}_best"
    ckpt = trainer.checkpoint_callback
    if key not in metrics and isinstance(ckpt, ModelCheckpoint) and ckpt.best_model_score is not None:
        metrics[key] = float(ckpt.best_model_score)


def finished_already(plan, out_dir: Path, step: int) -> float | None:
    """For a run started again in the directory of a finished run: say that its results stand, and return the
    `optimized_value` of its metrics.json."""
    import json

    metrics = json.loads((out_dir / "metrics.json").read_text())
    log.info("this run directory holds a finished run (step %d): nothing left to train; its results in %s stand "
             "(resume=false starts over)", step, out_dir / "metrics.json")
    return optimized_value(plan, metrics)


def peak_memory(device) -> tuple[str, int]:
    """The run's peak memory: ("GPU", max_memory_allocated) on a GPU; ("CPU", this process's own peak resident
    memory) otherwise, in bytes."""
    if device.type == "cuda":
        import torch

        return "GPU", torch.cuda.max_memory_allocated(device)
    from attnlab.memory import peak_rss

    return "CPU", peak_rss()


def report(plan, metrics: dict[str, float], trainer, out_dir: Path, estimate=None) -> None:
    import json

    from attnlab.memory import GiB
    from attnlab.protocols import data as data_hooks

    # <monitor>_last: the last validation's score, beside <monitor>_best (which chose the checkpoint, so optimistic);
    # reported_split: "val" where the validation split is the benchmark's official evaluation set (ImageNet-1k, ADE20K)
    key, benchmark = plan.model.monitor, data_hooks.benchmark_split(trainer.datamodule)
    if key and key in metrics and plan.run.train:
        metrics[f"{key}_last"] = float(metrics[key])
    if benchmark:
        metrics["reported_split"] = "val"
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    lines = [f"  {k:<24} {v:.4f}" for k, v in sorted(metrics.items())
             if k.startswith(("test/", "val/")) and not k.endswith("_step")]
    ckpt = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    device, peak = peak_memory(trainer.strategy.root_device)
    lines.append(f"  peak memory ({device})      {peak / GiB:.2f} GiB"
                 + (f" (estimated at start: {estimate.total / GiB:.2f} GiB)" if estimate is not None else ""))
    if benchmark:
        lines.append(f"  the validation split is the reported set: {benchmark}, the benchmark's official evaluation "
                     f"split, as published results use it (trained on the whole training split); {key}_last is the "
                     f"last epoch's score, {key}_best the best epoch's (chosen on this split, so optimistic)"
                     + ("; test/* re-measure the best checkpoint on it" if metrics.get("test_is_validation") else ""))
    elif metrics.get("test_is_validation"):
        lines.append("  test/* are measured on the validation split (this data has no held-out test split; the best "
                     "checkpoint was chosen on it): not a held-out test score")
    summary = "\n".join([f"Results of {plan.run.task_name}:", *lines, f"  run directory: {out_dir}"]
                        + ([f"  best checkpoint: {ckpt}"] if ckpt else []))
    if "test/acc" in metrics:
        summary += f"\nTest accuracy: {100 * metrics['test/acc']:.2f}%"
    log.info(summary)
    _append_sweep_row(plan, metrics, out_dir)


def _append_sweep_row(plan, metrics: dict[str, float], out_dir: Path) -> None:
    """In a multirun (a grid or an Optuna sweep), one row per job in <sweep dir>/results.csv: the job number, its
    overrides, the optimized metric and the run's main results."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hc = HydraConfig.get()
    target = plan.run.optimized_metric or ""
    row = {"job": hc.job.num, "overrides": " ".join(hc.overrides.task), "metric": target,
           "value": metrics.get(target, float("nan")), "run_dir": str(out_dir)}
    row |= {k: v for k, v in sorted(metrics.items()) if k.startswith(("val/", "test/")) and not k.endswith("_step")}
    append_row(Path(hc.sweep.dir) / "results.csv", row)


def append_row(path: Path, row: dict) -> None:
    """Add a row to a CSV table that parallel jobs (submitit, joblib) share; a row with new keys adds columns."""
    import csv

    from filelock import FileLock

    from attnlab.utils.atomic import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        rows = []
        if path.exists():
            with open(path, newline="") as fh:
                rows = list(csv.DictReader(fh))
        rows.append(row)
        fields = list(dict.fromkeys(k for r in rows for k in r))
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:  # a job killed meanwhile: the old table
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
