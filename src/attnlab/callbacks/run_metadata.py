"""Stores the run's resolved config and W&B run id in every checkpoint, so a checkpoint alone can be evaluated,
used for prediction, or resumed into the same W&B run."""

from __future__ import annotations

from typing import Any

import lightning as L

import attnlab


def wandb_run_id(trainer: L.Trainer) -> str | None:
    for lg in trainer.loggers:
        if type(lg).__name__ == "WandbLogger":
            return lg.version
    return None


class RunMetadata(L.Callback):
    def __init__(self, config: dict[str, Any]):
        self.config = config

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["attnlab"] = {
            "version": attnlab.__version__,
            "config": self.config,
            "wandb_run_id": wandb_run_id(trainer),
        }
