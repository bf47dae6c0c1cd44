"""What the sweep driver asks SLURM's controller (squeue) and accounting (sacct), as plain functions. A module
whose name starts with an underscore: Hydra's plugin scan does not import it on its own."""

from __future__ import annotations

import re
import subprocess
from typing import NamedTuple


class Queued(NamedTuple):
    """squeue's answer for one job: its state, its nodes, and when its current attempt started (squeue's %S, kept
    for a running or completing job only; "" when not known). An attempt that started at another time is another
    attempt: a job requeued and started again between two polls is told from one that ran on."""

    state: str | None
    nodes: str = ""
    began: str = ""


def _ask(*command: str) -> subprocess.CompletedProcess | None:
    """A SLURM command's answer (text), or None when it cannot be run or does not answer within 30 s."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def _queue_states(ids: list[str]) -> dict[str, Queued] | None:
    """{job id: Queued(state, nodes, began)} of the jobs the controller still knows (squeue, any state); None when
    squeue fails (the controller down or restarting: the jobs' states are unknown, not gone)."""
    if not ids:
        return {}
    out = _ask("squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N|%S", "-j", ",".join(ids))
    if out is None:
        return None
    if out.returncode != 0:
        # an id the controller forgot makes squeue fail with "Invalid job id" while it answers: ask the rest
        if "Invalid job id" in out.stderr and len(ids) > 1:
            return _one_by_one(ids)
        return {} if "Invalid job id" in out.stderr else None
    states = {}
    for line in out.stdout.splitlines():
        job_id, state, nodes, began = (line.strip().split("|") + ["", "", ""])[:4]
        states[job_id] = Queued(state, nodes, began if state in ("RUNNING", "COMPLETING") else "")
    return states


def _one_by_one(ids: list[str]) -> dict[str, Queued] | None:
    states: dict[str, Queued] = {}
    for job_id in ids:
        found = _queue_states([job_id])
        if found is None:
            return None
        states |= found
    return states


def _accounting_on() -> bool:
    out = _ask("sacct", "-n", "-X", "-j", "1")
    return out is not None and out.returncode == 0


def _sacct_state(job_id: str) -> str | None:
    out = _ask("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id)
    states = out.stdout.split() if out is not None else []
    return states[0] if states else None


def _requeueable(job_id: str) -> bool | None:
    """Whether SLURM may still run the job again: False once its Requeue flag is 0 (made non-requeueable when its
    budget of requeues was spent, `--no-requeue`, a site's JobRequeue=0), which neither SLURM's own requeue (a node
    failure, a preemption) nor `scontrol requeue` gets past; None where scontrol cannot say (the controller has
    forgotten the job, or does not answer)."""
    out = _ask("scontrol", "-o", "show", "job", job_id)
    found = re.search(r"(?:^|\s)Requeue=(\d+)", out.stdout) if out is not None and out.returncode == 0 else None
    return None if found is None else found[1] != "0"
