"""ModelCheckpoint's internals that attnlab's ModelCheckpoint (callbacks/checkpoint.py) builds on, under public names;
and which files of a checkpoint folder a callback may remove (`holds`)."""

from __future__ import annotations

import logging
import os

from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import ModelCheckpoint

from attnlab.compat import validates_after_this_batch
from attnlab.utils.atomic import link_file

log = logging.getLogger("attnlab")


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
        never run."""
        if self._every_n_train_steps and not trainer.sanity_checking and validates_after_this_batch(trainer):
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def save_last_now(self, trainer) -> None:
        """Write last.ckpt at once, unless save_last is off or Lightning skips saving here (a sanity check, a
        fast_dev_run, a step saved already)."""
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
    top, text = os.path.realpath(dirpath), os.path.expanduser(str(path))
    # its folder as the system finds it (a link before a `..` followed), and as the path reads once normalized
    found = os.path.realpath(os.path.dirname(text) or os.curdir)
    read = os.path.realpath(os.path.dirname(os.path.abspath(text)))
    return all(d == top or d.startswith(top.rstrip(os.sep) + os.sep) for d in (found, read)) and (
        os.path.basename(text) not in ("", ".", ".."))


def _is_link(path: str) -> bool:
    """A symbolic link, or a file with another name (a hard link)."""
    try:
        return os.path.islink(path) or os.stat(path).st_nlink > 1
    except OSError:
        return False
