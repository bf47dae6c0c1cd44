"""What a run decides from its config once, before anything is built or saved, and writes back into the config so
that everything after it (config.yaml, .hydra/config.yaml, the loggers' hyperparameters, preflight, the Trainer)
reads the value the run uses."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, open_dict

from attnlab.devices import check_devices, device_count
from attnlab.errors import UserError

log = logging.getLogger("attnlab")


def accumulation_for(global_batch_size: int, batch_size: int, devices: int, nodes: int) -> int:
    """Gradient accumulation giving `global_batch_size` samples per optimizer step on devices x nodes."""
    per_step = batch_size * devices * nodes
    if global_batch_size % per_step:
        raise UserError(
            f"global_batch_size={global_batch_size} is not a multiple of data.batch_size x devices x nodes = "
            f"{batch_size} x {devices} x {nodes} = {per_step}. Pick a global batch size that is, or change "
            "data.batch_size (the per-device batch)."
        )
    return global_batch_size // per_step


def decide_accumulation(cfg: DictConfig) -> None:
    """`global_batch_size` -> `trainer.accumulate_grad_batches`, decided once, before the run's config is saved:
    config.yaml, .hydra/config.yaml, the loggers' hyperparameters, preflight and the Trainer all read the value the
    run uses."""
    if not cfg.get("global_batch_size"):
        return
    trainer_cfg = cfg.trainer
    check_devices(trainer_cfg)
    accumulate = accumulation_for(int(cfg.global_batch_size), int(cfg.data.batch_size),
                                  device_count(trainer_cfg), int(trainer_cfg.get("num_nodes", 1)))
    with open_dict(trainer_cfg):
        trainer_cfg.accumulate_grad_batches = accumulate
    log.info("global_batch_size=%d: accumulating gradients over %d batches", cfg.global_batch_size, accumulate)
    hydra_config = Path(cfg.paths.output_dir) / ".hydra" / "config.yaml"  # the composed config --rerun reads
    if hydra_config.is_file():
        from omegaconf import OmegaConf

        from attnlab.utils.atomic import write_text

        composed = OmegaConf.load(hydra_config)
        if "trainer" in composed:
            with open_dict(composed):
                composed.trainer.accumulate_grad_batches = accumulate
            write_text(hydra_config, OmegaConf.to_yaml(composed))
