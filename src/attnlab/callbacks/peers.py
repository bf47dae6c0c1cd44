"""A rank of a multi-rank run that is lost (its node died, its process was killed), told apart from a bug in the run;
and the job's ledger of requeues, which holds the budgets of requeues on every rank.

When one rank of a run of several goes away, the others learn it from their next collective: gloo's "Connection
reset by peer" or "Connection closed by peer", NCCL's aborted communicator, torch's DistNetworkError. The same error
reaches them when that rank stopped on an exception of its own (a bug, a bad batch), so each rank that fails on
anything else leaves a note in the run folder (`.ranks/`) first, and a surviving rank waits a few seconds for one:

- a note from a peer: the run failed there; this rank says so in one line (which rank, its error) and fails too,
  its lineage naming the peer's error. Nothing is requeued: a bug comes back on every attempt.
- no note: the peer was lost. In a SLURM job, the job is requeued (`scontrol requeue`: it waits for its nodes, then
  continues from `last.ckpt` in its own folder), at most `launcher.max_num_timeout` times (3 for a job of one's
  own batch script); the attempt ends with status 143 and its lineage says `requeued: a peer was lost`. Elsewhere
  (torchrun, a local launch) the error stands, after one line naming the checkpoint to resume from.

The ledger (`Ledger`): each attempt of a multi-rank SLURM job has one small file in the run folder,
`.requeues/<job>.<restart count>.json` (the SLURM job's id and SLURM_RESTART_COUNT, the same on every rank of an
attempt). Rank 0 writes it, `running`, as training begins; it is rewritten, whole, with how the attempt ends, before
any requeue is asked for, by the rank that knows: rank 0 on SLURM's warning or a SIGTERM (callbacks/signals.py), every
surviving rank as soon as its collective breaks (rank 0's node may be the one lost; a failed peer's note then replaces
it). A rank that must decide counts the files of its job from earlier attempts (restart counts below its own) by their
cause: the same files and the same count on every rank, whichever rank was lost. A file still `running` is an attempt
that ended without a word (killed outright, its node lost) and that SLURM requeued itself, as on a node failure: it
counts as a lost peer. The budgets are per cause: a lost peer and a time limit each at most `launcher.max_num_timeout`
times; a preemption, or a warning in a batch script of one's own, is recorded but not counted. Once the lost-peer
budget is spent, the next loss makes the job non-requeueable at once (`scontrol update Requeue=0`, before the wait for
a peer's note), so that SLURM itself does not requeue it on a node failure either: the job fails once, saying why,
with status 1, and is not run again.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from attnlab.utils import atomic

# what torch's backends say when the other end of a collective went away
LOST_MARKS = ("connection reset by peer", "connection closed by peer", "broken pipe", "communicator was aborted",
              "connection refused", "socket timeout", "no route to host", "timed out", "nccl error", "rank dead")
LOST_TYPES = ("DistNetworkError", "DistBackendError", "DistStoreError")
LOST, TIME_LIMIT = "a peer was lost", "time limit"  # the causes of requeues counted against a budget
RUNNING = "running"  # an attempt's record until it ends: one still so in a later attempt was lost without a word
REQUEUED_LOST = f"requeued: {LOST}"
DEFAULT_MAX_REQUEUES = 3  # SLURM jobs of one's own batch script (launcher=slurm: launcher.max_num_timeout)
LEDGER = ".requeues"


def lost_peer(error: BaseException) -> bool:
    """Whether `error` (or one it was raised from) is a collective's report that another rank went away."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error).lower()
        if type(error).__name__ in LOST_TYPES or (
                isinstance(error, RuntimeError) and ("gloo" in text or "nccl" in text or "c10d" in text)
                and any(mark in text for mark in LOST_MARKS)):
            return True
        error = error.__cause__ or error.__context__
    return False


def this_attempt() -> tuple[str | None, int]:
    """(the SLURM job as scontrol names it, SLURM_RESTART_COUNT: how many times SLURM had requeued it when this
    attempt started), the same on every rank of the attempt."""
    from attnlab.callbacks.signals import slurm_job_id

    return slurm_job_id(), int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def max_requeues(trainer) -> tuple[int, str]:
    """(the budget of requeues of each counted cause, how to name it): launcher.max_num_timeout under launcher=slurm
    (the run's resolved launcher, as every rank composed it), else DEFAULT_MAX_REQUEUES."""
    from attnlab.callbacks.run_metadata import RunMetadata

    record = getattr(RunMetadata.of(trainer), "lineage", None) or {}
    try:
        budget = int((record.get("launcher") or {})["max_num_timeout"])
        return budget, f"launcher.max_num_timeout={budget}"
    except (KeyError, TypeError, ValueError):
        return DEFAULT_MAX_REQUEUES, f"{DEFAULT_MAX_REQUEUES}, in a batch script of one's own"


