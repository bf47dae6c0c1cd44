"""Checkpoints survive kills: SIGTERM saves the current state, a failed write never replaces a good file, and a
killed run started again in its directory continues exactly where it stopped."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from attnlab.checkpoints.io import AtomicCheckpointIO
from conftest import ROOT, DATA_DIR, run_cli, wandb_offline


def test_a_failed_checkpoint_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)

    def broken_write(self, checkpoint, file):
        with open(file, "wb") as fh:  # the disk fills up half-way through the file
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(AtomicCheckpointIO, "write", broken_write)
    with pytest.raises(OSError):
        io.save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["global_step"] == 1


@pytest.mark.slow
def test_sigterm_saves_the_current_step_before_exit(tmp_path):
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "ATTNLAB_DATA_DIR": str(DATA_DIR),
                        "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "trainer.max_epochs=50", "extras.print_config=false",
         "callbacks.progress_bar=null", f"hydra.run.dir={tmp_path}/run"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    deadline = time.time() + 300
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert last.exists(), "training never wrote its first checkpoint"
    first_step = torch.load(last, weights_only=False)["global_step"]
    time.sleep(1.5)  # well into the next epoch
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    saved = torch.load(last, weights_only=False)
    assert saved["global_step"] > first_step, out[-2000:]
    # a preempted run is not a finished one: SIGTERM's status, and a line naming what was saved
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert f"stopped on SIGTERM: step {saved['global_step']} is saved in {last}" in out, out[-2000:]


def _processes_of(run_dir) -> list[int]:
    """The processes whose command line names `run_dir` (a run's ranks)."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            if proc.isdigit() and str(run_dir).encode() in open(f"/proc/{proc}/cmdline", "rb").read():
                found.append(int(proc))
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("to", ["rank 0", "every rank"])
def test_sigterm_stops_a_run_of_two_ranks_after_the_same_step(tmp_path, to):
    """SIGTERM to one rank of a `trainer=ddp_cpu` run (the `kill` of its pid) or to all of them (as SLURM signals a
    step's tasks), at any moment: every rank stops after the same step, last.ckpt holds it, and the process ends with
    SIGTERM's status. Collectives inside a signal handler would meet ranks in another collective and wait forever."""
    run_dir = tmp_path / "run"
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "ATTNLAB_DATA_DIR": str(DATA_DIR),
                        "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "trainer=ddp_cpu", "trainer.devices=2", "trainer.max_epochs=50",
         "extras.print_config=false", "callbacks.progress_bar=null", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last, deadline = run_dir / "checkpoints" / "last.ckpt", time.time() + 300
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert last.exists(), "training never wrote its first checkpoint"
    time.sleep(1.5)  # well into the next epoch
    for pid in ([proc.pid] if to == "rank 0" else _processes_of(run_dir)):
        os.kill(pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        for pid in _processes_of(run_dir):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the ranks did not stop on SIGTERM to {to}:\n{proc.communicate()[0][-3000:]}")
    step = torch.load(last, weights_only=False)["global_step"]
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert out.count(f"stopped on SIGTERM: step {step} is saved in {last}") == 2, out[-3000:]


def _metrics(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.slow
def test_a_killed_run_started_again_in_its_directory_continues_exactly(tmp_path):
    """SIGKILL mid-epoch (no chance to save), then the same command again: the run resumes from the directory's
    last.ckpt at the same step, the same batch of the epoch and the same random state, in the same W&B run, and
    ends exactly where an uninterrupted run ends."""
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "ATTNLAB_DATA_DIR": str(DATA_DIR),
                        "PYTHONUNBUFFERED": "1", **wandb_offline(tmp_path)}
    args = [sys.executable, str(ROOT / "train.py"), "trainer.max_epochs=2", "logger=[csv,wandb]",
            "callbacks.model_checkpoint.every_n_train_steps=5", "extras.print_config=false",
            "callbacks.progress_bar=null", "callbacks.model_summary=null"]
    steps_per_epoch = 1258 // 32  # digits' training split, data.batch_size=32, last partial batch dropped

    def run(run_dir):
        out = subprocess.run([*args, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:]
        return out.stdout

    run(tmp_path / "whole")

    run_dir = tmp_path / "killed"
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen([*args, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    step, seen, deadline = 0, None, time.time() + 300
    while proc.poll() is None and time.time() < deadline:  # kill in the second epoch, after a mid-epoch save
        try:
            written = last.stat().st_mtime_ns
            if written != seen:  # read each save once (saved atomically: a new file replaces the old)
                seen, step = written, torch.load(last, weights_only=False, map_location="cpu")["global_step"]
        except OSError:  # not saved yet, or its link replaced meanwhile
            pass
        if step > steps_per_epoch:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    saved = torch.load(last, weights_only=False)
    assert steps_per_epoch < saved["global_step"] < 2 * steps_per_epoch, "the kill did not land mid-epoch"
    assert not (run_dir / "metrics.json").exists()
    (offline,) = (run_dir / "wandb").glob("offline-run-*")

    out = run(run_dir)  # the same command, into the same directory
    assert f"resuming from {last}" in out
    whole, resumed = _metrics(tmp_path / "whole"), _metrics(run_dir)
    for key in ("val/loss", "val/acc", "test/acc", "test/loss", "train/loss"):
        assert resumed[key] == pytest.approx(whole[key], abs=1e-5), key
    assert torch.load(last, weights_only=False)["global_step"] == 2 * steps_per_epoch
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and runs[1].name.endswith(offline.name.rsplit("-", 1)[1])  # the same W&B run id
    logged = pd.read_csv(run_dir / "csv" / "metrics.csv")
    assert (logged["epoch"] == 0).any() and (logged["epoch"] == 1).any()  # rows from before the kill are kept


@pytest.mark.slow
def test_ctrl_c_outside_training_ends_with_one_line_and_status_130():
    """Ctrl-C while a corpus is tokenized (before Lightning's own handler is there): one line, no traceback, and
    the shell's status for SIGINT."""
    script = ("import torch\nfrom attnlab.cli.app import run_process\n\n"
              "def main():\n    raise KeyboardInterrupt\n\nrun_process(main)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 130, out.stderr[-2000:]
    assert "attnlab: interrupted (Ctrl-C)" in out.stderr and "Traceback" not in out.stderr


# ---- faults of the machine: files written whole or not at all, and one paragraph naming the fix


def test_an_atomic_write_that_fails_leaves_neither_a_partial_file_nor_a_temporary(tmp_path):
    from attnlab.utils.atomic import atomic_path, write_text

    target = write_text(tmp_path / "cache.json", "good")
    for fault in (OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()):
        with pytest.raises(type(fault)):
            with atomic_path(target) as tmp:
                tmp.write_text("half")
                raise fault
        assert target.read_text() == "good" and sorted(p.name for p in tmp_path.iterdir()) == ["cache.json"]


@pytest.mark.parametrize("error, expected", [
    (OSError(errno.ENOSPC, "No space left on device", "{out}/checkpoints/.last.ckpt.77.tmp"),
     r"the disk is full \(No space left on device\) while writing {out}/checkpoints/last.ckpt.* point "
     r"paths.log_dir \(or ATTNLAB_LOG_DIR\) at a disk with room"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "{cache}/tokens/train.1.bin.tmp"),
     r"the disk is full .* point paths.cache_dir \(or ATTNLAB_CACHE_DIR\)"),
    (OSError(errno.EROFS, "Read-only file system", "{cache}/tokenizers/bpe-1.json"),
     r"writing {cache}/tokenizers/bpe-1.json failed: {cache}/tokenizers is read-only or not writable .* Point "
     r"paths.cache_dir \(or ATTNLAB_CACHE_DIR\) at a folder you can write to"),
    (RuntimeError("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's "
                  "workers are out of shared memory."), r"out of shared memory \(/dev/shm.*data.num_workers=0"),
    (RuntimeError("unable to write to file </torch_4242_1_0>: No space left on device (28)"),
     r"ran out of shared memory.*--shm-size"),
])
def test_a_fault_of_the_machine_is_one_paragraph_with_its_fix(tmp_path, error, expected):
    from omegaconf import OmegaConf

    from attnlab.cli.faults import explain

    out, cache = tmp_path / "run", tmp_path / "cache"
    (out / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 3}, out / "checkpoints" / "last.ckpt")
    cfg = OmegaConf.create({"paths": {"output_dir": str(out), "log_dir": str(tmp_path), "cache_dir": str(cache)}})
    if isinstance(error, OSError):
        error.filename = error.filename.format(out=out, cache=cache)
    wrapped = RuntimeError("while saving")  # however deep it was raised: the cause is found
    wrapped.__cause__ = error
    msg = str(explain(wrapped, cfg))
    assert re.search(expected.format(out=out, cache=cache), msg), msg
    assert f"ckpt_path={out / 'checkpoints' / 'last.ckpt'} resumes" in msg
    assert explain(ValueError("a bug"), cfg) is None and explain(OSError(errno.ENOENT, "gone"), cfg) is None


@pytest.mark.slow
def test_a_disk_that_fills_during_training_stops_with_one_paragraph_and_the_last_checkpoint_intact(
        tmp_path, monkeypatch, capsys):
    from attnlab.cli.app import run_app
    from attnlab.cli.training import train
    from conftest import FAST, compose_cfg

    saves = []
    real_write = AtomicCheckpointIO.write

    def filling_disk(self, checkpoint, file):
        saves.append(file)
        if len(saves) < 3:
            return real_write(self, checkpoint, file)
        with open(file, "wb") as fh:
            fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(file))

    monkeypatch.setattr(AtomicCheckpointIO, "write", filling_disk)
    out = tmp_path / "run"
    cfg = compose_cfg(["trainer.max_epochs=4", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                       "test=false", *FAST], out)
    with pytest.raises(SystemExit) as stop:
        run_app(train, cfg)
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    last = out / "checkpoints" / "last.ckpt"
    assert "attnlab: error: the disk is full (No space left on device) while writing" in err, err
    assert f"The last good checkpoint is {last}: ckpt_path={last} resumes from it." in err, err
    assert not [p for p in (out / "checkpoints").iterdir() if ".tmp" in p.name]
    assert torch.load(last, weights_only=False)["global_step"] > 0  # whole, and resumable


def test_a_move_onto_a_full_disk_names_the_destination_not_the_staged_file(tmp_path):
    from omegaconf import OmegaConf

    from attnlab.cli.faults import explain

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    cfg = OmegaConf.create({"paths": {"output_dir": str(out), "log_dir": str(tmp_path)}})
    # shutil.move of a file staged in TMPDIR, copied across disks: the error names the source first
    error = OSError(errno.ENOSPC, "No space left on device", "/elsewhere/tmp94uw65l9", None,
                    str(out / "checkpoints" / ".last.ckpt.77.tmp"))
    msg = str(explain(error, cfg))
    assert f"while writing {out / 'checkpoints' / 'last.ckpt'}: the filesystem mounted at /" in msg, msg
    assert "/elsewhere" not in msg


@pytest.fixture
def small_disk(tmp_path):
    """A 10 MB tmpfs of its own (a log disk that fills up); skipped where this user may not mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 10 MB tmpfs for the full disk ({mounted.stderr.strip()}): needs root, or "
                    "CAP_SYS_ADMIN in a container")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
def test_a_full_log_disk_is_named_with_the_checkpoint_not_the_temporary_folder(small_disk, tmp_path, monkeypatch,
                                                                                capsys):
    import shutil
    import tempfile

    from attnlab.cli.app import run_app
    from attnlab.cli.training import train
    from conftest import FAST, compose_cfg

    elsewhere = tmp_path / "tmp"  # TMPDIR on another disk, with room
    elsewhere.mkdir()
    monkeypatch.setenv("TMPDIR", str(elsewhere))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read again from TMPDIR
    out = small_disk / "run"
    cfg = compose_cfg(["trainer.max_epochs=2", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                       "test=false", *FAST], out)
    # room for the run's config and logs, not for a checkpoint of the digits classifier (3.7 MB)
    (small_disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - 2**20))
    with pytest.raises(SystemExit) as stop:
        run_app(train, cfg)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    paragraph = re.search(r"attnlab: error: (.*)", err).group(1)
    assert re.match(rf"the disk is full \(No space left on device\) while writing {out}/checkpoints/[\w=.-]+\.ckpt: "
                    rf"the filesystem mounted at {small_disk} has [01] MiB free of 10 MiB", paragraph), paragraph
    assert str(elsewhere) not in paragraph and ".tmp" not in paragraph
    assert not [p for p in (out / "checkpoints").iterdir() if ".tmp" in p.name]
    assert not [p for p in elsewhere.iterdir() if p.is_file()]  # nothing staged in TMPDIR (Lightning's tmpXXXXXXXX)


def test_runs_started_in_the_same_second_each_claim_a_run_directory_of_their_own(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import attnlab.utils.atomic as atomic
    from attnlab.config import CONF_DIR

    monkeypatch.setenv("ATTNLAB_LOG_DIR", str(tmp_path / "logs"))
    frozen = "2026-01-01_00-00-00"
    dirs = []
    for process in range(3):  # three processes starting in one second: each its own, none shared
        monkeypatch.setattr(atomic, "_claimed", {})
        monkeypatch.delenv(atomic._claim_key(f"{tmp_path}/runs/{frozen}"), raising=False)  # started by no claimer
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            cfg = compose(config_name="train", overrides=[f"hydra.run.dir=${{claim_dir:{tmp_path}/runs/{frozen}}}"],
                          return_hydra_config=True)
        first, again = cfg.hydra.run.dir, cfg.hydra.run.dir  # resolved twice in one process: the same folder
        assert first == again
        dirs.append(first)
    assert dirs == [f"{tmp_path}/runs/{frozen}", f"{tmp_path}/runs/{frozen}_2", f"{tmp_path}/runs/{frozen}_3"]
    assert all(os.path.isdir(d) for d in dirs)
    # the shipped run directory is claimed the same way
    assert "run:\n  dir: ${claim_dir:" in (CONF_DIR / "hydra" / "default.yaml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("monitor, when", [("val/accuracy", "before"), ("train/acc_epoch", "after")])
def test_a_monitored_metric_never_logged_is_named_with_what_is_logged(monitor, when, tmp_path, capsys):
    from attnlab.cli.app import run_app
    from attnlab.cli.training import train
    from conftest import FAST, compose_cfg

    out = tmp_path / "run"
    cfg = compose_cfg([f"model.monitor={monitor}", "trainer.max_epochs=2", "trainer.limit_train_batches=2",
                       "trainer.limit_val_batches=1", *FAST], out)
    with pytest.raises(SystemExit) as stop:
        run_app(train, cfg)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert f"the checkpoints rank runs by monitor={monitor} (model.monitor, or callbacks.model_checkpoint.monitor), " \
           "but the model never logs that metric" in err, err
    assert "It logs: " in err and "val/acc" in err.split("It logs: ")[1]
    last = out / "checkpoints" / "last.ckpt"
    if when == "before":  # the sanity check's batches show it before any training
        assert "(checked on the sanity-check batches, before training)" in err and not last.exists()
        assert "Did you mean val/acc" in err
    else:  # found at the first validation: the training so far is kept
        assert f"The training so far is saved in {last}" in err
        assert torch.load(last, weights_only=False)["global_step"] == 2


def test_wandb_credentials_are_looked_for_where_wandb_reads_them(tmp_path, monkeypatch):
    """`wandb login` writes the key to $NETRC when it is set, else to ~/.netrc: the offline decision (no key: log
    offline) reads the same file W&B would."""
    from attnlab.loggers import wandb_has_credentials

    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k" + "0" * 39 + "\n")
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_API_KEY", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    assert wandb_has_credentials()
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))  # W&B reads only this one now
    assert not wandb_has_credentials()
    (tmp_path / "elsewhere").write_text((home / ".netrc").read_text())
    monkeypatch.setenv("NETRC", str(tmp_path / "elsewhere"))
    assert wandb_has_credentials()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")  # a key for another host does not count
    assert not wandb_has_credentials()


@pytest.mark.slow
def test_wandb_folders_go_to_the_run_folder_when_home_cannot_be_written(tmp_path, monkeypatch):
    from attnlab.loggers import wandb_logger

    home = tmp_path / "home"
    home.write_text("a file, not a folder: nothing can be created under it")
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "mine"))  # one the user set stays
    run_dir = tmp_path / "run"
    logger = wandb_logger(save_dir=str(run_dir), offline=True)
    assert os.environ["WANDB_CACHE_DIR"] == str(run_dir / "wandb" / "cache")
    assert os.environ["WANDB_CONFIG_DIR"] == str(run_dir / "wandb" / "config")
    assert os.environ["WANDB_DATA_DIR"] == str(tmp_path / "mine")
    import wandb

    run = logger.experiment  # W&B starts, logs and stages an artifact without touching HOME
    run.log({"val/acc": 0.5})
    (tmp_path / "weights.txt").write_text("w")
    artifact = wandb.Artifact("model", type="model")
    artifact.add_file(str(tmp_path / "weights.txt"))
    run.log_artifact(artifact)
    run.finish()
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.mark.slow
def test_a_second_sigterm_ends_at_once_leaving_no_temporary_file_and_the_wandb_run_ended(tmp_path):
    """A second SIGTERM stops the process at once (the current step is lost), but what can be ended is: the
    temporary file of a checkpoint being written is removed, and the W&B run is marked ended with status 143. Both
    signals come while a checkpoint is being written; where that write ended before the second could be sent (a busy
    machine), the scenario is run again, at most three times."""
    from conftest import wandb_records

    for attempt in range(3):
        run_dir = tmp_path / f"run{attempt}"
        env = os.environ | wandb_offline(tmp_path) | {"ATTNLAB_DATA_DIR": str(DATA_DIR), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), "trainer.max_epochs=50", "logger=wandb",
             "+model.backbone_kwargs={embed_dim:384,depth:12,num_heads:6}",
             "+callbacks.model_checkpoint.every_n_train_steps=1", "callbacks.progress_bar=null",
             "extras.print_config=false", f"hydra.run.dir={run_dir}"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        checkpoints, deadline = run_dir / "checkpoints", time.time() + 300
        while not checkpoints.is_dir() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)  # until the first checkpoint is saved (one each step from then on)
        while not list(checkpoints.glob(".*.tmp*")) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.002)  # until a checkpoint is being written
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        during = bool(list(checkpoints.glob(".*.tmp*")))  # the write still going: the second SIGTERM comes during it
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
        if during or "stopped at once on a second SIGTERM" in out:
            break
    assert "stopped at once on a second SIGTERM" in out, out[-3000:]
    assert not [p.name for p in checkpoints.iterdir() if ".tmp" in p.name]
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    exits = [r.exit.exit_code for r in wandb_records(run_file) if r.WhichOneof("record_type") == "exit"]
    assert exits == [128 + signal.SIGTERM], exits


# a user's callback that interrupts the run once (the marker file says it has), at the last validation (after step 8):
# `kill` ends the process at once (as SIGKILL would) as it starts; `sigterm` sends the process SIGTERM after its first
# batch, `sigterm_after` after its end
INTERRUPT_AT_VALIDATION = '''
import os
import signal
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class Interrupt(Callback):
    def __init__(self, marker: str, how: str):
        self.marker, self.how = Path(marker), how

    def now(self, trainer, how: str, step: int) -> bool:
        if self.how != how or trainer.sanity_checking or trainer.global_step != step or self.marker.exists():
            return False
        self.marker.touch()
        return True

    def on_validation_start(self, trainer, pl_module):
        if self.now(trainer, "kill", 8):
            os._exit(137)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.now(trainer, "sigterm", 8):
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_end(self, trainer, pl_module):
        if self.now(trainer, "sigterm_after", 8):
            os.kill(os.getpid(), signal.SIGTERM)
'''
VALIDATED = ["trainer.max_epochs=2", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
             "trainer.limit_test_batches=2", "data.num_workers=0", "callbacks.model_checkpoint.every_n_train_steps=2",
             "extras.print_config=false", "callbacks.progress_bar=null", "callbacks.model_summary=null"]


@pytest.fixture(scope="module")
def validated_whole(tmp_path_factory) -> dict:
    """The final metrics of the run the interrupted ones are compared with, left alone."""
    tmp = tmp_path_factory.mktemp("validated")
    whole = run_cli("train.py", *VALIDATED, f"hydra.run.dir={tmp / 'whole'}", env={"ATTNLAB_LOG_DIR": str(tmp)})
    assert whole.returncode == 0, whole.stdout[-3000:]
    return json.loads((tmp / "whole" / "metrics.json").read_text())


@pytest.mark.parametrize("how, status, saved", [
    ("kill", 137, 6),
    pytest.param("sigterm", 128 + signal.SIGTERM, 8, marks=pytest.mark.slow),
    pytest.param("sigterm_after", 128 + signal.SIGTERM, 8, marks=pytest.mark.slow)])
def test_a_run_interrupted_at_a_validation_resumes_to_the_numbers_of_the_run_left_alone(
        how, status, saved, validated_whole, tmp_path):
    """Killed as the last validation starts (the last save is the step save before, the one after the last step
    waiting for that validation), stopped by SIGTERM during the last validation (resumed, it runs that validation again whole), or after it (resumed, nothing is left to
    train: the results are those saved): the run started again ends with the numbers of the run left alone, its
    training metrics over whole epochs (the epoch's running ones are in the checkpoint)."""
    (tmp_path / "interrupt.py").write_text(INTERRUPT_AT_VALIDATION)
    env = {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "PYTHONPATH": str(tmp_path)}
    interrupt = ["+callbacks.interrupt._target_=interrupt.Interrupt", f"+callbacks.interrupt.how={how}",
                 f"+callbacks.interrupt.marker={tmp_path / 'interrupted'}"]
    run_dir = tmp_path / "resumed"
    first = run_cli("train.py", *VALIDATED, *interrupt, f"hydra.run.dir={run_dir}", env=env)
    assert first.returncode == status and (tmp_path / "interrupted").exists(), first.stdout[-3000:]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == saved
    again = run_cli("train.py", *VALIDATED, *interrupt, f"hydra.run.dir={run_dir}", env=env)
    assert again.returncode == 0 and f"resuming from {run_dir / 'checkpoints' / 'last.ckpt'}" in again.stdout
    resumed = json.loads((run_dir / "metrics.json").read_text())
    for key in ("val/loss", "val/acc", "val/acc_best", "test/acc", "train/acc", "train/loss_epoch"):
        assert resumed[key] == pytest.approx(validated_whole[key], abs=1e-5), (key, resumed, validated_whole)


def test_weights_that_do_not_fit_the_network_are_one_paragraph_naming_the_checkpoint(tmp_path, capsys):
    """torch's refusal of a state dict of another network (unknown keys, other shapes), raised wherever Lightning or
    attnlab loads one, reaches the user as one paragraph naming ckpt_path and what to give instead."""
    from omegaconf import OmegaConf

    from attnlab.cli.app import run_app

    saved = torch.nn.Linear(4, 2).state_dict()
    cfg = OmegaConf.create({"ckpt_path": str(tmp_path / "other.ckpt"), "paths": {"output_dir": str(tmp_path)}})

    def load_into_this_network(_):
        try:
            torch.nn.Linear(8, 2).load_state_dict(saved)
        except RuntimeError as e:
            raise RuntimeError("while restoring the checkpoint") from e  # found however deep in the chain

    with pytest.raises(SystemExit) as stop:
        run_app(load_into_this_network, cfg)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert f"ckpt_path: {tmp_path / 'other.ckpt'} holds weights that do not fit the network this run builds" in err
    assert "size mismatch for weight" in err and "<run dir>/checkpoints/" in err
