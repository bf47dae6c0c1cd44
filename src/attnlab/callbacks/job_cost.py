"""What a SLURM job of a run measured on its partition's nodes, kept for the next jobs of the same key
(`launcher.timeout_min=auto`, `launcher.mem_gb=auto`: attnlab.cluster.costs)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from attnlab.cluster.outcome import AttemptEnd, Cause, Outcome

MIN_STEPS = 5  # fewer steps than this measure the start more than the steps


class JobCost(Callback):
    """On rank 0 of a SLURM job: the run's start-up, seconds per step, steps per epoch and peak memory per node,
    recorded under the job's partition and the run's key (`where_recorded`) when fit ends after at least MIN_STEPS
    steps, or when the attempt runs out of time."""

    def __init__(self):
        self.startup_s: float | None = None
        self.started = 0.0
        self.first_step = 0
        self.where: tuple[str, str, str] | None = None  # (cache dir, partition, key): where this job records
        self.ran_out = False  # this attempt's time limit came: recorded as such

    def on_train_start(self, trainer, pl_module) -> None:
        from attnlab.cluster.costs import process_age_s

        self.startup_s, self.started, self.first_step = process_age_s(), time.monotonic(), trainer.global_step
        self.where = where_recorded(trainer) if trainer.is_global_zero else None

    def on_fit_end(self, trainer, pl_module) -> None:
        steps = trainer.global_step - self.first_step
        if self.where is None or self.startup_s is None or steps < MIN_STEPS:
            return
        self.record(trainer, (time.monotonic() - self.started) / steps)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """An attempt that ran out of its time limit is recorded with its step time the process's whole age
        (start-up, validation and checkpoints included) over the steps it did, marked `ran_out` so that a later
        attempt of the same job does not lower it. Once per attempt."""
        from attnlab.cluster.costs import process_age_s

        if self.where is None or self.ran_out or not ran_out_of_time(trainer, exception):
            return
        self.ran_out = True
        self.record(trainer, process_age_s() / max(1, trainer.global_step - self.first_step), ran_out=True)

    def record(self, trainer, step_s: float, ran_out: bool = False) -> None:
        from attnlab.cluster import costs as estimates

        batches = trainer.num_training_batches
        steps = trainer.global_step - self.first_step
        per_epoch = math.ceil(batches / trainer.accumulate_grad_batches) if math.isfinite(batches) else steps
        try:
            peak_gb, memory_from = estimates.peak_memory_gb(tasks_per_node=trainer.num_devices)  # per node: --mem's
            measured = estimates.Measured(startup_s=round(self.startup_s or 0.0, 1), step_s=round(step_s, 4),
                                          steps_per_epoch=per_epoch, peak_gb=round(peak_gb, 2),
                                          job=str(os.environ.get("SLURM_JOB_ID", "")), ran_out=ran_out,
                                          memory_from=memory_from)
            estimates.record(*self.where, measured)
        except Exception:  # a cache that cannot be written costs the next job its estimate, nothing more
            pass


def ran_out_of_time(trainer, exception: BaseException) -> bool:
    """Whether a SIGTERMException stops the run on its time limit, by the attempt's end as recorded in the lineage
    (SignalGuard's on_exception must come first): a time limit; SLURM's warning while no preemption is under way; or a
    plain stop within a minute of the job's end time (SLURM_JOB_END_TIME, where SLURM sets it)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from attnlab.callbacks.run_metadata import RunMetadata

    if not isinstance(exception, SIGTERMException):
        return False
    metadata = RunMetadata.of(trainer)
    ended = AttemptEnd.of(getattr(metadata, "lineage", None))
    if ended is None:
        return False
    if ended.cause is Cause.TIME_LIMIT:
        return True
    if ended.cause is Cause.SLURM_WARNING:
        from attnlab.cluster.slurm_job import being_preempted

        return not being_preempted()
    end = os.environ.get("SLURM_JOB_END_TIME", "")
    return ended.outcome is Outcome.STOPPED and end.isdigit() and time.time() >= int(end) - 60


def where_recorded(trainer) -> tuple[str, str, str] | None:
    """(cache dir, partition, key) under which this job's measurement is kept; None outside a SLURM job of a Hydra
    run, or where the key cannot be computed (no `.hydra/config.yaml`, `sinfo` does not know the node)."""
    from attnlab import lineage
    from attnlab.callbacks.run_metadata import RunMetadata
    from attnlab.cluster import costs as estimates

    partition, job = os.environ.get("SLURM_JOB_PARTITION"), os.environ.get("SLURM_JOB_ID")
    metadata = RunMetadata.of(trainer)
    cache_dir = metadata.setting("paths", "cache_dir") if metadata is not None else None
    if not (partition and job and cache_dir):
        return None
    try:
        cfg = composed_config()
        node = estimates.job_node_type() if cfg is not None else None
        if node is None:
            return None
        code = estimates.code_version(getattr(metadata, "lineage", None) or lineage.code_record())
        key = estimates.fingerprint(cfg, devices=trainer.num_devices, nodes=trainer.num_nodes, node=node, code=code)
    except Exception:  # the estimate is a convenience: it never stops a run
        return None
    return str(cache_dir), partition, key


def composed_config(path: str | os.PathLike | None = None):
    """The job's config as Hydra composed it, before the run changed anything (`.hydra/config.yaml` of its output
    folder, which Hydra writes before the run starts); None outside a Hydra run."""
    from omegaconf import OmegaConf

    if path is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            hydra = HydraConfig.get()
            path = Path(hydra.runtime.output_dir) / str(hydra.output_subdir) / "config.yaml"
        except Exception:  # not a Hydra run
            return None
    try:
        return OmegaConf.load(path)
    except Exception:  # no such file (hydra.output_subdir=null), or not a config
        return None
