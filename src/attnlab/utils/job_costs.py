"""What a run costs on a partition's nodes, measured by its own jobs, for `launcher.timeout_min=auto` and
`launcher.mem_gb=auto` (attnlab.cli.slurm.estimates sizes the jobs from it).

A run trained in a SLURM job records, when it finishes, what it measured there: its start-up (the process's start
to the first step), its seconds per training step (validation and checkpoints included: the job's whole time over
its steps), its steps per epoch and its peak memory per task. The record goes in `<paths.cache_dir>/slurm/
estimates.json` under the job's partition and the run's config (its config name and its command line, less the keys
that do not change what a step costs: the seed, the length, the loggers, the launcher's own). A later sweep of the
same config on that partition sizes its jobs from it: time = start-up + steps x seconds per step, plus a quarter
and 2 minutes; memory = the peak plus a quarter and 1 GB. A step timed anywhere else (the submitting machine,
another partition's nodes) is never used. With no record the job asks for the partition's limit and SLURM's
default memory, as before, and the driver's line says so.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIME_MARGIN, TIME_SLACK_S = 1.25, 120.0
MEM_MARGIN, MEM_SLACK_GB = 1.25, 1.0
# command-line keys that do not change what a step costs or how much memory it takes
NOT_COST = ("seed", "trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "logger", "logger.",
            "callbacks.progress_bar", "callbacks.model_summary", "extras.", "launcher.", "hydra.", "ckpt_path",
            "paths.", "tags", "task_name", "test", "preflight", "optimizer.lr")


def fingerprint(config_name: str, overrides: list[str]) -> str:
    """The run's config as far as its cost goes: its config name and its overrides, less NOT_COST, sorted."""
    kept = sorted(o for o in _normal(overrides) if not _key(o).startswith(NOT_COST) and _key(o) != "trainer.devices")
    return hashlib.sha1(json.dumps([config_name, kept]).encode()).hexdigest()[:16]


def _normal(overrides: list[str]) -> list[str]:
    """Each override as Hydra reads it (`test=false` as a sweep's job gets it back: `test=False`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # left as typed: Hydra's run says what it cannot parse
        return list(overrides)
    return [f"{o.get_key_element()}={o.get_value_element_as_str()}" for o in parsed]


def _key(override: str) -> str:
    return override.lstrip("~+").partition("=")[0]


def store(cache_dir: str | os.PathLike) -> Path:
    return Path(cache_dir) / "slurm" / "estimates.json"


@dataclass
class Measured:
    """What one job of a run measured on its partition's nodes."""

    startup_s: float
    step_s: float
    steps_per_epoch: float
    peak_gb: float
    job: str = ""

    def time_min(self, steps: int, lead_s: float = TIME_SLACK_S) -> int:
        """The time limit for `steps` steps: the work plus a quarter, and SLURM's warning lead after it (2 minutes,
        or the run's own `launcher.signal_delay_s` when longer: the run stops at the warning)."""
        work = (self.startup_s + steps * self.step_s) * TIME_MARGIN
        return math.ceil((work + max(TIME_SLACK_S, lead_s)) / 60)

    def mem_gb(self) -> int:
        return math.ceil(self.peak_gb * MEM_MARGIN + MEM_SLACK_GB)


def lookup(cache_dir, partition: str, key: str) -> Measured | None:
    try:
        found = json.loads(store(cache_dir).read_text())[partition][key]
        return Measured(**found)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record(cache_dir, partition: str, key: str, measured: Measured) -> None:
    """Keep what this job measured (the file locked: the jobs of a sweep finish together)."""
    from filelock import FileLock

    from attnlab.utils import atomic

    path = store(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        known.setdefault(partition, {})[key] = measured.__dict__
        atomic.write_text(path, json.dumps(known, indent=1))


def run_steps(trainer: Any, measured: Measured) -> int | None:
    """The steps the run will train: trainer.max_steps, else max_epochs x the steps per epoch measured."""
    max_steps = int(trainer.get("max_steps") or -1)
    if max_steps > 0:
        return max_steps
    epochs = trainer.get("max_epochs")
    return math.ceil(int(epochs) * measured.steps_per_epoch) if epochs not in (None, -1) else None


def peak_memory_gb() -> float:
    """The peak resident memory of this process and its finished children (the loader's workers), in GB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 2**20  # kB


def process_age_s() -> float:
    """Seconds since this process started (its start-up before the first step, measured once training starts)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


