"""The cluster as real sites run it (tools/slurm-cluster.sh: tasks bound to their CPUs under task/affinity,
preemption by partition priority with a grace time, a controller that goes away): a job uses the CPUs it was given;
a job preempted by a higher-priority one, twice, then losing a node, is requeued each time and ends as the run left
alone, whether SLURM sends SIGTERM or the job's --signal; a sweep rides out a controller outage with every row."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab.cluster.outcome import UNRECORDED_TEXT as UNRECORDED
from conftest import ROOT
from slurm_cluster import slurm, start_daemon
from test_slurm_preemption import PACE, PEER_NOTE_WAIT_S, Batch, Sweep, paced


def _wait_training(job, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not job.training():
        assert time.monotonic() < deadline, f"the job never started training:\n{job.log()[-3000:]}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("strict")
    (folder / "pace.py").write_text(PACE)
    return folder


@pytest.fixture(scope="module")
def references(tmp, slurm_cluster):
    """The run left alone that the tests compare with (the two-node run as one process), started in the background as the module's first test starts: they train while it waits on the
    cluster. Not where the cluster cannot run (the tests skip)."""
    slurm_cluster(accounting=True)
    with open(tmp / "single.out", "w") as log:
        single = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *TWO_NODES[4:8], "trainer=cpu",
                                "data.batch_size=32", "global_batch_size=32", "data.num_workers=0",
                                "callbacks.progress_bar=null", f"hydra.run.dir={tmp / 'single'}"], cwd=ROOT,
                               env=os.environ | {"OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT,
                               text=True)
    procs = {"single": single}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _references_started(request):
    """The reference runs start with the module's first test that runs on the cluster."""
    if "slurm_cluster" in request.fixturenames:
        request.getfixturevalue("references")


def _finished(references: dict, name: str, folder: Path) -> dict:
    out, _ = references[name].communicate(timeout=600)
    out = out if out is not None else (folder.parent / f"{folder.name}.out").read_text()
    assert references[name].returncode == 0, out[-3000:]
    return json.loads((folder / "metrics.json").read_text())


@pytest.mark.slow
def test_a_job_runs_on_the_cpus_it_was_given_and_its_workers_and_threads_follow(slurm_cluster, tmp):
    """launcher=slurm fits 2 CPUs per task for one loader worker; under task/affinity the job's process sees those
    2 (os.sched_getaffinity), and so does `srun` in a batch script: torch's threads follow that number."""
    slurm_cluster(accounting=True)
    sweep = Sweep(tmp, "cpus", "data.num_workers=1", "trainer.max_epochs=1", "trainer.limit_train_batches=4")
    batch = Batch(tmp, "cpus_batch", "trainer.max_epochs=1", "trainer.limit_train_batches=4", "data.num_workers=1")
    out = sweep.wait(timeout=300)
    assert sweep.proc.returncode == 0 and "2 CPUs per task" in out, out[-3000:]
    assert slurm_cluster(accounting=True).wait(int(batch.id), timeout=300) == "COMPLETED", batch.log()[-3000:]
    # the run folder records what the job was fitted to (launcher=slurm's values) and how the trainer ran
    lineage = json.loads((sweep.run_dir / "lineage.json").read_text())
    assert lineage["launcher"]["cpus_per_task"] == 2 and lineage["launcher"]["partition"] == "debug", lineage
    assert lineage["trainer"]["devices"] == 1 and lineage["trainer"]["num_nodes"] == 1, lineage["trainer"]
    for job, cpus in ((sweep, 2), (batch, 1)):  # the batch script asks for one CPU (sbatch -c 1)
        record = json.loads((job.run_dir / "lineage.json").read_text())["accelerator"]
        assert record["cpus_usable"] == cpus and record["torch_threads"] <= cpus, (job.name, record)
        assert record["cpu_count"] >= cpus


def _preempt_when_training(job) -> str:
    """A job on the high partition that needs every CPU of both nodes, once `job` trains: the job id."""
    _wait_training(job)
    time.sleep(2)
    return slurm("sbatch", "--parsable", "-p", "high", "-N", "2", "--exclusive", "-J", "attnlab-high",
                 "-o", "/dev/null", "--wrap", "sleep 5").stdout.strip()


