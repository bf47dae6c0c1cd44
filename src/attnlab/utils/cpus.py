"""The CPUs this process may run on: those of its affinity mask (what a SLURM step under task/affinity or
task/cgroup, `taskset` or a container gives it), not the host's count."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs of this process's affinity mask (os.cpu_count() where the platform has none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def is_bound() -> bool:
    """Whether the process was given fewer CPUs than the host has (a SLURM task bound to its CPUs, taskset)."""
    return usable_cpus() < (os.cpu_count() or 1)
