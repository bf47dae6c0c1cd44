"""The sweep driver of `launcher=slurm`: it follows the jobs it submitted through the controller until each has
ended, one line per change of state (the state machine: sweep_states.py). It polls squeue once for all the jobs it
follows, backing off from 2 s to 30 s while nothing changes; a result file showing brings the next poll forward.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from attnlab.cluster import slurm_queue, sweep_states
from attnlab.cluster.outcome import AttemptEnd, Outcome
from attnlab.cluster.outcome import SlurmState
from attnlab.cluster.sweep_states import FINAL, POLL_MAX_S, POLL_S, RESULT_LOOK_S, RESULT_LOOKS_PER_S, Returned, Wait

log = logging.getLogger("attnlab")
TAIL_LINES = 5


class Watched:
    """One submitted job as the driver follows it."""

    def __init__(self, job: Any, num: int, overrides: list[str], common: set[str], run_dir: Path | None = None):
        self.job, self.num, self.overrides = job, num, overrides  # a submitit.SlurmJob, its number, its overrides
        self.run_dir = run_dir  # where its run writes (the sweep folder's <num>), for how an attempt ended
        self.label = " ".join(o for o in overrides  # what this job of the sweep sets (not the sweeper's own keys)
                              if o.lower() not in common and not o.lstrip("+").startswith("hydra."))
        self.state, self.nodes = SlurmState.SUBMITTED, ""
        self.started = False  # an attempt was seen running (or ending) since the job last went back to the queue
        self.began = ""  # when the attempt seen running started (squeue's %S; "" when not known)
        self.requeued = False  # "requeued" said, and no attempt seen running since
        self.requeues = 0  # how many times "requeued" was said
        # sweep_states.py's: the end the controller last gave for this attempt, the one wait it is in (None: none)
        # and since when
        self.ended_as: SlurmState | None = None
        self.waiting: Wait | None = None
        self.since = 0.0
        self.outcome: Returned | None = None  # its result file's: (True, JobReturn) or (False, traceback text)
        self.woke = False  # its result file showed between two polls and brought the next one forward

    @property
    def id(self) -> str:
        return str(self.job.job_id)

    def log_file(self) -> Path:
        return self.job.task(0).paths.stdout if self.job.num_tasks > 1 else self.job.paths.stdout

    def result_file(self) -> Path:
        return self.job.task(0).paths.result_pickle if self.job.num_tasks > 1 else self.job.paths.result_pickle


def watch(watched: list[Watched], poll_s: float = POLL_S, poll_max_s: float = POLL_MAX_S) -> None:
    """Follow the jobs until each has ended (or is gone), one line per change of state."""
    accounting, interval, unreachable, woke = slurm_queue.accounting_on(), poll_s, False, False
    ids = [w.id for w in watched]
    for w in watched:  # as sbatch leaves it: in the queue, whether or not it starts before the first poll
        if w.state == SlurmState.SUBMITTED:
            w.state = SlurmState.PENDING
            report(w)
    slurm_queue.QUEUE.follow(ids)
    try:
        while any(w.state not in FINAL for w in watched):
            queue = slurm_queue.QUEUE.states(0.0 if woke else interval)
            changed = False
            if queue is None:  # the controller did not answer: nothing is known, so nothing is taken as gone
                if not unreachable:
                    log.warning("SLURM's controller does not answer (squeue failed); the jobs go on running on "
                                "their nodes: waiting for it")
                unreachable = True
            else:
                if unreachable:
                    log.info("SLURM's controller answers again")
                    for w in watched:  # SLURM requeued nothing, the driver saw nothing, meanwhile: the waits start anew
                        w.waiting = None
                unreachable = False
                changed = any([sweep_states.follow(w, queue, accounting, report)
                               for w in watched if w.state not in FINAL])
            if any(w.state not in FINAL for w in watched):
                interval = poll_s if changed or woke else min(poll_max_s, interval * 1.5)
                woke = _nap(watched, interval)
    finally:
        slurm_queue.QUEUE.forget(ids)


def _nap(watched: list[Watched], seconds: float) -> bool:
    """Sleep until the next poll, or until the result file of a job not ended yet shows (its verdict comes at the
    next poll instead of up to POLL_MAX_S later); each job's file wakes the driver once. -> whether one woke it."""
    looked = [w for w in watched if w.state not in FINAL and not w.woke]
    step = max(RESULT_LOOK_S, len(looked) / RESULT_LOOKS_PER_S)  # a large sweep looks less often
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(step, left))
        for w in looked:
            if w.result_file().exists():
                w.woke = True
                return True
    return False


def report(w: Watched) -> None:
    where = f" on {w.nodes}" if w.state == SlurmState.RUNNING and w.nodes else ""
    line = f"job {w.id} ({job_name(w)}): {state_text(w)}{where}"
    if w.state in (SlurmState.RUNNING, SlurmState.COMPLETED):
        log.info(f"{line}; log {w.log_file()}")
    elif w.state == SlurmState.REQUEUED:
        log.warning(line + _requeued_because(w))
        w.requeues += 1
    elif w.state in FINAL:
        log.error(f"{line}; log {w.log_file()}{_tail(w)}")
    else:
        log.info(line)


def _requeued_because(w: Watched) -> str:
    """Why the job's last attempt ended, as its run recorded it (lineage.json: a lost peer, a preemption, a time
    limit), and where it goes on from."""
    try:
        record = json.loads((w.run_dir / "lineage.json").read_text())
    except (OSError, ValueError, TypeError):
        return ""
    # the attempt that ended: the one SLURM numbered by the requeues said before this one (an attempt that ended
    # without a word, its node lost, is not taken for the one before it); else the last that ended
    attempts = [*record.get("earlier", []), record]
    ended = [a for a in attempts if (a.get("slurm") or {}).get("restart_count") == w.requeues]
    if ended:
        record = ended[-1]
    elif getattr(AttemptEnd.of(record), "outcome", None) is not Outcome.REQUEUED and record.get("earlier"):
        record = record["earlier"][-1]  # the next attempt has begun already
    end = AttemptEnd.of(record)
    if end is None or end.outcome is not Outcome.REQUEUED:
        return ""
    detail = f": {record['error']}" if record.get("error") else ""
    return (f" ({end.cause.value if end.cause else 'requeued'}{detail}); it continues from step "
            f"{record.get('global_step', '?')} (last.ckpt) when it runs again")


def state_text(w: Watched) -> str:
    """The job's state in the driver's lines: `running`, `timeout (slurm may requeue it)`, ..."""
    if w.state == SlurmState.MAY_REQUEUE:
        return f"{w.ended_as} (SLURM may requeue it)".lower()
    return str(w.state).lower()


def job_name(w: Watched) -> str:
    return f"#{w.num}: {w.label}" if w.label else f"#{w.num}"


def _tail(w: Watched) -> str:
    """What the job's error log says of how it ended: attnlab's own lines (a failed rank, a stop) and its last line,
    else its last lines (a traceback, or the reason SLURM gave)."""
    lines: list[str] = []
    for path in (w.log_file().with_suffix(".err"), w.log_file()):
        try:
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        said = [ln for ln in lines if ln.startswith("attnlab: ")][-2:]
        lines = list(dict.fromkeys(said + lines[-1:])) if said else lines[-TAIL_LINES:]
        if lines:
            break
    return ("\n    " + "\n    ".join(lines)) if lines else ""