def _attempt_training(job, attempt: int, timeout: float = 180) -> None:
    """Until the job's attempt `attempt` (1, 2, ...) trains: its lineage written, its status `running`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lineage = json.loads((job.run_dir / "lineage.json").read_text())
            if lineage.get("attempt") == attempt and lineage.get("status") == "running":
                return
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, f"attempt {attempt} never trained:\n{job.log()[-3000:]}"
        time.sleep(0.3)


# two nodes, one task each (gloo), 16 samples a node: the same 32 samples a step as one process with batch 32
TWO_NODES = ("trainer=multinode", "trainer.num_nodes=2", "trainer.accelerator=cpu", "trainer.precision=32-true",
             "trainer.max_epochs=2", "trainer.limit_train_batches=12", "data.augment=null", "test=false",
             "data.num_workers=0", "data.batch_size=16", "global_batch_size=32", "callbacks.progress_bar=null",
             "extras.print_config=false")


@pytest.fixture(scope="module")
def one_process(tmp, references) -> dict:
    """The two-node run's numbers from one process with the same global batch, left alone."""
    return _finished(references, "single", tmp / "single")


@pytest.mark.slow
def test_a_two_node_job_preempted_twice_then_losing_a_node_is_requeued_each_time_and_ends_as_one_process(
        slurm_cluster, tmp, one_process):
    """A two-node job on the preemptible partition, preempted by a job of a higher tier, then preempted again in its
    second attempt: both ranks get SLURM's SIGTERM (the job being preempted, as `scontrol show job` tells) and stop
    after the same step, rank 0 saves it each time, and the job is requeued twice (preemptions spend no budget:
    max_num_timeout=1). In its third attempt node n1 dies (its slurmd and the job's processes on it killed: rank 0
    and the batch script) and comes back once the rank left has decided: rank 1 stops on the lost peer at once, tells
    it from a failure of the run, records the attempt and has the job requeued (the budget's one requeue). The driver
    says each requeue in one line, and the job continues from last.ckpt each time to the numbers of one process with
    the same global batch left alone, in one row. (With PreemptParameters=send_user_signal, SLURM 23.02 and later
    send the job's USR1 instead: the warning that test_slurm_preemption.py sends with scancel --signal=USR1.)"""
    slurm_cluster(accounting=True)
    sweep = Sweep(tmp, "preempted_2n", *paced(0.6), "launcher.max_num_timeout=1", partition="low", run=TWO_NODES)
    job = sweep.job_id()
    high = [_preempt_when_training(sweep)]
    _attempt_training(sweep, 2)
    time.sleep(2)
    high.append(slurm("sbatch", "--parsable", "-p", "high", "-N", "2", "--exclusive", "-J", "attnlab-high",
                      "-o", "/dev/null", "--wrap", "sleep 5").stdout.strip())
    _attempt_training(sweep, 3)
    time.sleep(2)
    _lose_node(job, "n1")
    try:
        until_decided(sweep.run_dir / ".requeues" / f"{job}.2.json", job, "n2")
    finally:
        start_daemon("slurmd", "-N", "n1")
    out = sweep.wait(timeout=600)
    log = sweep.log()
    assert sweep.proc.returncode == 0, out[-3000:] + log[-3000:]
    attempts = sweep.attempts()
    assert [a["status"] for a in attempts[:2]] == ["requeued: preempted"] * 2, attempts
    assert [a["signal"] for a in attempts[:2]] == ["SIGTERM"] * 2, attempts
    assert 0 < attempts[0]["global_step"] < attempts[1]["global_step"] < 24, attempts
    assert len(attempts) == 4 and attempts[3]["status"] == "finished" and attempts[3]["global_step"] == 24, attempts
    assert [a["slurm"]["restart_count"] for a in attempts] == [0, 1, 2, 3], attempts
    assert "stopped on SIGTERM" not in log and "Traceback" not in out, out[-3000:] + log[-3000:]
    said = [line for line in out.splitlines() if ": requeued" in line]
    assert len(said) == 3 and all(": requeued (preempted" in line for line in said[:2]), out[-3000:]
    # rank 1 records the loss and has the job requeued; or, ended with the step before it could (srun, on n1, is
    # gone too), the attempt ends unrecorded and SLURM requeues the job itself on the node failure
    lost = attempts[2]
    assert lost["status"] in ("requeued: a peer was lost", UNRECORDED), lost
    if lost["status"] != UNRECORDED:
        assert attempts[1]["global_step"] <= lost["global_step"] < 24 and lost.get("recorded_by_rank") == 1, lost
        assert "a peer was lost" in said[2] and "continues from step" in said[2], said
    else:  # nothing recorded of the attempt: its cause is not guessed
        assert said[2].endswith(": requeued"), said
    both = json.loads((sweep.run_dir / "metrics.json").read_text())
    assert both["val/loss"] == pytest.approx(one_process["val/loss"], abs=2e-3), (both, one_process)
    rows = (sweep.folder / "results.csv").read_text().splitlines()
    assert len(rows) == 2, rows  # the header and the job's one row
    assert [slurm_cluster(accounting=True).sacct_state(int(h)) for h in high] == ["COMPLETED"] * 2


