"""Multi-node runs that a launcher outside train.py starts, as docs/clusters.md shows them: a user's own sbatch script
(docs/examples/train_multinode.sbatch, `srun python train.py`) on the real two-node SLURM cluster, and two
`torchrun --nnodes 2` agents side by side on one host. Each launch writes one run folder, which its rank 0 claims
and the other rank joins; a requeued job continues in it; and the two nodes end with the same metrics as one process
with the same global batch."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DATA_DIR, ROOT, docs_command, run_cli
from slurm_cluster import slurm

# the digits ViT on a tiny budget; 32 samples an optimizer step: 16 on each of two nodes, or 32 in one process
BUDGET = ["trainer.max_epochs=2", "trainer.limit_train_batches=12", "data.augment=null", "test=false",
          "extras.print_config=false", "callbacks.progress_bar=null", "data.num_workers=0", "global_batch_size=32"]


def env_for(log_dir: Path) -> dict[str, str]:
    return os.environ | {"PYTHONUNBUFFERED": "1", "ATTNLAB_DATA_DIR": str(DATA_DIR), "ATTNLAB_LOG_DIR": str(log_dir),
                         "ATTNLAB_CACHE_DIR": str(log_dir.parent / "cache"), "OMP_NUM_THREADS": "1",
                         "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def the_run_folder(log_dir: Path) -> Path:
    """The one run folder of the launch (runs/.launches holds the names rank 0 gave the other ranks)."""
    runs = sorted(p for p in (log_dir / "train" / "runs").iterdir() if not p.name.startswith("."))
    assert len(runs) == 1, f"one launch, {len(runs)} run folders: {[p.name for p in runs]}"
    return runs[0]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    log_dir = tmp_path_factory.mktemp("one_process") / "logs"
    out = run_cli("train.py", *BUDGET, "trainer=cpu", "data.batch_size=32", env=env_for(log_dir))
    assert out.returncode == 0, out.stdout[-3000:]
    return json.loads((the_run_folder(log_dir) / "metrics.json").read_text())


def assert_same_metrics(two_nodes: dict, one: dict, keys=("val/loss", "train/loss_epoch")) -> None:
    for key in keys:  # each step averages the same 32 samples' gradients
        assert two_nodes[key] == pytest.approx(one[key], abs=1e-4), key
    assert two_nodes["val/acc"] == pytest.approx(one["val/acc"], abs=1 / 180 + 1e-6)  # at most one of 180 samples


def launch_lines(text: str) -> list[str]:
    return [ln.split("launch: ", 1)[1] for ln in text.splitlines() if "[attnlab][INFO] - launch: " in ln]


@pytest.mark.slow
def test_two_torchrun_agents_on_one_host_write_one_run_folder(tmp_path, one_process):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    log_dir, procs = tmp_path / "logs", []
    for rank in (0, 1):
        argv = docs_command("docs/clusters.md", f"torchrun --nnodes 2 --node-rank {rank} ")
        argv[argv.index("--master-port") + 1] = port
        argv[0:1] = [sys.executable, "-m", "torch.distributed.run"]  # torchrun of this Python
        procs.append(subprocess.Popen([*argv, "trainer.num_nodes=2", "data.batch_size=16", *BUDGET], cwd=ROOT,
                                      env=env_for(log_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(o[-3000:] for o in outs)
    folder = the_run_folder(log_dir)
    assert launch_lines(outs[0]) == [
        f"rank 0 of torchrun (run id none, world size 2), as Lightning's TorchElasticEnvironment numbers it: run "
        f"folder {folder} (claimed, shared with the other ranks through the agent's store)"]
    assert launch_lines(outs[1]) == [
        f"rank 1 of torchrun (run id none, world size 2), as Lightning's TorchElasticEnvironment numbers it: run "
        f"folder {folder} (rank 0's, through the elastic agent's store)"]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in outs[1]
    # rank 0 alone writes Hydra's files, the log, metrics and checkpoints; rank 1 its own log
    assert "rank 0 of torchrun" in (folder / "train.log").read_text()
    assert "rank 1 of torchrun" in (folder / "train_rank1.log").read_text()
    assert (folder / ".hydra" / "config.yaml").is_file() and (folder / "checkpoints" / "last.ckpt").is_file()
    assert not (log_dir / "train" / "runs" / ".launches").exists()  # run id none: nothing to find again
    assert_same_metrics(json.loads((folder / "metrics.json").read_text()), one_process)


SRUN_TORCHRUN = """#!/bin/bash
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun bash -c "{python} -m torch.distributed.run --nnodes 2 --node-rank \\$SLURM_NODEID --nproc-per-node 1 \\
  --master-addr $head --master-port {port} train.py trainer=multinode trainer.num_nodes=2 trainer.accelerator=cpu \\
  trainer.devices=1 trainer.precision=32-true data.batch_size=16 {budget}"
