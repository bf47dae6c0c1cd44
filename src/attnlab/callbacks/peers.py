"""A rank of a multi-rank run that is lost (its node died, its process was killed), told apart from a bug in the run.

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
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from attnlab.utils import atomic

# what torch's backends say when the other end of a collective went away
LOST_MARKS = ("connection reset by peer", "connection closed by peer", "broken pipe", "communicator was aborted",
              "connection refused", "socket timeout", "no route to host", "timed out", "nccl error", "rank dead")
LOST_TYPES = ("DistNetworkError", "DistBackendError", "DistStoreError")
REQUEUED_LOST = "requeued: a peer was lost"
DEFAULT_MAX_REQUEUES = 3  # SLURM jobs of one's own batch script (launcher=slurm: launcher.max_num_timeout)


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


class PeerWatch(Callback):
    """Tells a lost rank from a failed one at the end of a multi-rank run that raised (module docstring)."""

    def __init__(self, wait_s: float = 10.0):
        self.wait_s = wait_s
        self.notes = Path(".ranks")

    def setup(self, trainer, pl_module, stage: str) -> None:
        from attnlab.callbacks.run_metadata import RunMetadata

        metadata = RunMetadata.of(trainer)
        run_dir = metadata.run_dir() if metadata is not None else None
        self.notes = Path(run_dir or trainer.default_root_dir) / ".ranks"

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
        failed = self.peer_failure(trainer.global_rank)
        if failed is not None:
            _record(trainer, f"failed: rank {failed['rank']} failed", peer_error=failed["error"])
            _say(f"rank {failed['rank']} of this run failed ({failed['error'].splitlines()[0][:200]}); rank "
                 f"{trainer.global_rank} stops with it (its own error, below, follows from that one). See rank "
                 f"{failed['rank']}'s log for the cause.")
            return
        self.on_lost(trainer, exception)

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
        if not in_slurm_job():
            _say(f"a peer rank of this run was lost ({what}): its process or its machine went away. {kept}; "
                 + (f"resume from it with ckpt_path={last}." if last and last.is_file() else "start it again."))
            return
        _record(trainer, REQUEUED_LOST, error=what)  # before the requeue, for the sweep driver that sees it
        requeued, why = self.requeue(trainer)
        if requeued:
            _say(f"a peer rank was lost ({what}): its node or its process went away, not a fault of the run. {kept}; "
                 f"the job is requeued, and continues from it in this folder once its nodes are back. Exit status "
                 f"{STOPPED}.")
            end_at_once(STOPPED)  # the process group is broken: nothing more to unwind
        _record(trainer, "failed: a peer was lost, not requeued", error=what, not_requeued=why)
        _say(f"a peer rank was lost ({what}). The job is not requeued: {why}. {kept}"
             + (f"; resume from it with ckpt_path={last}." if last and last.is_file() else "."))

    @staticmethod
    def requeue(trainer) -> tuple[bool, str]:
        """`scontrol requeue` of this job, within its budget of requeues for lost peers. Every surviving rank asks:
        one of them is enough."""
        from attnlab.callbacks.run_metadata import RunMetadata
        from attnlab.callbacks.signals import slurm_job_id

        record = getattr(RunMetadata.of(trainer), "lineage", None) or {}
        budget = int((record.get("launcher") or {}).get("max_num_timeout", DEFAULT_MAX_REQUEUES))
        spent = sum(1 for r in record.get("earlier", []) if r.get("status") == REQUEUED_LOST)
        if spent >= budget:
            return False, (f"it was requeued for a lost peer {spent} times already (launcher.max_num_timeout="
                           f"{budget}); check the nodes (sinfo -R), then run the same command again")
        job = slurm_job_id()
        try:
            out = subprocess.run(["scontrol", "requeue", str(job)], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            return False, f"scontrol requeue {job} failed ({e})"
        text = (out.stderr or out.stdout).strip()
        if out.returncode != 0 and "already" not in text.lower() and "pending" not in text.lower():
            return False, f"scontrol requeue {job}: {text}"
        return True, ""


def _record(trainer, status: str, **fields) -> None:
    from attnlab.callbacks.signals import SignalGuard

    SignalGuard.record(trainer, status, **fields)


def _say(line: str) -> None:
    os.write(2, f"\nattnlab: {line}\n".encode())
