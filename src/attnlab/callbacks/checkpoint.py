"""attnlab's ModelCheckpoint: Lightning's, for runs that stop and resume. `last.ckpt` is written at every save point and
on SIGTERM, Ctrl-C, or a monitored metric that is never logged (other errors save nothing); a checkpoint saved
mid-validation resumes by redoing that validation; a tie of the monitored metric goes to the newer checkpoint; a
loaded checkpoint's callback states keep no path outside this run's checkpoint folder. On a local disk, `last.ckpt`
links to the top-k file saved at the same step, if any.
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Any

import torch

from lightning.pytorch.utilities.exceptions import SIGTERMException

from attnlab.compat import redo_interrupted_validation
from attnlab.compat.checkpoint import CheckpointBase, holds
from attnlab.errors import UserError
from attnlab.utils.printable import printable

log = logging.getLogger("attnlab")


class ModelCheckpoint(CheckpointBase):
    _trainer = None  # this class's own: the trainer its state_dict reads metrics from
    _resumed_value = None
    _validating = False  # a validation of the fit is under way (a save now is a stop's, mid-validation)

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._trainer = trainer

    def state_dict(self) -> dict:
        state = super().state_dict()
        metrics = self._trainer.callback_metrics if self._trainer is not None else {}
        state["monitored_value"] = metrics.get(self.monitor) if self.monitor else None
        return state

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Before any callback's state is restored: every path in them that is not inside this run's checkpoint
        folder dropped, with one line (a file from elsewhere cannot make a callback delete or write there)."""
        dropped, foreign = [], False
        for name, state in (checkpoint.get("callbacks") or {}).items():
            if isinstance(state, dict):  # a moved run folder's own paths named in its new place first
                kept, gone = confined(_moved(state, self.dirpath) if name == self.state_key else state, self.dirpath)
                own = state.get("dirpath")  # the files of the run that wrote it (ckpt_path= of another run): info
                foreign |= any(not (isinstance(own, str) and holds(own, g)) for g in gone)
                state.clear()
                state.update(kept)
                dropped += [f"{name}: {g}" for g in gone]
        if dropped:
            say = log.warning if foreign else log.info
            say("the checkpoint's callback state names %d path%s outside this run's checkpoint folder %s, dropped: %s",
                len(dropped), "" if len(dropped) == 1 else "s", self.dirpath,
                "; ".join(printable(d) for d in dropped[:3]) + (" ..." if len(dropped) > 3 else ""))

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(_moved(state_dict, self.dirpath))
        self._resumed_value = state_dict.get("monitored_value")

    def monitor_candidates(self, trainer) -> dict:
        """A run resumed mid-epoch has no validation metrics until its next validation: until then, the monitored
        value is the one of the interrupted run, so that top-k decisions are those of an uninterrupted run."""
        candidates = super().monitor_candidates(trainer)
        if self.monitor and self.monitor not in candidates and self._resumed_value is not None:
            candidates[self.monitor] = self._resumed_value
        return candidates

    def check_monitor_top_k(self, trainer, current=None) -> bool:
        if current is None or self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return super().check_monitor_top_k(trainer, current)
        op = torch.le if self.mode == "min" else torch.ge
        better = bool(op(current, self.best_k_models[self.kth_best_model_path]))
        return trainer.strategy.reduce_boolean_decision(better)

    def links_last(self, trainer) -> bool:
        """Only on a local disk whose checkpoints are renamed into place (AtomicCheckpointIO): a linked file is never
        rewritten in place."""
        from attnlab.checkpoints.io import AtomicCheckpointIO

        return self.on_local_disk() and isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)

    def on_sanity_check_end(self, trainer, pl_module) -> None:
        """Before training: a monitored validation metric the sanity check did not log is never logged."""
        namespace = self.monitor.split("/")[0] + "/" if self.monitor and "/" in self.monitor else None
        candidates = self.monitor_candidates(trainer)
        # `<metric>_best` (val/acc_best) is logged from the first real validation on, once its metric is there
        best_of_logged = self.monitor.endswith("_best") and self.monitor.removesuffix("_best") in candidates
        if namespace and any(k.startswith(namespace) for k in candidates) and not best_of_logged:
            self._check_monitor(candidates, trainer, before_training=True)

    def _check_monitor(self, candidates: dict, trainer, before_training: bool = False) -> None:
        if not self.monitor or self.monitor in candidates or trainer.fast_dev_run:
            return
        logged = sorted(k for k in candidates if k not in ("epoch", "step") and not k.endswith("_step"))
        close = difflib.get_close_matches(self.monitor, logged, n=2, cutoff=0.5)
        saved = ""
        if not before_training:  # what it trained so far is kept
            self.save_last_now(trainer)
            saved = f" The training so far is saved in {Path(self.dirpath) / 'last.ckpt'}."
        raise UserError(
            f"the checkpoints rank runs by monitor={self.monitor} (model.monitor, or "
            f"callbacks.model_checkpoint.monitor), but the model never logs that metric"
            + (" (checked on the sanity-check batches, before training)" if before_training else "") + ". "
            + (f"Did you mean {' or '.join(close)}? " if close else "")
            + f"It logs: {', '.join(logged) or 'nothing'}. Set model.monitor to one of them.{saved}")

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validating = trainer.state.fn == "fit" and not trainer.sanity_checking

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self._validating:
            redo_interrupted_validation(checkpoint)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._validating = False  # the saves from here on follow a whole validation
        if not trainer.sanity_checking:
            self._check_monitor(self.monitor_candidates(trainer), trainer)
        super().on_validation_end(trainer, pl_module)
        if not self.saves_at_train_epoch_end(trainer):
            self.save_last_now(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self.saves_at_train_epoch_end(trainer):
            self.save_last_now(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if not trainer.fast_dev_run:  # Lightning's own hook would write last.ckpt even for a fast_dev_run
            super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, (SIGTERMException, KeyboardInterrupt)) and not trainer.sanity_checking:
            self.save_last_now(trainer)


_PATH_KEYS = ("path", "dir", "dirpath", "file", "filename")


def _is_path(key: Any, value: str) -> bool:
    return value.startswith(("/", "~")) or "://" in value or ".." in Path(value).parts or (
        isinstance(key, str) and key.lower().endswith(_PATH_KEYS) and bool(value))


def confined(state: Any, dirpath: str | None, key: Any = None) -> tuple[Any, list[str]]:
    """(a callback's state without the paths that are not inside `dirpath`, those paths). A path with a protocol
    (`local://`, `s3://`) counts as one; the state's own `dirpath` is kept (Lightning compares it with its own)."""
    if isinstance(state, dict):
        kept, gone = {}, []
        for k, v in state.items():
            if k == "dirpath":
                kept[k] = v
                continue
            # best_k_models: path -> score, each key a path whatever its form (a relative one is the cwd's)
            if isinstance(k, str) and (key == "best_k_models" or _is_path(None, k)) and not holds(dirpath, k):
                gone.append(k)
                continue
            value, lost = confined(v, dirpath, k)
            kept[k] = value
            gone += lost
        return kept, gone
    if isinstance(state, (list, tuple)):
        pairs = [confined(v, dirpath, key) for v in state]
        return type(state)(v for v, _ in pairs), [g for _, lost in pairs for g in lost]
    if isinstance(state, str) and _is_path(key, state) and not holds(dirpath, state):
        return "", [state]
    return state, []


def _moved(state: dict, dirpath: str | None) -> dict:
    """The callback's state of a run folder moved to `dirpath` (copied off a cluster's scratch, renamed), its paths
    named in the new folder, so that the run goes on replacing and pruning its own last.ckpt and top-k files. A state
    whose last.ckpt is not found in `dirpath` (another run's: ckpt_path=) is returned as it is."""
    old = state.get("dirpath")
    if not old or not dirpath or old == dirpath:
        return state

    def here(path):
        if not isinstance(path, str) or not path.startswith(old.rstrip("/") + "/"):
            return path
        return str(Path(dirpath) / Path(path).relative_to(old))

    last = here(state.get("last_model_path"))
    if not last or not Path(last).exists():
        return state
    moved = dict(state, dirpath=dirpath, last_model_path=last)
    for key in ("best_model_path", "kth_best_model_path"):
        moved[key] = here(state.get(key))
    moved["best_k_models"] = {here(k): v for k, v in (state.get("best_k_models") or {}).items()
                              if Path(here(k)).exists()}
    return moved