"""


@pytest.mark.slow
def test_srun_torchrun_in_a_users_batch_script_trains_under_torchruns_environment(slurm_cluster, tmp_path,
                                                                                  one_process):
    """`srun ... torchrun ...`: both environments are there; torchrun's wins, as Lightning decides, and the
    two nodes train in one run folder to the numbers of one process."""
    cluster = slurm_cluster(accounting=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_dir = tmp_path / "logs"
    script = tmp_path / "srun_torchrun.sbatch"
    script.write_text(SRUN_TORCHRUN.format(python=sys.executable, port=port, budget=shlex.join(BUDGET)))
    job = int(slurm("sbatch", "--parsable", "-N", "2", "--ntasks-per-node=1", "-c", "1", "-J",
                    "attnlab-test-multinode", "-o", str(tmp_path / "slurm-%j.out"), str(script), cwd=ROOT,
                    env=env_for(log_dir)).stdout.strip().split(";")[0])
    try:
        assert cluster.wait(job, timeout=300) == "COMPLETED", (tmp_path / f"slurm-{job}.out").read_text()[-3000:]
    finally:
        slurm("scancel", str(job), check=False)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    folder = the_run_folder(log_dir)
    # torchrun's agents may log a traceback of their own exit barrier when node 0's agent, which holds their store,
    # exits first (a race of torch's elastic agent, after every rank has finished): not a run's
    ours = "\n".join(line for line in out.splitlines() if "torch/distributed/elastic/agent/server/api.py" not in line)
    assert "Traceback" not in ours and "as Lightning's TorchElasticEnvironment numbers it" in out, out[-3000:]
    assert "SLURMEnvironment" not in out, out[-3000:]
    assert_same_metrics(json.loads((folder / "metrics.json").read_text()), one_process)


@pytest.mark.slow
def test_a_users_sbatch_script_trains_on_two_nodes_in_one_folder_and_a_requeue_continues_there(
        slurm_cluster, tmp_path, one_process):
    cluster = slurm_cluster(accounting=True)
    argv = docs_command("docs/clusters.md", "sbatch -N 2 --ntasks-per-node=1 ")
    log_dir = tmp_path / "logs"
    # -c 1: beside other jobs on the 4-CPU nodes; a checkpoint every 4 steps, so that the job is requeued mid-run
    argv[1:1] = ["--parsable", "-c", "1", "-o", str(tmp_path / "slurm-%j.out"), "-J", "attnlab-test-multinode"]
    job = int(slurm(*argv, *BUDGET, "data.batch_size=16", "callbacks.model_checkpoint.every_n_train_steps=4",
                    cwd=ROOT, env=env_for(log_dir)).stdout.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 120
        while not list(log_dir.glob("train/runs/*/checkpoints/last.ckpt")):
            assert time.monotonic() < deadline and cluster.state(job) in ("PENDING", "RUNNING", "CONFIGURING"), \
                f"job {job}: {cluster.state(job)}, no checkpoint"
            time.sleep(0.2)
        slurm("scontrol", "requeue", str(job))
        assert cluster.wait(job, timeout=240) == "COMPLETED"
    finally:
        slurm("scancel", str(job), check=False)
    out = (tmp_path / f"slurm-{job}.out").read_text()  # both attempts (--open-mode=append)
    folder = the_run_folder(log_dir)
    marker = log_dir / "train" / "runs" / ".launches" / f"slurm-attnlab-{job}.0.json"
    env = f"SLURM job {job}, step 0 (2 tasks), as Lightning's SLURMEnvironment numbers it: run folder {folder}"
    assert sorted(launch_lines(out)) == sorted([
        f"rank 0 of {env} (claimed, named to the other ranks in {marker})",
        f"rank 1 of {env} (rank 0's, named in {marker})",
        f"rank 0 of {env} (attempt 2: the folder of the first attempt)",
        f"rank 1 of {env} (rank 0's, named in {marker})"]), out[-3000:]
    assert "Restarts=1" in slurm("scontrol", "show", "job", str(job)).stdout
    assert f"resuming from {folder}/checkpoints/last.ckpt" in (folder / "train.log").read_text()
    assert "rank 1 of SLURM job" in (folder / "train_rank1.log").read_text()
    # the same weights (train/loss_epoch of the resumed epoch averages the batches after the requeue only)
    assert_same_metrics(json.loads((folder / "metrics.json").read_text()), one_process, keys=("val/loss",))


def test_a_rank_that_never_hears_of_rank_0s_folder_stops_with_one_paragraph(slurm_cluster, tmp_path):
    """As where the nodes share no filesystem: rank 1 waits $ATTNLAB_RANK_WAIT_S for rank 0's name of the folder."""
    slurm_cluster(accounting=True)
    log_dir = tmp_path / "logs"
    script = ('[ "$SLURM_PROCID" = 0 ] || exec python train.py trainer=multinode trainer.num_nodes=2 '
              'trainer.accelerator=cpu trainer.devices=1')  # rank 0 never starts
    out = slurm("srun", "-N", "2", "--ntasks-per-node=1", "-c", "1", "-J", "attnlab-test-multinode", "bash", "-c",
                script, check=False, timeout=120, cwd=ROOT, env=env_for(log_dir) | {"ATTNLAB_RANK_WAIT_S": "2"})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    paragraph = out.stderr.split("attnlab: error: ", 1)[1].splitlines()[0]
    assert re.fullmatch(
        r"rank 1 of SLURM job \d+, step 0 \(2 tasks\) waited 2 s for rank 0 to name the run folder in "
        + re.escape(str(log_dir / "train" / "runs" / ".launches")) + r"/slurm-attnlab-\d+\.0\.json, in vain\. The run "
        r"folders must be on a filesystem that every node shares .*\(raise \$ATTNLAB_RANK_WAIT_S\)\.", paragraph)
    assert not (log_dir / "train" / "runs").exists()  # no folder claimed by rank 1
