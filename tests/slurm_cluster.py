"""A real two-node SLURM cluster for the tests: tools/slurm-cluster.sh starts it on this machine (as root, installing
Debian's packages when missing), with accounting (slurmdbd, so `sacct` shows the jobs) or without. The
`slurm_cluster` fixture (conftest.py) hands out a `ClusterManager`: `slurm_cluster(accounting=True)` returns the
cluster in that mode, reusing one that is up in it. Where the cluster cannot start here (not root, no apt-get, no
package registry) the test is skipped with one line; with ATTNLAB_REQUIRE_SLURM=1 (CI) it fails instead. The tests
that use the fixture run on one pytest-xdist worker (XDIST_GROUP), one after the other."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "slurm-cluster.sh"
REQUIRE_SLURM = os.environ.get("ATTNLAB_REQUIRE_SLURM", "") not in ("", "0")
XDIST_GROUP = "slurm_cluster"
CANNOT_RUN_HERE = 3  # the script's exit status for: not root, no apt-get, packages that cannot be installed
# states in which a job is over (SLURM's JOB_STATE_STRING); a requeued job goes back to PENDING instead
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE"}


def script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def running_mode() -> tuple[bool, bool] | None:
    """(whether the cluster that is up keeps accounting, whether a preemption sends USR1 instead of SIGTERM); None
    when none is up (or its nodes cannot run jobs)."""
    out = script("status", timeout=60)
    if out.returncode != 0:
        return None
    return "accounting on" in out.stdout, "preemption signal USR1" in out.stdout


def slurm(*argv: str, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """A SLURM command (sbatch, squeue, sacct, scontrol ...), its output as text."""
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited with {out.returncode}: {out.stderr.strip() or out.stdout}")
    return out


def start_daemon(*argv: str) -> None:
    """A daemon of the cluster started again (slurmd -N <node>, slurmctld), at the priority tools/slurm-cluster.sh
    starts them at, the machine's normal one, whatever the test process's own (`make test` runs it lower), and a
    node with the view of the machine's CPUs the script gave it (its topology: the second node's CPUs in the reverse
    order)."""
    env = os.environ.copy()
    if argv[:2] == ("slurmd", "-N") and (topology := Path(f"/var/lib/slurm/topology-{argv[2]}.xml")).is_file():
        env |= {"HWLOC_XMLFILE": str(topology), "HWLOC_THISSYSTEM": "1"}
    subprocess.run(["nice", "-n", str(-os.nice(0)), *argv], check=True, env=env)


@dataclass
class SlurmCluster:
    """The cluster as the tests see it: two nodes, the default partition, and whether `sacct` has the jobs."""

    accounting: bool
    nodes: tuple[str, ...] = ("n1", "n2")
    partition: str = "debug"

    def sbatch(self, *args: str, cwd: Path) -> int:
        """Submit (`sbatch --parsable <args>` in cwd, where the job's output goes); the job id."""
        out = slurm("sbatch", "--parsable", *args, cwd=cwd)
        return int(out.stdout.strip().split(";")[0])

    def state(self, job_id: int) -> str | None:
        """The job's state as slurmctld knows it (PENDING, RUNNING, COMPLETED ...); None once it forgot the job
        (MinJobAge after its end)."""
        out = slurm("scontrol", "show", "job", "-o", str(job_id), check=False)
        found = re.search(r"\bJobState=(\S+)", out.stdout)
        return found.group(1) if found else None

    def wait(self, job_id: int, timeout: float = 120) -> str:
        """Wait until the job is over; its final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in FINAL_STATES:
                return state
            if state is None:
                return self.sacct_state(job_id) or "GONE"
            time.sleep(0.5)
        slurm("scancel", str(job_id), check=False)
        raise AssertionError(f"job {job_id} did not end within {timeout} s (last state {state}); cancelled")

    def sacct_state(self, job_id: int, timeout: float = 20) -> str | None:
        """The job's state in the accounting database (slurmctld sends it there a moment after the job ends);
        None without accounting."""
        if not self.accounting:
            return None
        deadline = time.monotonic() + timeout
        while True:
            out = slurm("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State")
            state = out.stdout.strip().split(" ")[0]  # CANCELLED by 0
            if state in FINAL_STATES or time.monotonic() > deadline:
                return state or None
            time.sleep(0.5)


class ClusterManager:
    """`manager(accounting=..., user_signal=...)`: the cluster in that mode, started (or restarted in another mode)
    when needed.
    `close()` stops it at the end of the session when the session started it."""

    def __init__(self):
        self.up_before = running_mode()  # None: the session starts it, and stops it when done
        self.mode = self.up_before
        self.cannot: str | None = None  # why it cannot start here, once known

    def __call__(self, accounting: bool = True, user_signal: bool = False) -> SlurmCluster:
        if self.cannot:
            self._unavailable(self.cannot)
        if self.mode != (accounting, user_signal):
            flags = ["--accounting" if accounting else "--no-accounting", *(["--user-signal"] if user_signal else [])]
            flag = " ".join(flags)
            out = script("start", *flags)
            if out.returncode == CANNOT_RUN_HERE:
                lines = [ln for ln in out.stdout.splitlines() if "error:" in ln] or out.stdout.splitlines()[-1:]
                self.cannot = f"needs the SLURM cluster of {SCRIPT.relative_to(ROOT)}, which cannot start here: " + \
                    lines[-1].split("error: ")[-1]
                self._unavailable(self.cannot)
            if out.returncode != 0:
                self.mode = None
                pytest.fail(f"tools/slurm-cluster.sh start {flag} exited with {out.returncode}:\n{out.stdout}")
            self.mode = (accounting, user_signal)
        return SlurmCluster(accounting=accounting)

    @staticmethod
    def _unavailable(msg: str):
        if REQUIRE_SLURM:
            pytest.fail(msg + "; ATTNLAB_REQUIRE_SLURM=1 makes it an error")
        pytest.skip(msg)

    def close(self):
        if self.up_before is None and self.mode is not None:
            script("stop", timeout=120)
