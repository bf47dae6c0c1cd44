"""A SLURM job's requeues as every rank of it sees them: the job's ids, what `scontrol show job` says of it, and the
ledger of its attempts in the run folder that holds the lost-peer and time-limit budgets (callbacks/peers.py and
callbacks/signals.py act on them)."""

from __future__ import annotations

import glob
import json
import os
import re
import time
from pathlib import Path

from attnlab.cluster.outcome import Cause, SlurmState, Outcome
from attnlab.cluster.slurm_queue import ask
from attnlab.utils import atomic

LOST, TIME_LIMIT = Cause.PEER_LOST, Cause.TIME_LIMIT  # the causes of requeues counted against a budget
RUNNING = Outcome.RUNNING  # an attempt's record until it ends: one still so in a later attempt was lost without a word
DEFAULT_MAX_REQUEUES = 3  # SLURM jobs of one's own batch script (launcher=slurm: launcher.max_num_timeout)
LEDGER = ".requeues"


def in_slurm_job() -> bool:
    """A task of a SLURM job started by srun (submitit's jobs, a user's `srun python train.py`), not an interactive
    allocation: where Lightning uses its SLURM environment and a requeue can continue the run."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return bool(os.environ.get("SLURM_JOB_ID")) and SLURMEnvironment.detect()


def slurm_job_id() -> str | None:
    """The job as scontrol names it: `<array job>_<task>` for a task of an array, else its id."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def this_attempt() -> tuple[str | None, int]:
    """(the SLURM job as scontrol names it, SLURM_RESTART_COUNT: how many times SLURM had requeued it when this
    attempt started), the same on every rank of the attempt."""

    return slurm_job_id(), int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def max_requeues(launcher: dict | None) -> tuple[int, str]:
    """(the budget of requeues of each counted cause, how to name it): launcher.max_num_timeout under launcher=slurm
    (`launcher`: the run's resolved launcher, as every rank composed it), else DEFAULT_MAX_REQUEUES."""
    try:
        budget = int((launcher or {})["max_num_timeout"])
        return budget, f"launcher.max_num_timeout={budget}"
    except (KeyError, TypeError, ValueError):
        return DEFAULT_MAX_REQUEUES, f"{DEFAULT_MAX_REQUEUES}, in a batch script of one's own"


class Ledger:
    """The requeues attnlab asked for in this run folder, one file per attempt of a SLURM job (module docstring)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.folder = Path(run_dir) / LEDGER

    def earlier(self) -> list[dict]:
        """The records of this job's earlier attempts (restart counts below this attempt's), oldest first."""
        job, restart = this_attempt()
        found = []
        for path in self.folder.glob(f"{glob.escape(str(job))}.*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and record.get("job") == job and \
                    isinstance(record.get("restart_count"), int) and record["restart_count"] < restart:
                found.append(record)
        return sorted(found, key=lambda r: r["restart_count"])

    def spent(self, cause: Cause) -> int:
        """How many times this job was requeued for `cause` before this attempt. An earlier attempt that began
        training and ended without any rank's word (its record still `running`: killed outright, its node lost,
        and SLURM requeued the job itself, as it does on a node failure) counts as a lost peer."""
        causes = {LOST.value, RUNNING.value} if cause is LOST else {Cause(cause).value}
        return sum(1 for r in self.earlier() if r.get("cause") in causes)

    def note(self, cause: Cause | Outcome, unless_said: bool = False, **fields) -> Path | None:
        """This attempt's record: `running` as it begins training, then how it ends, written whole before a requeue
        is asked for; with `unless_said`, only over `running` (a SIGTERM after a requeue asked for a lost peer does
        not replace it). None outside a SLURM job (nothing to count) or where the folder cannot be written."""
        job, restart = this_attempt()
        if job is None:
            return None
        path = self.folder / f"{job}.{restart}.json"
        if unless_said and self.said(path):
            return path
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic.write_text(path, json.dumps({"job": job, "restart_count": restart, "cause": cause.value,
                                                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}))
        except OSError:
            return None
        return path

    @staticmethod
    def said(path: Path) -> bool:
        """Whether the record at `path` says how its attempt ended."""
        try:
            return json.loads(path.read_text()).get("cause") != RUNNING.value
        except (OSError, ValueError, AttributeError):
            return False

    def requeue(self, cause: Cause, **fields) -> tuple[bool, str]:
        """Note this attempt's requeue, then `scontrol requeue` the job: (requeued, why not). A requeue that SLURM
        refuses leaves no note."""
        path = self.note(cause, **fields)
        requeued, why = scontrol_requeue()
        if not requeued and path is not None:
            path.unlink(missing_ok=True)
        return requeued, why


def scontrol_requeue() -> tuple[bool, str]:
    """`scontrol requeue` of this job: (requeued, why not). A job that SLURM has requeued already (its own requeue
    of a preempted job, another rank's) counts as requeued."""

    job = slurm_job_id()
    out = ask("scontrol", "requeue", str(job), timeout=60)
    if out is None:
        return False, f"scontrol requeue {job} could not be run, or did not answer within 60 s"
    text = (out.stderr or out.stdout).strip()
    if out.returncode != 0 and "already" not in text.lower() and "pending" not in text.lower():
        return False, f"scontrol requeue {job}: {text or f'exit status {out.returncode}'}"
    return True, ""


def forbid_requeue() -> bool:
    """Make this job non-requeueable (`scontrol update JobId=<job> Requeue=0`), so that SLURM does not requeue it
    itself either (a node failure, its batch host lost); whether SLURM took it."""

    out = ask("scontrol", "update", f"JobId={slurm_job_id()}", "Requeue=0", timeout=60)
    return out is not None and out.returncode == 0


def slurm_fields(*what: str) -> dict[str, str]:
    """`scontrol show <what> -o` (`job <id>`, `partition <name>`, `config`) as {key: value}; {} when it cannot say."""
    out = ask("scontrol", "show", *what, *(["-o"] if what[0] != "config" else []), timeout=10)
    if out is None or out.returncode != 0:
        return {}
    if what[0] == "config":
        return {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in out.stdout.splitlines()) if v}
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", out.stdout))


