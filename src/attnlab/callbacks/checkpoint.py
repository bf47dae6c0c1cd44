"""Lightning's ModelCheckpoint, with `last.ckpt` written at every save point.

Lightning >= 2.5 refreshes last.ckpt only when a top-k checkpoint was saved in the same step, so a run whose
monitored metric stopped improving would resume from an old epoch. Here last.ckpt always holds the latest state.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint as _ModelCheckpoint


class ModelCheckpoint(_ModelCheckpoint):
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
