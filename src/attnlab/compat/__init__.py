"""The private names of other packages that attnlab relies on (Lightning, torchmetrics, torch, Hydra, OmegaConf, Optuna,
CPython's atexit), each behind a public name here; submitit's are in cluster/submitit_bridge.py. tests/test_compat.py
checks that each exists in the installed versions, and that no other module reads or sets another package's private
attribute, imports its private name or overrides its private method. Importing this package imports none of them:
each is imported where it is used (ModelCheckpoint's internals: checkpoint.py; the progress bar's: progress.py).
"""

from __future__ import annotations

from collections.abc import Callable


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
    """Load the training DataLoader's saved position, if a checkpoint left one to load, and start the epoch's iterator
    again from it. Lightning loads it only for a checkpoint written mid-epoch, and only when it sets the training
    data up after reading the checkpoint (a schedule that asks for `trainer.estimated_stepping_batches` sets it up
    earlier)."""
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
    """Make a checkpoint saved during fit's validation (a stop after one of its batches) resume by running that
    validation again from its first batch; as saved, Lightning would resume past it. Its progress is set to
    Lightning's state of a save inside a validation batch ("restarted mid-evaluation"), with no batch done."""
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
    """Stop training at the end of the current step, as Lightning stops on SIGTERM (a SIGTERMException). Each
    process checks its own flag: in a run of several, set it in all of them after the same step."""
    trainer._signal_connector.received_sigterm = True


def stand_down_rank_observer() -> None:
    """Let every rank end by itself. The launcher of `trainer=ddp_cpu` (and of any run whose ranks Lightning starts)
    watches from rank 0 the ranks it started, and kills them all, rank 0 too, with SIGKILL once one ends non-zero. A
    run stopped by a signal ends every rank with status 143 on purpose, after the same step."""
    import threading

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    for thread in threading.enumerate():
        if isinstance(thread, _ChildProcessObserver):
            thread._run = lambda: True  # its next look ends it, without a signal


# ---- torchmetrics
def metric_defaults(metric) -> dict:
    """A torchmetrics Metric's states as they are after `reset()`, by name."""
    return dict(metric._defaults)


def metric_state(metric) -> dict:
    """A Metric's current states and update count, for `restore_metric_state`."""
    return {name: getattr(metric, name) for name in metric._defaults} | {"_update_count": metric._update_count}


def restore_metric_state(metric, state: dict) -> None:
    for name, value in state.items():
        setattr(metric, name, value)


# ---- torch, Hydra: private modules and objects, each behind one name here
def fake_tensor_mode(**kwargs):
    """torch's FakeTensorMode: tensors with shapes and dtypes but no storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(**kwargs)


def dispatch_mode_class() -> type:
    """torch's TorchDispatchMode, the base of a mode that sees every op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def activation_checkpointing() -> tuple[type, Callable]:
    """(CheckpointWrapper, apply_activation_checkpointing): torch's wrapper that recomputes a block's activations."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        apply_activation_checkpointing,
    )

    return CheckpointWrapper, apply_activation_checkpointing


def weights_only_globals() -> set[str]:
    """The globals torch.load(weights_only=True) admits (torch._weights_only_unpickler), the user's added ones too."""
    from torch import _weights_only_unpickler as restricted

    return set(restricted._get_allowed_globals()) | set(restricted._get_user_allowed_globals())


def dcp_load_whole(state_dict: dict, reader, planner) -> None:
    """torch.distributed.checkpoint's loading of a whole state dict without a process group (`_load_state_dict`, what
    its public `dcp_to_torch_save` calls)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _load_state_dict(state_dict, storage_reader=reader, planner=planner, no_dist=True)


def dcp_empty_planner_class() -> type:
    """DCP's `_EmptyStateDictLoadPlanner`: a load planner that builds the state dict from the metadata."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    return _EmptyStateDictLoadPlanner


def lightning_load_state(cls, checkpoint: dict, **kwargs):
    """Lightning's `_load_state`: what `load_from_checkpoint` does with a checkpoint dict already read."""
    from lightning.pytorch.core.saving import _load_state

    return _load_state(cls, checkpoint, **kwargs)


def migrate_checkpoint(checkpoint: dict) -> dict:
    """Lightning's upgrade of a checkpoint written by an older version (`_pl_migrate_checkpoint`)."""
    from lightning.pytorch.utilities.migration.utils import _pl_migrate_checkpoint

    return _pl_migrate_checkpoint(checkpoint, checkpoint_path=None)


