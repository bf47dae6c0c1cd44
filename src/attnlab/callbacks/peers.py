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

import json
import os
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from attnlab.callbacks.requeues import (  # noqa: F401  (the names tests and callers import from here)
    DEFAULT_MAX_REQUEUES, LEDGER, LOST, REQUEUED_LOST, RUNNING, TIME_LIMIT, Ledger, forbid_requeue, in_slurm_job,
    job_fields, max_requeues, scontrol_requeue, seconds_left, slurm_fields, slurm_job_id, slurm_requeues, this_attempt)
from attnlab.utils import atomic, env

# what torch's backends say when the other end of a collective went away
LOST_MARKS = ("connection reset by peer", "connection closed by peer", "broken pipe", "communicator was aborted",
              "connection refused", "socket timeout", "no route to host", "timed out", "nccl error", "rank dead")
# how long a surviving rank waits for a failed peer's note before it calls the peer lost (longer where a shared file
# system is slow to show a file written on another node)
NOTE_WAIT_ENV, NOTE_WAIT_S = "ATTNLAB_PEER_NOTE_WAIT_S", 10.0
LOST_TYPES = ("DistNetworkError", "DistBackendError", "DistStoreError")



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

    def __init__(self, wait_s: float | None = None):
        self.wait_s = env.seconds(NOTE_WAIT_ENV, NOTE_WAIT_S) if wait_s is None else wait_s
        self.notes = Path(".ranks")
        self.held: bool | None = None  # made non-requeueable at the loss (past the budget): whether SLURM took it

    def setup(self, trainer, pl_module, stage: str) -> None:
        from attnlab.callbacks.run_metadata import RunMetadata

        metadata = RunMetadata.of(trainer)
        run_dir = metadata.run_dir() if metadata is not None else None
        self.notes = Path(run_dir or trainer.default_root_dir) / ".ranks"
        if stage == "fit" and in_slurm_job():
            self.refuse_past_budget(trainer)
        if stage == "fit" and trainer.world_size > 1 and trainer.is_global_zero:
            Ledger.of(trainer).note(RUNNING)  # the attempt began: a later one counts it if it ends without a word

    def refuse_past_budget(self, trainer) -> None:
        """An attempt that SLURM itself started past the lost-peer budget (a node failure whose surviving ranks were
        ended before they could decide, so no rank made the job non-requeueable) does not train: the job fails here
        on every rank alike (the same ledger), is made non-requeueable, and rank 0 says why, once."""
        spent, (budget, named) = Ledger.of(trainer).spent(LOST), max_requeues(trainer)
        if spent <= budget:
            return
        if trainer.global_rank != 0:  # every rank of this attempt is up: rank 0 records and says it
            from attnlab.callbacks.signals import end_at_once

            forbid_requeue()
            end_at_once(1)
            return
        why = (f"it was requeued for a lost peer or node {spent} times already, past the budget of this job ({named}), "
               "SLURM requeuing it itself after a node failure; check the nodes (sinfo -R), then run the same command "
               "again")
        if not forbid_requeue():
            why += " (SLURM may still requeue it on a node failure: scontrol update Requeue=0 was refused)"
        from attnlab.callbacks.signals import SignalGuard

        last = SignalGuard.saved(trainer)
        kept = f"{last} holds the last step saved." if last and last.is_file() else "No checkpoint was saved yet."
        self.fail(trainer, "in an earlier attempt of this job", why, kept, requeues_spent=spent)

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
        from attnlab.callbacks.signals import STOPPED, SignalGuard, end_at_once

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
