"""What every task shares: optimizer param groups, schedules, torch.compile of the network, best-metric tracking."""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from torch import nn
from torchmetrics import MaxMetric, MeanMetric, MinMetric

from attnlab.checkpoints import trust
from attnlab.compat import has_trainer, logs_this_step, metric_defaults
from attnlab.data.info import DataInfo
from attnlab.errors import UserError
from attnlab.nn.registry import network_settings
from attnlab.optim.param_groups import param_groups
from attnlab.protocols import data as data_hooks
from attnlab.settings import split_optimizer

log = logging.getLogger("attnlab")


def _initial_kept_metrics(task, state_dict, prefix, *args) -> None:
    """A checkpoint written before an epoch's running metric was kept in checkpoints (BaseTask.keep_across_resume)
    loads with the metric's initial state."""
    for metric in task._kept_metrics:
        for name, default in metric_defaults(getattr(task, metric)).items():
            state_dict.setdefault(f"{prefix}{metric}.{name}", default.clone())


def has_values(metric) -> bool:
    """Whether a torchmetrics metric holds anything to compute: updates of this process since its reset, or a state
    restored from a checkpoint (which its update count does not count)."""
    return bool(metric.update_count) or any(bool(torch.ne(getattr(metric, name), default).any())
                                            for name, default in metric_defaults(metric).items()
                                            if isinstance(default, torch.Tensor))


class TokenizerInCheckpoint:
    """For a task that reads text: its tokenizer (JSON, `self.tokenizer_json`) travels in every checkpoint, so
    `load_from_checkpoint` rebuilds a model that can encode and decode alone."""

    tokenizer_json: str | None = None
    _tokenizer = None

    @property
    def tokenizer(self):
        from attnlab.data.text.tokenizers import tokenizer_from_json

        if self._tokenizer is None and self.tokenizer_json:
            self._tokenizer = tokenizer_from_json(self.tokenizer_json)
        return self._tokenizer

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokenizer"] = self.tokenizer_json

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizer_json, self._tokenizer = checkpoint.get("tokenizer"), None


