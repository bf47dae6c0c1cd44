"""The sweep driver's view of one SLURM job, as one state machine: `follow` is one poll's step, `ended` the verdict
on a job the queue shows ended or no longer shows.

A poll reads squeue's state of the job (an outage, squeue failing, teaches nothing and changes no state), sacct's
while the job is missing, the run's result file, and scontrol's Requeue flag while a requeue may come. An ended job
is in one wait, its timer started when it entered it (never carried over; after an outage every timer starts anew):

  requeue  ended TIMEOUT, NODE_FAIL or PREEMPTED: SLURM may run it again       at most REQUEUE_GRACE_S
  result   ended COMPLETED, its result file not visible yet (a shared cache)  at most RESULT_GRACE_S
  gone     missing from the queue, no end known                              at most GONE_GRACE_S

Guarantees: no verdict while the job is alive, nor while SLURM can still run it again provided its next attempt
shows in squeue within the wait's grace; COMPLETED when the last attempt completed and its result file shows within
RESULT_GRACE_S; the verdict at most VERDICT_BOUND_S after the job's last event (a change of squeue's or sacct's
answer, the end of an outage, the result file showing), plus squeue's and sacct's own time (each at most 30 s).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from hydra.core.utils import JobStatus

from attnlab.cluster import slurm_queue
from attnlab.cluster.outcome import SlurmState
from attnlab.cluster.slurm_queue import Queued

POLL_S = 2.0  # the first interval between polls; it grows by half while nothing changes, up to POLL_MAX_S
POLL_MAX_S = 30.0
GONE_GRACE_S = 30.0  # a job missing from the queue, its end not known, is GONE after this long
RESULT_GRACE_S = 120.0  # a COMPLETED job's result file may show late on a shared filesystem
REQUEUE_GRACE_S = 180.0  # a job ended in one of MAYBE_REQUEUED may be requeued by SLURM within this long
RESULT_LOOK_S = 1.0  # between polls, how often the driver looks for the result files of the jobs not ended
RESULT_LOOKS_PER_S = 200  # at most this many result files looked for a second: a larger sweep looks less often
S = SlurmState
MAYBE_REQUEUED = {S.TIMEOUT, S.NODE_FAIL, S.PREEMPTED}
QUEUED = {S.PENDING, S.REQUEUED, S.REQUEUE_HOLD}
FINAL = {S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.NODE_FAIL, S.OUT_OF_MEMORY, S.PREEMPTED, S.BOOT_FAIL,
         S.DEADLINE, S.GONE}


class Wait(Enum):
    """The one wait an ended job is in (the module docstring's table)."""

    REQUEUE = "requeue"
    RESULT = "result"
    GONE = "gone"


class Returned(NamedTuple):
    """What the run's result file holds (submitit's `("success", value)` or `("error", traceback)`), read once."""

    ok: bool
    value: Any


# the longest a verdict comes after a job's last event, squeue's and sacct's own time aside: the next poll sees the
# event within a poll's longest interval, the wait it starts lasts at most its grace, the poll finding it over comes
# within another interval
VERDICT_BOUND_S = 2 * POLL_MAX_S + max(GONE_GRACE_S, RESULT_GRACE_S, REQUEUE_GRACE_S)


def waited(w: Any, wait: Wait, grace: float, now: float) -> bool:
    """Whether the job has been in `wait` for `grace`: its timer starts when the job enters it, from another wait or
    from none (never carried over from an earlier attempt or another wait)."""
    if w.waiting != wait:
        w.waiting, w.since = wait, now
    return now - w.since >= grace


def result_verdict(w: Any) -> SlurmState | None:
    """COMPLETED or FAILED as the run's result file says (a run that raised returns Hydra's JobReturn with status
    FAILED; submitit's error is a traceback); None while it is not there or cannot be read yet (being written)."""
    result = w.result_file()
    if w.outcome is None and visible(result):
        from submitit.core.utils import pickle_load

        try:
            tag, value = pickle_load(result)
        except Exception:  # cut short (EOFError, UnpicklingError): as if not there yet, the wait's grace bounds it
            return None
        w.outcome = Returned(tag == "success", value)
    if w.outcome is None:
        return None
    ok = w.outcome.ok and getattr(w.outcome.value, "status", None) != JobStatus.FAILED
    return S.COMPLETED if ok else S.FAILED


def follow(w: Any, queue: dict[str, Queued], accounting: bool, report: Callable[[Any], None]) -> bool:
    """One poll's news of a job (`w`: the driver's Watched): its state updated, and `report`ed when it changed.
    -> whether it changed. The first rule that applies: COMPLETING with its result readable, the verdict from it;
    alive, that state (back in the queue after running: REQUEUED, said once); ended or missing, `ended`."""
    before = w.state
    state, nodes, began = Queued(*queue.get(w.id, (None,)))
    if state is None or state in FINAL:  # ended, or no longer in the queue: its verdict, or a wait
        state = ended(w, accounting, state, report)
        if state is None:
            return w.state != before
    elif state == S.COMPLETING and (verdict := result_verdict(w)) is not None:  # the run is over: SLURM cleans up
        state = verdict
    else:  # alive: what the driver waited for is over (a requeue; a controller that had lost the job for a while)
        w.ended_as = w.waiting = None
    if state in QUEUED and (w.started or (state == S.REQUEUED and not w.requeued)):
        state = S.REQUEUED  # back in the queue after running: a time limit, a preemption, a lost node requeued it
    elif state == S.REQUEUED:
        state = S.PENDING  # the requeue said already
    elif state == S.RUNNING and w.started and (w.state != S.RUNNING or (began and w.began and began != w.began)):
        w.state = S.REQUEUED  # requeued and started again between two polls: not seen running, or started anew
        report(w)
    changed = state != w.state
    if changed:
        w.state, w.nodes = state, nodes or w.nodes
        report(w)
    if state == S.REQUEUED:
        w.state, w.started, w.requeued, w.began = S.PENDING, False, True, ""
    elif state == S.RUNNING:
        w.started, w.requeued, w.began = True, False, began or w.began
    return changed


def ended(w: Any, accounting: bool, queue_state: SlurmState | None,
          report: Callable[[Any], None]) -> SlurmState | None:
    """The verdict on a job that squeue shows ended (`queue_state`) or no longer shows (None): COMPLETED or FAILED
    from its result file, else from its end (squeue's, sacct's, or the last one known) once its wait is over (the
    module docstring's waits). None: not known yet."""
    verdict = result_verdict(w)
    if verdict is not None:
        return verdict
    if queue_state is None and accounting:
        queue_state = slurm_queue.sacct_state(w.id)
        queue_state = queue_state if queue_state in FINAL else None
    said = (w.state, w.ended_as)
    w.ended_as = end = queue_state or w.ended_as  # what the controller said last stands while it says nothing
    now = time.monotonic()
    if end == S.COMPLETED:  # its result is written before it ends: not visible here yet
        return S.GONE if waited(w, Wait.RESULT, RESULT_GRACE_S, now) else None
    if end in MAYBE_REQUEUED:  # SLURM may requeue it: said once, final when it stays so
        w.started = True  # an attempt ran: back in the queue, it was requeued
        if waited(w, Wait.REQUEUE, REQUEUE_GRACE_S, now) or slurm_queue.requeueable(w.id) is False:
            return end
        if said != (S.MAY_REQUEUE, end):
            w.state = S.MAY_REQUEUE  # reported with the end it is: "timeout (SLURM may requeue it)"
            report(w)
        return None
    if end is not None:
        return end
    return S.GONE if waited(w, Wait.GONE, GONE_GRACE_S, now) else None


def visible(path: Path) -> bool:
    """Whether the file is there, its folder read first: on NFS a folder's listing refreshes the cached attributes
    that an exists() alone may answer from (what submitit does for its result files)."""
    try:
        os.listdir(path.parent)
    except OSError:
        pass
    return path.exists()
