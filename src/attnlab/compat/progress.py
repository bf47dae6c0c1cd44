"""Lightning's Rich progress bar with its epoch description behind a public method."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


class DescribedProgressBar(RichProgressBar):
    """RichProgressBar whose training bar reads `train_description(current_epoch)` (Lightning's private
    `_get_train_description`, which a subclass overrides)."""

    def train_description(self, current_epoch: int) -> str:
        return super()._get_train_description(current_epoch)

    def _get_train_description(self, current_epoch: int) -> str:
        return self.train_description(current_epoch)
