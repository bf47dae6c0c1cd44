"""python eval.py ckpt_path=<path|last> [split=test|val] [+data.<key>=...]"""

from __future__ import annotations

from omegaconf import DictConfig

from attnlab.cli.command_line import entry_point


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Rebuild the data and the task from the checkpoint's own run config and evaluate on one split; -> the metrics,
    also written to metrics.json in the output folder."""
    import json
    import logging
    from pathlib import Path

    import lightning as L
    from lightning.pytorch.callbacks import RichProgressBar
    from omegaconf import OmegaConf

    from attnlab.cli import builders
    from attnlab.checkpoints.resume import read_run_metadata
    from attnlab.cli.app import begin
    from attnlab.cli.checks import check_config
    from attnlab.errors import UserError
    from attnlab.protocols import data as data_hooks
    from attnlab.protocols import task as task_hooks
    from attnlab.cli.plan import make_plan
    from attnlab.settings import RunSettings

    log = logging.getLogger("attnlab")
    begin(cfg)
    check_config(cfg)  # the split, the trainer's and loggers' settings
    plan = make_plan(cfg)  # the run keys and the trainer's devices and precision, decided once
    run = plan.run
    ckpt = builders.required_checkpoint(cfg, "eval.py")
    meta = read_run_metadata(ckpt)
    run_cfg = OmegaConf.create(meta["config"])
    L.seed_everything(RunSettings.of(run_cfg).seed if "seed" in run_cfg else run.seed, workers=True)
    data_cfg = OmegaConf.merge(run_cfg.data, cfg.get("data") or {})
    model = builders.load_task(ckpt, meta)
    # the text read with the checkpoint's own tokenizer (GLUE's AX, evaluation only, has no text to learn one on)
    dm = builders.build_datamodule(data_cfg, tokenizer=task_hooks.tokenizers(model).get("tokenizer"))
    model = task_hooks.check_data(model, data_hooks.info(dm))
    decode = {k: v for k, v in (run.decode or {}).items() if v is not None}
    settings = task_hooks.decode_settings(model)
    if decode and settings is None:
        raise UserError(f"decode.* settings ({', '.join(decode)}) are for translation checkpoints; this one is a "
                        f"{type(model).__name__}: leave them out.")
    if decode:
        settings |= decode
    from attnlab.strategies import for_model

    strategy = for_model(model, plan.trainer.strategy)
    trainer = builders.build_trainer(cfg, plan, [RichProgressBar()], builders.build_loggers(cfg), strategy)
    evaluate_on = trainer.test if run.split == "test" else trainer.validate
    results = {k: v for per_loader in evaluate_on(model, datamodule=dm, verbose=True) for k, v in per_loader.items()}
    metrics = {k: float(v) for k, v in results.items()
               if not k.endswith("_best")}  # *_best are the training run's, restored from the checkpoint
    where = f"the {run.split} split"
    if run.split == "test" and data_hooks.test_is_validation(dm):  # said where the results are printed and written
        metrics["test_is_validation"] = True
        where += ", which is this data's validation split (it has no held-out test data)"
    out = Path(cfg.paths.output_dir)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    log.info("evaluated %s on %s: %s (written to %s)", ckpt, where,
             ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()) if k != "test_is_validation"),
             out / "metrics.json")
    return metrics


# the `eval.py` script and the `attnlab-eval` command: main(), then the process ends without teardown
main, run = entry_point("eval", evaluate)
