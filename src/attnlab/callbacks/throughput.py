"""Logs `perf/samples_per_s` (and `perf/tokens_per_s`, `perf/mfu` when the task can tell) during training, and the
time each step waited for its batch (`perf/data_wait_s`, `perf/data_wait_frac`): a starved device shows there."""

from __future__ import annotations

import time

import lightning as L

from attnlab.protocols import task as task_hooks


class Throughput(L.Callback):
    """Throughput over windows of `log_every_n_steps` training batches, data loading included; the clock is read only
    at a window's edges, after the device's queued work (one synchronisation per window).

    Data wait: the host's time from the end of one training batch to the start of the next (the loader's next batch,
    its transfer and `on_after_batch_transfer`), per step and as a share of the window: near 0 when the model sets
    the pace, most of the window when the loader does. A validation within the epoch, and the checkpoint after it,
    count in neither: the window's clock stops from its start to the next training batch.
    """

    def __init__(self, log_every_n_steps: int = 50):
        self.every = max(1, int(log_every_n_steps))
        self._t0: float | None = None
        self._samples = self._tokens = self._batches = 0
        self._flop_count = 0.0
        self._flops: float | None = None
        self._peak: float | None = None
        self._wait = 0.0
        self._paused_at: float | None = None  # when a validation within the window started
        self._last_end: float | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # FLOPs are counted here, before the strategy wraps the model: a forward through the network of an
        # FSDP-wrapped module bypasses the root FSDP unit, and one that fails midway (bf16-mixed: fp32 activations
        # reach the bf16 parameters of a block) leaves that block's parameters unregistered, so the first
        # checkpoint fails ("FSDP assumes ...blocks.0.norm1.weight is in the state_dict").
        if stage != "fit":
            return
        self._flops = task_hooks.flops_per_sample(pl_module)  # best effort: None when counting fails

    def on_train_start(self, trainer, pl_module) -> None:
        from attnlab.utils.flops import device_peak_flops

        self._peak = device_peak_flops(pl_module.device, trainer.precision) if self._flops else None
        self.on_train_epoch_start(trainer, pl_module)  # a run resumed mid-epoch starts with no epoch start

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        _wait_for_device(pl_module.device)
        self._t0, self._samples, self._tokens, self._batches = time.perf_counter(), 0, 0, 0
        self._flop_count, self._wait, self._last_end, self._paused_at = 0.0, 0.0, self._t0, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._paused_at is not None:  # back from a validation: the window's clock goes on where it stopped
            self._t0 = None if self._t0 is None else self._t0 + now - self._paused_at
            self._paused_at = None
        elif self._last_end is not None:
            self._wait += now - self._last_end

    def on_validation_start(self, trainer, pl_module) -> None:
        self._last_end, self._paused_at = None, time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._samples += task_hooks.batch_size_of(pl_module, batch)
        # an int, or a count on the device read at the window's end
        self._tokens = self._tokens + task_hooks.tokens_of(pl_module, batch)
        if self._flops:  # tasks whose batches vary in shape count each one (`flops_of`)
            self._flop_count += task_hooks.flops_of(pl_module, batch, self._flops)
        self._batches += 1
        if self._batches < self.every:
            self._last_end = time.perf_counter()
            return
        _wait_for_device(pl_module.device)
        elapsed = time.perf_counter() - self._t0
        world = trainer.world_size
        metrics = {"perf/samples_per_s": self._samples * world / elapsed,
                   "perf/data_wait_s": self._wait / self._batches, "perf/data_wait_frac": self._wait / elapsed}
        tokens = float(self._tokens)
        if tokens:
            metrics["perf/tokens_per_s"] = tokens * world / elapsed
        if self._flops and self._peak:
            metrics["perf/mfu"] = self._flop_count / elapsed / self._peak
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, rank_zero_only=True)
        self.on_train_epoch_start(trainer, pl_module)  # the next window


def _wait_for_device(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)

