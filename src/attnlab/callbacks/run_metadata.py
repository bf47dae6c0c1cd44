"""Stores the run's resolved config, W&B run id, lineage and last logged metrics in every checkpoint, so that a
checkpoint alone can be evaluated, resumed into the same W&B run, or traced back to the code and machine that made it;
and writes the run folder's `lineage.json` (attnlab.lineage) when training starts and when an attempt ends, with the
trainer as it runs and what the run's plan decided (`decided`)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

import attnlab
from attnlab import lineage
from attnlab.cluster.outcome import FINISHED, RUNNING, AttemptEnd, Cause, Outcome
from attnlab.cluster.slurm_job import Ledger, max_requeues
from attnlab.utils.media import wandb_logger


def trainer_as_run(trainer: L.Trainer) -> dict[str, Any]:
    """The Trainer as it runs: its accelerator, devices, nodes, precision, accumulation and strategy."""
    return {"accelerator": type(trainer.accelerator).__name__.removesuffix("Accelerator").lower(),
            "devices": trainer.num_devices, "num_nodes": trainer.num_nodes, "world_size": trainer.world_size,
            "precision": str(trainer.precision), "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "strategy": type(trainer.strategy).__name__}


class RunMetadata(L.Callback):
    def __init__(self, config: dict[str, Any], decided: dict[str, Any] | None = None):
        self.config = config
        self.decided = decided or {}  # the plan's decisions (cli/plan.py: RunPlan.decided)
        self.lineage: dict[str, Any] | None = None

    def run_dir(self) -> str | None:
        return (self.config.get("paths") or {}).get("output_dir")

    def setting(self, group: str, key: str) -> Any:
        """A value of the run's resolved config (`paths`, `cache_dir`), None where it has none."""
        return (self.config.get(group) or {}).get(key)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.lineage is not None:
            return
        self.lineage, diff = lineage.collect()
        self.lineage["trainer"] = trainer_as_run(trainer)
        self.lineage["decided"] = self.decided
        launcher = lineage.launcher_settings()
        if launcher:
            self.lineage["launcher"] = launcher
        if trainer.is_global_zero and self.run_dir():
            lineage.write(self.run_dir(), self.lineage, diff)

    @staticmethod
    def of(trainer: L.Trainer) -> RunMetadata | None:
        return next((c for c in trainer.callbacks if isinstance(c, RunMetadata)), None)

    def finish(self, trainer, end: AttemptEnd, any_rank: bool = False, **fields: Any) -> None:
        """How this attempt of the run ended (cluster/outcome.py), in lineage.json:
        rank 0 writes it; with `any_rank` (a lost peer: rank 0 may be the rank lost) another rank writes it too,
        into the record rank 0 wrote of this attempt, unless rank 0 has recorded its end already."""
        if self.lineage is None or not self.run_dir():
            return
        ended = {"ended": lineage.now(), **end.record(), "global_step": trainer.global_step, **fields}
        if trainer.is_global_zero:
            self.lineage |= ended
            lineage.write(self.run_dir(), self.lineage)
        elif any_rank:
            written = lineage.read(self.run_dir())
            if written and written.get("slurm") == self.lineage.get("slurm") and AttemptEnd.of(written) == RUNNING:
                lineage.write(self.run_dir(), written | ended | {"recorded_by_rank": trainer.global_rank})

    def on_fit_end(self, trainer, pl_module) -> None:
        self.finish(trainer, FINISHED)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        guarded = any(type(c).__name__ == "SignalGuard" for c in trainer.callbacks)  # callbacks/signals.py
        if isinstance(exception, SIGTERMException) and guarded:
            return  # a signal's stop: the guard records how it ended (stopped, requeued, ...)
        if type(exception).__name__ == "TrialPruned":  # an Optuna sweep's pruner stopped it
            self.finish(trainer, AttemptEnd(Outcome.PRUNED))
        elif isinstance(exception, KeyboardInterrupt):
            self.finish(trainer, AttemptEnd(Outcome.STOPPED, Cause.CTRL_C))
        else:
            self.finish(trainer, AttemptEnd(Outcome.FAILED, Cause.ERROR, type(exception).__name__))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        wandb = wandb_logger(trainer)
        checkpoint["attnlab"] = {
            "version": attnlab.__version__,
            "config": self.config,
            "wandb_run_id": wandb.version if wandb is not None else None,
            "lineage": self.lineage,
            # what the run had logged last: the results of a run resumed from the end of its training, which
            # then trains and validates no more (a stop after the last validation)
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()
                        if isinstance(v, torch.Tensor) and v.numel() == 1},
        }


def ledger_of(trainer: L.Trainer) -> Ledger:
    """The ledger of this run folder's SLURM attempts (cluster/slurm_job.py)."""
    metadata = RunMetadata.of(trainer)
    return Ledger((metadata.run_dir() if metadata is not None else None) or trainer.default_root_dir)


def requeue_budget(trainer: L.Trainer) -> tuple[int, str]:
    """The budget of requeues of each counted cause, from the run's resolved launcher (cluster/slurm_job.py)."""
    return max_requeues((getattr(RunMetadata.of(trainer), "lineage", None) or {}).get("launcher"))


def record_end(trainer, end: AttemptEnd, any_rank: bool = False, **fields: Any) -> None:
    """How this attempt ended, in the run's lineage (`RunMetadata.finish`), where the trainer has a RunMetadata."""
    metadata = RunMetadata.of(trainer)
    if metadata is not None:
        metadata.finish(trainer, end, any_rank=any_rank, **fields)
