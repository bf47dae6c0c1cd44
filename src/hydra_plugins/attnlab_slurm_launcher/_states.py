"""The sweep driver's view of one SLURM job, as one state machine: what `watch`, `_follow` and `_ended` of
slurm_launcher.py do at each poll, and the times that bound it. (A module whose name starts with an underscore:
Hydra's plugin scan does not import it on its own.)

Inputs, one set a poll (every POLL_S at first; the interval grows by half at each poll that changes nothing, up to
POLL_MAX_S, and is POLL_S again after a change; a job's result file showing between two polls, looked for every
RESULT_LOOK_S, brings the next poll forward to then):

- squeue's state of the job (and, running, when its attempt started), one of three kinds:
  alive   in the queue and not ended: PENDING, CONFIGURING, RUNNING, COMPLETING, REQUEUED, REQUEUE_HOLD (and any other
          state not in FINAL: SUSPENDED, REQUEUE_FED, SPECIAL_EXIT...);
  ended   a state of FINAL: COMPLETED, FAILED, CANCELLED, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, and TIMEOUT, NODE_FAIL,
          PREEMPTED (MAYBE_REQUEUED: SLURM may requeue the job from these, under the same id);
  missing squeue answers, without the job (the controller has forgotten it, or lost it for a while);
- an outage: squeue fails (slurmctld down or restarting; the job goes on on its nodes). Nothing is learnt from it;
- sacct's state, asked while the job is missing and accounting is on; a state not in FINAL is no answer;
- the run's result file (submitit's pickle: ("success", Hydra's JobReturn) or ("error", a traceback)), read while
  the job is ended or missing; a file that cannot be read yet (being written) counts as not there;
- scontrol's Requeue flag of the job, asked while it is in the requeue wait: 0 (the job made non-requeueable, its
  budget of requeues spent) means SLURM runs it no more; None (the controller forgot the job) is no answer;
- the run's own records (its lineage.json), which say why an attempt was requeued (the report line only).

The driver's state of a job (Watched.state, what its lines say): PENDING (alive, no attempt seen running since the
last requeue), RUNNING (an attempt runs; `started`), CONFIGURING / COMPLETING / other alive states as squeue names
them, "<STATE> (SLURM may requeue it)" (in the requeue wait below), and the verdict. Beside it, Watched.ended_as is
the end the controller last gave for the current attempt (squeue's or sacct's state of FINAL), and Watched.waiting
the one wait the job is in, its timer started at Watched.since:

  requeue  the end is TIMEOUT, NODE_FAIL or PREEMPTED: SLURM may run the job again; at most REQUEUE_GRACE_S
  result   the end is COMPLETED, the result file not visible yet (a shared filesystem's cache); at most RESULT_GRACE_S
  gone     missing, no end known (nor any from sacct); at most GONE_GRACE_S

Transitions, at a poll where squeue answers (the first rule that applies):

  COMPLETING, result readable -> verdict from the result file as below: the run is over, SLURM is cleaning up
                                (which can take a minute after an outage of the controller)
  alive                      -> that state; the wait and the end known are dropped. Back in the queue after
                                running (or after a requeue wait), squeue's REQUEUED, or running again without a poll
                                seeing it pending (after another state, or with another start time than the attempt
                                seen running): "requeued", said once a requeue, with the reason the run recorded
  result file readable       -> verdict COMPLETED (its JobReturn is not FAILED), else FAILED (the run raised)
  end COMPLETED              -> wait `result`; its grace past: verdict GONE
  end in MAYBE_REQUEUED      -> wait `requeue` (said once); its grace past, or the job no longer requeueable
                                (Requeue=0): verdict the end (TIMEOUT...)
  end any other of FINAL     -> verdict the end (FAILED, CANCELLED, OUT_OF_MEMORY...)
  no end known (missing)     -> wait `gone`; its grace past: verdict GONE

where the end is squeue's state, else sacct's, else the one known before (Watched.ended_as).

A wait's timer starts when the job enters that wait, from another wait or from none (`waited` below): it is never
carried over from an earlier attempt, nor from another wait. An outage changes no state; when squeue answers again
every timer starts anew (SLURM requeues nothing, and the driver sees nothing, while the controller is down).

Verdicts: COMPLETED; FAILED (the run's result, or SLURM's state); CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED,
OUT_OF_MEMORY, BOOT_FAIL, DEADLINE (SLURM's end); GONE (no result and no end known, or COMPLETED without a result
file). A verdict is said once, in the job's last line: an error line with the last lines of its log, unless COMPLETED.

Guarantees:
- no verdict while the job is alive (COMPLETING with its result written aside), and none while SLURM can still run it
  again provided its next attempt shows in squeue (alive) within the grace of the wait the driver is in
  (REQUEUE_GRACE_S after TIMEOUT, NODE_FAIL, PREEMPTED; GONE_GRACE_S while it is missing), counted from the end of
  any outage;
- COMPLETED when the last attempt completed and its result file shows within RESULT_GRACE_S;
- the time bound. An event is a change of squeue's or sacct's answer, the end of an outage, or the result file
  showing. After a job's last event the next poll sees it within POLL_MAX_S, the wait that poll starts (or one
  started before) lasts at most its grace, and the poll that finds it over comes at most POLL_MAX_S later: the
  verdict comes at most VERDICT_BOUND_S (2 * POLL_MAX_S + the longest grace: 4 minutes) after the last event, plus
  the time squeue and sacct themselves take (each timed out at 30 s). A job that stays alive (pending, held,
  running) or a controller that stays down gets no verdict: SLURM can still run the job.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus

POLL_S = 2.0  # the first interval between polls; it grows by half while nothing changes, up to POLL_MAX_S
POLL_MAX_S = 30.0
GONE_GRACE_S = 30.0  # a job missing from the queue, its end not known, is GONE after this long
RESULT_GRACE_S = 120.0  # a COMPLETED job's result file may show late on a shared filesystem
REQUEUE_GRACE_S = 180.0  # a job ended in one of MAYBE_REQUEUED may be requeued by SLURM within this long
RESULT_LOOK_S = 1.0  # between polls, how often the driver looks for the result files of the jobs not ended
RESULT_LOOKS_PER_S = 200  # at most this many result files looked for a second: a larger sweep looks less often
MAYBE_REQUEUED = {"TIMEOUT", "NODE_FAIL", "PREEMPTED"}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE", "GONE"}


def verdict_bound_s(poll_max_s: float = POLL_MAX_S, gone_s: float = GONE_GRACE_S, result_s: float = RESULT_GRACE_S,
                    requeue_s: float = REQUEUE_GRACE_S) -> float:
    """The longest a verdict comes after a job's last event (module docstring), squeue's and sacct's own time aside."""
    return 2 * poll_max_s + max(gone_s, result_s, requeue_s)


