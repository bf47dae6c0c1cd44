"""`launcher=slurm` fits each job to its partition from the run's own settings, on the real two-node cluster of
tools/slurm-cluster.sh: a CPU sweep runs with no hand edits, two nodes train like one process with the same global
batch, and whatever sbatch would refuse is one paragraph naming the setting (exit status 2, nothing submitted). The
fitting itself is checked for a partition with GPUs, which this cluster has not, from its `sinfo` description."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from attnlab.cli.hydra_errors import check_composes
from attnlab.cli.slurm import fit_command_line, settings
from attnlab.cluster.nodes import Cluster, parse_gpus, parse_minutes, parse_sinfo
from attnlab.cli.slurm.fit import default_lead, fit
from attnlab.config import CONF_DIR
from attnlab.errors import UserError
from conftest import DATA_DIR, ROOT, run_cli
from slurm_cluster import slurm

TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "callbacks.progress_bar=null", "extras.print_config=false",
        "data.num_workers=0"]


def _job_dir(log_env: dict) -> "os.PathLike":
    from pathlib import Path

    sweeps = sorted((Path(log_env["ATTNLAB_LOG_DIR"]) / "train" / "multiruns").iterdir())
    assert len(sweeps) == 1, sweeps
    return sweeps[0]


def test_a_cpu_sweep_runs_on_its_partition_without_hand_edits(slurm_cluster, log_env):
    slurm_cluster(accounting=True)
    out = run_cli("train.py", "-m", "launcher=slurm", "launcher.partition=debug", "trainer=cpu", *TINY, env=log_env,
                  timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "attnlab: SLURM partition debug: 1 node x 1 task (trainer.devices=1), 1 CPU per task, no GPU per node, " \
           "time limit 1440 min (the partition's limit: no earlier job of this config on debug to estimate from), " \
           "USR1 120 s before it" in out.stdout
    sweep = _job_dir(log_env)
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    assert {"val/acc", "test/acc"} <= set(metrics)
    overrides = yaml.safe_load((sweep / "0" / ".hydra" / "overrides.yaml").read_text())
    assert {"launcher.tasks_per_node=1", "launcher.gpus_per_node=null", "launcher.cpus_per_task=1",
            "launcher.timeout_min=1440", "launcher.signal_delay_s=120"} <= set(overrides)
    script = next((sweep / ".submitit").glob("*/*_submission.sh")).read_text()
    for flag in ("--partition=debug", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=1440",
                 "--signal=USR1@120"):
        assert f"#SBATCH {flag}\n" in script, script
    assert "gpus-per-node" not in script and "gres" not in script


@pytest.mark.slow
def test_two_nodes_train_like_one_process_with_the_same_global_batch(slurm_cluster, log_env, tmp_path):
    """trainer=multinode trainer.num_nodes=2 on CPUs: one task on each node (gloo), one run folder, the same metrics
    as one local process with the same global batch (as trainer=ddp_cpu in test_distributed.py)."""
    slurm_cluster(accounting=True)
    common = ["trainer.max_epochs=2", "data.augment=null", "test=false", "extras.print_config=false",
              "callbacks.progress_bar=null", "trainer.limit_train_batches=6", "global_batch_size=32"]
    env = os.environ | {"PYTHONUNBUFFERED": "1", "ATTNLAB_DATA_DIR": str(DATA_DIR)} | log_env
    single = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *common, "data.batch_size=32",
                            f"hydra.run.dir={tmp_path}/single"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        two = run_cli("train.py", "-m", "launcher=slurm", "trainer=multinode", "trainer.num_nodes=2",
                      "trainer.accelerator=cpu", "trainer.precision=32-true", "data.batch_size=16", *common,
                      env=log_env, timeout=300)
        single_out, _ = single.communicate(timeout=300)
    finally:
        single.kill()
    assert two.returncode == 0, two.stdout[-3000:]
    assert single.returncode == 0, single_out[-3000:]
    assert "2 nodes x 1 task (trainer.devices=1)" in two.stdout
    sweep = _job_dir(log_env)
    job_id = next((sweep / ".submitit").glob("*/*_submission.sh")).name.split("_")[0]
    assert slurm("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "NodeList").stdout.split() == ["n[1-2]"]
    logs = "".join(p.read_text() for p in (sweep / ".submitit" / job_id).glob("*_log.err"))
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in logs and "GLOBAL_RANK: 1, MEMBER: 2/2" in logs
    assert "trainer.devices=1" in yaml.safe_load((sweep / "0" / ".hydra" / "overrides.yaml").read_text())
    one = json.loads((tmp_path / "single" / "metrics.json").read_text())
    both = json.loads((sweep / "0" / "metrics.json").read_text())
    # each global step sees the same 32 samples, split 16 + 16 across the nodes; gradients are averaged
    assert both["val/loss"] == pytest.approx(one["val/loss"], abs=2e-3)
    assert both["val/acc"] == pytest.approx(one["val/acc"], abs=1 / 180 + 1e-6)


REFUSED = {
    "unknown partition": (["launcher.partition=nope", "trainer=cpu"],
                          r"launcher\.partition=nope: this cluster has no partition 'nope'\. Set launcher\.partition "
                          r"to one of its partitions: debug \(default\): 2 nodes of \d+ CPUs"),
    "unknown account": (["launcher.account=nosuch", "trainer=cpu"],
                        r"launcher\.account=nosuch: SLURM's accounting has no account 'nosuch' for user \w+; theirs: "
                        r".*Set launcher\.account to one of them, or launcher\.account=null"),
    "unknown qos": (["launcher.qos=nosuch", "trainer=cpu"], r"launcher\.qos=nosuch: SLURM's accounting has no QOS"),
    "CPUs the nodes lack": (["launcher.cpus_per_task=64", "trainer=cpu"],
                            r"launcher\.cpus_per_task=64: the nodes of partition debug have (\d+) CPUs .* Set "
                            r"launcher\.cpus_per_task=\1 or fewer"),
    "more nodes than the partition": (["trainer=multinode", "trainer.num_nodes=3", "trainer.accelerator=cpu"],
                                      r"trainer\.num_nodes=3: partition debug has 2 nodes .* Set trainer\.num_nodes=2 "
                                      r"or fewer"),
    "GPUs on the CPU partition": (["launcher.gpus_per_node=1", "trainer=cpu"],
                                  r"launcher\.gpus_per_node=1: partition debug has no GPUs .* Set "
                                  r"launcher\.gpus_per_node=auto"),
    "a GPU trainer on the CPU partition": (["trainer=ddp", "trainer.num_nodes=2"],
                                           r"trainer\.accelerator=gpu: partition debug has no GPUs .* Train on its "
                                           r"CPUs with trainer\.accelerator=cpu"),
    "a time limit over the partition's": (["launcher.partition=short", "launcher.timeout_min=20", "trainer=cpu"],
                                          r"launcher\.timeout_min=20: partition short allows at most 10 minutes .* Set "
                                          r"launcher\.timeout_min=10 or less.* or launcher\.partition=debug"),
    "a node feature sbatch refuses": (["hydra.launcher.constraint=bigmem", "trainer=cpu"],
                                      r"sbatch refuses the job this run would submit to partition debug: \"Invalid "
                                      r"feature specification\" \(sbatch .*--partition=debug.*\)\. The setting: "
                                      r"hydra\.launcher\.constraint"),
    "sbatch missing": (["trainer=cpu"], r"launcher=slurm submits the jobs with SLURM's commands, and `sbatch` and "
                                        r"`sinfo` are not on this machine's PATH\. Run the command on the cluster's "
                                        r"login node"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_sbatch_would_refuse_is_one_paragraph_naming_the_setting(case, slurm_cluster, log_env, tmp_path):
    slurm_cluster(accounting=True)
    args, expected = REFUSED[case]
    env = log_env | ({"PATH": str(tmp_path / "no-slurm")} if case == "sbatch missing" else {})
    out = run_cli("train.py", "-m", "launcher=slurm", *args, *TINY, env=env, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    assert "Traceback" not in out.stdout
    error = out.stdout.split("attnlab: error: ", 1)[1].strip()
    assert "\n" not in error, error
    assert __import__("re").search(expected, error), error
    assert not (tmp_path / "logs").exists(), "nothing is created or submitted"


def test_signal_lead_and_time_limit_follow_the_partition(slurm_cluster):
    """The real partitions, sinfo and sbatch --test-only, nothing submitted: the short partition's own 10 minutes,
    a warning signal that stays within a fifth of a short limit, the user's own values kept, and the commands that
    are (and are not) SLURM multiruns."""
    slurm_cluster(accounting=True)

    def fit(argv: list[str]) -> list[str]:  # as the one step before Hydra fits it, from its composition
        return fit_command_line(argv, check_composes(argv, CONF_DIR, "train"))

    def fitted(*args: str) -> dict[str, str]:
        argv = fit(["-m", "launcher=slurm", "trainer=cpu", *args])
        return dict(a.split("=", 1) for a in argv if "=" in a)

    short = fitted("launcher.partition=short")
    assert (short["launcher.timeout_min"], short["launcher.signal_delay_s"]) == ("10", "120")
    one_minute = fitted("launcher.timeout_min=1")
    assert (one_minute["launcher.timeout_min"], one_minute["launcher.signal_delay_s"]) == ("1", "12")
    own = fitted("launcher.timeout_min=30", "launcher.signal_delay_s=60", "launcher.cpus_per_task=1",
                 "trainer.devices=2")  # the nodes' 2 CPUs, one for each task
    assert (own["launcher.signal_delay_s"], own["launcher.cpus_per_task"], own["launcher.tasks_per_node"]) == \
        ("60", "1", "2")
    with pytest.raises(UserError, match=r"launcher\.signal_delay_s=120 with launcher\.timeout_min=1: .* Set "
                                        r"launcher\.signal_delay_s=12 \(or auto\)"):
        fitted("launcher.timeout_min=1", "launcher.signal_delay_s=120")
    with pytest.raises(UserError, match=r"trainer\.num_nodes=1,2: launcher=slurm asks SLURM for the same resources "
                                        r"for every job of a sweep"):
        fitted("trainer.num_nodes=1,2")
    # an Optuna search is a multirun without -m (its config sets hydra.mode); a single run trains here, unfitted
    search = fit(["hparams_search=vit_digits_optuna", "launcher=slurm", "trainer=cpu"])
    assert "launcher.tasks_per_node=1" in search
    assert fit(["launcher=slurm", "trainer=cpu"]) == ["launcher=slurm", "trainer=cpu"]


def test_submitits_own_submission_error_is_one_paragraph(slurm_cluster):
    """What sbatch refuses at submission (here an array larger than the cluster's MaxArraySize, which
    --test-only of one job cannot see), as submitit raises it, becomes the same kind of paragraph."""
    from submitit.core.utils import CommandFunction, FailedJobError

    from attnlab.cli.slurm.sbatch import explain_submission

    slurm_cluster(accounting=True)
    with pytest.raises(FailedJobError) as raised:
        CommandFunction(["sbatch", "--test-only", "--array=0-100000", "--wrap=true"], verbose=False)()
    err = explain_submission(raised.value, {"launcher.partition": "debug"})
    assert isinstance(err, UserError)
    assert str(err).startswith("sbatch refuses the job this run would submit to partition debug: \"Invalid job array "
                               "specification\"")
    assert "split the sweep into smaller ones" in str(err) and "\n" not in str(err)


# ---- the fitting for a partition with GPUs (this cluster has none): sinfo's description in, the job's resources out

GPU_SINFO = """cpu*|up|1-00:00:00|16|32|192000|(null)
gpu|up|2-00:00:00|4|64|512000|gpu:a100:8(S:0-1)
gpu|up|2-00:00:00|2|32|256000|gpu:v100:4(S:0),shard:8
"""


def _gpu_cluster() -> Cluster:
    return Cluster(parse_sinfo(GPU_SINFO), accounts={"lab"}, qos={"normal"}, user="me")


def _compose(overrides: list[str]):
    cfg = check_composes(["launcher=slurm", *overrides], CONF_DIR, "train").configs[0]
    assert cfg is not None
    return settings(cfg, {o.split("=")[0] for o in overrides})


def test_sinfo_of_a_gpu_partition_is_read():
    parts = parse_sinfo(GPU_SINFO)
    assert parts["cpu"].default and not parts["gpu"].default
    assert [(k.count, k.cpus, k.mem_mb, k.gpus, k.gpu_type) for k in parts["gpu"].nodes] == \
        [(4, 64, 512000, 8, "a100"), (2, 32, 256000, 4, "v100")]
    assert parts["gpu"].time_limit_min == 2 * 1440 and parts["cpu"].max_gpus == 0
    assert parse_gpus("gpu:2,gpu:tesla:2(S:0)") == (4, "tesla") and parse_gpus("(null)") == (0, "")
    assert [parse_minutes(t) for t in ("10:00", "2:00:00", "1-00:00:00", "30", "infinite", "1-12")] == \
        [10, 120, 1440, 30, None, 2160]
    assert [default_lead(m) for m in (1, 2, 10, 60, 1440)] == [12, 24, 120, 120, 120]


def test_a_gpu_partition_gets_one_task_per_gpu():
    cluster = _gpu_cluster()
    # the README's command: all GPUs of each node, one task each, trainer.devices following
    job = fit(_compose(["launcher.partition=gpu", "trainer=ddp", "trainer.num_nodes=2"]), cluster)
    assert (job.nodes, job.gpus_per_node, job.tasks_per_node, job.devices) == (2, 8, 8, 8)
    assert job.cpus_per_task == 1 and job.timeout_min == 2880 and job.signal_delay_s == 120
    assert job.overrides()["launcher.gpus_per_node"] == 8
    # four of the eight GPUs, the loader's workers within the node's 64 CPUs / 4 tasks
    job = fit(_compose(["launcher.partition=gpu", "trainer=ddp", "trainer.devices=4", "data.num_workers=30"]), cluster)
    assert (job.gpus_per_node, job.tasks_per_node, job.devices, job.cpus_per_task) == (4, 4, 4, 16)
    # accelerator=auto takes the GPUs where the partition has them, and none on the CPU partition
    job = fit(_compose(["launcher.partition=gpu", "trainer.accelerator=auto"]), cluster)
    assert (job.gpus_per_node, job.tasks_per_node) == (1, 1)
    job = fit(_compose(["trainer.accelerator=auto"]), cluster)
    assert (job.partition.name, job.gpus_per_node, job.overrides()["launcher.gpus_per_node"]) == ("cpu", 0, None)
    # six nodes of 4 GPUs: the four a100 nodes and the two v100 nodes together
    job = fit(_compose(["launcher.partition=gpu", "trainer=ddp", "launcher.gpus_per_node=4", "trainer.num_nodes=6"]),
              cluster)
    assert (job.nodes, job.gpus_per_node) == (6, 4)


@pytest.mark.parametrize("overrides, message", [
    (["launcher.partition=gpu", "trainer=ddp", "launcher.gpus_per_node=16"],
     r"launcher\.gpus_per_node=16: the nodes of partition gpu have 8 GPUs each .* Set launcher\.gpus_per_node=8 or "
     r"fewer"),
    (["launcher.partition=gpu", "trainer=ddp", "trainer.num_nodes=5"],
     r"trainer\.num_nodes=5: only 4 nodes of partition gpu have 8 CPUs, 8 GPUs .* Set trainer\.num_nodes=4"),
    (["trainer=ddp"], r"trainer\.accelerator=gpu: partition cpu has no GPUs .* or launcher\.partition=gpu, a "
                      r"partition with GPUs"),
    (["launcher.partition=gpu", "trainer=cpu", "launcher.gpus_per_node=2"],
     r"launcher\.gpus_per_node=2 with trainer\.accelerator=cpu: the run trains on CPUs"),
    (["launcher.partition=gpu", "trainer=ddp", "trainer.devices=2", "launcher.gpus_per_node=4"],
     r"trainer\.devices=2 but launcher\.gpus_per_node=4"),
    (["launcher.partition=gpu", "trainer=ddp", "launcher.tasks_per_node=1"],
     r"launcher\.tasks_per_node=1 with 8 GPU\(s\) per node: Lightning runs one task per GPU"),
    (["launcher.partition=gpu", "trainer=ddp", "launcher.cpus_per_task=9"],
     r"launcher\.cpus_per_task=9: .* 8 for each of the 8 tasks per node\. Set launcher\.cpus_per_task=8 or fewer"),
    (["launcher.partition=gpu", "trainer=ddp", "launcher.mem_gb=1000"],
     r"launcher\.mem_gb=1000: the nodes of partition gpu have at most 500 GB"),
    (["launcher.partition=gpu", "trainer=ddp", "launcher.account=other"],
     r"launcher\.account=other: SLURM's accounting has no account 'other' for user me; theirs: lab"),
    (["launcher.partition='cpu,gpu'", "trainer=ddp"], r"attnlab fits a job to one partition"),
])
def test_what_a_gpu_partition_cannot_give_is_refused(overrides, message):
    with pytest.raises(UserError, match=message):
        fit(_compose(overrides), _gpu_cluster())
