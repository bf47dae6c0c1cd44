"""The memory a SLURM job asks for is per node (`--mem`): what the job measured on its node (its cgroup, read from
made-up cgroup files here), else a task's peak with its loader workers' x the tasks per node."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

from omegaconf import OmegaConf

from attnlab.callbacks import job_cost
from attnlab.callbacks.run_metadata import RunMetadata
from attnlab.cli.slurm import estimates as sizing
from attnlab.cluster.nodes import NodeKind, Partition
from attnlab.cli.slurm.fit import AUTO, Fit, Settings
from attnlab.cluster import costs as estimates

GB = 2**30


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_jobs_cgroup_v1_is_read_at_the_jobs_level(tmp_path):
    _write(tmp_path / "proc/self/cgroup", "5:devices:/slurm/uid_1000/job_42/step_0/task_3\n"
                                          "4:memory:/slurm/uid_1000/job_42/step_0/task_3\n0::/\n")
    job = tmp_path / "sys/fs/cgroup/memory/slurm/uid_1000/job_42"
    _write(job / "memory.max_usage_in_bytes", f"{49 * GB}\n")  # 8 tasks of ~6 GB and the batch step
    _write(job / "step_0/memory.max_usage_in_bytes", f"{48 * GB}\n")
    _write(job / "step_0/task_3/memory.max_usage_in_bytes", f"{6 * GB}\n")  # one task: never the node's
    assert estimates.cgroup_peak_bytes(tmp_path, "42") == 49 * GB
    assert estimates.cgroup_peak_bytes(tmp_path) == 49 * GB  # any job_<id> where the id is not known
    assert estimates.cgroup_peak_bytes(tmp_path, "43") is None  # another job's cgroup is not this one's
    assert estimates.peak_memory_gb(8, tmp_path, {"SLURM_JOB_ID": "42"}) == (49.0, "the job's cgroup on its node")


def test_the_jobs_cgroup_v2_is_read_at_the_jobs_level(tmp_path):
    _write(tmp_path / "proc/self/cgroup", "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n")
    _write(tmp_path / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/memory.peak", f"{12 * GB}\n")
    assert estimates.cgroup_peak_bytes(tmp_path, "42") == 12 * GB
    os.remove(tmp_path / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/memory.peak")  # Linux before 5.19
    assert estimates.cgroup_peak_bytes(tmp_path, "42") is None


def test_without_a_jobs_cgroup_a_tasks_peak_counts_its_live_workers(tmp_path):
    _write(tmp_path / "proc/self/cgroup", "4:memory:/process_api/abc\n0::/\n")  # a container's, not a job's
    assert estimates.cgroup_peak_bytes(tmp_path, "42") is None
    procs = {100: (1, 6 * GB), 101: (100, GB // 2), 102: (100, GB // 2), 103: (101, GB // 4), 200: (1, 50 * GB)}
    for pid, (parent, hwm) in procs.items():
        _write(tmp_path / f"proc/{pid}/stat", f"{pid} (pt main) S {parent} 1 1 0 -1\n")
        _write(tmp_path / f"proc/{pid}/status", f"Name:\tpython\nVmHWM:\t{hwm // 1024} kB\nVmRSS:\t1 kB\n")
    # its own 6 GB, two workers and a worker's child (live), the largest finished child (1 GB); not pid 200
    assert estimates.process_peak_bytes(tmp_path, pid=100, finished_kb=2**20) == int(8.25 * GB)


def test_a_node_of_eight_tasks_asks_for_the_eight(tmp_path, monkeypatch):
    monkeypatch.setattr(estimates, "cgroup_peak_bytes", lambda root, job_id: None)
    monkeypatch.setattr(estimates, "process_peak_bytes", lambda root: 6 * GB)
    assert estimates.peak_memory_gb(8, env={}) == (48.0, "a task's peak with its loader workers' x 8 tasks per node")
    monkeypatch.setattr(estimates, "sstat_peak_bytes", lambda step: 7 * GB)
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}
    assert estimates.peak_memory_gb(8, env=env) == (56.0, "sstat's MaxRSS of a task x 8 tasks per node")

    # what the job records (rank 0, 8 devices per node), and the next job's --mem: 48 x 1.25 + 1 GB
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    cost = job_cost.JobCost()
    cost.startup_s, cost.where = 30.0, (str(tmp_path), "gpu", "k")
    trainer = SimpleNamespace(callbacks=[RunMetadata({}), cost], global_step=300, num_training_batches=100,
                              accumulate_grad_batches=1, is_global_zero=True, num_devices=8)
    cost.record(trainer, 0.8)
    measured = estimates.lookup(tmp_path, "gpu", "k")
    assert measured.peak_gb == 48.0 and "x 8 tasks per node" in measured.memory_from
    kind = NodeKind(1, 64, 128 * 1024, 8, "a100")
    cfg = OmegaConf.create({"trainer": {"max_epochs": 3, "max_steps": -1}})
    key = estimates.fingerprint(cfg, devices=8, nodes=2, node=estimates.node_type(kind), code="c")
    estimates.record(tmp_path, "gpu", key, measured)
    job = Fit(Partition("gpu", [kind]), 2, 8, 8, 8, 1440, 120, 8)
    sizing.size(job, Settings(mem_gb=AUTO), [cfg], [], tmp_path, code="c")
    assert job.mem_gb == 61 and job.overrides()["launcher.mem_gb"] == 61  # per node, each of the two
    assert "peak 48.0 GB per node measured by job 9" in job.mem_from and "x 8 tasks per node" in job.mem_from
    job = Fit(Partition("gpu", [NodeKind(1, 64, 40 * 1024, 8, "a100")]), 2, 8, 8, 8, 1440, 120, 8)
    estimates.record(tmp_path, "gpu", estimates.fingerprint(cfg, devices=8, nodes=2, code="c",
                                                            node=estimates.node_type(job.partition.nodes[0])), measured)
    sizing.size(job, Settings(mem_gb=AUTO), [cfg], [], tmp_path, code="c")
    assert job.mem_gb == 40  # at most what a node has


def test_sstats_maxrss_is_read():
    def sstat(stdout: str, code: int = 0):
        return lambda argv, **kw: subprocess.CompletedProcess(argv, code, stdout=stdout, stderr="")

    assert estimates.sstat_peak_bytes("42.0", run=sstat("1536M\n2G\n")) == 2 * GB
    assert estimates.sstat_peak_bytes("42.0", run=sstat("2046808K\n")) == 2046808 * 1024
    assert estimates.sstat_peak_bytes("42.0", run=sstat("0\n")) is None  # accounting gathers nothing
    assert estimates.sstat_peak_bytes("42.0", run=sstat("", 1)) is None

    def missing(argv, **kw):
        raise FileNotFoundError("sstat")

    assert estimates.sstat_peak_bytes("42.0", run=missing) is None
