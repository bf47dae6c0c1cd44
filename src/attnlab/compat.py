"""The Lightning and torchmetrics internals attnlab relies on, in one place.

Lightning is pinned below its next minor release (pyproject.toml). tests/test_compat.py checks that every name used
here exists in the installed versions, so a release that moves one fails there, by name, instead of deep in a run.
Nothing else in attnlab touches a private Lightning or torchmetrics attribute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lightning.pytorch.callbacks import ModelCheckpoint


# ---- Lightning
def has_trainer(module) -> bool:
    """Whether a LightningModule is attached to a Trainer (its `trainer` property raises when it is not)."""
    return module._trainer is not None


def logs_this_step(trainer) -> bool:
    """Whether the loggers write on this step (every trainer.log_every_n_steps, and every step of a fast_dev_run)."""
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


def keep_own_batch_sampler(trainer) -> None:
    """The data's batch sampler shards by rank itself: Lightning must not wrap it in a DistributedSampler."""
    trainer._accelerator_connector.use_distributed_sampler = False


def restore_loader_position(trainer) -> None:
    """Load the training DataLoader's saved position now, and start the epoch's iterator again from it.

    Lightning loads it only when it sets up the training data after the checkpoint was read, and only for a
    checkpoint written mid-epoch; a schedule that asks for `trainer.estimated_stepping_batches` sets the data up
    earlier, and the saved position would be dropped."""
    loop = trainer.fit_loop
    states = getattr(loop, "_combined_loader_states_to_load", None)
    if not states or loop._combined_loader is None:
        return
    # also when the checkpoint was written at an epoch's end, where Lightning does not count the run as
    # restarting: the loader then starts the next epoch, with the random state of the save point
    loop._combined_loader._load_state_dicts(states)
    loop._combined_loader_states_to_load = []
    if loop._data_fetcher is not None:
        iter(loop._data_fetcher)  # the iterator made before the state was loaded started at the epoch's start


@contextlib.contextmanager
def logging_off(module) -> Iterator[None]:
    """Run a LightningModule's step outside the trainer: its `log`, `log_dict` and attnlab's `log_train_loss` do
    nothing meanwhile (they would ask the trainer for its loop state)."""
    names = [n for n in ("log", "log_dict", "log_train_loss") if callable(getattr(type(module), n, None))]
    for name in names:
        setattr(module, name, lambda *a, **k: None)
    try:
        yield
    finally:
        for name in names:
            delattr(module, name)  # the class's method again


# ---- torchmetrics
def metric_defaults(metric) -> dict:
    """A torchmetrics Metric's states as they are after `reset()`, by name."""
    return dict(metric._defaults)


def metric_state(metric) -> dict:
    """A Metric's states and update count now, for `restore_metric_state`."""
    return {name: getattr(metric, name) for name in metric._defaults} | {"_update_count": metric._update_count}


def restore_metric_state(metric, state: dict) -> None:
    for name, value in state.items():
        setattr(metric, name, value)


# ---- ModelCheckpoint
class CheckpointBase(ModelCheckpoint):
    """ModelCheckpoint's internals that attnlab's ModelCheckpoint builds on, under public names."""

    def monitor_candidates(self, trainer) -> dict:
        """The metrics a save decision sees; subclasses add to them."""
        return super()._monitor_candidates(trainer)

    def _monitor_candidates(self, trainer) -> dict:
        return self.monitor_candidates(trainer)

    def save_last_now(self, trainer) -> None:
        """Write last.ckpt now (when save_last is on and this is not a sanity check or fast_dev_run)."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def saves_at_train_epoch_end(self, trainer) -> bool:
        return self._should_save_on_train_epoch_end(trainer)
