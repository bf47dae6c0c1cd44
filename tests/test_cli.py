"""The entry points as a user runs them: `make train`, eval.py, predict.py, DDP, multirun, sweeps, W&B offline."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import DATA_DIR, ROOT, run_cli, run_here, wandb_offline

QUICK = ["trainer.max_epochs=1", "trainer.limit_train_batches=5", "trainer.limit_val_batches=2",
         "trainer.limit_test_batches=2", "extras.print_config=false", "callbacks.progress_bar=null"]


def _run_dirs(logs: Path) -> list[Path]:
    return sorted(p.parent for p in logs.rglob("config.yaml") if p.parent.name != ".hydra")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`make train`: the default experiment, exactly as the README says."""
    tmp = tmp_path_factory.mktemp("make_train")
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp / "logs"), "ATTNLAB_DATA_DIR": str(DATA_DIR)}
    # its own process group: a timeout ends train.py too, not only make
    proc = subprocess.Popen(["make", "-s", "train"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=1500)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout)
    assert out.returncode == 0, out.stdout[-3000:]
    (run_dir,) = _run_dirs(tmp / "logs")
    return out.stdout, run_dir


def stated_default_result() -> tuple[float, float, float]:
    """(the seed-42 test accuracy, the lowest and the highest over seeds 42, 1 and 2), as the README states them;
    docs/results.md and docs/vision.md state the same."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"\*\*([\d.]+)%\*\* \(seed 42; ([\d.]+)–([\d.]+)% over seeds 42, 1 and 2\)", readme)
    assert found, "README.md no longer states the default run's result as the test reads it"
    seed42, low, high = map(float, found.groups())
    results = " ".join((ROOT / "docs" / "results.md").read_text().split())
    assert f"reaches **{seed42}%** test accuracy" in results
    assert f"digits: **{seed42}%** test accuracy" in readme
    assert f"reaches {seed42}% test accuracy" in " ".join((ROOT / "docs" / "vision.md").read_text().split())
    assert low <= seed42 <= high
    return seed42, low, high


@pytest.mark.slow
def test_make_train_reaches_the_readmes_number_and_writes_the_run(default_run):
    stdout, run_dir = default_run
    acc = float(re.search(r"Test accuracy: ([\d.]+)%", stdout).group(1))
    _, low, high = stated_default_result()
    assert low <= acc <= high, (acc, low, high, stdout[-2000:])  # within the spread the README gives
    assert run_dir.parent.name == "runs" and run_dir.parents[1].name == "vit_digits" or "train"
    for name in ("config.yaml", "config_tree.log", ".hydra/config.yaml", "checkpoints/last.ckpt",
                 "csv/metrics.csv", "metrics.json", "train.log"):
        assert (run_dir / name).exists(), name
    assert len(list((run_dir / "checkpoints").glob("epoch_*.ckpt"))) == 1
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["test/acc"] * 100 == pytest.approx(acc, abs=0.01)
    assert metrics["val/acc_best"] >= metrics["val/acc"]
    header = (run_dir / "csv" / "metrics.csv").read_text().splitlines()[0]
    for key in ("train/loss", "val/acc", "val/acc_best", "lr", "perf/samples_per_s", "perf/mfu"):
        assert key in header, key


@pytest.mark.slow
def test_eval_reproduces_the_test_metric(default_run, tmp_path):
    _, run_dir = default_run
    (best,) = (run_dir / "checkpoints").glob("epoch_*.ckpt")
    out = run_here("eval.py", f"ckpt_path={best}", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stdout[-3000:]
    trained = json.loads((run_dir / "metrics.json").read_text())["test/acc"]
    evaluated = json.loads((tmp_path / "metrics.json").read_text())["test/acc"]
    assert evaluated == pytest.approx(trained, abs=1e-4)


@pytest.mark.slow
def test_predict_prints_top5_per_image(default_run, tmp_path):
    from sklearn.datasets import load_digits

    _, run_dir = default_run
    digits = load_digits()
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(10):
        Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8)).save(folder / f"digit{i}_{digits.target[i]}.png")
    out = run_here("predict.py", f"ckpt_path={run_dir}/checkpoints/last.ckpt", f"input={folder}",
                   f"hydra.run.dir={tmp_path}/out", "extras.print_config=false")
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(str(folder))]
    assert len(lines) == 10 and all(" 5. " in ln for ln in lines)
    right = sum(ln.split(": 1. ")[1].split()[0] == Path(ln.split(":")[0]).stem.split("_")[1] for ln in lines)
    assert right >= 8  # these are real digits: the trained model gets (nearly) all of them
    assert (tmp_path / "out" / "predictions.csv").read_text().count("\n") == 11


@pytest.mark.slow
def test_user_errors_print_one_paragraph_without_traceback(tmp_path, log_env):
    out = run_here("train.py", "data=mnist", f"data.data_dir={tmp_path}/missing", env=log_env)
    assert out.returncode == 2
    assert "attnlab: error: MNIST files not found in" in out.stdout and "Traceback" not in out.stdout
    out = run_here("eval.py", f"ckpt_path={tmp_path}/none.ckpt", env=log_env)
    assert out.returncode == 2 and "does not exist" in out.stdout and "Traceback" not in out.stdout
    for script in ("eval.py", "predict.py"):
        out = run_here(script, env=log_env)
        assert out.returncode == 2 and f"{script} needs a checkpoint: ckpt_path=" in out.stdout, out.stdout[-2000:]
    fake = tmp_path / "fake.ckpt"
    fake.write_bytes(b"not read: the device is refused first")
    out = run_here("predict.py", f"ckpt_path={fake}", "device=cuda", env=log_env | {"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2 and "device=cuda, but this machine has no CUDA GPU" in out.stdout


def _append_rows(path, worker: int) -> None:
    from attnlab.cli.training import append_row

    for i in range(5):
        append_row(path, {"job": f"{worker}.{i}", "value": i} | ({"test/acc": 0.5} if worker % 2 else {}))


def test_parallel_jobs_share_the_sweep_table(tmp_path):
    import csv
    import multiprocessing as mp

    path = tmp_path / "sweep" / "results.csv"
    procs = [mp.get_context("fork").Process(target=_append_rows, args=(path, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames == ["job", "value", "test/acc"]  # a row with a new metric added a column
    assert sorted(r["job"] for r in rows) == sorted(f"{w}.{i}" for w in range(4) for i in range(5))
    assert all((r["test/acc"] == "0.5") == (int(r["job"].split(".")[0]) % 2 == 1) for r in rows)
    assert not list(path.parent.glob("*.tmp"))


def wandb_records(offline_run: Path):
    """The records of an offline W&B run (its run-<id>.wandb file: W&B's leveldb-style log of protobuf records)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = offline_run.glob("run-*.wandb")
    data, block, i, buf = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while i + 7 <= len(data):
        if block - i % block < 7:  # a block's tail too short for a record header is padding
            i += block - i % block
            continue
        _, length, kind = struct.unpack("<IHB", data[i:i + 7])
        buf, i = buf + data[i + 7:i + 7 + length], i + 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


@pytest.mark.slow
def test_wandb_offline_logs_config_metrics_media_and_resumes_the_same_run(tmp_path, log_env):
    # no key: none in the environment, none in the netrc file W&B reads (HOME stays, so train.py runs forked)
    env = log_env | wandb_offline(tmp_path) | {"WANDB_MODE": "", "NETRC": str(tmp_path / "no-netrc")}
    out = run_cli("train.py", "logger=wandb", *QUICK, "test=false", "logger.wandb.log_model=true",
                  "logger.wandb.group=ablation-1", "tags=[vit,digits,baseline]", env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "W&B: no API key found" in out.stdout and "wandb sync" in out.stdout
    (run_dir,) = _run_dirs(tmp_path / "logs")
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    run_id = offline.name.rsplit("-", 1)[1]
    media = offline / "files" / "media"
    assert list(media.rglob("predictions*.table.json")) and list(media.rglob("*.png"))
    records = list(wandb_records(offline))
    (run,) = [r.run for r in records if r.HasField("run")]
    assert (run.run_group, run.job_type, list(run.tags)) == ("ablation-1", "train", ["vit", "digits", "baseline"])
    # logger.wandb.log_model=true: the checkpoints, recorded offline as versions of this run's model artifact
    models = [r.artifact for r in records if r.HasField("artifact") and r.artifact.type == "model"]
    assert {a.name for a in models} == {f"model-{run_id}"}
    (best,) = [a for a in models if "best" in a.aliases]
    assert json.loads(best.metadata)["original_filename"] == "epoch_000.ckpt"
    assert [e.path for e in best.manifest.contents] == ["model.ckpt"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["attnlab"]["wandb_run_id"] == run_id

    out = run_cli("train.py", "logger=wandb", *QUICK[1:], "trainer.max_epochs=2", "test=false",
                  f"ckpt_path={run_dir}/checkpoints/last.ckpt", env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    resumed = [d for d in _run_dirs(tmp_path / "logs") if d != run_dir][0]
    (offline2,) = (resumed / "wandb").glob("offline-run-*")
    assert offline2.name.endswith(run_id)  # the same W&B run continues


def test_incompatible_model_and_data_are_refused_with_the_choices(log_env, small_data):
    out = run_here("train.py", "model=swin", "data=tinyshakespeare", env=log_env, data_dir=small_data)
    assert out.returncode == 2 and "Traceback" not in out.stdout
    msg = out.stdout.split("attnlab: error: ")[1]
    assert "model=swin cannot train on data=tinyshakespeare" in msg
    assert "cifar10" in msg and "digits" in msg and "imagenet" in msg


HIDE_SUBMITIT = '''
import importlib.abc, sys

class _Hide(importlib.abc.MetaPathFinder):  # as if hydra-submitit-launcher were not installed
    def find_spec(self, name, path=None, target=None):
        if name == "hydra_plugins.hydra_submitit_launcher" or name.startswith("hydra_plugins.hydra_submitit_launcher."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Hide())
'''


def test_a_launcher_whose_plugin_is_missing_names_the_package_to_install(tmp_path, log_env):
    (tmp_path / "sitecustomize.py").write_text(HIDE_SUBMITIT)
    env = log_env | {"PYTHONPATH": str(tmp_path)}
    out = run_cli("train.py", "-m", "launcher=slurm", "launcher.partition=gpu", env=env, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stdout, out.stdout[-3000:]
    msg = out.stdout.split("attnlab: error: ")[1]
    assert "launcher=slurm" in msg and "'submitit_slurm' plugin, which is not installed" in msg
    assert "pip install hydra-submitit-launcher" in msg
    assert not (tmp_path / "logs").exists()  # stopped before anything ran


def test_a_sweep_over_a_key_missing_from_the_config_is_refused_before_any_job(tmp_path, log_env):
    out = run_here("train.py", "-m", "optimizer.lr=1e-3,3e-4", "optimizer.no_such_option=1,2", "debug=fdr",
                   env=log_env, timeout=120)
    assert out.returncode == 2 and "optimizer.no_such_option=1: optimizer=adamw (conf/optimizer/adamw.yaml) has no " \
                                   "key 'no_such_option'" in out.stdout, out.stdout[-2000:]
    assert "+optimizer.no_such_option" in out.stdout  # how to add a new key on purpose
    assert not list((tmp_path / "logs").rglob("config.yaml"))  # no job ran


@pytest.mark.slow
def test_scripts_end_without_the_interpreters_teardown_but_run_the_exit_handlers():
    """train.py & co. end through app.run_process: the exit status, the atexit handlers and the output are kept, and
    the teardown of torch's modules (its peak memory) is not paid."""
    import sys

    script = ("import atexit, resource, sys, torch\n"
              "atexit.register(lambda: print('handler ran', flush=True))\n"
              "def main():\n    print('main ran', end='')\n    sys.exit(3)\n"
              "if sys.argv[1] == 'run_process':\n"
              "    from attnlab.cli.app import run_process\n    run_process(main)\n"
              "main()\n")
    # measured from a small launcher process: a child of pytest would report pytest's own size (OWN_PEAK_LAUNCHER)
    launcher = ("import json, os, subprocess, sys\n"
                "proc = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)\n"
                "out = proc.stdout.read()\n"
                "_, status, usage = os.wait4(proc.pid, 0)\n"
                "print(json.dumps([os.waitstatus_to_exitcode(status), out, usage.ru_maxrss / 1024]))\n")
    peaks = {}
    for how in ("run_process", "normal"):
        result = subprocess.run([sys.executable, "-c", launcher, script, how], capture_output=True, text=True)
        code, out, peak = json.loads(result.stdout)
        assert code == 3 and out == "main ranhandler ran\n", (how, out, result.stderr[-2000:])
        peaks[how] = peak  # MB
    assert peaks["run_process"] < peaks["normal"] - 50, peaks


COUNT_COMPOSITIONS = """
import atexit, sys
from hydra._internal.hydra import Hydra
calls = []
compose_config = Hydra.compose_config
def counted(self, *args, **kwargs):
    calls.append(kwargs.get("run_mode"))
    return compose_config(self, *args, **kwargs)
Hydra.compose_config = counted
atexit.register(lambda: print("compositions:", len(calls), flush=True))
sys.argv = ["train.py", *sys.argv[1:]]
from attnlab.cli.train import run
run()
"""


@pytest.mark.slow
def test_a_run_composes_its_config_once_after_the_command_line_check(log_env):
    """attnlab's check of the command line composes the config (and reads hydra.mode from it); Hydra then composes it
    once to run it, not once more just to read the mode."""
    out = subprocess.run([sys.executable, "-c", COUNT_COMPOSITIONS, "debug=fdr"], capture_output=True, text=True,
                         env=os.environ | log_env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "compositions: 2" in out.stdout, out.stdout[-1000:]