# torch's fused optimizer kernels run on CPU too from torch 2.5 (Adam/AdamW from 2.4, SGD/Adagrad from 2.5)
_CPU_FUSED = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def _takes(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class DeviceMean(MeanMetric):
    """A running (weighted) mean whose update only queues two additions on the device. MeanMetric's own update
    builds a device tensor from a Python weight (a blocking host-to-device copy on a GPU) and checks for NaN (a
    read on the host); this one does neither, so it can run every training step."""

    def update(self, value: torch.Tensor, weight: float = 1.0) -> None:
        self.mean_value += value.detach().to(self.mean_value.dtype).sum() * weight
        self.weight += weight * value.numel()


class BaseTask(L.LightningModule):
    """Subclasses build `self.net` in `__init__`, call `self.save_hyperparameters()`, and log their metrics.

    Args:
        optimizer: partial optimizer config (`_target_` + `_partial_: true`); weight decay is applied per group.
            Two keys are attnlab's, not the optimizer's: `blr` (the lr is blr x effective batch / 256; lr: null)
            and `layer_decay` (layer-wise lr decay, see attnlab.optim.param_groups).
        scheduler: partial schedule config from `attnlab.optim.schedulers`, or None for a constant lr.
        compile: run the training step's network and loss through `torch.compile` as one graph
            (`training_loss`), and the network alone for evaluation; the functions are compiled, not this module,
            so checkpoints stay portable.
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
        self._compiled: dict[str, Any] = {}
        self._kept_metrics: list[str] = []
        self.train_loss_mean = DeviceMean()
        self.keep_across_resume("train_loss_mean")
        self.register_load_state_dict_pre_hook(_initial_kept_metrics)

    def keep_across_resume(self, name: str) -> None:
        """Save the epoch's running metric `self.<name>` (a torchmetrics Metric over the training steps) in
        checkpoints, so that a run resumed mid-epoch reports it over the whole epoch, not over the steps since it
        resumed; a checkpoint from before it was kept loads with the metric's initial state."""
        getattr(self, name).persistent(True)
        self._kept_metrics.append(name)

    # ---- the (optionally compiled) training loss and network
    def training_loss(self, *batch: Any) -> Any:
        """The loss of a training batch: the network and everything between it and the loss, and nothing that logs,
        reads a value on the host or branches on one, so that with `compile` it runs as one graph (the loss inside
        it, as nanoGPT compiles its model with its loss). Returns the loss, or a tuple whose first item is the loss
        and whose others are what the step also needs (e.g. logits for a training accuracy). Call it through
        `run_training_loss`."""
        raise NotImplementedError(f"{type(self).__name__} does not define training_loss()")

    def configure_model(self) -> None:
        if self.hparams.get("compile") and not self._compiled:
            # data-dependent shapes (e.g. boolean indexing in a user's training_loss) stay inside the graph
            from attnlab.compat import compile_keeps_dynamic_shapes

            dynamic = compile_keeps_dynamic_shapes()
            self._compiled = {"net": torch.compile(self.net),
                              "training_loss": dynamic(torch.compile(self.training_loss))}

    def run_training_loss(self, *batch: Any) -> Any:
        return self._compiled.get("training_loss", self.training_loss)(*batch)

    def run_net(self, *args, **kwargs):
        return self._compiled.get("net", self.net)(*args, **kwargs)

    # ---- the training loss
    def log_train_loss(self, loss: torch.Tensor, batch_size: int, epoch_mean: bool = False) -> None:
        """`train/loss` (and, with epoch_mean, `train/loss_epoch`: the epoch's mean), logged only on the steps the
        loggers write (every trainer.log_every_n_steps): each self.log call costs Lightning about a
        millisecond of bookkeeping, which shows next to a small model's step."""
        if epoch_mean:
            self.train_loss_mean.update(loss.detach(), batch_size)
        if logs_this_step(self.trainer):
            self.log("train/loss", loss, on_step=True, on_epoch=False,
                     prog_bar=True, batch_size=batch_size)

    def on_train_epoch_end(self) -> None:
        if has_values(self.train_loss_mean):  # (an attempt resumed after the epoch's last step has no update)
            self.log("train/loss_epoch", self.train_loss_mean.compute())  # computed over all processes
        self.train_loss_mean.reset()

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
        trust.admit_node(self.optimizer_cfg, "optimizer")
        factory = instantiate(self.optimizer_cfg)
        # attnlab's own optimizer options (blr, layer_decay), taken off before the optimizer sees them
        keywords, options = split_optimizer(dict(factory.keywords) if isinstance(factory, functools.partial) else {})
        layer_decay, blr = options.layer_decay, options.blr
        if blr is not None:
            keywords["lr"] = self.lr_from_blr(blr, keywords.get("lr"))
        elif "lr" in keywords and keywords["lr"] is None:
            raise UserError("optimizer.lr is null: give the learning rate (optimizer.lr=1e-3), or a base rate scaled "
                            "by the batch size (optimizer.blr=1.5e-4, lr = blr x effective batch / 256).")
        if isinstance(factory, functools.partial):
            fusable = self.device.type == "cuda" or (self.device.type == "cpu" and _CPU_FUSED)
            if fusable and not {"fused", "foreach"} & keywords.keys() and _takes(factory.func, "fused"):
                keywords["fused"] = True  # one kernel for the whole update (torch's AdamW/Adam/SGD; 5x on CPU)
            factory = functools.partial(factory.func, *factory.args, **keywords)
        wd = keywords.get("weight_decay", 0.0)
        # the wrapped model (DDP/FSDP) when there is one, so sharded parameters are the ones optimized
        model = self.trainer.model if has_trainer(self) and self.trainer.model is not None else self
        optimizer = factory(param_groups(model, wd, layer_decay=layer_decay))
        for group in optimizer.param_groups:  # the schedules scale each group's initial lr, so the scales persist
            group["lr"] = group["lr"] * group.get("lr_scale", 1.0)
        if not self.scheduler_cfg:
            return optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))
        trust.admit_node(self.scheduler_cfg, "scheduler")
        schedule = instantiate(self.scheduler_cfg)(optimizer=optimizer, total_steps=total)
        if isinstance(schedule, list):
            return [optimizer], schedule
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def lr_from_blr(self, blr: float, lr: float | None) -> float:
        """MAE's linear scaling rule: lr = blr x effective batch size / 256, the effective batch being
        data.batch_size x gradient accumulation x devices x nodes."""
        if lr is not None:
            raise UserError(
                f"optimizer.lr={lr} and optimizer.blr={blr} are both set. optimizer.blr gives the lr as "
                "blr x effective batch size / 256: set optimizer.lr=null to use it, or optimizer.blr=null to give "
                "the lr directly."
            )
        trainer = self.trainer
        batch = data_hooks.batch_size(trainer.datamodule)
        if batch is None:
            raise UserError("optimizer.blr scales the lr by the batch size, but the data module has no batch_size: "
                            "give optimizer.lr directly (and optimizer.blr=null).")
        effective = int(batch) * int(trainer.accumulate_grad_batches) * int(trainer.world_size)
        lr = blr * effective / 256
        log.info("lr = optimizer.blr %g x effective batch %d (%d x %d accumulated x %d devices) / 256 = %g",
                 blr, effective, batch, trainer.accumulate_grad_batches, trainer.world_size, lr)
        return lr

    # ---- hooks the platform uses
    @classmethod
    def net_settings(cls, settings: dict) -> dict[str, tuple[inspect.Parameter, Any]]:
        """The settings of the network `model.net` names (attnlab.nn.registry), which the task's **kwargs carry to
        it: the config checks take them as the task's. Empty for a task without a `net` parameter."""
        param = inspect.signature(cls.__init__).parameters.get("net")
        if param is None:
            return {}
        return network_settings(settings.get("net") or param.default)

    def check_data(self, info: DataInfo) -> None:
        """Refuse data this model cannot take (a vocabulary larger than its embedding, sequences longer than its
        positions, another tokenizer than its checkpoint's). The entry points call it once, with the prepared data
        module's info, before fitting or evaluating."""

    def flops_per_sample(self) -> float | None:
        """Training FLOPs (forward + backward) per sample, for `perf/mfu`; None when unknown."""
        return None

    @staticmethod
    def batch_size_of(batch: Any) -> int:
        x = batch[0] if isinstance(batch, (tuple, list)) else next(iter(batch.values()))
        return int(x.shape[0])
