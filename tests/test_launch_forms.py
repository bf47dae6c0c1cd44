"""Every way a user starts a training run on one machine, each as a user's new process (never a fork of the test
process), one epoch of the default run on a tiny budget: each ends with its test metrics in one run folder.

The forms on a SLURM cluster (`srun` in a batch script of one's own, `srun ... torchrun ...`, `launcher=slurm` on one
node and on two, a job requeued) and two `torchrun --nnodes 2` agents are in tests/test_multinode_launch.py and
tests/test_slurm_*.py; LAUNCH_FORMS below names where each form is tested, and a test checks that every launch
command shown in README.md and docs/ is one of them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

BIN = Path(sys.executable).parent
# one epoch of the default run (the digits ViT), a few batches of each split
BUDGET = ["trainer.max_epochs=1", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
          "trainer.limit_test_batches=2", "data.num_workers=0", "callbacks.progress_bar=null",
          "extras.print_config=false"]
DDP = ["trainer=ddp_cpu", "trainer.devices=2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_env(tmp: Path) -> dict[str, str]:
    """A user's shell: the venv's scripts on PATH, the logs and caches under `tmp`, nothing else of the tests'."""
    return os.environ | {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
                         "ATTNLAB_LOG_DIR": str(tmp / "logs"), "ATTNLAB_CACHE_DIR": str(tmp / "cache"),
                         "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "OMP_NUM_THREADS": "1"}


def launch(argv: list[str], tmp: Path, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """`argv` as a user types it, in a new process group (a timeout ends every rank it started)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=user_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(argv)} ran past {timeout} s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def run_folders(tmp: Path) -> list[Path]:
    runs = tmp / "logs" / "train" / "runs"
    return sorted(p for p in runs.iterdir() if not p.name.startswith(".")) if runs.is_dir() else []


def assert_one_finished_run(out: subprocess.CompletedProcess, tmp: Path, ranks: int = 1) -> Path:
    """Exit 0, no traceback, one run folder holding the run's test metrics, its checkpoints and (for every rank
    beyond 0) the rank's own log."""
    assert out.returncode == 0, out.stdout[-4000:]
    assert "Traceback" not in out.stdout, out.stdout[-4000:]
    folders = run_folders(tmp)
    assert len(folders) == 1, f"one launch, {len(folders)} run folders: {[p.name for p in folders]}"
    folder = folders[0]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert 0 <= metrics["test/acc"] <= 1 and metrics["val/loss"] > 0, metrics
    assert f"run directory: {folder}" in out.stdout and "test/acc" in out.stdout
    assert (folder / "checkpoints" / "last.ckpt").exists() and (folder / ".hydra" / "config.yaml").is_file()
    for rank in range(1, ranks):
        assert any(folder.glob(f"train*{rank}.log")), f"rank {rank} wrote no log in {folder}"
    return folder


def launch_lines(text: str) -> list[str]:
    return [ln.split("launch: ", 1)[1] for ln in text.splitlines() if "[attnlab][INFO] - launch: " in ln]


def rdzv(run_id: str, port: int) -> list[str]:
    return ["torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
            "--nproc-per-node", "2"]


# name -> (argv before the overrides, processes, where the form is tested)
LAUNCH_FORMS = {
    "python train.py": ([sys.executable, "train.py"], 1),
    "python -m attnlab.train": ([sys.executable, "-m", "attnlab.train"], 1),
    "attnlab-train": (["attnlab-train"], 1),  # from another directory: the configs ship in the package
    "python train.py trainer=ddp_cpu": ([sys.executable, "train.py", *DDP], 2),
    "torchrun --standalone": (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py", *DDP], 2),
    "torchrun": (["torchrun", "--nproc-per-node", "2", "train.py", *DDP], 2),
    "torchrun --rdzv-id": ([*rdzv("exp42", 0), "train.py", *DDP], 2),
}
ELSEWHERE = {  # launch forms of a cluster, tested where the cluster is
    "torchrun --nnodes 2": "tests/test_multinode_launch.py::test_two_torchrun_agents_on_one_host_write_one_run_folder",
    "sbatch ... srun python train.py": "tests/test_multinode_launch.py::test_a_users_sbatch_script_trains_on_two_nodes"
                                       "_in_one_folder_and_a_requeue_continues_there",
    "srun ... torchrun": "tests/test_multinode_launch.py::test_srun_torchrun_in_a_users_batch_script_trains_under_"
                         "torchruns_environment",
    "launcher=slurm": "tests/test_slurm_launcher.py::test_a_cpu_sweep_runs_on_its_partition_without_hand_edits",
    "launcher=slurm trainer.num_nodes=2": "tests/test_slurm_launcher.py::test_two_nodes_train_like_one_process_with_"
                                          "the_same_global_batch",
}
QUICK_FORMS = ("torchrun --standalone",)  # also in `make test-fast`
# forms whose launch, as LAUNCH_FORMS has it, is part of a longer test below, checked there the same way
RUN_BY = {"torchrun --rdzv-id": "test_a_killed_rdzv_id_launch_continues_in_its_folder_when_launched_again",
          "python train.py trainer=ddp_cpu": "test_a_run_folder_whose_last_ckpt_is_a_sharded_folder_continues_from_it"}


def assert_launched(out: subprocess.CompletedProcess, tmp: Path, ranks: int, torchrun: bool) -> Path:
    """assert_one_finished_run; under torchrun, each rank's launch line names the one run folder."""
    folder = assert_one_finished_run(out, tmp, ranks)
    if torchrun:
        lines = launch_lines(out.stdout)
        assert sorted(ln.split(" of ")[0] for ln in lines) == [f"rank {r}" for r in range(ranks)], out.stdout[-3000:]
        assert all(f"run folder {folder} " in ln for ln in lines), lines
    return folder


@pytest.mark.parametrize("form", [f if f in QUICK_FORMS else pytest.param(f, marks=pytest.mark.slow)
                                  for f in LAUNCH_FORMS if f not in RUN_BY])
def test_each_launch_form_ends_with_its_test_metrics_in_one_run_folder(form, tmp_path):
    argv, ranks = LAUNCH_FORMS[form]
    argv = [f"127.0.0.1:{free_port()}" if a.endswith(":0") else a for a in argv]
    cwd = ROOT
    if form == "attnlab-train":
        cwd = tmp_path / "elsewhere"
        cwd.mkdir()
    out = launch([*argv, *BUDGET], tmp_path, cwd=cwd)
    assert_launched(out, tmp_path, ranks, torchrun=argv[0] == "torchrun" or "torch.distributed.run" in argv)


@pytest.mark.slow
def test_a_sweep_of_ddp_runs_writes_one_folder_per_job(tmp_path):
    out = launch([sys.executable, "train.py", "-m", "optimizer.lr=1e-3,3e-4", *DDP, *BUDGET], tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stdout, out.stdout[-4000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    lrs = [yaml.safe_load((sweep / j / "config.yaml").read_text())["optimizer"]["lr"] for j in jobs]
    assert lrs == [1e-3, 3e-4]
    for job in jobs:
        assert "test/acc" in json.loads((sweep / job / "metrics.json").read_text())
        assert (sweep / job / "train_ddp_process_1.log").exists()  # the second rank wrote into the job's folder


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{path} never appeared:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.2)


def kill_tree(pid: int) -> None:
    """SIGKILL to a process and all its descendants, found first and killed together (torchrun starts each worker in
    a session of its own, out of reach of the agent's process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    for each in tree:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_killed_rdzv_id_launch_continues_in_its_folder_when_launched_again(tmp_path):
    """kill -9 of every process of a `torchrun --rdzv-id` launch mid-way; the same command again continues in the
    same run folder from its last.ckpt, to the end of its budget. Launched a third time, after its run finished, the
    same id starts a new run in a new folder (docs/clusters.md)."""
    budget = ["trainer.max_epochs=2", "trainer.limit_train_batches=12", "trainer.limit_val_batches=2",
              "trainer.limit_test_batches=2", "data.num_workers=0", "callbacks.progress_bar=null",
              "extras.print_config=false", "callbacks.model_checkpoint.every_n_train_steps=2"]
    argv = [*rdzv("resumable", free_port()), "train.py", *DDP, *budget]
    first = subprocess.Popen(argv, cwd=ROOT, env=user_env(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not run_folders(tmp_path) and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    (folder,) = run_folders(tmp_path)
    wait_for(folder / "checkpoints" / "last.ckpt", first)
    kill_tree(first.pid)  # the agent and both ranks at once, as when the machine goes down
    first.communicate()
    import torch

    step = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["global_step"]
    assert 2 <= step < 24

    argv[argv.index("--rdzv-endpoint") + 1] = f"127.0.0.1:{free_port()}"  # the old agent's port may linger
    again = launch(argv, tmp_path)  # the form `torchrun --rdzv-id` of LAUNCH_FORMS, run to its end
    assert assert_launched(again, tmp_path, ranks=2, torchrun=True) == folder
    lines = launch_lines(again.stdout)
    assert any(ln.startswith("rank 0 ") and ln.endswith("(its run id launched before: that launch's folder)")
               for ln in lines), lines
    assert re.search(rf"resuming from {re.escape(str(folder / 'checkpoints' / 'last.ckpt'))}", again.stdout)
    last = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert last["global_step"] == 24  # the rest of the budget, not 24 more

    # the same id once its run has finished names no launch any more: a new run, in a folder of its own, from scratch
    argv[argv.index("--rdzv-endpoint") + 1] = f"127.0.0.1:{free_port()}"
    third = launch([*argv, "trainer.max_epochs=3"], tmp_path)
    assert third.returncode == 0, third.stdout[-3000:]
    (new,) = [f for f in run_folders(tmp_path) if f != folder]
    assert all(f"run folder {new} (claimed" in ln for ln in launch_lines(third.stdout) if ln.startswith("rank 0 "))
    assert "resuming from" not in third.stdout
    assert torch.load(new / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["global_step"] == 36
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")[
        "global_step"] == 24  # the finished run is left as it was


def documented_form(command: str) -> str | None:
    """The launch form a command of the docs is, by how it starts; None for a command that launches no run."""
    starts = [("torchrun --nnodes", "torchrun --nnodes 2"), ("python -m torch.distributed.run",
              "torchrun"),  # torchrun's own module ("torchrun --standalone", "torchrun --standalone"),
              ("torchrun --rdzv", "torchrun --rdzv-id"), ("torchrun", "torchrun"),
              ("sbatch", "sbatch ... srun python train.py"), ("attnlab-train", "attnlab-train"),
              ("python -m attnlab.train", "python -m attnlab.train"), ("python train.py -m", None),
              ("python train.py launcher=slurm", "launcher=slurm"), ("python train.py", "python train.py")]
    return next((form for start, form in starts if command.startswith(start + " ")), None)


def test_every_launch_command_in_the_docs_is_a_tested_form():
    """A launch form shown in README.md or docs/ (a line of a code block) is one of LAUNCH_FORMS or ELSEWHERE."""
    forms = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            form = documented_form(line.strip().removeprefix("$ "))
            if form:
                forms.add(form)
    assert {"torchrun --nnodes 2", "sbatch ... srun python train.py", "python train.py"} <= forms
    assert forms <= LAUNCH_FORMS.keys() | ELSEWHERE.keys(), forms - (LAUNCH_FORMS.keys() | ELSEWHERE.keys())


TO_SHARDS = """
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from attnlab.cli.builders import load_task
from attnlab.optim.param_groups import param_groups
from attnlab.checkpoints.resume import read_run_metadata


def by_name(optimizer_state, names):  # an optimizer's state keyed by parameter name, as FSDP's sharded state keys it
    ids = [i for group in optimizer_state["param_groups"] for i in group["params"]]
    name_of = dict(zip(ids, names))
    groups = [g | {"params": [name_of[i] for i in g["params"]]} for g in optimizer_state["param_groups"]]
    return {"state": {name_of[i]: s for i, s in optimizer_state["state"].items()}, "param_groups": groups}


src, out = sys.argv[1:]
dist.init_process_group("gloo")
ckpt = torch.load(src, map_location="cpu", weights_only=True)
meta = read_run_metadata(src)
task = load_task(src, meta)
name_of = {id(p): n for n, p in task.named_parameters()}
groups = param_groups(task, meta["config"]["optimizer"].get("weight_decay") or 0.0)
assert [len(g["params"]) for g in groups] == [len(g["params"]) for g in ckpt["optimizer_states"][0]["param_groups"]]
names = [name_of[id(p)] for g in groups for p in g["params"]]
state = {"model": ckpt.pop("state_dict")}
state |= {f"optimizer_{i}": by_name(o, names) for i, o in enumerate(ckpt.pop("optimizer_states"))}
dcp.save(state, checkpoint_id=out)  # each rank writes its part, over gloo
if dist.get_rank() == 0:
    torch.save(ckpt, f"{out}/meta.pt")  # the rest, as Lightning's FSDP strategy writes it
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_run_folder_whose_last_ckpt_is_a_sharded_folder_continues_from_it(tmp_path):
    """A run folder whose last.ckpt is a sharded checkpoint (a folder of torch.distributed.checkpoint shards and
    meta.pt, as Lightning's FSDP strategy writes it), started again on CPUs: it continues from that step, to the
    same numbers as the same folder continued in place from the checkpoint file, and its next last.ckpt is a file.
    The sharded folder is a copy of the first: a run folder moved elsewhere continues as it would have in place."""
    import shutil

    import torch

    # the form `python train.py trainer=ddp_cpu` of LAUNCH_FORMS
    first = launch([sys.executable, "train.py", *DDP, *BUDGET], tmp_path)
    folders = {"file": assert_launched(first, tmp_path, ranks=2, torchrun=False), "sharded": tmp_path / "sharded"}
    shutil.copytree(folders["file"], folders["sharded"], symlinks=True)
    last = tmp_path / "sharded" / "checkpoints" / "last.ckpt"
    script = tmp_path / "to_shards.py"
    script.write_text(TO_SHARDS)
    converted = launch(["torchrun", "--standalone", "--nproc-per-node", "2", str(script), str(last),
                        str(tmp_path / "shards")], tmp_path)
    assert converted.returncode == 0, converted.stdout[-3000:]
    last.unlink()
    (tmp_path / "shards").rename(last)
    assert (last / ".metadata").is_file() and (last / "meta.pt").is_file() and len(list(last.glob("*.distcp"))) == 2

    more = [*DDP, *BUDGET, "trainer.max_epochs=2"]
    results = {}
    for name in ("file", "sharded"):
        out = launch([sys.executable, "train.py", *more, f"hydra.run.dir={folders[name]}"], tmp_path)
        assert out.returncode == 0 and "Traceback" not in out.stdout, out.stdout[-3000:]
        checkpoints = folders[name] / "checkpoints"
        assert f"resuming from {checkpoints / 'last.ckpt'}" in out.stdout
        assert (checkpoints / "last.ckpt").is_file()  # the folder replaced by the next save
        assert torch.load(checkpoints / "last.ckpt", weights_only=True, map_location="cpu")["global_step"] == 8
        results[name] = json.loads((folders[name] / "metrics.json").read_text())
    assert results["sharded"] == pytest.approx(results["file"], abs=1e-6)
