"""The training run: compose, check, build, fit, test, report."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.cli import builders
from attnlab.cli.app import save_resolved_config
from attnlab.config import check_compatible, check_schedule_keys, prepare
from attnlab.errors import UserError

log = logging.getLogger("attnlab")


def train(cfg: DictConfig) -> float | None:
    prepare(cfg)
    check_compatible(cfg)  # before anything heavy
    check_schedule_keys(cfg)
    from attnlab.cli.checks import check_config

    check_config(cfg)  # every constructor's keys, types and ranges
    import lightning as L

    from attnlab.callbacks.resume import ResumeDataPosition
    from attnlab.callbacks.run_metadata import RunMetadata
    from attnlab.callbacks.signals import SignalGuard
    from attnlab.cli.hydra_ddp import pin_subprocess_ranks_to_job

    L.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)

    ckpt_path = builders.resolve_checkpoint(cfg.get("ckpt_path"), cfg.paths.log_dir, cfg.task_name)
    if not cfg.get("train", True) and not ckpt_path:
        raise UserError("train=false tests a trained model, but no ckpt_path was given: add "
                        "ckpt_path=<run dir>/checkpoints/best.ckpt (or ckpt_path=last), or drop train=false.")
    in_run_dir = not ckpt_path and cfg.get("train", True) and builders.checkpoint_in_run_dir(cfg)
    ckpt_path = ckpt_path or in_run_dir or None
    meta, estimate = {}, None
    if ckpt_path:
        meta = builders.read_run_metadata(ckpt_path)
        builders.check_same_task(meta, cfg.model._target_, ckpt_path, run_dir=bool(in_run_dir))

    dm = builders.build_datamodule(cfg.data, tokenizer=builders.init_tokenizer(cfg))
    model = builders.build_task(cfg, dm)
    if cfg.get("preflight"):  # time a few steps, print what the run will cost, write nothing
        from attnlab.cli.preflight import preflight

        return preflight(cfg, model, dm)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if in_run_dir:
        builders.check_same_model(meta, resolved["model"], ckpt_path)
    elif ckpt_path:
        builders.check_resumable(meta, model, resolved.get("optimizer"), ckpt_path)
    if cfg.get("train", True):
        from attnlab.memory import check_run_memory

        estimate = check_run_memory(cfg, model, dm)  # refuse a run too large for the machine before it starts
    save_resolved_config(cfg, out_dir / "config.yaml")
    wandb_id = meta.get("wandb_run_id")

    loggers = builders.build_loggers(cfg, wandb_resume_id=wandb_id, resuming=bool(ckpt_path))
    callbacks = builders.build_callbacks(cfg, has_logger=bool(loggers)) + [RunMetadata(resolved), ResumeDataPosition(),
                                                                              SignalGuard()]
    pin_subprocess_ranks_to_job()
    trainer = builders.build_trainer(cfg, callbacks, loggers, model)
    for lg in loggers:
        lg.log_hyperparams(resolved | builders.count_parameters(model))

    if cfg.get("train", True):
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=False)  # see load_task
        if in_run_dir and trainer.global_step == meta.get("global_step") and (out_dir / "metrics.json").is_file():
            return _finished_already(cfg, out_dir, trainer.global_step)
    train_metrics = dict(trainer.callback_metrics)

    test_metrics = {}
    if cfg.get("test", True) and cfg.get("train", True) and getattr(dm, "test_is_validation", False):
        log.info("no test pass: the test split of this data is its validation split, whose results (val/*) stand "
                 "(data.test_files or data.test_fraction give it a test split of its own)")
    elif cfg.get("test", True):
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not cfg.get("train", True):
            best = ckpt_path or ""
        if not best and cfg.get("train", True):
            log.warning("no checkpoint was saved: testing the weights as they are at the end of training")
        trainer.test(model, datamodule=dm, ckpt_path=best or None, weights_only=False)
        test_metrics = dict(trainer.callback_metrics)

    metrics = {k: float(v) for k, v in (train_metrics | test_metrics).items()}
    _add_best_of_monitor(cfg, metrics, trainer)
    if trainer.is_global_zero:
        _report(cfg, metrics, trainer, out_dir, estimate)
    value = metrics.get(cfg.get("optimized_metric") or "")
    return None if value is None or math.isnan(value) else value


def _add_best_of_monitor(cfg: DictConfig, metrics: dict[str, float], trainer) -> None:
    """`<monitor>_best`, which sweepers optimize, for a LightningModule that logs only `<monitor>` (a user's own):
    the best score the checkpoint callback saw."""
    key = f"{cfg.model.get('monitor')}_best"
    ckpt = trainer.checkpoint_callback
    if key not in metrics and ckpt is not None and getattr(ckpt, "best_model_score", None) is not None:
        metrics[key] = float(ckpt.best_model_score)


def _finished_already(cfg: DictConfig, out_dir: Path, step: int) -> float | None:
    """A run started again in the directory of a run that had finished: nothing to do, its results stand."""
    import json

    metrics = json.loads((out_dir / "metrics.json").read_text())
    log.info("this run directory holds a finished run (step %d): nothing left to train; its results in %s stand "
             "(resume=false starts over)", step, out_dir / "metrics.json")
    value = metrics.get(cfg.get("optimized_metric") or "")
    return None if value is None or math.isnan(value) else value


def _report(cfg: DictConfig, metrics: dict[str, float], trainer, out_dir: Path, estimate=None) -> None:
    import json

    from attnlab.memory import GiB, peak_memory

    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    lines = [f"  {k:<24} {v:.4f}" for k, v in sorted(metrics.items())
             if k.startswith(("test/", "val/")) and not k.endswith("_step")]
    ckpt = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    device, peak = peak_memory(trainer.strategy.root_device)
    lines.append(f"  peak memory ({device})      {peak / GiB:.2f} GiB"
                 + (f" (estimated at start: {estimate.total / GiB:.2f} GiB)" if estimate is not None else ""))
    summary = "\n".join([f"Results of {cfg.task_name}:", *lines, f"  run directory: {out_dir}"]
                        + ([f"  best checkpoint: {ckpt}"] if ckpt else []))
    if "test/acc" in metrics:
        summary += f"\nTest accuracy: {100 * metrics['test/acc']:.2f}%"
    log.info(summary)
    _append_sweep_row(cfg, metrics, out_dir)


def _append_sweep_row(cfg: DictConfig, metrics: dict[str, float], out_dir: Path) -> None:
    """In a multirun (a grid or an Optuna sweep), one row per job in <sweep dir>/results.csv: the job number, its
    overrides, the optimized metric and the run's main results."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hc = HydraConfig.get()
    target = cfg.get("optimized_metric") or ""
    row = {"job": hc.job.num, "overrides": " ".join(hc.overrides.task), "metric": target,
           "value": metrics.get(target, float("nan")), "run_dir": str(out_dir)}
    row |= {k: v for k, v in sorted(metrics.items()) if k.startswith(("val/", "test/")) and not k.endswith("_step")}
    append_row(Path(hc.sweep.dir) / "results.csv", row)


def append_row(path: Path, row: dict) -> None:
    """Add a row to a CSV table that parallel jobs (submitit, joblib) share; a row with new keys adds columns."""
    import csv

    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        rows = []
        if path.exists():
            with open(path, newline="") as fh:
                rows = list(csv.DictReader(fh))
        rows.append(row)
        fields = list(dict.fromkeys(k for r in rows for k in r))
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)  # a job killed while writing leaves the previous table whole