def apply_overrides(cfg, overrides: list) -> None:
    """Hydra's application of parsed overrides to a composed config (ConfigLoaderImpl._apply_overrides_to_config)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def hydra_args_parser():
    """Hydra's own parser of the command line (hydra._internal.utils.get_args_parser): its flags and overrides."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def pin_hydra_mode(mode: str | None) -> None:
    """Hydra composes the whole config once only to read `hydra.mode` (Hydra.get_mode), then again to run it; where
    the entry point has just read the mode from the same command line, that first composition is skipped, once (the
    next command of the process composes again)."""
    if mode is None:
        return
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    original = Hydra.get_mode

    def get_mode(self, config_name, overrides):
        Hydra.get_mode = original
        return RunMode[mode] if mode else None

    Hydra.get_mode = get_mode


def config_node(cfg, key):
    """The node at `key` of an OmegaConf config (its `_get_node`): a nested config, or the value's own node."""
    return cfg._get_node(key)


def raw_value(cfg, key):
    """The value at `key` of an OmegaConf config as written: an interpolation (`${data.vocab_size}`) unresolved."""
    return cfg._get_node(key)._value()


def storage_key(storage) -> int:
    """One number per storage (an untyped storage's `_cdata`): equal for every view of it, fake tensors' too."""
    return storage._cdata


def compile_keeps_dynamic_shapes():
    """A decorator: torch.compile keeps ops whose output shape depends on the data (boolean indexing) in the graph
    (`torch._dynamo.config`'s `capture_dynamic_output_shape_ops`)."""
    import torch

    return torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)


def dcp_metadata_private_names() -> dict[tuple[str, str], object]:
    """The two private names a sharded checkpoint's `.metadata` pickle gives, by (module, name): torch's name ->
    layout function and DCP's `_StorageInfo`. A reader of that format admits them."""
    import torch
    from torch.distributed.checkpoint import filesystem

    return {("torch.serialization", "_get_layout"): torch.serialization._get_layout,
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): filesystem._StorageInfo}


def shut_down_loader_workers(iterator) -> None:
    """End a DataLoader iterator's worker processes now (`_shutdown_workers`), not when the iterator is collected."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def appending_csv_logger(**kwargs):
    """Lightning's CSVLogger continuing an existing metrics.csv (its header's columns kept) instead of replacing it:
    its writer's `_check_log_dir_exists` and the logger's `_experiment` and `_fs`."""
    import csv

    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter
    from lightning.pytorch.loggers.logger import rank_zero_experiment

    class AppendingWriter(ExperimentWriter):
        def _check_log_dir_exists(self) -> None:
            if self._fs.isfile(self.metrics_file_path):
                with self._fs.open(self.metrics_file_path, "r", newline="") as fh:
                    self.metrics_keys = list(next(csv.reader(fh), []))

    class AppendingCSVLogger(CSVLogger):
        @property
        @rank_zero_experiment
        def experiment(self):
            if self._experiment is None:
                self._fs.makedirs(self.root_dir, exist_ok=True)
                self._experiment = AppendingWriter(log_dir=self.log_dir)
            return self._experiment

    return AppendingCSVLogger(**kwargs)


# ---- Optuna, CPython
def optuna_trial_id(trial) -> int:
    """A trial's id in its study's storage (`_trial_id`), which `optuna.trial.Trial(study, trial_id)` takes."""
    return trial._trial_id


def stored_trial(study, trial):
    """The trial as its study's storage holds it now (`Study._storage`), a live trial's reported values too."""
    return study._storage.get_trial(trial._trial_id)


def set_stored_attr(study, trial, key: str, value) -> None:
    """Set a user attribute of a trial in its study's storage, a running trial read back from it too (a
    FrozenTrial's own `set_user_attr` changes only that object)."""
    study._storage.set_trial_user_attr(trial._trial_id, key, value)


def run_exit_handlers() -> bool:
    """Run the handlers registered with atexit now (CPython's `atexit._run_exitfuncs`); False where the interpreter
    has no such function (it then runs them itself at its exit)."""
    import atexit

    run = getattr(atexit, "_run_exitfuncs", None)
    if run is None:
        return False
    run()
    return True
