"""Jobs sized from the run's own measurements (`launcher.timeout_min=auto`, `launcher.mem_gb=auto`), on the test
cluster under backfill: the first job of a config asks for the partition's limit and says so; it records what it
measured on the partition's nodes; the next job of that config asks for its estimate and, while a long job holds n1
and a two-node job waits for it, starts on n2 at once, where the same job asking for the partition's limit waits."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from slurm_cluster import slurm
from test_slurm_preemption import Sweep

AUTO = ("launcher.timeout_min=auto", "launcher.mem_gb=auto")


def _started_within(sweep: Sweep, seconds: float) -> float | None:
    """Seconds from submission until the job runs, or None if it has not within `seconds`."""
    job = sweep.job_id()
    begun = time.monotonic()
    while time.monotonic() - begun < seconds:
        if slurm("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING":
            return time.monotonic() - begun
        time.sleep(0.5)
    return None


def _held_to_what_it_asked(job: str, asked_gb: int, measured_from: str, out: str) -> None:
    """The job asked SLURM for `asked_gb` per node and, where the cluster holds jobs to it (task/cgroup,
    ConstrainRAMSpace=yes: tools/slurm-cluster.sh), ran within it, its peak measured the way SLURM counts it."""
    fields = slurm("sacct", "-j", job, "-n", "-P", "--units=M", "-o", "JobID,ReqMem,MaxRSS,State").stdout.split()
    rows = [f.split("|") for f in fields]
    assert rows[0][1] == f"{asked_gb * 1024}M" and rows[0][3] == "COMPLETED", rows
    peaks = [float(r[2].rstrip("M")) for r in rows if r[2]]
    assert peaks and max(peaks) <= asked_gb * 1024, (rows, out[-2000:])
    if Path("/etc/slurm/cgroup.conf").is_file():
        assert measured_from == "the job's cgroup on its node", out[-2000:]


@pytest.mark.slow
def test_jobs_sized_from_their_own_estimates_start_at_once_under_backfill(slurm_cluster, tmp_path):
    slurm_cluster(accounting=True)
    first = Sweep(tmp_path, "first", *AUTO)
    out = first.wait(timeout=400)
    assert first.proc.returncode == 0, out[-3000:]
    assert "time limit 1440 min (the partition's limit: no earlier job of this config on debug" in out, out
    assert "memory not asked (SLURM's default: no earlier job of this config on debug" in out, out
    (measured,) = json.loads((tmp_path / "cache" / "slurm" / "estimates.json").read_text())["debug"].values()
    assert measured["step_s"] > 0 and measured["steps_per_epoch"] == 20 and 0.2 < measured["peak_gb"] < 8, measured

    holder = slurm("sbatch", "--parsable", "-p", "debug", "-w", "n1", "--exclusive", "-t", "10", "-J",
                   "attnlab-holder", "-o", "/dev/null", "--wrap", "sleep 600").stdout.strip()
    waiting = None
    try:
        deadline = time.monotonic() + 60
        while slurm("squeue", "-h", "-j", holder, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, "the job holding n1 never started"
            time.sleep(0.5)
        waiting = slurm("sbatch", "--parsable", "-p", "debug", "-N", "2", "--exclusive", "-t", "10", "-J",
                        "attnlab-two-nodes", "-o", "/dev/null", "--wrap", "sleep 5").stdout.strip()
        sized = Sweep(tmp_path, "sized", *AUTO, "seed=2")
        sized_start = _started_within(sized, 90)
        out = sized.wait(timeout=400)
        fitted = re.search(r"time limit (\d+) min \(estimated from job (\d+) on debug", out)
        assert fitted and 1 <= int(fitted[1]) <= 10 and fitted[2] == str(measured["job"]), out[-3000:]
        asked = re.search(r"memory (\d+) GB \(peak ([\d.]+) GB per node measured by job \d+ on debug \(([^)]*)\)", out)
        assert asked, out[-3000:]
        assert sized.proc.returncode == 0 and sized_start is not None and sized_start < 30, (sized_start, out)
        _held_to_what_it_asked(sized.job_id(), int(asked[1]), asked[3], out)
        whole = Sweep(tmp_path, "partition_limit", "launcher.timeout_min=1440", "seed=3")
        try:
            whole_start = _started_within(whole, 20)
        finally:
            whole.stop()
        assert whole_start is None, f"the job asking for the partition's limit started after {whole_start:.0f} s"
        print(f"\nbackfill: sized by its estimate ({fitted[1]} min) started after {sized_start:.1f} s; asking for "
              "1440 min, not started after 20 s")
    finally:
        slurm("scancel", holder, *([waiting] if waiting else []), check=False)
