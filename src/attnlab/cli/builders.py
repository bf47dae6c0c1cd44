"""Build the pieces of a run from the composed config: data, task, callbacks, loggers, trainer, checkpoints."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate as _hydra_instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.checkpoints import trust
from attnlab.config import constructor_kwargs, import_user_modules, named_parameters
from attnlab.errors import UserError
from attnlab.protocols import data as data_hooks
from attnlab.protocols import task as task_hooks
from attnlab.checkpoints.resume import resolve_checkpoint
from attnlab.settings import split_optimizer

log = logging.getLogger("attnlab")


def instantiate(cfg, *args, **kwargs):
    """hydra.utils.instantiate, letting a UserError raised by the constructor through unwrapped."""
    try:
        return _hydra_instantiate(cfg, *args, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, UserError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise


def build_datamodule(data_cfg: DictConfig, tokenizer: str | None = None):
    """Instantiate the DataModule, load what it needs (downloading only where configured), and write the sizes the
    data determines (its `info()`: num_classes, image_size, vocab_size, ...) into the data config, where a model
    config interpolates them (`${data.vocab_size}`)."""
    node = OmegaConf.to_container(data_cfg, resolve=True)
    cls = trust.target_class(node.pop("_target_", None), "data")
    kwargs, _ = constructor_kwargs("data", node, cls)
    dm = instantiate({"_target_": f"{cls.__module__}.{cls.__qualname__}", **kwargs}, _convert_="all")
    data_hooks.use_tokenizer(dm, tokenizer)  # the tokenizer of the weights the run starts from
    if os.environ.get("LOCAL_RANK", "0") == "0":
        dm.prepare_data()
    dm.setup("fit")
    with open_dict(data_cfg):
        for key, value in data_hooks.info(dm).sizes().items():
            data_cfg[key] = value
    return dm


def build_task(cfg: DictConfig, dm) -> Any:
    """The task of cfg.model, given what the data `dm` provides. attnlab's tasks get plain configs for their network,
    optimizer and schedule and build them themselves, so a checkpoint alone rebuilds them. Any other LightningModule
    gets its own arguments, and `optimizer` / `scheduler` as Hydra partials when its constructor takes them."""
    from attnlab.tasks.base import BaseTask

    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    task_cls = trust.target_class(model_cfg.pop("_target_", None), "model")
    kwargs, _ = constructor_kwargs("model", model_cfg, task_cls)
    optimizer = OmegaConf.to_container(cfg.optimizer, resolve=True) if cfg.get("optimizer") else None
    scheduler = OmegaConf.to_container(cfg.scheduler, resolve=True) if cfg.get("scheduler") else None
    takes = named_parameters(task_cls)
    # the data's objects (tokenizers, class names, ...) for the parameters the task names and the config leaves empty
    info = data_hooks.info(dm)
    kwargs |= {k: v for k, v in info.task_arguments().items() if k in takes and kwargs.get(k) is None}
    if issubclass(task_cls, BaseTask):
        return task_hooks.check_data(task_cls(**kwargs, optimizer=optimizer, scheduler=scheduler), info)
    if optimizer and "optimizer" in takes:
        opt_kwargs, options = split_optimizer(optimizer)
        used = {k: v for k, v in dataclasses.asdict(options).items() if v is not None}
        if used:
            raise UserError(
                f"{', '.join(f'optimizer.{k}={v}' for k, v in used.items())}: attnlab's tasks apply these, but "
                f"{task_cls.__qualname__} builds its own optimizer. Set them to null, or implement them in its "
                "configure_optimizers."
            )
        kwargs["optimizer"] = instantiate(opt_kwargs | {"_partial_": True})
    if scheduler and "scheduler" in takes:
        kwargs["scheduler"] = instantiate(scheduler | {"_partial_": True})
    return instantiate({"_target_": f"{task_cls.__module__}.{task_cls.__qualname__}", **kwargs}, _convert_="all")


def build_callbacks(cfg: DictConfig, has_logger: bool = True) -> list:
    from lightning.pytorch.callbacks import LearningRateMonitor

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None and "_target_" in c]
    if not has_logger:  # nothing to monitor the learning rate into (logger=null, debug presets, sweeps)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    return callbacks


def build_loggers(cfg: DictConfig, wandb_resume_id: str | None = None, resuming: bool = False) -> list:
    """The loggers of cfg.logger; a factory that takes `resume_id` gets the W&B id of the run being resumed, one that
    takes `append` gets `resuming`, so a resumed run continues its W&B run and its metrics.csv."""
    loggers = []
    for lg in (cfg.get("logger") or {}).values():
        if lg is None or "_target_" not in lg:
            continue
        takes = _parameters(lg._target_)
        extra = {"resume_id": wandb_resume_id} if "resume_id" in takes and wandb_resume_id else {}
        if "append" in takes:
            extra["append"] = resuming
        loggers.append(instantiate(lg, **extra))
    return loggers


def _parameters(target: str) -> set[str]:
    """The parameters a `_target_` names (a class's constructor's, a function's); empty when it cannot be read."""
    from hydra.utils import get_object

    try:
        fn = get_object(target)
        return named_parameters(fn) if inspect.isclass(fn) else set(inspect.signature(fn).parameters)
    except Exception:  # the instantiation says what is wrong with it
        return set()


def build_trainer(cfg: DictConfig, plan, callbacks: list, loggers: list, strategy=None):
    """The Trainer of cfg.trainer, as the run's plan decided it; `strategy`, where given (the one made for the task:
    FSDP given the network's block classes), replaces trainer.strategy."""
    pin_subprocess_ranks_to_job()
    trainer_cfg = cfg.trainer
    if plan.trainer.accelerator == "cpu" and isinstance(trainer_cfg.get("devices"), int):
        # CPU processes of a DDP run share the cores instead of each taking all of them (and never take more
        # threads than the process was given, e.g. by OMP_NUM_THREADS)
        from attnlab.utils.cpus import usable_cpus

        share = max(1, usable_cpus() // max(1, trainer_cfg.devices))
        torch.set_num_threads(min(torch.get_num_threads(), share))
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision(cfg.get("extras", {}).get("float32_matmul_precision", "high"))
    from lightning.pytorch.callbacks import Checkpoint, ProgressBar

    extra = {}
    # callbacks.progress_bar=null / callbacks.model_checkpoint=null mean none, not Lightning's default one
    if "enable_progress_bar" not in trainer_cfg:
        extra["enable_progress_bar"] = any(isinstance(c, ProgressBar) for c in callbacks)
    if "enable_checkpointing" not in trainer_cfg:
        extra["enable_checkpointing"] = any(isinstance(c, Checkpoint) for c in callbacks)
    if strategy is not None:
        trainer_cfg = trainer_cfg.copy()
        with open_dict(trainer_cfg):
            del trainer_cfg["strategy"]
        extra["strategy"] = strategy
    plugins = []
    if not trainer_cfg.get("plugins") and not plan.trainer.writes_own_checkpoints:  # sharded: own IO
        from attnlab.checkpoints.io import AtomicCheckpointIO

        plugins.append(AtomicCheckpointIO())
    plugins, trainer_cfg = with_slurm_environment(plugins, trainer_cfg)
    if plugins:
        extra["plugins"] = plugins
    return instantiate(trainer_cfg, callbacks=callbacks, logger=loggers or False, **extra)


def pin_subprocess_ranks_to_job() -> None:
    """In a job of a multirun, the command Lightning re-executes for each extra DDP rank is a single run of this job
    (its own overrides, an Optuna trial's parameters among them) in the job's directory: one directory per job,
    never one per rank."""
    import sys

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hc = HydraConfig.get()
    # hydra.mode=RUN: a config that sets MULTIRUN itself (hparams_search=...) would make each rank a sweep of its own
    sys.argv = [sys.argv[0], *hc.overrides.task, "hydra.mode=RUN"]
    with read_write(hc), open_dict(hc):
        hc.run.dir = hc.runtime.output_dir


def with_slurm_environment(plugins: list, trainer_cfg: DictConfig) -> tuple[list, DictConfig]:
    """Under SLURM, (plugins, trainer_cfg) with Lightning's SLURM environment added without its requeue handler, so
    that SignalGuard alone acts on SLURM's warning signal; the config's own plugins come along. Unchanged elsewhere,
    or where the config's plugins name a cluster environment of their own."""
    from lightning.fabric.plugins.environments import ClusterEnvironment

    from attnlab.cluster.slurm_job import slurm_environment

    environment = slurm_environment()
    if environment is None:
        return plugins, trainer_cfg
    own = list(instantiate(trainer_cfg.plugins)) if trainer_cfg.get("plugins") else []
    if any(isinstance(p, ClusterEnvironment) for p in own):
        return plugins, trainer_cfg
    trainer_cfg = trainer_cfg.copy()
    with open_dict(trainer_cfg):
        trainer_cfg.pop("plugins", None)
    return [*own, *plugins, environment], trainer_cfg


# ---- checkpoints

def required_checkpoint(cfg: DictConfig, script: str) -> str:
    """The checkpoint eval.py / predict.py work on, which the user must name."""
    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.ckpt_path:
        raise UserError(f"{script} needs a checkpoint: ckpt_path=<run dir>/checkpoints/last.ckpt (or best), or "
                        "ckpt_path=last for the newest run's.")
    return resolve_checkpoint(cfg.ckpt_path, cfg.paths.log_dir)


def load_task(ckpt_path: str, meta: dict):
    """The task a checkpoint holds, rebuilt from it alone on the device its weights are on: read safely (weights
    only, what its config names checked), the user's modules it names imported, its hyperparameters given to the
    task's class (those built from config nodes, such as `net` and `optimizer`, built again)."""
    from attnlab.callbacks.plain_hparams import rebuild_hparams
    from attnlab.checkpoints.reading import load_checkpoint
    from attnlab.compat import lightning_load_state, migrate_checkpoint

    # what Lightning's load_from_checkpoint does, from the dict the one reader gave (a sharded folder's too)
    ckpt = migrate_checkpoint(load_checkpoint(ckpt_path))
    imports = (meta["config"].get("extras") or {}).get("imports")
    for module in imports or []:
        trust.admit("module", str(module), "extras.imports")
    import_user_modules(imports)
    task_cls = trust.target_class(meta["config"]["model"]["_target_"], "model")
    rebuild_hparams(ckpt, instantiate)
    try:
        model = lightning_load_state(task_cls, ckpt)
    except TypeError as e:  # hyperparameters its task's constructor does not take
        raise UserError(f"ckpt_path: {ckpt_path} holds hyperparameters that {task_cls.__qualname__} does not take "
                        f"({e}). The file was changed after its run wrote it, or another program wrote it: give a "
                        "checkpoint as attnlab's train.py wrote it (<run dir>/checkpoints/).") from None
    state = ckpt.get("state_dict") or {}
    device = next((t.device for t in state.values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
    return model.to(device)


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"model/params_total": total, "model/params_trainable": trainable,
            "model/params_frozen": total - trainable}
