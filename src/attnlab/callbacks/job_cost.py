"""What a SLURM job of a run measured on its partition's nodes, kept for the next jobs of the same config
(`launcher.timeout_min=auto`, `launcher.mem_gb=auto`: attnlab.utils.job_costs)."""

from __future__ import annotations

import math
import os
import time

from lightning.pytorch.callbacks import Callback

MIN_STEPS = 5  # fewer steps than this measure the start more than the steps


class JobCost(Callback):
    """Rank 0 of a run trained to its end in a SLURM job records its start-up, seconds per step, steps per epoch and
    peak memory under the job's partition and the run's config."""

    def __init__(self):
        self.startup_s: float | None = None
        self.started = 0.0
        self.first_step = 0

    def on_train_start(self, trainer, pl_module) -> None:
        from attnlab.utils.job_costs import process_age_s

        self.startup_s, self.started, self.first_step = process_age_s(), time.monotonic(), trainer.global_step

    def on_fit_end(self, trainer, pl_module) -> None:
        from attnlab.callbacks.run_metadata import RunMetadata

        partition, job = os.environ.get("SLURM_JOB_PARTITION"), os.environ.get("SLURM_JOB_ID")
        steps = trainer.global_step - self.first_step
        metadata = RunMetadata.of(trainer)
        cache_dir = metadata.setting("paths", "cache_dir") if metadata is not None else None
        if not (partition and job and cache_dir and trainer.is_global_zero and self.startup_s is not None) \
                or steps < MIN_STEPS:
            return
        try:
            from hydra.core.hydra_config import HydraConfig

            hydra = HydraConfig.get()
            config_name, overrides = hydra.job.config_name, list(hydra.overrides.task)
        except ValueError:  # not a Hydra run
            return
        from attnlab.utils import job_costs as estimates

        batches = trainer.num_training_batches
        per_epoch = math.ceil(batches / trainer.accumulate_grad_batches) if math.isfinite(batches) else steps
        measured = estimates.Measured(startup_s=round(self.startup_s, 1),
                                      step_s=round((time.monotonic() - self.started) / steps, 4),
                                      steps_per_epoch=per_epoch, peak_gb=round(estimates.peak_memory_gb(), 2),
                                      job=str(job))
        try:
            estimates.record(cache_dir, partition, estimates.fingerprint(config_name or "train", overrides),
                             measured)
        except OSError:  # a cache that cannot be written costs the next job its estimate, nothing more
            pass
