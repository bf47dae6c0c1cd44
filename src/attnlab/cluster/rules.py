"""The rules of a job's life, as pure functions: `decide(event, state) -> Decision` (whether to save, whether to
ask for a requeue, how the attempt ends and with which exit status), `warning_cause` (why SLURM warned: a time
limit, a preemption) and `lost_peer` (whether an error is a collective's report of a rank gone away). They read no
clock, no file and no signal. The callbacks gather the state (the ledger's counts, what SLURM says) and carry the
decision out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from attnlab.cluster.exit import STOPPED
from attnlab.cluster.outcome import COUNTED, FINISHED, RUNNING, AttemptEnd, Cause, Outcome
from attnlab.errors import causes

# SLURM sends --signal up to a minute before the time it was asked for (its controller's checks): a warning within a
# job's lead and this much of its end time is its time limit's
WARNING_SLACK_S = 90.0
# what torch's backends say when the other end of a collective went away
LOST_MARKS = ("connection reset by peer", "connection closed by peer", "broken pipe", "communicator was aborted",
              "connection refused", "socket timeout", "no route to host", "timed out", "nccl error", "rank dead")
LOST_TYPES = ("DistNetworkError", "DistBackendError", "DistStoreError")


class Event(Enum):
    STARTED = "training began"
    WARNING = "SLURM's warning"            # before a time limit or a preemption: `state.cause` says which
    SIGTERM = "SIGTERM"                    # kill, scancel, Ctrl-C's kin
    SIGTERM_AGAIN = "a second SIGTERM"
    REQUEUE_REFUSED = "SLURM refused the requeue"
    PEER_LOST = "a peer was lost"          # its collective broke, and no note of its own failure came
    PEER_FAILED = "a peer failed"          # a note of its own error came
    FINISHED = "finished"


@dataclass(frozen=True)
class JobState:
    in_slurm: bool = False      # a task of a SLURM job (srun): a requeue can continue the run
    cause: Cause | None = None  # why SLURM warned (time limit, preempted, SLURM's warning)
    spent: int = 0              # requeues already spent for the cause that counts (the ledger's)
    budget: int = 3             # launcher.max_num_timeout, per counted cause
    step_s: float = 0.0         # how long the current step has run
    patience_s: float = 30.0    # a first SIGTERM after a step has run this long stops at once
    detail: str = ""            # the failed rank, the reason of a stop at once
    warned: bool = False        # SLURM's warning came: a SIGTERM now is the end it announced, not a new stop


@dataclass(frozen=True)
class Decision:
    end: AttemptEnd
    save: bool = False            # last.ckpt at the end of the current step
    requeue: bool = False         # ask SLURM for it (scontrol, or submitit's handler)
    exit_code: int | None = None  # None: the run goes on
    at_once: bool = False         # end the process without unwinding (a collective may never return)
    forbid_requeue: bool = False  # make the job non-requeueable (SLURM would requeue it on a node failure)


def decide(event: Event, state: JobState) -> Decision:
    if event is Event.FINISHED:
        return Decision(FINISHED, exit_code=0)
    if event is Event.STARTED:
        if state.in_slurm and state.spent > state.budget:  # SLURM requeued it itself past the lost-peer budget
            return Decision(AttemptEnd(Outcome.FAILED, Cause.PEER_LOST), exit_code=1, at_once=True,
                            forbid_requeue=True)
        return Decision(RUNNING)
    if event in (Event.SIGTERM, Event.SIGTERM_AGAIN) and state.warned and state.step_s < state.patience_s:
        return Decision(RUNNING)  # the warning's save goes on (srun and the step each pass the end's SIGTERM on)
    if event is Event.SIGTERM and state.step_s < state.patience_s:
        return Decision(AttemptEnd(Outcome.STOPPED, Cause.SIGTERM), save=True, exit_code=STOPPED)
    if event in (Event.SIGTERM, Event.SIGTERM_AGAIN):
        why = state.detail or ("a second SIGTERM" if event is Event.SIGTERM_AGAIN
                               else f"SIGTERM while a step has run for {state.step_s:.0f} s")
        return Decision(AttemptEnd(Outcome.STOPPED, Cause.SIGTERM, why, at_once=True), exit_code=STOPPED,
                        at_once=True)
    if event is Event.WARNING:
        cause = state.cause or Cause.SLURM_WARNING
        past = cause in COUNTED and state.spent >= state.budget
        return Decision(AttemptEnd(Outcome.STOPPED if past else Outcome.REQUEUED, cause), save=True,
                        requeue=not past, exit_code=STOPPED)
    if event is Event.REQUEUE_REFUSED:
        return Decision(AttemptEnd(Outcome.STOPPED, state.cause or Cause.SLURM_WARNING), exit_code=STOPPED)
    if event is Event.PEER_FAILED:  # a bug comes back on every attempt: never requeued
        return Decision(AttemptEnd(Outcome.FAILED, Cause.RANK_FAILED, state.detail or "a rank"), exit_code=1)
    if event is Event.PEER_LOST:
        if not state.in_slurm:  # torchrun, a local launch: the error stands
            return Decision(AttemptEnd(Outcome.FAILED, Cause.PEER_LOST), exit_code=1)
        if state.spent >= state.budget:  # the same loss every time (a bad node): fail once, for good
            return Decision(AttemptEnd(Outcome.FAILED, Cause.PEER_LOST), exit_code=1, at_once=True,
                            forbid_requeue=True)
        return Decision(AttemptEnd(Outcome.REQUEUED, Cause.PEER_LOST), requeue=True, exit_code=STOPPED,
                        at_once=True)
    raise ValueError(event)


def warning_cause(preempting: bool, under_submitit: bool, left_s: float | None, lead_s: float | None,
                  timed_out: Callable[[], bool]) -> Cause:
    """Why SLURM warned: preempted while SLURM is preempting the job (`scontrol show job`'s PreemptTime); in a batch
    script of one's own (not `under_submitit`), SLURM's warning; else the time limit when the warning came within the
    job's lead (`lead_s`, launcher.signal_delay_s) plus WARNING_SLACK_S of its end (`left_s`), preempted otherwise;
    where either is not known, submitit's judgement by the time the job has run (`timed_out()`, asked only then)."""
    if preempting:
        return Cause.PREEMPTED
    if not under_submitit:
        return Cause.SLURM_WARNING
    if left_s is None or lead_s is None:
        return Cause.TIME_LIMIT if timed_out() else Cause.PREEMPTED
    return Cause.TIME_LIMIT if left_s <= lead_s + WARNING_SLACK_S else Cause.PREEMPTED


def lost_peer(error: BaseException) -> bool:
    """Whether `error` (or one it was raised from) is a collective's report that another rank went away."""
    for e in causes(error):
        text = str(e).lower()
        if type(e).__name__ in LOST_TYPES or (
                isinstance(e, RuntimeError) and ("gloo" in text or "nccl" in text or "c10d" in text)
                and any(mark in text for mark in LOST_MARKS)):
            return True
    return False
