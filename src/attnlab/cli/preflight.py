"""`python train.py <anything> preflight=true`: what the configured run will cost, measured before waiting for it.

It builds what the run would, times `preflight_steps` training batches after warm-up and one validation batch, and
prints the parameters, samples/s and tokens/s, MFU, the peak memory beside the estimate, the configured run's time,
the largest `data.batch_size` that fits and, for an image task, whether the loader sets the pace. Nothing is written
to the run's checkpoints or loggers; in a multirun, each job prints a one-line summary.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field

import lightning as L
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.protocols import data as data_hooks
from attnlab.protocols import task as task_hooks

log = logging.getLogger("attnlab")
WARMUP = 2  # batches before the clock starts: allocator, cudnn autotuning, torch.compile


class StepTimer(L.Callback):
    """Seconds per training batch (data loading included: the time between consecutive batch ends) after WARMUP
    batches, with their samples, tokens and FLOPs; and seconds per validation batch after the first."""

    def __init__(self, flops_per_sample: float | None):
        self.flops_per_sample = flops_per_sample
        self.batch_s: list[float] = []
        self.step_s: list[float] = []  # the same batches from their start: waiting for data left out
        self.val_s: list[float] = []
        self.samples = self.tokens = 0
        self.flops = 0.0
        self._last: float | None = None
        self._seen = 0

    @staticmethod
    def _now(pl_module) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = self._now(pl_module)
        self._seen += 1
        if self._seen > WARMUP and self._last is not None:
            self.batch_s.append(now - self._last)
            self.step_s.append(now - self._start)
            n = task_hooks.batch_size_of(pl_module, batch)
            self.samples += n
            self.tokens += task_hooks.tokens_of(pl_module, batch)
            if self.flops_per_sample:
                self.flops += task_hooks.flops_of(pl_module, batch, self.flops_per_sample)
        self._last = now

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._val_start = self._now(pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.val_s.append(self._now(pl_module) - self._val_start)


@dataclass
class Report:
    params: int
    device: str
    batch_s: float | None = None
    samples_s: float | None = None
    tokens_s: float | None = None
    mfu: float | None = None
    peak: tuple[str, int] | None = None
    estimate: object = None
    available: int | None = None
    run_s: float | None = None
    run_parts: dict[str, float] = field(default_factory=dict)
    max_batch: int | None = None
    max_batch_how: str = ""
    skipped: str = ""
    loader: object = None  # loader_pace.LoaderPace of an image task

    def memory(self) -> list[str]:
        """The peak measured, the estimate and what the machine has, those known."""
        from attnlab.memory import GiB

        return ([f"{self.peak[1] / GiB:.2f} GiB measured ({self.peak[0]})"] if self.peak else []) \
            + ([f"{self.estimate.total / GiB:.2f} GiB estimated"] if self.estimate is not None else []) \
            + ([f"{self.available / GiB:.2f} GiB available"] if self.available else [])

    def line(self) -> str:
        """One line: what a sweep prints per job."""
        parts = [f"{self.params / 1e6:.2f}M params"]
        if self.samples_s:
            parts.append(f"{self.samples_s:,.1f} samples/s" + (f", {self.tokens_s:,.0f} tokens/s" if self.tokens_s
                                                              else ""))
        if self.mfu is not None:
            parts.append(f"MFU {100 * self.mfu:.1f}%")
        if self.memory():
            parts.append("memory " + ", ".join(self.memory()))
        if self.run_s is not None:
            parts.append(f"run ≈ {_duration(self.run_s)}")
        if self.max_batch:
            parts.append(f"largest data.batch_size ≈ {self.max_batch}")
        if self.loader is not None:
            parts.append(f"loader {self.loader.loader_s:,.1f} images/s vs model {self.loader.model_s:,.1f}"
                         + (f": the loader sets the pace ({self.loader.slower:.1f}x slower)" if self.loader.slower > 1
                            else ""))
        return "; ".join(parts) + (f" ({self.skipped})" if self.skipped else "")


def _duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


# ---- the budget of the configured run
def _limited(n: int, limit) -> int:
    if limit is None:
        return n
    return min(n, int(limit)) if isinstance(limit, int) or (isinstance(limit, float) and limit > 1) else \
        int(n * float(limit))


def _run_seconds(cfg: DictConfig, plan, dm, train_batches: int, batch_s: float, val_batch_s: float | None
                 ) -> tuple[float, dict[str, float]]:
    """(total, {part: seconds}) of the configured run: its optimizer steps (max_steps, or max_epochs of the
    epoch's batches), its validation passes and the test pass."""
    t = cfg.trainer
    accumulate = plan.trainer.accumulate_grad_batches  # decided by the plan (global_batch_size)
    per_epoch = max(1, train_batches)
    max_steps = int(t.get("max_steps") or -1)
    max_epochs = t.get("max_epochs")
    epochs_batches = per_epoch * int(max_epochs) if max_epochs not in (None, -1) else None
    step_batches = max_steps * accumulate if max_steps > 0 else None
    batches = min(b for b in (epochs_batches, step_batches, None) if b is not None) if (epochs_batches or
                                                                                         step_batches) else per_epoch
    parts = {"training": batches * batch_s}
    if val_batch_s:
        n_val = _batches(dm.val_dataloader(), t.get("limit_val_batches"))
        interval = t.get("val_check_interval")
        every = t.get("check_val_every_n_epoch")
        if isinstance(interval, int) and not isinstance(interval, bool):  # every `interval` training batches
            passes = batches // interval
        else:
            per = max(1, round(1 / float(interval))) if interval else 1
            epochs = batches / per_epoch
            passes = int(epochs // int(every or 1)) * per if every else int(epochs) * per
            passes = max(passes, 1)
        parts["validation"] = passes * n_val * val_batch_s
        if plan.run.test:
            parts["test"] = _batches(dm.test_dataloader(), t.get("limit_test_batches")) * val_batch_s
    return sum(parts.values()), parts


def _batches(loaders, limit) -> int:
    """The batches of one pass over a loader, or over each of several (MNLI's two validation sets), as Lightning
    limits each (limit_val_batches, limit_test_batches); 0 for a loader of unknown length."""
    n = 0
    for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
        try:
            n += _limited(len(loader), limit)
        except TypeError:
            continue
    return n


# ---- the largest batch
SEARCH_TRIALS = 3  # batch sizes tried on one GPU, each for two steps


def _largest_batch_estimated(est, batch_size: int) -> int | None:
    """From the estimate: the activations grow with the batch, the rest does not."""
    if est is None or not est.available or not est.terms.get("activations"):
        return None
    per_sample = est.terms["activations"] / batch_size
    fixed = est.total - est.terms["activations"]
    return max(0, int((est.available - fixed) // per_sample))


def _largest_batch_gpu(trainer_factory, model, dm, start: int, limit: int | None = None) -> int | None:
    """The largest batch that trains on one GPU, up to `limit` (the training split): `start` (the estimate's) tried
    first, then doubled while a size fits and bisected once one runs out of memory, SEARCH_TRIALS sizes at most.
    None when none fits."""
    from lightning.pytorch.utilities.memory import is_oom_error

    from attnlab.errors import UserError

    limit = limit or 2**31
    fits, fails, size = 0, None, max(1, min(start, limit))
    for _ in range(SEARCH_TRIALS):
        dm.batch_size = size
        try:
            trainer = trainer_factory(max_steps=2)
            trainer.fit(model, datamodule=dm)
            if trainer.global_step == 0:
                break
            fits = size
        except UserError:  # larger than the training split
            break
        except Exception as e:  # noqa: BLE001 - only running out of memory is an answer
            if not is_oom_error(e):
                raise
            fails = size
        finally:
            model.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
        size = min(2 * fits, limit) if fails is None else (fits + fails) // 2
        if size <= fits:
            break
    return fits or None


# ---- the preflight
def preflight(cfg: DictConfig, plan, model, dm) -> None:
    from attnlab.cli import builders
    from attnlab.cli.report import peak_memory
    from attnlab.memory import check_run_memory
    from attnlab.utils.flops import device_peak_flops

    steps = plan.run.preflight_steps
    resolved = OmegaConf.to_container(cfg, resolve=True)
    estimate = check_run_memory(plan, model, dm, data=resolved["data"], refuse=False)
    params = builders.count_parameters(model)
    timer = StepTimer(task_hooks.flops_per_sample(model))

    def trainer_factory(max_steps: int, callbacks=()):
        run = cfg.copy()
        with open_dict(run):
            run.trainer.update(max_steps=max_steps, max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0,
                               fast_dev_run=False, enable_checkpointing=False, enable_progress_bar=False,
                               enable_model_summary=False)
        from attnlab.strategies import for_model

        # a strategy of its own for each trainer (FSDP); blocks checkpointed already are left as they are
        strategy = for_model(model, plan.trainer.strategy, plan.model.activation_checkpointing)
        return builders.build_trainer(run, plan, list(callbacks), [], strategy)

    report = Report(params=params["model/params_total"], device="")
    report.estimate, report.available = estimate, estimate.available if estimate is not None else None
    fits = estimate is None or not estimate.available or estimate.total <= estimate.available
    trainer = None
    if fits:
        trainer = trainer_factory(steps + WARMUP, [timer])  # the first timed batch runs from the last warm-up one
        trainer.fit(model, datamodule=dm)
        trainer.limit_val_batches = 2  # the first batch starts the loader: the second is timed alone
        trainer.validate(model, datamodule=dm, verbose=False)
        device = trainer.strategy.root_device
        report.device = f"{device.type.upper()}" + (f" {torch.cuda.get_device_name(device)}" if device.type == "cuda"
                                                      else f", {torch.get_num_threads()} threads")
        world = trainer.world_size
        timed = sum(timer.batch_s)
        if timed > 0:
            report.batch_s = timed / len(timer.batch_s)
            report.samples_s = timer.samples * world / timed
            report.tokens_s = timer.tokens * world / timed or None
            peak = device_peak_flops(device, trainer.precision) if timer.flops else None
            report.mfu = timer.flops / timed / peak if peak else None
            val_s = timer.val_s[-1] if timer.val_s else None
            report.run_s, report.run_parts = _run_seconds(cfg, plan, dm, trainer.num_training_batches,
                                                          report.batch_s, val_s)
            from attnlab.cli.loader_pace import pace

            # the loader alone, with the configured workers, against the steps' own rate (per process)
            report.loader = pace(dm, timer.samples / sum(timer.step_s) if sum(timer.step_s) else None, steps)
        report.peak = peak_memory(device)
    else:
        report.skipped = "not run: the estimate exceeds what the machine has"
    bs = int(cfg.data.get("batch_size") or data_hooks.batch_size(dm) or 1)
    report.max_batch = _largest_batch_estimated(estimate, bs)
    report.max_batch_how = "from the memory estimate" + (f" for each of {trainer.world_size} processes"
                                                          if trainer is not None and trainer.world_size > 1 else "")
    limit = data_hooks.training_samples(dm)
    one_gpu = trainer is not None and isinstance(trainer.strategy, SingleDeviceStrategy)
    if one_gpu and trainer.strategy.root_device.type == "cuda":  # several processes: the estimate alone
        start = report.max_batch or bs
        try:
            report.max_batch = _largest_batch_gpu(trainer_factory, model, dm, start, limit=limit)
            report.max_batch_how = f"tried on this GPU from the estimate's {start}, {SEARCH_TRIALS} sizes at most"
        except Exception as e:  # noqa: BLE001 - a report, not a run: say why there is no number
            report.max_batch_how = f"not found on this GPU ({type(e).__name__}: {e}); the estimate's: {start}"
        finally:
            dm.batch_size = bs
    if limit and report.max_batch and report.max_batch >= limit:
        report.max_batch, report.max_batch_how = limit, report.max_batch_how + "; the whole training split fits"
    if trainer is None or trainer.is_global_zero:  # one report for a multi-process run
        _print(cfg, report, steps, bs)


def _print(cfg: DictConfig, r: Report, steps: int, bs: int) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        hc = HydraConfig.get()
        log.info("preflight job %s (%s): %s", hc.job.num, " ".join(hc.overrides.task), r.line())
        return
    lines = [f"Preflight of {cfg.task_name} ({r.device or 'not run'}, precision {cfg.trainer.get('precision')}): "
             f"{steps} timed training batches after {WARMUP} warm-up ones, one validation batch"]
    lines.append(f"  parameters          {r.params / 1e6:.2f}M")
    if r.batch_s:
        speed = f"{1000 * r.batch_s:.1f} ms/batch; {r.samples_s:,.1f} samples/s"
        lines.append(f"  speed               {speed}" + (f"; {r.tokens_s:,.0f} tokens/s" if r.tokens_s else ""))
        lines.append("  MFU                 " + (f"{100 * r.mfu:.1f}% of the device's peak" if r.mfu is not None
                                                 else "unknown (no FLOP count for this model or no peak for this "
                                                      "device)"))
    lines.append(f"  peak memory         {'; '.join(r.memory()) or 'unknown'}")
    if r.run_s is not None:
        parts = " + ".join(f"{_duration(s)} {k}" for k, s in r.run_parts.items() if s)
        lines.append(f"  the configured run  ≈ {_duration(r.run_s)} ({parts})")
    lines.append("  largest batch       " + (f"data.batch_size ≈ {r.max_batch} ({r.max_batch_how}; now {bs})"
                                             if r.max_batch else f"unknown ({r.max_batch_how})"))
    if r.loader is not None:
        lines.append(f"  data loader         {r.loader.line()}")
    if r.skipped:
        lines.append(f"  training steps      {r.skipped}")
    lines.append("Nothing was written to checkpoints or loggers; without preflight=true the run starts.")
    log.info("\n".join(lines))