class Ledger:
    """The requeues attnlab asked for in this run folder, one file per attempt of a SLURM job (module docstring)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.folder = Path(run_dir) / LEDGER

    @classmethod
    def of(cls, trainer) -> Ledger:
        from attnlab.callbacks.run_metadata import RunMetadata

        metadata = RunMetadata.of(trainer)
        return cls((metadata.run_dir() if metadata is not None else None) or trainer.default_root_dir)

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

    def spent(self, cause: str) -> int:
        """How many times this job was requeued for `cause` before this attempt. An earlier attempt that began
        training and ended without any rank's word (its record still `running`: killed outright, its node lost,
        and SLURM requeued the job itself, as it does on a node failure) counts as a lost peer."""
        causes = (LOST, RUNNING) if cause == LOST else (cause,)
        return sum(1 for r in self.earlier() if r.get("cause") in causes)

    def note(self, cause: str, unless_said: bool = False, **fields) -> Path | None:
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
            atomic.write_text(path, json.dumps({"job": job, "restart_count": restart, "cause": cause,
                                                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}))
        except OSError:
            return None
        return path

    @staticmethod
    def said(path: Path) -> bool:
        """Whether the record at `path` says how its attempt ended."""
        try:
            return json.loads(path.read_text()).get("cause") != RUNNING
        except (OSError, ValueError, AttributeError):
            return False

    def requeue(self, cause: str, **fields) -> tuple[bool, str]:
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
    from attnlab.callbacks.signals import slurm_job_id

    job = slurm_job_id()
    try:
        out = subprocess.run(["scontrol", "requeue", str(job)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"scontrol requeue {job} failed ({e})"
    text = (out.stderr or out.stdout).strip()
    if out.returncode != 0 and "already" not in text.lower() and "pending" not in text.lower():
        return False, f"scontrol requeue {job}: {text or f'exit status {out.returncode}'}"
    return True, ""


def forbid_requeue() -> bool:
    """Make this job non-requeueable (`scontrol update JobId=<job> Requeue=0`), so that SLURM does not requeue it
    itself either (a node failure, its batch host lost); whether SLURM took it."""
    from attnlab.callbacks.signals import slurm_job_id

    try:
        out = subprocess.run(["scontrol", "update", f"JobId={slurm_job_id()}", "Requeue=0"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def slurm_fields(*what: str) -> dict[str, str]:
    """`scontrol show <what> -o` (`job <id>`, `partition <name>`, `config`) as {key: value}; {} when it cannot say."""
    try:
        out = subprocess.run(["scontrol", "show", *what, *(["-o"] if what[0] != "config" else [])],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0:
        return {}
    if what[0] == "config":
        return {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in out.stdout.splitlines()) if v}
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", out.stdout))


def job_fields() -> dict[str, str]:
    """`scontrol show job` of this job; {} when it cannot say."""
    from attnlab.callbacks.signals import slurm_job_id

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
    if fields.get("JobState") in ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD") or \
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


class PeerWatch(Callback):
    """Tells a lost rank from a failed one at the end of a multi-rank run that raised (module docstring)."""

    def __init__(self, wait_s: float = 10.0):
        self.wait_s = wait_s
        self.notes = Path(".ranks")
        self.held: bool | None = None  # made non-requeueable at the loss (past the budget): whether SLURM took it

    def setup(self, trainer, pl_module, stage: str) -> None:
        from attnlab.callbacks.run_metadata import RunMetadata

        metadata = RunMetadata.of(trainer)
        run_dir = metadata.run_dir() if metadata is not None else None
        self.notes = Path(run_dir or trainer.default_root_dir) / ".ranks"
        if stage == "fit" and trainer.world_size > 1 and trainer.is_global_zero:
            Ledger.of(trainer).note(RUNNING)  # the attempt began: a later one counts it if it ends without a word

    @staticmethod
    def attempt() -> str:
        """What names this attempt of the launch, the same on every rank."""
        from attnlab.utils.launch import current_launch

        launch = current_launch()
        return f"{launch.key}-{launch.attempt}" if launch and launch.key else "local"

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if trainer.world_size == 1 or isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if not lost_peer(exception):
            self.notes.mkdir(parents=True, exist_ok=True)
            atomic.write_text(self.notes / f"{self.attempt()}.rank{trainer.global_rank}.json", json.dumps(
                {"rank": trainer.global_rank, "error": f"{type(exception).__name__}: {exception}"[:500]}))
            return
        self.note_loss(trainer)
        failed = self.peer_failure(trainer.global_rank)
        if failed is not None:
            Ledger.of(trainer).note(f"failed: rank {failed['rank']} failed", rank=trainer.global_rank)
            _record(trainer, f"failed: rank {failed['rank']} failed", peer_error=failed["error"])
            _say(f"rank {failed['rank']} of this run failed ({failed['error'].splitlines()[0][:200]}); rank "
                 f"{trainer.global_rank} stops with it (its own error, below, follows from that one). See rank "
                 f"{failed['rank']}'s log for the cause.")
            return
        self.on_lost(trainer, exception)

    def note_loss(self, trainer) -> None:
        """Before the wait for a peer's note, as SLURM may requeue the job itself meanwhile (its batch host lost) and
        end this process too: the loss in the ledger, and past the budget a job no longer requeueable (no requeue
        follows, whether a peer was lost or failed)."""
        from attnlab.callbacks.signals import in_slurm_job

        ledger = Ledger.of(trainer)
        ledger.note(LOST, rank=trainer.global_rank, global_step=trainer.global_step)
        self.held = forbid_requeue() if in_slurm_job() and ledger.spent(LOST) >= max_requeues(trainer)[0] else None

    def peer_failure(self, rank: int) -> dict | None:
        """A note of another rank's own failure in this attempt, waited for a few seconds (it may still be
        writing it)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            for note in sorted(self.notes.glob(f"{self.attempt()}.rank*.json")):
                try:
                    found = json.loads(note.read_text())
                except (OSError, ValueError):
                    continue
                if found.get("rank") != rank:
                    return found
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.5)

    def on_lost(self, trainer, exception: BaseException) -> None:
        from attnlab.callbacks.signals import STOPPED, SignalGuard, end_at_once, in_slurm_job

        what = str(exception).strip().splitlines()[0][:200] if str(exception).strip() else type(exception).__name__
        last = SignalGuard.saved(trainer)
        kept = f"{last} holds the last step saved" if last and last.is_file() else "no checkpoint was saved yet"
        resume = f"; resume from it with ckpt_path={last}." if last and last.is_file() else "."
        if not in_slurm_job():
            _say(f"a peer rank of this run was lost ({what}): its process or its machine went away. {kept}; "
                 + (f"resume from it with ckpt_path={last}." if last and last.is_file() else "start it again."))
            return
        ledger, (budget, named) = Ledger.of(trainer), max_requeues(trainer)
        spent = ledger.spent(LOST)
        if spent >= budget:  # the same loss every time (a bad node, a host's OOM killer): fail once, for good
            why = (f"it was requeued for a lost peer or node {spent} times already, the budget of this job ({named}); "
                   "check the nodes (sinfo -R), then run the same command again")
            if not (self.held if self.held is not None else forbid_requeue()):
                why += " (SLURM may still requeue it on a node failure: scontrol update Requeue=0 was refused)"
            self.fail(trainer, what, why, f"{kept[:1].upper()}{kept[1:]}{resume}", requeues_spent=spent)
        # recorded before the requeue, for the sweep driver that sees it
        _record(trainer, REQUEUED_LOST, error=what, requeues_spent=spent + 1)
        requeued, why = ledger.requeue(LOST, rank=trainer.global_rank, global_step=trainer.global_step, error=what)
        if requeued:
            _say(f"a peer rank was lost ({what}): its node or its process went away, not a fault of the run. {kept}; "
                 f"the job is requeued ({spent + 1} of {named} requeues for a lost peer), "
                 f"and continues from it in this folder once its nodes are back. Exit status {STOPPED}.")
            end_at_once(STOPPED)  # the process group is broken: nothing more to unwind
        self.fail(trainer, what, why, f"{kept[:1].upper()}{kept[1:]}{resume}")

    @staticmethod
    def fail(trainer, what: str, why: str, kept: str, **fields) -> None:
        """The job fails here, not requeued: one line and the lineage say why, and the process ends with status 1
        (the process group is broken: nothing more to unwind)."""
        from attnlab.callbacks.signals import end_at_once

        _record(trainer, f"failed: {LOST}, not requeued", error=what, not_requeued=why, **fields)
        _say(f"a peer rank was lost ({what}). The job fails and is not requeued: {why}. {kept} Exit status 1.")
        end_at_once(1)


def _record(trainer, status: str, **fields) -> None:
    """How this attempt ended, in the run's lineage: by this rank whichever it is (rank 0 may be the one lost)."""
    from attnlab.callbacks.run_metadata import RunMetadata

    metadata = RunMetadata.of(trainer)
    if metadata is not None:
        metadata.finish(trainer, status, any_rank=True, **fields)


def _say(line: str) -> None:
    os.write(2, f"\nattnlab: {line}\n".encode())
