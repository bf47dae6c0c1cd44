"""What the sweep driver asks SLURM's controller (squeue, scontrol) and accounting (sacct), as plain functions, and
the one squeue a poll that every thread of a sweep shares (`QUEUE`)."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from typing import NamedTuple

from attnlab.cluster.outcome import SlurmState


class Queued(NamedTuple):
    """squeue's answer for one job: its state, its nodes, and when its current attempt started (squeue's %S, kept
    for a running or completing job only; "" when not known). An attempt that started at another time is another
    attempt: a job requeued and started again between two polls is told from one that ran on."""

    state: SlurmState | None
    nodes: str = ""
    began: str = ""


def ask(*command: str, timeout: float = 30) -> subprocess.CompletedProcess | None:
    """A SLURM command's answer (text), or None when it cannot be run or does not answer within `timeout` s."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None


def queue_states(ids: list[str]) -> dict[str, Queued] | None:
    """{job id: Queued(state, nodes, began)} of the jobs the controller still knows (squeue, any state); None when
    squeue fails (the controller down or restarting: the jobs' states are unknown, not gone)."""
    if not ids:
        return {}
    out = ask("squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N|%S", "-j", ",".join(ids))
    if out is None:
        return None
    if out.returncode != 0:
        # an id the controller forgot makes squeue fail with "Invalid job id" while it answers: ask the rest
        if "Invalid job id" in out.stderr and len(ids) > 1:
            return _one_by_one(ids)
        return {} if "Invalid job id" in out.stderr else None
    states = {}
    for line in out.stdout.splitlines():
        job_id, text, nodes, began = (line.strip().split("|") + ["", "", ""])[:4]
        state = SlurmState.of(text)
        states[job_id] = Queued(state, nodes, began if state in (SlurmState.RUNNING, SlurmState.COMPLETING) else "")
    return states


def _one_by_one(ids: list[str]) -> dict[str, Queued] | None:
    states: dict[str, Queued] = {}
    for job_id in ids:
        found = queue_states([job_id])
        if found is None:
            return None
        states |= found
    return states


def accounting_on() -> bool:
    out = ask("sacct", "-n", "-X", "-j", "1")
    return out is not None and out.returncode == 0


def sacct_state(job_id: str) -> SlurmState | None:
    out = ask("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id)
    lines = out.stdout.splitlines() if out is not None else []
    return SlurmState.of(lines[0]) if lines and lines[0].strip() else None


def requeueable(job_id: str) -> bool | None:
    """Whether SLURM may still run the job again: False once its Requeue flag is 0 (made non-requeueable when its
    budget of requeues was spent, `--no-requeue`, a site's JobRequeue=0), which neither SLURM's own requeue (a node
    failure, a preemption) nor `scontrol requeue` gets past; None where scontrol cannot say (the controller has
    forgotten the job, or does not answer)."""
    out = ask("scontrol", "-o", "show", "job", job_id)
    found = re.search(r"(?:^|\s)Requeue=(\d+)", out.stdout) if out is not None and out.returncode == 0 else None
    return None if found is None else found[1] != "0"


class SharedQueue:
    """squeue for every job the driver follows, one query a poll however many threads watch (an Optuna sweep's
    parallel trials each launch from a thread of their own)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.followed: Counter[str] = Counter()  # job id -> how many threads follow it
        self.answer: dict[str, Queued] | None = None
        self.asked_at = float("-inf")

    def follow(self, ids: list[str]) -> None:
        with self.lock:
            self.followed.update(ids)
            self.asked_at = float("-inf")  # new jobs: the next poll asks

    def forget(self, ids: list[str]) -> None:
        with self.lock:
            self.followed -= Counter(ids)  # a job no thread follows any more is dropped

    def states(self, interval: float) -> dict[str, Queued] | None:
        """{job id: Queued(state, nodes, began)} of the followed jobs the controller knows; None when it did not
        answer. An answer younger than most of `interval` is shared."""
        with self.lock:
            if time.monotonic() - self.asked_at >= 0.9 * interval:
                self.answer, self.asked_at = queue_states(sorted(self.followed)), time.monotonic()
            return self.answer


QUEUE = SharedQueue()
