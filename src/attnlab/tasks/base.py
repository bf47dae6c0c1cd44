"""What every task shares: optimizer param groups, schedules, torch.compile of the network, best-metric tracking."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from torch import nn
from torchmetrics import MaxMetric, MinMetric

from attnlab.optim.param_groups import param_groups


class BaseTask(L.LightningModule):
    """Subclasses build `self.net` in `__init__`, call `self.save_hyperparameters()`, and log their metrics.

    Args:
        optimizer: partial optimizer config (`_target_` + `_partial_: true`); weight decay is applied per group.
        scheduler: partial schedule config from `attnlab.optim.schedulers`, or None for a constant lr.
        compile: run the network through `torch.compile` (the network, not this module, so checkpoints stay portable).
        monitor / monitor_mode: the validation metric that defines "best" (`<monitor>_best` is logged).
        data_kinds: the data kinds (`data.kind`) this task trains on.
    """

    net: nn.Module

    def __init__(
        self,
        optimizer: dict | None = None,
        scheduler: dict | None = None,
        compile: bool = False,
        monitor: str = "val/loss",
        monitor_mode: str = "min",
        data_kinds: tuple[str, ...] = (),
    ):
        super().__init__()
        self.optimizer_cfg = optimizer
        self.scheduler_cfg = scheduler
        self.monitor, self.monitor_mode = monitor, monitor_mode
        self.best = MaxMetric() if monitor_mode == "max" else MinMetric()
        self.best.persistent(True)  # a resumed run keeps its best-so-far
        self._compiled: list = []

    # ---- forward through the (optionally compiled) network
    def configure_model(self) -> None:
        if self.hparams.get("compile") and not self._compiled:
            self._compiled.append(torch.compile(self.net))

    def run_net(self, *args, **kwargs):
        fn = self._compiled[0] if self._compiled else self.net
        return fn(*args, **kwargs)

    # ---- best-so-far tracking of the monitored metric
    def on_train_start(self) -> None:
        if self.trainer.global_step == 0:
            self.best.reset()

    def log_best(self, value: torch.Tensor) -> None:
        if self.trainer.sanity_checking:
            return
        self.best.update(value)
        self.log(f"{self.monitor}_best", self.best.compute(), prog_bar=True, sync_dist=True)

    # ---- optimizers
    def configure_optimizers(self) -> Any:
        if self.optimizer_cfg is None:
            raise ValueError("no optimizer configured: pass optimizer=<config> to the task")
        factory = instantiate(self.optimizer_cfg)
        wd = factory.keywords.get("weight_decay", 0.0) if hasattr(factory, "keywords") else 0.0
        # the wrapped model (DDP/FSDP) when there is one, so sharded parameters are the ones optimized
        model = self.trainer.model if self._trainer is not None and self.trainer.model is not None else self
        optimizer = factory(param_groups(model, wd))
        if not self.scheduler_cfg:
            return optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))
        schedule = instantiate(self.scheduler_cfg)(optimizer=optimizer, total_steps=total)
        if isinstance(schedule, list):
            return [optimizer], schedule
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    # ---- hooks the platform uses
    def flops_per_sample(self) -> float | None:
        """Training FLOPs (forward + backward) per sample, for `perf/mfu`; None when unknown."""
        return None

    @staticmethod
    def batch_size_of(batch: Any) -> int:
        x = batch[0] if isinstance(batch, (tuple, list)) else next(iter(batch.values()))
        return int(x.shape[0])
