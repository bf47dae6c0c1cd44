"""How an attempt of a run ended, as a type: written by the run into its lineage and the ledger, read by the sweep
driver and by the next attempt. No reader parses the text a person reads (`status`); each reads `outcome` and `cause`.
And a job's state as SLURM gives it (`SlurmState`), read once where squeue, sacct or scontrol answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Named(str, Enum):
    """An enum whose members are their text: in a message as in a record (JSON), and equal to it."""

    def __str__(self) -> str:  # the value, in a message as in a record
        return self.value

    __format__ = str.__format__


class Outcome(Named):
    RUNNING = "running"        # training began; still so in a later attempt: it ended without a word
    FINISHED = "finished"
    PRUNED = "pruned"          # stopped by an Optuna sweep's pruner
    REQUEUED = "requeued"      # the job was requeued, and continues from last.ckpt in its folder
    STOPPED = "stopped"        # by a signal, not requeued: not finished
    FAILED = "failed"
    UNRECORDED = "unrecorded"  # an earlier attempt that never said how it ended (SIGKILL, out of memory, node lost)


class Cause(Named):
    TIME_LIMIT = "time limit"
    PREEMPTED = "preempted"
    SLURM_WARNING = "SLURM's warning"  # in a batch script of one's own, whose warning lead is not known
    PEER_LOST = "a peer was lost"
    SIGTERM = "SIGTERM"
    CTRL_C = "Ctrl-C"
    RANK_FAILED = "a rank failed"
    ERROR = "an error"


class SlurmState(Named):
    """A job's state: SLURM's (squeue's %T, sacct's State), read once (`of`) where SLURM answers, and the sweep
    driver's own: SUBMITTED (before its first poll), REQUEUED (back in the queue after running), MAY_REQUEUE (ended
    as SLURM may run it again), GONE (missing from the queue, no end known). A state this table lacks (a newer
    SLURM's) is UNKNOWN: the job is alive."""

    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    RESIZING = "RESIZING"
    COMPLETING = "COMPLETING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    MAY_REQUEUE = "MAY_REQUEUE"
    GONE = "GONE"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def of(cls, text: str) -> SlurmState:
        """SLURM's word for a state (sacct's `CANCELLED by 1000` is CANCELLED)."""
        word = text.split()[0] if text.split() else ""
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN


# the causes of a requeue (each its own budget where counted: COUNTED)
REQUEUEABLE = (Cause.TIME_LIMIT, Cause.PREEMPTED, Cause.SLURM_WARNING, Cause.PEER_LOST)
COUNTED = (Cause.TIME_LIMIT, Cause.PEER_LOST)
UNRECORDED_TEXT = "ended unrecorded: killed (SIGKILL, out of memory) or its node lost"


@dataclass(frozen=True)
class AttemptEnd:
    outcome: Outcome
    cause: Cause | None = None
    detail: str = ""        # the error's type, the failed rank, why the stop was at once
    at_once: bool = False   # ended without unwinding (a second SIGTERM, a hung step)

    @property
    def status(self) -> str:
        """The line a person reads in lineage.json and `attnlab-compare`."""
        o, c = self.outcome, self.cause
        if o is Outcome.UNRECORDED:
            return UNRECORDED_TEXT
        if o is Outcome.REQUEUED:
            return f"requeued: {c.value}"
        if o is Outcome.STOPPED and self.at_once:
            return f"stopped at once: {self.detail}"
        if o in (Outcome.STOPPED, Outcome.FAILED) and c in REQUEUEABLE:
            return f"{o.value}: {c.value}, not requeued"
        if o is Outcome.STOPPED and c is Cause.CTRL_C:
            return "stopped: Ctrl-C"
        if o is Outcome.FAILED and c is Cause.RANK_FAILED:
            return f"failed: {self.detail} failed"
        if o is Outcome.FAILED and self.detail:
            return f"failed: {self.detail}"
        return o.value

    def record(self) -> dict:
        """The fields of a lineage or ledger record that say how the attempt ended."""
        return {"status": self.status, "outcome": self.outcome.value,
                "cause": self.cause.value if self.cause else None, **({"detail": self.detail} if self.detail else {}),
                **({"at_once": True} if self.at_once else {})}

    @classmethod
    def of(cls, record: dict | None) -> AttemptEnd | None:
        """How a record says its attempt ended; None where it says nothing a type can hold (a record of another
        version, a damaged file)."""
        try:
            cause = record.get("cause")
            return cls(Outcome(record["outcome"]), Cause(cause) if cause else None, str(record.get("detail") or ""),
                       bool(record.get("at_once")))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None


RUNNING = AttemptEnd(Outcome.RUNNING)
FINISHED = AttemptEnd(Outcome.FINISHED)
