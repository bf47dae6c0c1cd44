"""Pruning inside an Optuna sweep (`hydra.sweeper.pruner`): rank 0 reports the monitored metric to the job's trial at
every validation, and every rank stops together (optuna.TrialPruned) when the study's pruner prunes it. The job finds
its study and trial in its environment (ATTNLAB_OPTUNA_*); outside such a sweep the callback does nothing."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning as L

ENV_STORAGE, ENV_STUDY, ENV_TRIAL, ENV_PRUNER = ("ATTNLAB_OPTUNA_STORAGE", "ATTNLAB_OPTUNA_STUDY",
                                                 "ATTNLAB_OPTUNA_TRIAL_ID", "ATTNLAB_OPTUNA_PRUNER")
# studies kept in memory (`hydra.sweeper.storage: memory`), found by name by jobs of the same process
IN_PROCESS: dict[str, Any] = {}


class OptunaPruning(L.Callback):
    def __init__(self, monitor: str | None = None):
        self.monitor = monitor
        self.trial = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or not self.monitor or not os.environ.get(ENV_TRIAL):
            return
        import optuna

        from attnlab.optuna_pruners import make_pruner

        name, storage = os.environ[ENV_STUDY], os.environ[ENV_STORAGE]
        pruner = make_pruner(json.loads(os.environ.get(ENV_PRUNER) or "null"))
        study = IN_PROCESS.get(name) if storage == "memory" else \
            optuna.load_study(study_name=name, storage=storage, pruner=pruner)
        if study is None:
            return
        self.trial = optuna.trial.Trial(study, int(os.environ[ENV_TRIAL]))

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.trial is None or trainer.sanity_checking:
            return
        prune = False
        if trainer.is_global_zero:
            value = trainer.callback_metrics.get(self.monitor)
            if value is not None:
                self.trial.report(float(value), step=trainer.global_step)
                prune = self.trial.should_prune()
        prune = trainer.strategy.broadcast(prune, src=0)  # every rank stops together
        if prune:
            import optuna

            if trainer.is_global_zero:
                self.trial.set_user_attr("pruned_at_step", trainer.global_step)
            raise optuna.TrialPruned(f"pruned at step {trainer.global_step} ({self.monitor}="
                                     f"{float(trainer.callback_metrics[self.monitor]):.4g})"
                                     if self.monitor in trainer.callback_metrics else "pruned")
