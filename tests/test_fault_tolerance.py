"""Checkpoints survive kills: SIGTERM saves the current state, and a failed write never replaces a good file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from attnlab.callbacks.checkpoint import AtomicCheckpointIO
from conftest import ROOT, SHARED_DATA


def test_a_failed_checkpoint_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)

    def broken_write(self, checkpoint, path, storage_options=None):
        with open(path, "wb") as fh:  # the disk fills up half-way through the file
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", broken_write)
    with pytest.raises(OSError):
        io.save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["global_step"] == 1


def test_sigterm_saves_the_current_step_before_exit(tmp_path):
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "ATTNLAB_DATA_DIR": str(SHARED_DATA),
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
    assert "SIGTERM" in out
