"""Stops training at the first non-finite loss, before anything is saved from the broken weights."""

from __future__ import annotations

import lightning as L
import torch

from attnlab.errors import UserError


class NaNGuard(L.Callback):
    """Watches the training loss without a host-device synchronisation per step.

    Every step queues a check on the device (the step and value of the first non-finite loss are kept there); the
    host reads the result every `check_every_n_steps` steps (default: the trainer's `log_every_n_steps`, when the
    loggers synchronise anyway), before every validation, at each epoch's end, and before any checkpoint is written:
    a checkpoint never holds weights trained on a non-finite loss, and the error names the step where it began.
    """

    def __init__(self, check_every_n_steps: int | None = None):
        self.every = int(check_every_n_steps) if check_every_n_steps else None
        # on the device: the step, epoch and batch of the first non-finite loss (-1: none yet), and that loss
        self._first: dict[str, torch.Tensor] | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        loss = loss.detach().float()
        first = self._first
        if first is None or first["step"].device != loss.device:
            first = self._first = {k: torch.full((), -1, dtype=torch.long, device=loss.device)
                                   for k in ("step", "epoch", "batch")} | {"loss": torch.zeros((), device=loss.device)}
        new = (first["step"] < 0) & ~torch.isfinite(loss)  # all queued on the device: nothing waits here
        for key, now in (("step", trainer.global_step), ("epoch", trainer.current_epoch), ("batch", batch_idx),
                         ("loss", loss)):
            first[key] = torch.where(new, now, first[key])
        if trainer.global_step % (self.every or trainer.log_every_n_steps or 1) == 0:
            self.check(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.check(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.check(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.check(trainer)  # raised before the file is written

    def check(self, trainer) -> None:
        """Raise if a non-finite training loss has been seen (one read of a device scalar)."""
        if self._first is None or int(self._first["step"]) < 0:
            return
        step, epoch, batch = (int(self._first[k]) for k in ("step", "epoch", "batch"))
        value, self._first = float(self._first["loss"]), None
        last = None
        for cb in trainer.checkpoint_callbacks:
            last = getattr(cb, "last_model_path", None) or getattr(cb, "best_model_path", None) or last
        raise UserError(
            f"the training loss became {value} at step {step} (epoch {epoch}, batch {batch}); training stopped. "
            + (f"The last good checkpoint is {last} (resume with ckpt_path={last}). " if last else
               "No checkpoint had been written yet. ")
            + "Lower optimizer.lr, add trainer.gradient_clip_val=1.0, or use fp32 (trainer.precision=32-true)."
        )
