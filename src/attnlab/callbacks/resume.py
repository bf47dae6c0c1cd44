"""Puts the training DataLoader back at the batch a resumed run stopped at, at the start of training, where Lightning
would drop the saved position (attnlab.compat.restore_loader_position).
"""

from __future__ import annotations

import lightning as L

from attnlab.compat import restore_loader_position


class ResumeDataPosition(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        restore_loader_position(trainer)
