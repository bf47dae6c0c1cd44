"""Lightning's ModelCheckpoint with three changes:

- `last.ckpt` is written at every save point. Lightning >= 2.5 refreshes it only when a top-k checkpoint was
  saved in the same step, so a run whose monitored metric stopped improving would resume from an old epoch.
- On SIGTERM (a cluster's preemption or `kill`) or Ctrl-C, the current state is saved to `last.ckpt` before exit.
  Other errors (a NaN loss, bad input) save nothing: what was written before them stays the last good state.

- On a tie of the monitored metric the newer checkpoint wins: with an annealed schedule the later weights are the
  better ones, and a small validation set ties often (accuracy moves in steps of 1/len(val)).

Files are written to a temporary name and renamed, so no checkpoint is ever half-written.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint as _ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        os.replace(tmp, path)


class ModelCheckpoint(_ModelCheckpoint):
    def check_monitor_top_k(self, trainer, current=None) -> bool:
        if current is None or self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return super().check_monitor_top_k(trainer, current)
        op = torch.le if self.mode == "min" else torch.ge
        better = bool(op(current, self.best_k_models[self.kth_best_model_path]))
        return trainer.strategy.reduce_boolean_decision(better)

    def _save_last_now(self, trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_now(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_now(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, (SIGTERMException, KeyboardInterrupt)) and not trainer.sanity_checking:
            self._save_last_now(trainer)
