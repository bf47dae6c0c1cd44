"""The plan of a run: its typed settings and what is decided from them (devices, precision, gradient accumulation,
sharding), once, before anything is built or saved. What was asked and what was decided are kept apart:
`.hydra/config.yaml` keeps what Hydra composed, each decision is written into the config in memory (cfg.trainer), and
`plan.decided` (`{key: {asked, decided, why, on}}`) goes into lineage.json.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.errors import UserError
from attnlab.settings import ModelKeys, RunSettings, split_optimizer

log = logging.getLogger("attnlab")
MIXED = ("bf16-mixed", "bf16", "16-mixed", "16")


@dataclass(frozen=True)
class TrainerPlan:
    accelerator: str  # as configured (auto, cpu, gpu, ...)
    on_gpu: bool  # decided: the run is on CUDA GPUs
    devices: int  # per node
    num_nodes: int
    precision: str  # decided: follows the accelerator
    accumulate_grad_batches: int
    strategy: Any  # trainer.strategy as plain values (a name, a `_target_` dict) or None
    sharded: bool  # FSDP
    writes_own_checkpoints: bool  # FSDP, DeepSpeed: no atomic checkpoint IO plugin

    @property
    def processes(self) -> int:
        return self.devices * self.num_nodes


@dataclass(frozen=True)
class RunPlan:
    run: RunSettings
    trainer: TrainerPlan
    model: ModelKeys
    model_target: str
    output_dir: Path
    log_dir: Path
    cache_dir: str | None
    averages_weights: bool = False
    force: bool = False  # extras.force: a run the memory estimate refuses starts anyway
    optimizer: dict[str, Any] | None = None  # the optimizer node's own arguments (attnlab's keys off), resolved
    # what the plan changed in the config: {"trainer.precision": {"asked", "decided", "why", "on"}, ...}
    decided: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: Path | None = None  # the checkpoint folder (callbacks.model_checkpoint.dirpath)
    # a training run's (plan_training): what it continues from; what the weights of model.init_from fix
    resume: Any = None  # attnlab.checkpoints.resume.ResumePoint
    init_tokenizer: str | None = None


def accumulation_for(global_batch_size: int, batch_size: int, devices: int, nodes: int) -> int:
    """Gradient accumulation giving `global_batch_size` samples per optimizer step on devices x nodes."""
    per_step = batch_size * devices * nodes
    if global_batch_size % per_step:
        raise UserError(
            f"global_batch_size={global_batch_size} is not a multiple of data.batch_size x devices x nodes = "
            f"{batch_size} x {devices} x {nodes} = {per_step}. Pick a global batch size that is, or change "
            "data.batch_size (the per-device batch)."
        )
    return global_batch_size // per_step


def make_plan(cfg: DictConfig) -> RunPlan:
    """The run's plan from its checked config, each decision applied to cfg.trainer. On the CPU, a mixed precision
    the command line does not give becomes 32-true; `trainer.devices=auto` is every GPU, or one process on the CPU.
    Raises a UserError for settings that cannot go together (FSDP with EMA or SWA, an indivisible global batch)."""
    from attnlab.devices import check_devices, device_count, uses_gpu
    from attnlab.memory import averages_weights
    from attnlab.strategies import is_fsdp, writes_own_checkpoints

    run = RunSettings.of(cfg)
    t = OmegaConf.to_container(cfg.trainer, resolve=True)
    accelerator, devices = str(t.get("accelerator") or "auto"), t.get("devices", 1)
    on_gpu = uses_gpu(accelerator)
    on = "gpu" if on_gpu else "cpu" if accelerator in ("auto", "cpu") else accelerator
    decided: dict[str, dict[str, Any]] = {}

    def choose(key: str, value: Any, why: str) -> Any:
        """Record a decision and write it into cfg.trainer, the config in memory (.hydra/config.yaml keeps what was
        asked)."""
        decided[f"trainer.{key}"] = {"asked": t.get(key), "decided": value, "why": why, "on": on}
        with open_dict(cfg.trainer):
            cfg.trainer[key] = value
        return value

    precision = str(t.get("precision") or "32-true")
    if not on_gpu and precision in MIXED and not _given("trainer.precision"):
        precision = choose("precision", "32-true", f"the run is on the CPU (the preset's {precision} is for GPUs)")
        log.info("trainer.precision=32-true: the run is on the CPU (the preset's %s is for GPUs; "
                 "trainer.precision=%s keeps it)", t.get("precision"), t.get("precision"))
    check_devices(accelerator, devices, precision)  # the one device check
    count, nodes = device_count(accelerator, devices), int(t.get("num_nodes") or 1)
    if devices in ("auto", -1, "-1"):
        choose("devices", count, "every GPU of this machine" if on_gpu else "one process")
    accumulate = int(t.get("accumulate_grad_batches") or 1)
    if run.global_batch_size:
        accumulate = choose("accumulate_grad_batches",
                            accumulation_for(run.global_batch_size, int(cfg.data.batch_size), count, nodes),
                            f"global_batch_size={run.global_batch_size} over data.batch_size={cfg.data.batch_size}"
                            f" x {count} device(s) x {nodes} node(s)")
        log.info("global_batch_size=%d: accumulating gradients over %d batches", run.global_batch_size, accumulate)
    strategy = t.get("strategy") or None
    paths, model = cfg.get("paths") or {}, cfg.get("model") or {}
    callbacks = OmegaConf.to_container(cfg.callbacks, resolve=False) if cfg.get("callbacks") else {}
    sharded, averaged = is_fsdp(strategy), averages_weights(callbacks)
    if sharded and averaged:
        raise UserError("callbacks=ema (or another callback averaging the weights) keeps a whole copy of the "
                        "model, which FSDP's sharded weights cannot be averaged into: train with trainer=ddp, or "
                        "leave the average out (callbacks=default).")
    output_dir = Path(str(paths.get("output_dir") or "."))
    optimizer = OmegaConf.to_container(cfg.optimizer, resolve=True) if cfg.get("optimizer") else None
    own_dir = ((cfg.get("callbacks") or {}).get("model_checkpoint") or {}).get("dirpath")
    return RunPlan(
        run=run,
        trainer=TrainerPlan(accelerator, on_gpu, count, nodes, precision, accumulate, strategy, sharded,
                            writes_own_checkpoints(strategy)),
        model=ModelKeys(**{k: model.get(k) for k in ("monitor", "monitor_mode", "compile", "activation_checkpointing")
                           if model.get(k) is not None}),
        model_target=str(model.get("_target_", "")),
        output_dir=output_dir, log_dir=Path(str(paths.get("log_dir") or ".")), cache_dir=paths.get("cache_dir"),
        averages_weights=averaged, force=bool((cfg.get("extras") or {}).get("force")), decided=decided,
        optimizer=split_optimizer(optimizer)[0] if optimizer and optimizer.get("_target_") else None,
        checkpoints=Path(str(own_dir)) if own_dir else output_dir / "checkpoints")


def plan_training(cfg: DictConfig) -> RunPlan:
    """A training run's plan: make_plan's, with the checkpoint it continues from (ckpt_path=, or its run directory's
    own last.ckpt) and what the weights `model.init_from` names fix: the network's settings, written into cfg.model
    (so the run's config.yaml says what was built), and the tokenizer the data is read with."""
    import dataclasses

    from attnlab.checkpoints import trust
    from attnlab.checkpoints.reading import check_init_from
    from attnlab.checkpoints.resume import resume_point
    from attnlab.cli import rerun
    from attnlab.protocols import task as task_hooks

    plan = make_plan(cfg)
    rerun.warn_decisions(cfg, plan.decided)  # a --rerun: where this machine decided otherwise than the run's
    run, init_from = plan.run, cfg.model.get("init_from")
    check_init_from(init_from)  # a file that cannot be loaded safely: refused before anything is built
    resume = resume_point(run.ckpt_path, plan.log_dir, run.task_name, plan.checkpoints, run.train, run.resume,
                          plan.model_target)
    if not init_from:
        return dataclasses.replace(plan, resume=resume)
    task_cls = trust.target_class(plan.model_target, "model")
    changed = {k: v for k, v in task_hooks.init_settings(task_cls, str(init_from)).items() if cfg.model.get(k) != v}
    if changed:
        log.info("model.init_from=%s sets %s", init_from, ", ".join(f"model.{k}={v}" for k, v in changed.items()))
        with open_dict(cfg.model):
            for k, v in changed.items():
                cfg.model[k] = v
    tokenizer = task_hooks.init_tokenizer(task_cls, str(init_from))
    return dataclasses.replace(plan, resume=resume, init_tokenizer=tokenizer)


def _given(key: str) -> bool:
    """Whether the command line sets `key` (Hydra's task overrides; in a `--rerun`, the run's own overrides and the
    keys changed on purpose). Outside a Hydra run (a config composed in Python) every value counts as given: it is
    kept as it is."""
    try:
        from hydra.core.hydra_config import HydraConfig

        from attnlab.cli import rerun

        if not HydraConfig.initialized():
            return True
        given = [*HydraConfig.get().overrides.task, *rerun._asked]
        return any(str(o).lstrip("+~").partition("=")[0] == key for o in given)
    except Exception:
        return True