# a user's callback that makes each validation batch last a second and notes it: (process, rank, batch) per line
SLOW_VALIDATION = '''
import os
import time

from lightning.pytorch.callbacks import Callback


class SlowValidation(Callback):
    def __init__(self, note: str):
        self.note = note

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            time.sleep(1.0)
            with open(self.note, "a") as f:
                f.write(f"{os.getpid()} {trainer.global_rank} {batch_idx}\\n")
'''


@pytest.mark.slow
def test_a_warning_during_validation_of_a_two_node_job_is_acted_on_before_validation_ends(slurm_cluster, tmp,
                                                                                          one_process):
    """SLURM's warning (USR1) reaches a two-node job while it validates, each validation batch lasting a second:
    both ranks stop after the same validation batch, not after the next training step (which would come after the
    whole validation, past the warning's lead), rank 0 saves last.ckpt and the job is requeued; the requeued run
    goes on from that step and ends with the numbers of one process left alone."""
    slurm_cluster(accounting=True)
    (tmp / "slow_validation.py").write_text(SLOW_VALIDATION)
    note = tmp / "validation.txt"
    sweep = Sweep(tmp, "warned_in_validation", "+callbacks.slow._target_=slow_validation.SlowValidation",
                  f"+callbacks.slow.note={note}", "trainer.limit_val_batches=10", run=TWO_NODES)
    job, deadline = sweep.job_id(), time.monotonic() + 300
    while not (note.is_file() and note.read_text().strip()):
        assert time.monotonic() < deadline and sweep.proc.poll() is None, f"no validation:\n{sweep.log()[-3000:]}"
        time.sleep(0.2)
    slurm("scancel", "--signal=USR1", job)
    out = sweep.wait(timeout=600)
    log = sweep.log()
    assert sweep.proc.returncode == 0, out[-3000:] + log[-3000:]
    first, *_, last = sweep.attempts()
    assert first["status"].startswith("requeued") and first["signal"] == "SIGUSR1", first
    assert first["global_step"] == 12 and last["status"] == "finished" and last["global_step"] == 24, (first, last)
    seen = [line.split() for line in note.read_text().splitlines()]
    first_pid = {pid for pid, rank, _ in seen[:1]}
    cut = [int(batch) for pid, rank, batch in seen if pid in first_pid]
    assert max(cut) < 4, f"the first attempt validated on to batch {max(cut)} of 10 after the warning"
    both = json.loads((sweep.run_dir / "metrics.json").read_text())
    assert both["val/loss"] == pytest.approx(one_process["val/loss"], abs=2e-3), (both, one_process)


@pytest.mark.slow
def test_a_sweep_rides_out_a_controller_outage_with_every_row(slurm_cluster, tmp):
    """slurmctld stopped for 50 s while both jobs of a sweep train (longer than the driver's 30 s grace for a job
    missing from the queue; the jobs end meanwhile), then started again: the jobs go on on their nodes, no job is
    reported gone, and the sweep ends with both rows."""
    slurm_cluster(accounting=True)
    sweep = Sweep(tmp, "outage", *paced(0.5), "seed=1,2")
    sweep.run_dir = sweep.folder / "1"
    _wait_training(sweep)
    subprocess.run(["pkill", "-x", "slurmctld"], check=True)
    try:
        time.sleep(50)
    finally:
        start_daemon("slurmctld")
    out = sweep.wait(timeout=600)
    assert sweep.proc.returncode == 0, out[-3000:]
    assert "gone" not in out.lower() and "controller does not answer" in out and "answers again" in out, out[-3000:]
    rows = (sweep.folder / "results.csv").read_text().splitlines()
    assert len(rows) == 3, rows
    for job in ("0", "1"):
        assert (sweep.folder / job / "metrics.json").is_file()


