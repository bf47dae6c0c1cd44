"""Lightning's Rich progress bar, with a description that fits step-budgeted runs."""

from __future__ import annotations

from attnlab.compat.progress import DescribedProgressBar


class ProgressBar(DescribedProgressBar):
    """`Epoch 3/9` for epoch-budgeted runs; for runs that stop at `trainer.max_steps` (max_epochs -1), `Epoch 3 ·
    step budget 5000` instead of Lightning's `Epoch 3/-2`."""

    def train_description(self, current_epoch: int) -> str:
        max_epochs, max_steps = self.trainer.max_epochs, self.trainer.max_steps
        description = f"Epoch {current_epoch}"
        if max_epochs is not None and max_epochs > 0:
            description += f"/{max_epochs - 1}"
        elif max_steps > 0:
            description += f" · step budget {max_steps}"
        if len(self.validation_description) > len(description):  # as Lightning: no flicker between bars
            description = f"{description:{len(self.validation_description)}}"
        return description
