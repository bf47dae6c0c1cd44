"""The Lightning and torchmetrics internals attnlab relies on, in one place.

Lightning is pinned below its next minor release (pyproject.toml). tests/test_compat.py checks that every name used
here exists in the installed versions, so a release that moves one fails there, by name, instead of deep in a run.
Nothing else in attnlab touches a private Lightning or torchmetrics attribute.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import ModelCheckpoint

from attnlab.utils.atomic import link_file

log = logging.getLogger("attnlab")


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


def redo_interrupted_validation(checkpoint: dict) -> None:
    """Make a checkpoint saved while fit's validation was under way (a stop after one of its batches) resume that
    validation from its first batch. As saved, Lightning resumes it past the validation (the epoch's last training
    batch counts as done), which then never runs: a stop during the last validation would leave the run without its
    validation metrics. The validation loop's progress is set to Lightning's own state of a save inside a
    validation batch ("restarted mid-evaluation", whose validation Lightning runs before training on), with no
    batch done, so the whole validation runs again."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.val_loop.batch_progress")
    if not progress:
        return
    before = progress["total"]["completed"] - progress["current"]["completed"]  # the earlier validations' batches
    progress["total"] = {"ready": before + 1, "started": before + 1, "processed": before, "completed": before}
    progress["current"] = {"ready": 0, "started": 0, "processed": 0, "completed": 0}
    progress["is_last_batch"] = False


def validates_after_this_batch(trainer) -> bool:
    """Whether a validation runs right after the training batch that just ended (the end of an epoch, or
    `val_check_interval`): Lightning's own decision (`_should_check_val_fx`)."""
    loop = trainer.fit_loop
    fetcher = loop._data_fetcher
    return fetcher is not None and bool(loop.epoch_loop._should_check_val_fx(fetcher))


def stop_after_this_step(trainer) -> None:
    """Stop training at the end of the current step, as Lightning stops on SIGTERM: a SIGTERMException, on which the
    checkpoint callbacks' on_exception save. Each process checks its own flag: in a run of several, set it in all of
    them after the same step."""
    trainer._signal_connector.received_sigterm = True


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

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """A step save (every_n_train_steps) at a batch that a validation follows is left to the save after that
        validation: Lightning resumes a checkpoint saved at such a batch past the validation, which would then
        never run (a kill during the last validation would leave the run without its validation metrics)."""
        if self._every_n_train_steps and not trainer.sanity_checking and validates_after_this_batch(trainer):
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def save_last_now(self, trainer) -> None:
        """Write last.ckpt now (when save_last is on and this is not a sanity check or fast_dev_run)."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def saves_at_train_epoch_end(self, trainer) -> bool:
        return self._should_save_on_train_epoch_end(trainer)

    def links_last(self, trainer) -> bool:
        """Whether last.ckpt may name the file of a checkpoint saved at the same step instead of a second copy."""
        return False

    def saved_this_step(self, trainer) -> str | None:
        """The checkpoint file saved at the trainer's current step (a top-k one), or None."""
        if self._last_checkpoint_saved and self._last_global_step_saved == trainer.global_step:
            return str(self._last_checkpoint_saved)
        return None

    def on_local_disk(self) -> bool:
        return bool(self.dirpath) and _is_local_file_protocol(self.dirpath)

    def _last_path(self, trainer, candidates: dict) -> str:
        """Where last.ckpt goes at this save point (Lightning's naming, `last-v1.ckpt` beside another run's)."""
        path = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)
        version = self.STARTING_VERSION
        while self._enable_version_counter and self.file_exists(path, trainer) and path != self.last_model_path:
            path = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST, ver=version)
            version += 1
        return path

    def _save_topk_checkpoint(self, trainer, monitor_candidates: dict) -> None:
        # the top-k file may become last.ckpt: it records last.ckpt's path, as a last.ckpt written itself does
        if self.save_last and not self.last_model_path:
            self.last_model_path = self._last_path(trainer, monitor_candidates)
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_last_checkpoint(self, trainer, monitor_candidates: dict) -> None:
        """Lightning's, except that last.ckpt names the checkpoint saved at this same step when there is one
        (`_link_checkpoint`), and is written itself only where no other file holds this step."""
        if not self.save_last:
            return
        path = self._last_path(trainer, monitor_candidates)
        previous, self.last_model_path = self.last_model_path, path
        source = self.saved_this_step(trainer)
        if source and source != path and self.links_last(trainer):
            self._link_checkpoint(trainer, source, path)
        else:
            if trainer.is_global_zero and not self.links_last(trainer) and _is_link(path):
                os.remove(path)  # a writer that does not rename would write through the link into its file
            self._save_checkpoint(trainer, path)
        if previous and self._should_remove_checkpoint(trainer, previous, path):
            self._remove_checkpoint(trainer, previous)

    @staticmethod
    def _link_checkpoint(trainer, filepath: str, linkpath: str) -> None:
        """Lightning's (for save_last="link"), made atomic: last.ckpt becomes a hard link to the file, else a
        relative symbolic link, else a copy, at a temporary name renamed over the previous last.ckpt."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            link_file(filepath, linkpath)
        trainer.strategy.barrier()

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        """A checkpoint that top-k prunes while last.ckpt is a symbolic link to it is renamed to last.ckpt instead
        of deleted: last.ckpt never dangles, not even until it is linked to the new checkpoint. Only a file of this
        run's checkpoint folder is ever removed."""
        if not holds(self.dirpath, filepath):
            log.warning("kept %s: it is not a file of this run's checkpoint folder %s", filepath, self.dirpath)
            return
        last = self.last_model_path
        if (trainer.is_global_zero and last and os.path.islink(last)
                and os.path.realpath(last) == os.path.realpath(filepath)):
            os.replace(filepath, last)
        else:
            super()._remove_checkpoint(trainer, filepath)


def holds(dirpath: str | None, path: str) -> bool:
    """Whether `path` is inside the checkpoint folder `dirpath` (a local one: its real path; object storage: by
    prefix). A protocol other than the folder's (`local://`, `s3://`) is outside."""
    if not dirpath or not path:
        return False
    if not _is_local_file_protocol(dirpath):
        return str(path).startswith(str(dirpath).rstrip("/") + "/") and ".." not in str(path).split("/")
    if not _is_local_file_protocol(path) or str(path).startswith("file:"):
        return False
    real = os.path.realpath(os.path.dirname(os.path.abspath(os.path.expanduser(str(path)))))
    top = os.path.realpath(dirpath)
    return (real == top or real.startswith(top.rstrip(os.sep) + os.sep)) and os.path.basename(str(path)) not in (
        "", ".", "..")


def _is_link(path: str) -> bool:
    """A symbolic link, or a file with another name (a hard link)."""
    try:
        return os.path.islink(path) or os.stat(path).st_nlink > 1
    except OSError:
        return False
