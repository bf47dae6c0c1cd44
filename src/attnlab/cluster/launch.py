"""One run folder for all the processes of one launch.

A run started by `srun python train.py` or `torchrun --nnodes N` is several processes, each composing the config.
Global rank 0 (as Lightning numbers it) claims the run folder as a lone run does; the other ranks take rank 0's,
through the elastic agent's store under torchrun, or through `<runs>/.launches/slurm-<cluster>-<job>.<step>.json`
under srun. A launch that starts again (a requeued job, restarted workers, the same `--rdzv-id`) keeps its folder
and continues from its last.ckpt. Nothing here imports torch unless torchrun or srun started the process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback

from attnlab.errors import UserError, fail
from attnlab.utils import atomic

# how long a rank other than 0 waits for rank 0's folder ($ATTNLAB_RANK_WAIT_S): rank 0 may start a little later
# (a slow shared filesystem, a busy node)
RANK_WAIT_ENV = "ATTNLAB_RANK_WAIT_S"
DEFAULT_RANK_WAIT_S = 300.0
STORE_KEY = "attnlab/run_dir"


@dataclass(frozen=True)
class Launch:
    kind: str  # "torchrun" or "srun"
    rank: int
    attempt: int  # how many times the launch started again (requeued, restarted)
    key: str | None  # the launch's name for its file, None where it has none
    description: str
    identity: str = ""  # what every rank of this attempt of the launch shares, and no other launch: its own ids

    def marker(self, runs: Path) -> Path | None:
        return runs / ".launches" / f"{self.key}.json" if self.key else None


def current_launch() -> Launch | None:
    """The launch this process is a rank of; None for a process that no launcher started."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        from lightning.fabric.plugins.environments import TorchElasticEnvironment

        if TorchElasticEnvironment.detect():
            run_id = env["TORCHELASTIC_RUN_ID"]
            key = None if run_id in ("", "none") else "torchrun-" + _safe(run_id)
            restart = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
            return Launch("torchrun", TorchElasticEnvironment().global_rank(), restart, key,
                          f"torchrun (run id {run_id}, world size {env.get('WORLD_SIZE')})",
                          f"torchrun {run_id} restart {restart} world {env.get('WORLD_SIZE')}")
    if "SLURM_STEP_ID" in env and "SLURM_JOB_ID" in env:  # a task of `srun`, not the batch script itself
        from lightning.fabric.plugins.environments import SLURMEnvironment

        if SLURMEnvironment.detect():  # not `srun --job-name=interactive|bash`, which Lightning leaves alone too
            job, step = env["SLURM_JOB_ID"], env["SLURM_STEP_ID"]
            key = _safe(f"slurm-{env.get('SLURM_CLUSTER_NAME', 'cluster')}-{job}.{step}")
            # SLURMEnvironment.global_rank() (its constructor would refuse what the Trainer refuses, later, itself)
            restart = int(env.get("SLURM_RESTART_COUNT") or 0)
            return Launch("srun", int(env["SLURM_PROCID"]), restart, key,
                          f"SLURM job {job}, step {step} ({env.get('SLURM_STEP_NUM_TASKS', '?')} tasks)",
                          f"slurm {key} restart {restart} nodes {env.get('SLURM_STEP_NODELIST', '')} "
                          f"tasks {env.get('SLURM_STEP_NUM_TASKS', '')}")
    return None


def launch_rank() -> int:
    """This process's global rank in its launch; 0 for a process that no launcher started."""
    launch = current_launch()
    return launch.rank if launch else 0


def rank_zero_only(value):
    """`${rank_zero_only:x}`: x on rank 0 (and a lone process), None on the other ranks of a launch."""
    return value if launch_rank() == 0 else None


def rank_suffix() -> str:
    """`${rank_suffix:}`: "" on rank 0 (and a lone process), "_rank<N>" on rank N of a launch."""
    rank = launch_rank()
    return f"_rank{rank}" if rank else ""


_told: list[str] = []  # how this process came to its run folder, logged once Hydra's logging is set up (LogLaunch)


def claim_run_folder(path: str) -> str:
    """The `${claim_dir:...}` resolver of the run directory: `path` claimed for this process alone (claim_folder),
    or, for a rank of a launch, the one folder of the launch. The same answer every time within a process."""
    if path not in atomic._claimed:  # the answers of claim_folder, this process's alone
        inherited = os.environ.get(atomic._claim_key(path))  # claimed by the process that started this one
        launch = None if inherited and Path(inherited).is_dir() else current_launch()
        try:
            atomic._claimed[path] = atomic.claim_folder(path) if launch is None else _launch_folder(launch, Path(path))
        except UserError as e:  # raised inside Hydra's config resolution: shown as attnlab's paragraph, not Hydra's
            fail(e)
    return atomic._claimed[path]