VERDICT_BOUND_S = verdict_bound_s()


def waited(w: Any, wait: str, grace: float, now: float) -> bool:
    """Whether the job has been in `wait` for `grace`: its timer starts when the job enters it, from another wait or
    from none (never carried over from an earlier attempt or another wait)."""
    if w.waiting != wait:
        w.waiting, w.since = wait, now
    return now - w.since >= grace


def result_verdict(w: Any) -> str | None:
    """COMPLETED or FAILED as the run's result file says (a run that raised returns Hydra's JobReturn with status
    FAILED; submitit's error is a traceback); None while it is not there or cannot be read yet (being written)."""
    result = w.result_file()
    if w.outcome is None and visible(result):
        from submitit.core.utils import pickle_load

        try:
            w.outcome = pickle_load(result)
        except Exception:  # cut short (EOFError, UnpicklingError): as if not there yet, the wait's grace bounds it
            return None
    if w.outcome is None:
        return None
    ok = w.outcome[0] == "success" and getattr(w.outcome[1], "status", None) != JobStatus.FAILED
    return "COMPLETED" if ok else "FAILED"


def visible(path: Path) -> bool:
    """Whether the file is there, its folder read first: on NFS a folder's listing refreshes the cached attributes
    that an exists() alone may answer from (what submitit does for its result files)."""
    try:
        os.listdir(path.parent)
    except OSError:
        pass
    return path.exists()
