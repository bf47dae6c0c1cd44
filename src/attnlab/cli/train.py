"""python train.py [group=option ...] [key=value ...]  — see README.md for the grammar.

The training run from the command line to `Trainer.fit`, top to bottom (`--rerun <run dir>`: cli/rerun.py):
1. `run()` -> `main()` (cli/command_line.entry_point): the command line made ready for Hydra, which composes
   `conf/train.yaml`; `run_app` runs `_work(cfg)`, showing a UserError as one paragraph.
2. `_work(cfg)`: `train(cfg)`, or in a rerun `train` of the run's own config.
3. `train(cfg)`: the config checked and planned, the data and the task built, the Trainer: fit, test, report.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from attnlab.cli.command_line import entry_point

log = logging.getLogger("attnlab")


def _work(cfg: DictConfig) -> float | None:
    """`train(cfg)`; in a `--rerun <run dir> [key=value ...]` (cli/rerun.py), `train` of the run's own config."""
    from attnlab.cli import rerun

    if rerun._request is None:
        return train(cfg)
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    return train(rerun.config(*rerun._request, out_dir))


def train(cfg: DictConfig) -> float | None:
    """Check, build, fit, test, report. -> the run's `optimized_metric` (for sweepers), None when it has none."""

    from omegaconf import OmegaConf

    from attnlab.cli.app import begin
    from attnlab.cli.checks import check_config
    from attnlab.cli.plan import plan_training

    # ---- the config: prepared (user imports, platform keys) and checked, before anything is read or built
    begin(cfg)  # a model/data pair of other kinds is refused there
    check_config(cfg)  # every constructor's keys, types and ranges
    plan = plan_training(cfg)  # the run's settings and what is decided from them, once, applied to cfg
    run = plan.run

    import lightning as L

    from attnlab.checkpoints import trust
    from attnlab.callbacks.job_cost import JobCost
    from attnlab.callbacks.peers import PeerWatch
    from attnlab.callbacks.plain_hparams import PlainHyperparameters
    from attnlab.callbacks.resume import ResumeDataPosition
    from attnlab.callbacks.run_metadata import RunMetadata
    from attnlab.callbacks.signals import SignalGuard
    from attnlab.cli import builders, report
    from attnlab.protocols import data as data_hooks
    from attnlab.redact import redact
    from attnlab.checkpoints.resume import check_continues
    from attnlab.strategies import for_model

    L.seed_everything(run.seed, workers=True)
    out_dir = plan.output_dir

    # ---- the checkpoint the run continues (ckpt_path=, or its own run directory's) or tests (train=false): planned
    ckpt_path, in_run_dir, meta = plan.resume.ckpt_path, plan.resume.in_run_dir, plan.resume.meta
    estimate = None

    # ---- the data, then the task (its sizes from the data's info)
    dm = builders.build_datamodule(cfg.data, tokenizer=plan.init_tokenizer)
    model = builders.build_task(cfg, dm)
    strategy = for_model(model, plan.trainer.strategy, plan.model.activation_checkpointing)  # FSDP, or its blocks
    if run.preflight:  # time a few steps, print what the run will cost, write nothing
        from attnlab.cli.preflight import preflight

        return preflight(cfg, plan, model, dm)
    # what the run records (checkpoints, loggers): without the secrets it was given (attnlab.redact)
    resolved = redact(OmegaConf.to_container(cfg, resolve=True))
    # the platform's callbacks: what the run records, its checkpoints' plain hyperparameters, its job's end
    platform = [RunMetadata(resolved, plan.decided), PlainHyperparameters(resolved["model"], plan.optimizer,
                resolved.get("scheduler")), ResumeDataPosition(), SignalGuard(), PeerWatch(), JobCost()]
    check_continues(plan.resume, model, resolved)  # the checkpoint it continues: this task's optimizer and sizes
    if run.train:
        from attnlab.memory import check_run_memory

        # refuse a run too large for the machine before it starts
        estimate = check_run_memory(plan, model, dm, data=resolved["data"])
    out_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(resolved), out_dir / "config.yaml")

    # ---- the config's loggers and callbacks and the platform's, the Trainer
    loggers = builders.build_loggers(cfg, wandb_resume_id=meta.get("wandb_run_id"), resuming=bool(ckpt_path))
    callbacks = builders.build_callbacks(cfg, has_logger=bool(loggers)) + platform
    trainer = builders.build_trainer(cfg, plan, callbacks, loggers, strategy)
    for lg in loggers:
        lg.log_hyperparams(resolved | builders.count_parameters(model))

    # ---- fit
    if run.train:
        # read as every checkpoint is (attnlab.checkpoints): AtomicCheckpointIO's reader, or the strategy's own,
        # told explicitly, so that no environment variable turns it into a full unpickling
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=not trust.trusted())
        if in_run_dir and trainer.global_step == meta.get("global_step") and (out_dir / "metrics.json").is_file():
            return report.finished_already(plan, out_dir, trainer.global_step)
    train_metrics = dict(trainer.callback_metrics)
    if run.train and ckpt_path and trainer.global_step == meta.get("global_step"):
        # resumed at the end of its training (stopped after the last validation): nothing trained or validated
        # again, the results are those the checkpoint was saved with
        train_metrics = (meta.get("metrics") or {}) | train_metrics

    # ---- test the best checkpoint (or the checkpoint train=false names)
    test_metrics = {}
    if run.test:
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not run.train:
            best = ckpt_path or ""
        if not best and run.train:
            log.warning("no checkpoint was saved: testing the weights as they are at the end of training")
        trainer.test(model, datamodule=dm, ckpt_path=best or None, weights_only=not trust.trusted())
        test_metrics = dict(trainer.callback_metrics)

    # ---- report: metrics.json, the summary, a sweep's results.csv row
    metrics = {k: float(v) for k, v in (train_metrics | test_metrics).items()}
    if test_metrics and data_hooks.test_is_validation(dm):  # said with the results (report.report)
        metrics["test_is_validation"] = True
    report.add_best_of_monitor(plan, metrics, trainer)
    if trainer.is_global_zero:
        report.report(plan, metrics, trainer, out_dir, estimate)
    return report.optimized_value(plan, metrics)


# the `train.py` script, the `attnlab-train` command and `python -m attnlab.train`: main(), then the process ends
# without teardown
main, run = entry_point("train", _work)
