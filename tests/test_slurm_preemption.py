"""Preemption and time limits on the real two-node SLURM cluster (tools/slurm-cluster.sh), through
`python train.py -m launcher=slurm ...` as a user submits, and through a batch script of one's own: SLURM's warning
(USR1) saves the current step and requeues the job, which continues in its folder to the same metrics as a run left
alone; a job longer than its time limit is requeued until it is done, at most `launcher.max_num_timeout` times, and
past that ends saying why; `scancel` saves, exits 143 and is not a success; every attempt has its record in the
lineage; no Lightning hpc_ckpt beside last.ckpt.

The jobs of the module start together (with the local reference run) and each test checks its own: the time-limit
jobs wait through whole minutes, the others fit in that time."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from attnlab.cluster.outcome import FINISHED, UNRECORDED_TEXT
from conftest import ROOT
from slurm_cluster import slurm


# the run every job trains (digits, the ViT): 3 epochs of 20 batches; the same seed and no loader workers, so that
# an interrupted run can end exactly where the run left alone ends
RUN = ["trainer=cpu", "trainer.max_epochs=3", "trainer.limit_train_batches=20", "data.num_workers=0",
       "callbacks.progress_bar=null", "callbacks.model_summary=null", "extras.print_config=false"]
STEPS = 3 * 20
COMPARED = ("val/loss", "val/acc", "test/loss", "test/acc", "train/loss")

# a user's callback that gives each training step at least step_s seconds: runs of a known length in wall time
PACE = '''
import time

from lightning.pytorch.callbacks import Callback


class Pace(Callback):
    def __init__(self, step_s: float):
        self.step_s = step_s

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.started = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(max(0.0, self.step_s - (time.monotonic() - self.started)))
'''


def paced(step_s: float) -> list[str]:
    return ["+callbacks.pace._target_=pace.Pace", f"+callbacks.pace.step_s={step_s}"]


# a surviving rank's wait for a failed peer's note (callbacks/peers.py): a lost node's tests wait it out
PEER_NOTE_WAIT_S = 10


class Job:
    """A job of this module's on the cluster, started in the background, whose run trains in `run_dir`."""

    name: str
    run_dir: Path

    def __init__(self, tmp: Path, name: str):
        self.name = f"attnlab-preempt-{os.getpid()}-{name}"  # the SLURM job name: this session's own jobs
        self.env = os.environ | {
            "PYTHONUNBUFFERED": "1", "ATTNLAB_LOG_DIR": str(tmp / "logs"), "ATTNLAB_CACHE_DIR": str(tmp / "cache"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), os.environ.get("PYTHONPATH")]))}
        self.started = time.monotonic()
        # sacct's window opens at this day's midnight unless told: a job submitted before it is found from here
        self.since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))
        self.sent: threading.Thread | None = None
        self.failed: str | None = None

    def job_id(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = slurm("squeue", "-h", "-n", self.name, "-o", "%i").stdout.split() or \
                slurm("sacct", "-n", "-X", "-S", self.since, f"--name={self.name}", "-o", "JobID").stdout.split()
            if ids:
                return ids[0]
            time.sleep(0.5)
        raise AssertionError(f"no job named {self.name} in the queue after {timeout} s")

    def training(self) -> bool:
        return (self.run_dir / "lineage.json").is_file()

    def scancel_when_training(self, *args: str) -> None:
        """`scancel <args> <job>` once the job trains (its lineage written, its signal handlers set) and a little
        more, from a thread of its own."""
        def send():
            try:
                job = self.job_id()
                deadline = time.monotonic() + 180
                while not self.training():
                    assert time.monotonic() < deadline, "the job never started training"
                    time.sleep(0.2)
                time.sleep(3)
                slurm("scancel", *args, job)
            except AssertionError as e:
                self.failed = str(e)

        self.sent = threading.Thread(target=send, daemon=True)
        self.sent.start()

    def signal_sent(self) -> None:
        if self.sent is not None:
            self.sent.join()
            assert self.failed is None, f"{self.failed}:\n{self.log()[-3000:]}"

    def stop(self) -> None:
        slurm("scancel", "-n", self.name, check=False)

    def log(self) -> str:
        raise NotImplementedError

    def attempts(self) -> list[dict]:
        lineage = json.loads((self.run_dir / "lineage.json").read_text())
        return [*lineage.get("earlier", []), lineage]

    def metrics(self) -> dict:
        return json.loads((self.run_dir / "metrics.json").read_text())

    def checkpoints(self) -> list[str]:
        return sorted(p.name for p in (self.run_dir / "checkpoints").iterdir())


class Sweep(Job):
    """`python train.py -m launcher=slurm ...` of a single job; the driver's output in <name>.out beside it."""

    def __init__(self, tmp: Path, name: str, *overrides: str, partition: str = "debug", run: tuple = ()):
        super().__init__(tmp, name)
        self.folder = tmp / name
        self.run_dir = self.folder / "0"
        self.output = tmp / f"{name}.out"
        with open(self.output, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "train.py"), "-m", "launcher=slurm", f"launcher.partition={partition}",
                 *(run or RUN),
                 *overrides, f"hydra.sweep.dir={self.folder}", f"hydra.job.name={self.name}"],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 420) -> str:
        """Wait until the sweep ends: its output."""
        try:
            self.proc.wait(timeout=max(1.0, timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"sweep {self.name} did not end within {timeout} s:\n{self.out()[-3000:]}\n"
                                 f"{self.log()[-3000:]}") from None
        self.signal_sent()
        return self.out()

    def out(self) -> str:
        return self.output.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        super().stop()

    def log(self) -> str:
        """The job's error log, where submitit, SLURM and attnlab's signal lines go (all its attempts: submitit
        appends)."""
        return "".join(p.read_text(errors="replace") for p in sorted((self.folder / ".submitit").rglob("*_log.err")))


class Batch(Job):
    """A batch script of the user's own: `srun python train.py ...` in an sbatch job that SLURM may requeue."""

    def __init__(self, tmp: Path, name: str, *overrides: str):
        super().__init__(tmp, name)
        self.run_dir = tmp / name / "run"
        self.output = tmp / f"{name}.log"
        command = shlex.join(["srun", sys.executable, str(ROOT / "train.py"), *RUN, *overrides,
                              f"hydra.run.dir={self.run_dir}"])
        self.id = slurm("sbatch", "--parsable", "-J", self.name, "-n", "1", "-c", "1", "--requeue",
                        "--open-mode=append", "-o", str(self.output), "--wrap", command, cwd=ROOT,
                        env=self.env).stdout.strip()

    def job_id(self, timeout: float = 120) -> str:
        return self.id

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.is_file() else ""


def reference_run(tmp: Path):
    """The same run, left alone, on this machine (forked from the tests' server: it is what the jobs are compared
    with, not a launch form under test)."""
    env = os.environ | {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "ATTNLAB_LOG_DIR": str(tmp / "logs")}
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *RUN, f"hydra.run.dir={tmp / 'alone'}"], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# the sweeps each test needs, all started at once by the module's fixture
NEEDS = {
    "test_usr1_saves_the_current_step_requeues_and_ends_as_the_run_left_alone": ("usr1", "alone"),
    "test_scancel_saves_exits_143_and_the_sweep_reports_no_success": ("scancel",),
    "test_in_a_batch_script_of_ones_own_usr1_saves_and_scontrol_requeues": ("sbatch", "alone"),
    "test_a_job_longer_than_its_time_limit_is_requeued_until_done_at_most_max_num_timeout_times":
        ("limit", "past_limit", "alone"),
}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory, slurm_cluster):
    # the session's cluster (conftest.py), not one of the module's own: a second manager that found the cluster down
    # would start it again at its first use, cancelling the jobs under way
    slurm_cluster(accounting=True)  # skips (or fails, ATTNLAB_REQUIRE_SLURM=1) where the cluster cannot run
    tmp = tmp_path_factory.mktemp("preemption")
    (tmp / "pace.py").write_text(PACE)
    wanted = {n for item in request.session.items if item.module is request.module for n in NEEDS.get(item.name, ())}
    started = {}
    # a minute's time limit, warned 1 s before it: SLURM checks limits every 30 s, so USR1 comes 29-59 s into each
    # attempt and the limit ends it 30 s later; each step takes 1 s, so the 60 steps need 2 attempts or more
    limit = ["launcher.timeout_min=1", "launcher.signal_delay_s=1", *paced(1.0)]
    longer = [*limit, "launcher.max_num_timeout=1", "trainer.max_epochs=20"]
    for name, kind, overrides in (("limit", Sweep, [*limit, "launcher.max_num_timeout=5"]),
                                  ("past_limit", Sweep, longer), ("usr1", Sweep, paced(0.2)),
                                  ("scancel", Sweep, paced(0.2)), ("sbatch", Batch, paced(0.2))):
        if name in wanted:
            if name not in ("limit", "past_limit"):  # once the time-limit jobs have started up (faster alone)
                _until_training([started[n] for n in ("limit", "past_limit") if n in started], timeout=60)
            started[name] = kind(tmp, name, *overrides)
    for name in ("usr1", "sbatch"):  # SLURM's warning, as before a preemption: to the job's steps, where python runs
        if name in started:  # (scancel --batch would signal the batch script's shell only)
            started[name].scancel_when_training("--signal=USR1")
    if "scancel" in started:
        started["scancel"].scancel_when_training()
    if "alone" in wanted:
        started["alone"] = reference_run(tmp)
    yield started
    for job in started.values():
        if isinstance(job, Job):
            job.stop()
        elif job.poll() is None:
            job.kill()