def job_fields() -> dict[str, str]:
    """`scontrol show job` of this job; {} when it cannot say."""

    job = slurm_job_id()
    return slurm_fields("job", str(job)) if job else {}


def seconds_left(fields: dict[str, str], at: float) -> float | None:
    """Seconds from `at` (time.time()) to the job's end time (`EndTime`, in this machine's time zone as scontrol
    writes it); None when it cannot say."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(fields["EndTime"]).timestamp() - at
    except (KeyError, ValueError):
        return None


def slurm_requeues(fields: dict[str, str], preempted: bool) -> tuple[bool, str]:
    """After a requeue that SLURM refused, what SLURM says of the job (`fields`: scontrol show job): (whether it is
    requeued all the same, why not). It is when SLURM has requeued it already (pending again, or restarted since
    this attempt began), or when it is being preempted under PreemptMode=REQUEUE (the partition's, else the
    cluster's) and can be requeued (Requeue=1)."""
    queued = (SlurmState.PENDING, SlurmState.REQUEUED, SlurmState.REQUEUE_FED, SlurmState.REQUEUE_HOLD)
    if SlurmState.of(fields.get("SlurmState", "")) in queued or \
            int(fields.get("Restarts", "0") or 0) > this_attempt()[1]:
        return True, ""
    if fields.get("Requeue") == "0":
        return False, "the job cannot be requeued (Requeue=0: --no-requeue, or the cluster's JobRequeue=0)"
    if not preempted:
        return False, ""
    mode = slurm_fields("partition", fields.get("Partition", "")).get("PreemptMode", "") or \
        slurm_fields("config").get("PreemptMode", "")
    if "REQUEUE" in mode.upper():
        return True, ""
    return False, f"SLURM cancels a preempted job here (PreemptMode={mode or 'unknown'}), it does not requeue it"


def slurm_environment():
    """Lightning's SLURM environment (ranks, nodes, rendezvous) without its requeue handler, under SLURM; else None.
    SignalGuard alone acts on SLURM's warning signal. Under torchrun inside a SLURM job (`srun ... torchrun ...` in
    a batch script) torchrun's environment wins, as Lightning itself decides (TorchElasticEnvironment first)."""
    from lightning.fabric.plugins.environments import TorchElasticEnvironment

    if not in_slurm_job() or TorchElasticEnvironment.detect():
        return None
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment(auto_requeue=False)


def being_preempted(fields: dict[str, str] | None = None) -> bool:
    """Whether SLURM is preempting this job now: the controller has given it a preemption time (`PreemptTime` of
    `scontrol show job`), which a cancellation, a time limit or a plain kill does not. False when it cannot say."""
    fields = job_fields() if fields is None else fields
    return fields.get("PreemptTime", "None") not in ("None", "Unknown", "")
