"""The two-node SLURM cluster of tools/slurm-cluster.sh, which the SLURM tests run on: a job on both nodes, the
accounting database that `sacct` (and submitit) read, a requeued job starting again within seconds, one task per
node on cores of their own (as on two machines), and the same cluster without accounting."""

from __future__ import annotations

import os
import socket
import time

import pytest

from slurm_cluster import slurm

TASKS = "srun bash -c 'echo task=$SLURM_PROCID node=$SLURMD_NODENAME'"


def test_a_job_on_both_nodes_completes_and_sacct_records_it(slurm_cluster, tmp_path):
    cluster = slurm_cluster(accounting=True)
    assert {socket.gethostbyname(node) for node in cluster.nodes} == {"127.0.0.1"}  # MASTER_ADDR of torch's rendezvous
    job = cluster.sbatch("-N", "2", "-o", "out-%j.txt", "--wrap", f"hostname; {TASKS}", cwd=tmp_path)
    assert cluster.wait(job) == "COMPLETED"
    lines = (tmp_path / f"out-{job}.txt").read_text().splitlines()
    assert sorted(lines[1:]) == ["task=0 node=n1", "task=1 node=n2"], lines
    assert cluster.sacct_state(job) == "COMPLETED"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: the nodes can only share it")
def test_one_task_on_each_node_runs_on_a_core_of_its_own(slurm_cluster, tmp_path):
    """The nodes are two slurmd on this host, each declaring its CPUs: a one-CPU task on each would both be bound to
    the machine's first CPU, and a two-node job would run on one core. The second node sees the CPUs in the reverse
    order (tools/slurm-cluster.sh), so the tasks are bound to two, as on two machines; a node's every CPU is its."""
    cluster = slurm_cluster(accounting=True)
    bound = "srun bash -c 'echo $SLURMD_NODENAME $(grep Cpus_allowed_list /proc/self/status | cut -f2)'"
    job = cluster.sbatch("-N", "2", "-c", "1", "-o", "out.txt", "--wrap", bound, cwd=tmp_path)
    assert cluster.wait(job) == "COMPLETED"
    cpus = dict(line.split() for line in (tmp_path / "out.txt").read_text().splitlines())
    assert sorted(cpus) == ["n1", "n2"] and cpus["n1"] != cpus["n2"], cpus
    whole = cluster.sbatch("-w", "n2", "--exclusive", "-o", "whole.txt", "--wrap", bound, cwd=tmp_path)
    assert cluster.wait(whole) == "COMPLETED"
    assert (tmp_path / "whole.txt").read_text().split() == ["n2", f"0-{os.cpu_count() - 1}"]


def test_a_requeued_job_starts_again_within_seconds(slurm_cluster, tmp_path):
    cluster = slurm_cluster(accounting=True)
    job = cluster.sbatch("-o", "out.txt", "--open-mode=append", "--wrap", "echo started; sleep 300", cwd=tmp_path)
    deadline = time.monotonic() + 30
    while cluster.state(job) != "RUNNING" or not (tmp_path / "out.txt").is_file():
        assert time.monotonic() < deadline, f"job {job} did not start: {cluster.state(job)}"
        time.sleep(0.2)
    slurm("scontrol", "requeue", str(job))
    requeued = time.monotonic()
    while (tmp_path / "out.txt").read_text().count("started") < 2:
        assert time.monotonic() - requeued < 60, f"job {job} did not start again: {cluster.state(job)}"
        time.sleep(0.5)
    slurm("scancel", str(job))
    assert "Restarts=1" in slurm("scontrol", "show", "job", str(job)).stdout
    assert cluster.wait(job) == "CANCELLED"


@pytest.mark.slurm_without_accounting
def test_without_accounting_squeue_knows_the_job_and_sacct_has_nothing(slurm_cluster, tmp_path):
    cluster = slurm_cluster(accounting=False)
    job = cluster.sbatch("-N", "2", "--wrap", "sleep 2", cwd=tmp_path)
    assert slurm("squeue", "-h", "-j", str(job), "-o", "%T").stdout.strip() in ("PENDING", "RUNNING", "CONFIGURING")
    assert cluster.wait(job) == "COMPLETED"
    sacct = slurm("sacct", "-j", str(job), check=False)
    assert sacct.returncode != 0 and "accounting storage is disabled" in sacct.stdout + sacct.stderr