def _until_training(jobs: list[Job], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(j.training() for j in jobs):
        time.sleep(0.5)


@pytest.fixture(scope="module")
def alone(runs) -> dict:
    """The final metrics of the run left alone."""
    proc = runs["alone"]
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    run_dir = Path(proc.args[-1].split("=", 1)[1])
    return json.loads((run_dir / "metrics.json").read_text())


def assert_same_metrics(run: dict, alone: dict) -> None:
    for key in COMPARED:
        assert run[key] == pytest.approx(alone[key], abs=1e-5), (key, run[key], alone[key])


@pytest.mark.slow
def test_usr1_saves_the_current_step_requeues_and_ends_as_the_run_left_alone(slurm_cluster, runs, alone):
    sweep = runs["usr1"]
    job = sweep.job_id()
    out = sweep.wait()
    log = sweep.log()
    assert sweep.proc.returncode == 0, out[-3000:]
    first, second = sweep.attempts()
    assert 0 < first["global_step"] < STEPS, first  # saved mid-run, at the step it was on
    assert first["status"] == "requeued: preempted" and first["signal"] == "SIGUSR1", first
    assert second["status"] == "finished" and second["global_step"] == STEPS, second
    assert (first["attempt"], first["slurm"]["restart_count"], second["attempt"], second["slurm"]["restart_count"]) \
        == (1, 0, 2, 1)
    assert first["slurm"]["job_id"] == second["slurm"]["job_id"] == job
    last = sweep.run_dir / "checkpoints" / "last.ckpt"
    assert f"attnlab: SIGUSR1 (preempted): step {first['global_step']} is saved in {last}; the job is requeued and " \
           "continues from it in this folder" in log, log[-3000:]
    assert f"resuming from {last}" in "".join(p.read_text() for p in sweep.run_dir.glob("*.log"))  # the run's log
    # one handler acted: attnlab's, which handed the requeue to submitit; not Lightning's, not submitit's SIGTERM one
    assert log.count("Caught signal SIGUSR1") == 1 and "requeing job" not in log and "Bypassing" not in log, log
    assert not [name for name in sweep.checkpoints() if name.startswith("hpc_ckpt")], sweep.checkpoints()
    assert_same_metrics(sweep.metrics(), alone)
    assert slurm_cluster(accounting=True).sacct_state(int(job)) == "COMPLETED"


@pytest.mark.slow
def test_scancel_saves_exits_143_and_the_sweep_reports_no_success(slurm_cluster, runs):
    sweep = runs["scancel"]
    job = sweep.job_id()
    out = sweep.wait(timeout=240)
    log = sweep.log()
    assert sweep.proc.returncode != 0, out[-3000:]
    (attempt,) = sweep.attempts()
    assert attempt["status"] == "stopped" and attempt["signal"] == "SIGTERM", attempt
    last = sweep.run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=False, map_location="cpu")["global_step"]
    assert 0 < saved == attempt["global_step"] < STEPS
    assert f"attnlab: stopped on SIGTERM: step {saved} is saved in {last}" in log and "Exit status 143" in log, log
    assert "task 0: Exited with exit code 143" in log, log[-3000:]
    assert "Bypassing" not in log and not (sweep.run_dir / "metrics.json").exists()
    assert sweep.checkpoints() == ["last.ckpt"]
    assert slurm_cluster(accounting=True).sacct_state(int(job)) == "CANCELLED"