@pytest.mark.slow
def test_a_sweeps_jobs_find_their_folder_where_sbatch_exports_no_environment(slurm_cluster, tmp):
    """SBATCH_EXPORT=NONE (a site's --export=NONE): the jobs inherit nothing from the driver's environment, and
    still write into the one sweep folder the driver claimed, each its own job folder."""
    slurm_cluster(accounting=True)
    logs = tmp / "noexport-logs"
    env = os.environ | {"SBATCH_EXPORT": "NONE", "ATTNLAB_LOG_DIR": str(logs), "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "launcher=slurm", "seed=1,2",
                          "trainer.max_epochs=1", "trainer.limit_train_batches=2", "data.num_workers=0",
                          "callbacks.progress_bar=null", "extras.print_config=false"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    (sweep,) = (logs / "train" / "multiruns").iterdir()
    assert sorted(p.parent.name for p in sweep.glob("*/metrics.json")) == ["0", "1"], sorted(sweep.rglob("*"))
    assert len((sweep / "results.csv").read_text().splitlines()) == 3


@pytest.mark.slow
def test_the_overhead_benchmark_of_launcher_slurm_runs(slurm_cluster):
    """benchmarks/slurm_overhead.py (docs/benchmarks.md), one pair: both paths reach their first training step."""
    slurm_cluster(accounting=True)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "slurm_overhead.py"), "--pairs", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "median to the first training step: sbatch + srun" in out.stdout, out.stdout


def until_decided(record: Path, job: str, survivor: str, least_s: float = PEER_NOTE_WAIT_S + 5,
                  most_s: float = 120) -> None:
    """A lost node stays away at least `least_s`, then until the rank left on `survivor` has decided (it waits
    PEER_NOTE_WAIT_S for a failed peer's note, longer on a loaded machine): the attempt's ledger record says how it
    ended, or that rank's process has ended without a word (at most `most_s`). Back earlier, n1, which runs the batch
    script, would have SLURM requeue the job itself, ending that rank; and a node back before the rank left has asked
    for the requeue has srun cancel the step (its ledger record says the peer was lost as soon as the rank meets the
    loss, before that wait: hence `least_s`)."""
    time.sleep(least_s)
    deadline = time.monotonic() + most_s - least_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(record.read_text()).get("cause") != "running":
                return
        if not _job_processes(job, survivor):
            return
        time.sleep(0.5)


def _job_processes(job_id: str, node: str) -> list[int]:
    """The processes of the job on the node (its tasks and their children), by their environment."""
    mine, found = (f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()), []
    for proc in Path("/proc").iterdir():
        try:
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except (OSError, ValueError):
            continue
        if all(m in env for m in mine):
            found.append(int(proc.name))
    return found


def _lose_node(job_id: str, node: str = "n2") -> None:
    """As when a machine dies: the node's slurmd, the job's processes on it and their slurmstepd killed at once."""
    victims = {int(Path(f"/run/slurm/slurmd-{node}.pid").read_text())}
    for pid in _job_processes(job_id, node):
        victims.add(pid)
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{parent}/comm").read_text().strip() == "slurmstepd":
                victims.add(parent)
    assert len(victims) >= 3, f"no process of job {job_id} on {node}"
    # all frozen, then all killed: none of them reports another's end (a batch step's slurmstepd would report its
    # script killed, and SLURM would end the job at once), as none can when the machine dies
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


# a user's callback with a bug that shows on rank 1 only, at step 15
BUG = '''
from lightning.pytorch.callbacks import Callback


class Bug(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == 15:
            raise ValueError("a bug on rank 1 at step 15")
'''


@pytest.mark.slow
def test_a_bug_on_one_rank_of_a_two_node_job_is_a_failure_not_a_lost_peer(slurm_cluster, tmp):
    """Rank 1 raises at step 15: rank 0 meets the same broken collective as when a node dies, but finds rank 1's
    note of its own error; the job fails (a bug comes back on every attempt: no requeue), its lineage naming rank
    1's error, and the driver reports it failed."""
    slurm_cluster(accounting=True)
    (tmp / "bug.py").write_text(BUG)
    sweep = Sweep(tmp, "bug_on_rank1", "+callbacks.bug._target_=bug.Bug", run=TWO_NODES)
    out = sweep.wait(timeout=600)
    assert sweep.proc.returncode == 1 and ": requeued" not in out and "Traceback" not in out, out[-3000:]
    failed = [line for line in out.splitlines() if ": failed; log" in line]
    assert len(failed) == 1, out[-3000:]
    assert "rank 1 of this run failed (ValueError: a bug on rank 1 at step 15)" in out, out[-3000:]
    (only,) = sweep.attempts()
    assert only["status"] == "failed: rank 1 failed" and "a bug on rank 1" in only["peer_error"], only
    assert "rank 1 of this run failed (ValueError: a bug on rank 1 at step 15)" in sweep.log(), sweep.log()[-3000:]
