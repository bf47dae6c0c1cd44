"""`PeerWatch`: tells a lost rank of a multi-rank run from a failed one. A rank that fails on an error of its own first
leaves a note in the run folder (`.ranks/`); a rank whose collective breaks waits a few seconds for a peer's note. A
note: this rank fails with that peer. None: the peer is lost, and attnlab.cluster.rules decides whether the SLURM job
is requeued (within its ledger's budget) or fails for good.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from attnlab.callbacks.run_metadata import RunMetadata, ledger_of, record_end, requeue_budget
from attnlab.callbacks.signals import SignalGuard
from attnlab.cluster.launch import current_launch
from attnlab.cluster.outcome import Cause
from attnlab.cluster.rules import Decision, Event, JobState, decide, lost_peer
from attnlab.cluster.slurm_job import LOST, RUNNING, forbid_requeue, in_slurm_job
from attnlab.utils import atomic, env

# said where the job could not be made non-requeueable
NOT_HELD = " (SLURM may still requeue it on a node failure: scontrol update Requeue=0 was refused)"
# how long a surviving rank waits for a failed peer's note before it calls the peer lost (longer where a shared file
# system is slow to show a file written on another node)
NOTE_WAIT_ENV, NOTE_WAIT_S = "ATTNLAB_PEER_NOTE_WAIT_S", 10.0


class PeerWatch(Callback):
    """Tells a lost rank from a failed one at the end of a multi-rank run that raised (module docstring)."""

    def __init__(self, wait_s: float | None = None):
        self.wait_s = env.seconds(NOTE_WAIT_ENV, NOTE_WAIT_S) if wait_s is None else wait_s
        self.notes = Path(".ranks")
        self.held: bool | None = None  # made non-requeueable at the loss (past the budget): whether SLURM took it

    def setup(self, trainer, pl_module, stage: str) -> None:
        metadata = RunMetadata.of(trainer)
        run_dir = metadata.run_dir() if metadata is not None else None
        self.notes = Path(run_dir or trainer.default_root_dir) / ".ranks"
        if stage == "fit" and in_slurm_job():
            self.refuse_past_budget(trainer)
        if stage == "fit" and trainer.world_size > 1 and trainer.is_global_zero:
            ledger_of(trainer).note(RUNNING)  # the attempt began: a later one counts it if it ends without a word

    def refuse_past_budget(self, trainer) -> None:
        """An attempt that SLURM requeued on its own past the lost-peer budget (after a node failure) does not
        train: every rank fails here alike (they read the same ledger), the job is made non-requeueable, and rank 0
        says why, once."""
        spent, (budget, named) = ledger_of(trainer).spent(LOST), requeue_budget(trainer)
        decision = decide(Event.STARTED, JobState(in_slurm=True, spent=spent, budget=budget))
        if decision.exit_code is None:
            return
        if trainer.global_rank != 0:  # every rank of this attempt is up: rank 0 records and says it
            from attnlab.cluster.exit import end_at_once

            forbid_requeue()
            end_at_once(decision.exit_code)
            return
        why = (f"it was requeued for a lost peer or node {spent} times already, past the budget of this job ({named}), "
               "SLURM requeuing it itself after a node failure; check the nodes (sinfo -R), then run the same command "
               "again")
        if not forbid_requeue():
            why += NOT_HELD
        last = SignalGuard.saved(trainer)
        kept = f"{last} holds the last step saved." if last and last.is_file() else "No checkpoint was saved yet."
        self.fail(trainer, decision, "in an earlier attempt of this job", why, kept, requeues_spent=spent)

    @staticmethod
    def attempt() -> str:
        """What names this attempt of the launch, the same on every rank."""
        launch = current_launch()
        return f"{launch.key}-{launch.attempt}" if launch and launch.key else "local"

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
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
            ledger_of(trainer).note(Cause.RANK_FAILED, rank=trainer.global_rank, failed_rank=failed["rank"])
            end = decide(Event.PEER_FAILED, JobState(detail=f"rank {failed['rank']}")).end
            record_end(trainer, end, any_rank=True, peer_error=failed["error"])
            _say(f"rank {failed['rank']} of this run failed ({failed['error'].splitlines()[0][:200]}); rank "
                 f"{trainer.global_rank} stops with it (its own error, below, follows from that one). See rank "
                 f"{failed['rank']}'s log for the cause.")
            return
        self.on_lost(trainer, exception)

    def note_loss(self, trainer) -> None:
        """Note the loss in the ledger and, past the budget, make the job non-requeueable: before the wait for a
        peer's note, since SLURM may requeue the job (and end this process) meanwhile."""
        ledger = ledger_of(trainer)
        ledger.note(LOST, rank=trainer.global_rank, global_step=trainer.global_step)
        self.held = forbid_requeue() if in_slurm_job() and ledger.spent(LOST) >= requeue_budget(trainer)[0] else None

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
        from attnlab.cluster.exit import end_at_once

        what = str(exception).strip().splitlines()[0][:200] if str(exception).strip() else type(exception).__name__
        last = SignalGuard.saved(trainer)
        saved = last is not None and last.is_file()
        kept = f"{last} holds the last step saved" if saved else "no checkpoint was saved yet"
        if not in_slurm_job():
            _say(f"a peer rank of this run was lost ({what}): its process or its machine went away. {kept}; "
                 + (f"resume from it with ckpt_path={last}." if saved else "start it again."))
            return
        kept_line = f"{kept[:1].upper()}{kept[1:]}" + (f"; resume from it with ckpt_path={last}." if saved else ".")
        ledger, (budget, named) = ledger_of(trainer), requeue_budget(trainer)
        spent = ledger.spent(LOST)
        decision = decide(Event.PEER_LOST, JobState(in_slurm=True, spent=spent, budget=budget))
        if not decision.requeue:  # the same loss every time (a bad node, a host's OOM killer): fail once, for good
            why = (f"it was requeued for a lost peer or node {spent} times already, the budget of this job ({named}); "
                   "check the nodes (sinfo -R), then run the same command again")
            if not (self.held if self.held is not None else forbid_requeue()):
                why += NOT_HELD
            self.fail(trainer, decision, what, why, kept_line, requeues_spent=spent)
        # recorded before the requeue, for the sweep driver that sees it
        record_end(trainer, decision.end, any_rank=True, error=what, requeues_spent=spent + 1)
        requeued, why = ledger.requeue(LOST, rank=trainer.global_rank, global_step=trainer.global_step, error=what)
        if requeued:
            _say(f"a peer rank was lost ({what}): its node or its process went away, not a fault of the run. {kept}; "
                 f"the job is requeued ({spent + 1} of {named} requeues for a lost peer), "
                 f"and continues from it in this folder once its nodes are back. Exit status {decision.exit_code}.")
            end_at_once(decision.exit_code)  # the process group is broken: nothing more to unwind
        refused = decide(Event.PEER_LOST, JobState(in_slurm=True, spent=budget, budget=budget))  # as past the budget
        self.fail(trainer, refused, what, why, kept_line)

    @staticmethod
    def fail(trainer, decision: Decision, what: str, why: str, kept: str, **fields) -> None:
        """The job fails here, not requeued: one line and the lineage say why, and the process ends with the
        decision's status (the process group is broken: nothing more to unwind)."""
        from attnlab.cluster.exit import end_at_once

        record_end(trainer, decision.end, any_rank=True, error=what, not_requeued=why, **fields)
        _say(f"a peer rank was lost ({what}). The job fails and is not requeued: {why}. {kept} Exit status "
             f"{decision.exit_code}.")
        end_at_once(decision.exit_code)


def _say(line: str) -> None:
    os.write(2, f"\nattnlab: {line}\n".encode())