@pytest.mark.slow
def test_in_a_batch_script_of_ones_own_usr1_saves_and_scontrol_requeues(slurm_cluster, runs, alone):
    batch = runs["sbatch"]
    assert slurm_cluster(accounting=True).wait(int(batch.id), timeout=300) == "COMPLETED", batch.log()[-3000:]
    batch.signal_sent()
    log = batch.log()
    first, second = batch.attempts()
    assert first["status"] == "requeued: SLURM's warning" and 0 < first["global_step"] < STEPS, first
    assert second["status"] == "finished" and second["slurm"]["restart_count"] == 1, second
    last = batch.run_dir / "checkpoints" / "last.ckpt"
    assert f"attnlab: SIGUSR1 (SLURM's warning): step {first['global_step']} is saved in {last}; the job is " \
           "requeued and continues from it in this folder" in log, log[-3000:]
    assert "requeing job" not in log and not [n for n in batch.checkpoints() if n.startswith("hpc_ckpt")], log
    assert_same_metrics(batch.metrics(), alone)


@pytest.mark.slow
def test_a_job_longer_than_its_time_limit_is_requeued_until_done_at_most_max_num_timeout_times(
        slurm_cluster, runs, alone):
    sweep, past = runs["limit"], runs["past_limit"]
    job = sweep.job_id()
    out = sweep.wait()
    log = sweep.log()
    assert sweep.proc.returncode == 0, out[-3000:] + log[-3000:]
    *requeued, done = sweep.attempts()
    # every attempt has its record, but one warned before training started (submitit requeued it at once, nothing
    # to save): SLURM's restart count and submitit's log count them all
    requeues = done["slurm"]["restart_count"]
    assert 1 <= requeues <= 5 and log.count("Caught signal SIGUSR1") == requeues, log[-3000:]  # max_num_timeout=5
    assert len(requeued) <= requeues and all(a["status"] == "requeued: time limit" for a in requeued), requeued
    assert done["status"] == "finished" and done["global_step"] == STEPS, done
    counts = [a["slurm"]["restart_count"] for a in [*requeued, done]]
    assert counts == sorted(set(counts))
    assert [a["attempt"] for a in [*requeued, done]] == list(range(1, len(counts) + 1))
    steps = [a["global_step"] for a in requeued]
    # each attempt went on from the one before; a warning during the last validation saves the last step (fit has
    # not ended: the next attempt validates and finishes)
    assert steps == sorted(steps) and steps[-1:] <= [STEPS], steps
    assert not [name for name in sweep.checkpoints() if name.startswith("hpc_ckpt")], sweep.checkpoints()
    assert_same_metrics(sweep.metrics(), alone)
    assert slurm_cluster(accounting=True).sacct_state(int(job)) == "COMPLETED"

    # a run that needs more: requeued once (launcher.max_num_timeout=1), then stopped, saying so
    past_job = past.job_id()
    out = past.wait()
    log = past.log()
    assert past.proc.returncode != 0, out[-3000:]
    *requeued, stopped = past.attempts()
    assert stopped["status"] == "stopped: time limit, not requeued" and stopped["slurm"]["restart_count"] == 1, stopped
    # the first warning went through submitit's requeue (during training, or before it); the second was refused by
    # attnlab's count, before submitit was asked
    assert "launcher.max_num_timeout" in stopped["not_requeued"] and log.count("Caught signal SIGUSR1") == 1, log
    assert log.count("attnlab: SIGUSR1 (time limit)") == 1 + len(requeued), log[-3000:]
    assert [a["status"] for a in requeued] in ([], ["requeued: time limit"]), requeued
    last = past.run_dir / "checkpoints" / "last.ckpt"
    assert f"step {stopped['global_step']} is saved in {last}. The job is not requeued: it has reached its time " \
           "limit launcher.max_num_timeout times already" in log, log[-3000:]
    assert torch.load(last, weights_only=False, map_location="cpu")["global_step"] == stopped["global_step"]
    assert slurm_cluster(accounting=True).sacct_state(int(past_job)) == "FAILED"


def test_each_attempt_in_a_run_folder_has_a_numbered_record_saying_how_it_ended(tmp_path, monkeypatch):
    """Without the cluster: the records lineage.json keeps of a SLURM job's attempts (SLURM's own variables)."""
    from attnlab import lineage

    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_PARTITION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1")
    records = []
    for restart, started in enumerate(("2026-11-28T10:00:00+00:00", "2026-11-28T10:01:00+00:00")):
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
        record, _ = lineage.collect(tmp_path)
        record["started"] = started
        lineage.write(tmp_path, record)  # as training starts; the first attempt is killed before it ends
        records.append(record)
    records[1] |= {**FINISHED.record(), "ended": "2026-11-28T10:02:00+00:00"}
    lineage.write(tmp_path, records[1])  # as it ends
    written = lineage.read(tmp_path)
    (killed,) = written["earlier"]
    assert (killed["attempt"], killed["slurm"]["restart_count"], killed["status"]) == (1, 0, UNRECORDED_TEXT)
    assert (written["attempt"], written["slurm"], written["status"]) == (
        2, {"job_id": "41", "restart_count": 1, "nodes": "n1", "partition": None}, "finished")