def _launch_folder(launch: Launch, path: Path) -> str:
    if launch.kind == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        folder, how = _through_agent_store(launch, path)
    else:
        folder, how = _through_file(launch, path)
    env = "TorchElasticEnvironment" if launch.kind == "torchrun" else "SLURMEnvironment"
    _told.append(f"rank {launch.rank} of {launch.description}, as Lightning's {env} numbers it: run folder {folder} "
                 f"({how})")
    return folder


def _wait_s() -> float:
    from attnlab.utils.env import seconds

    return seconds(RANK_WAIT_ENV, DEFAULT_RANK_WAIT_S)


def _through_agent_store(launch: Launch, path: Path) -> tuple[str, str]:
    from datetime import timedelta

    from torch.distributed import TCPStore

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    try:
        store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=_wait_s()))
        if launch.rank != 0:
            return store.get(STORE_KEY).decode(), "rank 0's, through the elastic agent's store"
        folder = store.get(STORE_KEY).decode() if store.check([STORE_KEY]) else None  # the workers restarted
    except (RuntimeError, OSError) as e:  # torch's DistStoreError (a RuntimeError): no answer within the wait
        raise UserError(
            f"rank {launch.rank} of {launch.description} got no run folder from the elastic agent's store at "
            f"{host}:{port} within {_wait_s():.0f} s ({str(e).splitlines()[0]}). Rank 0 did not start or failed "
            f"first (see its output); raise ${RANK_WAIT_ENV} where ranks start far apart."
        ) from e
    marker, how = launch.marker(path.parent), "restarted: the folder of its first attempt"
    if folder is None and marker is not None:  # this --rdzv-id launched before: continue in its folder
        folder, how = _previous_folder(marker), "its run id launched before: that launch's folder"
    if folder is None:
        folder, how = atomic.claim_folder(str(path)), "claimed, shared with the other ranks through the agent's store"
    if marker is not None:
        _write_marker(marker, folder, launch)
    store.set(STORE_KEY, folder)
    return folder, how


def _through_file(launch: Launch, path: Path) -> tuple[str, str]:
    marker = launch.marker(path.parent)
    if marker is None:
        raise UserError(f"this process is rank {launch.rank} of {launch.description}, but its launcher shares no "
                        "store and names no launch, so its ranks cannot agree on one run folder. Launch with "
                        "torchrun --rdzv-backend c10d or static (--master-addr/--master-port), give it --rdzv-id, "
                        "or give every rank the same folder: hydra.run.dir=<folder on a filesystem all nodes share>.")
    if launch.rank == 0:
        found, folder = _read_marker(marker), None
        if found and found.get("attempt", 0) < launch.attempt:  # requeued or restarted: the same folder
            folder, how = _previous_folder(marker), f"attempt {launch.attempt + 1}: the folder of the first attempt"
        if folder is None:
            folder, how = atomic.claim_folder(str(path)), f"claimed, named to the other ranks in {marker}"
        _write_marker(marker, folder, launch)
        return folder, how
    deadline = time.monotonic() + _wait_s()  # rank 0's file of this attempt of this launch: no clock compared
    while time.monotonic() < deadline:
        found = _read_marker(marker)
        if found and found.get("identity") == launch.identity:
            return str(found["run_dir"]), f"rank 0's, named in {marker}"
        time.sleep(0.2)
    raise UserError(
        f"rank {launch.rank} of {launch.description} waited {_wait_s():.0f} s for rank 0 to name the run folder in "
        f"{marker}, in vain. The run folders must be on a filesystem that every node shares (paths.log_dir, "
        f"$ATTNLAB_LOG_DIR, or hydra.run.dir=<shared folder>); if they are, rank 0 did not start or failed first "
        f"(see its output), or started much later (raise ${RANK_WAIT_ENV})."
    )


def _previous_folder(marker: Path) -> str | None:
    found = _read_marker(marker)
    folder = found.get("run_dir") if found else None
    return folder if folder and Path(folder).is_dir() else None


def _read_marker(marker: Path) -> dict | None:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None


_written: list[Path] = []  # the launch file this process (rank 0) wrote, removed when its run has finished


def _write_marker(marker: Path, folder: str, launch: Launch) -> None:
    marker.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(marker, json.dumps({"run_dir": folder, "attempt": launch.attempt, "identity": launch.identity}))
    _written.append(marker)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class LogLaunch(Callback):
    """Hydra callback (conf/hydra/default.yaml): the line saying how a rank of a launch came to its run folder,
    once Hydra has set up the run's logging."""

    def on_job_start(self, config, **kwargs) -> None:
        for line in _told:
            logging.getLogger("attnlab").info("launch: %s", line)
        _told.clear()

    def on_job_end(self, config, job_return, **kwargs) -> None:
        """A launch whose run has finished needs its file no more (a requeue continues only an unfinished run): it
        is removed, so that a job id the cluster gives out again never finds it."""
        from hydra.core.utils import JobStatus

        if getattr(job_return, "status", None) == JobStatus.COMPLETED:
            for marker in _written:
                marker.unlink(missing_ok=True)
            _written.clear()
