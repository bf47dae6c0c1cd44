"""Puts the training DataLoader back at the batch a resumed run stopped at.

Lightning stores the state of a DataLoader with `state_dict`/`load_state_dict` in every checkpoint
(attnlab.data.samplers.ResumableDataLoader), but loads it back only when it sets up the training data after the
checkpoint was read, and only for a checkpoint written mid-epoch. A task whose schedule asks for
`trainer.estimated_stepping_batches` (OneCycle, cosine, linear) makes Lightning set the data up earlier, while
configuring the optimizers, and the saved position would be dropped. This callback loads it at the start of training
instead, and creates the epoch's iterator again from there.
"""

from __future__ import annotations

import lightning as L

from attnlab.compat import restore_loader_position


class ResumeDataPosition(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        restore_loader_position(trainer)
