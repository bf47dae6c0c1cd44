"""Stops training at the first non-finite loss, before anything is saved from the broken weights."""

from __future__ import annotations

import lightning as L
import torch

from attnlab.errors import UserError


class NaNGuard(L.Callback):
    def __init__(self, check_every_n_steps: int = 1):
        self.every = max(1, int(check_every_n_steps))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None or bool(torch.isfinite(loss.detach()).all()):
            return
        last = None
        for cb in trainer.checkpoint_callbacks:
            last = getattr(cb, "last_model_path", None) or getattr(cb, "best_model_path", None) or last
        raise UserError(
            f"the training loss became {loss.item()} at step {trainer.global_step} (epoch {trainer.current_epoch}, "
            f"batch {batch_idx}); training stopped there. "
            + (f"The last good checkpoint is {last} (resume with ckpt_path={last}). " if last else
               "No checkpoint had been written yet. ")
            + "Lower optimizer.lr, add trainer.gradient_clip_val=1.0, or use fp32 (trainer.precision=32-true)."
        )
