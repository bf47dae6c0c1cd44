"""A run keeps each step's weights once on disk: last.ckpt is a link to the checkpoint of the same step (a hard link,
else a relative symbolic link, else a copy), replaced in one rename, never dangling, and runs resume from it."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest
import torch

from attnlab.checkpoints.reading import newest_last
from attnlab.utils.atomic import link_file
from conftest import FAST, compose_cfg, run_here


def _files(folder: Path) -> dict[tuple[int, int], int]:
    """The bytes the folder's checkpoints hold on disk: one entry per file (inode), symbolic links left out."""
    return {(st.st_dev, st.st_ino): st.st_size for p in folder.glob("*.ckpt") if not p.is_symlink()
            for st in [p.stat()]}


def _steps(folder: Path) -> set[int]:
    return {torch.load(p, weights_only=False, map_location="cpu")["global_step"] for p in folder.glob("*.ckpt")}


def _step(path: Path) -> int:
    return torch.load(path, weights_only=False, map_location="cpu")["global_step"]


@pytest.mark.slow
def test_a_run_keeps_each_step_once_and_resumes_from_its_linked_last_ckpt(tmp_path, log_env):
    run_dir = tmp_path / "run"
    args = ["trainer.limit_train_batches=5", "trainer.limit_val_batches=2", "test=false", "extras.print_config=false",
            "callbacks.progress_bar=null", f"hydra.run.dir={run_dir}"]
    ckpts = run_dir / "checkpoints"
    last = ckpts / "last.ckpt"
    out = run_here("train.py", *args, "trainer.max_epochs=1", env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert _step(last) == 5 and os.path.samefile(last, ckpts / "epoch_000.ckpt")  # one file, two names

    # the same command with one more epoch into the same folder (a SLURM requeue): it resumes from last.ckpt
    out = run_here("train.py", *args, "trainer.max_epochs=2", env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert f"resuming from {last}" in out.stdout
    assert _step(last) == 10  # the newest step
    assert not list(ckpts.glob("last-v*.ckpt"))  # the resumed run refreshes the same last.ckpt
    # one copy per distinct step saved, not the newest twice
    assert len(_files(ckpts)) == len(_steps(ckpts))
    assert sum(_files(ckpts).values()) < 1.1 * last.stat().st_size * len(_steps(ckpts))
    assert not [p.name for p in ckpts.iterdir() if ".tmp" in p.name or not p.name.endswith(".ckpt")]


@pytest.mark.slow
def test_last_ckpt_is_written_itself_at_a_step_no_top_k_checkpoint_holds(tmp_path):
    from attnlab.cli.training import train

    # ranked by the lowest step: epoch 0 stays the best, the later steps are held by last.ckpt alone
    base = ["trainer.limit_train_batches=5", "trainer.limit_val_batches=2", "test=false",
            "callbacks.model_checkpoint.monitor=step", "callbacks.model_checkpoint.mode=min", *FAST]
    train(compose_cfg([*base, "trainer.max_epochs=3"], tmp_path / "first"))
    ckpts = tmp_path / "first" / "checkpoints"
    last = ckpts / "last.ckpt"
    assert _step(last) == 15 and _step(ckpts / "epoch_000.ckpt") == 5
    assert os.stat(last).st_nlink == 1 and len(_files(ckpts)) == 2

    # ckpt_path=<run>/checkpoints/last.ckpt continues from it
    train(compose_cfg([*base, "trainer.max_epochs=4", f"ckpt_path={last}"], tmp_path / "second"))
    assert _step(tmp_path / "second" / "checkpoints" / "last.ckpt") == 20


@pytest.mark.slow
@pytest.mark.parametrize("allowed", ["symlink", "copy"])
def test_without_hard_links_last_ckpt_is_a_symlink_that_never_dangles_else_a_copy(tmp_path, monkeypatch, allowed):
    from attnlab.cli.training import train
    from attnlab.compat.checkpoint import CheckpointBase

    def refused(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refused)
    if allowed == "copy":
        monkeypatch.setattr(os, "symlink", refused)
    seen = []  # what last.ckpt holds right after top-k deletes a checkpoint (a kill there leaves that)
    prune = CheckpointBase._remove_checkpoint

    def watched(self, trainer, filepath):
        prune(self, trainer, filepath)
        seen.append(_step(Path(self.dirpath) / "last.ckpt"))

    monkeypatch.setattr(CheckpointBase, "_remove_checkpoint", watched)
    out = tmp_path / "run"
    # ranked by the highest step: each epoch's checkpoint replaces the one before
    train(compose_cfg(["trainer.max_epochs=3", "trainer.limit_train_batches=5", "trainer.limit_val_batches=2",
                       "test=false", "callbacks.model_checkpoint.monitor=step", "callbacks.model_checkpoint.mode=max",
                       *FAST], out))
    ckpts = out / "checkpoints"
    last = ckpts / "last.ckpt"
    assert seen == [5, 10]
    assert sorted(p.name for p in ckpts.iterdir()) == ["epoch_002.ckpt", "last.ckpt"]
    assert _step(last) == 15
    if allowed == "symlink":
        assert os.readlink(last) == "epoch_002.ckpt" and len(_files(ckpts)) == 1
    else:
        assert not last.is_symlink() and len(_files(ckpts)) == 2


def test_link_file_replaces_the_previous_file_in_one_rename_and_leaves_no_temporary(tmp_path, monkeypatch):
    old, new, last = tmp_path / "epoch_000.ckpt", tmp_path / "epoch_001.ckpt", tmp_path / "last.ckpt"
    old.write_bytes(b"step 5")
    new.write_bytes(b"step 10")
    assert link_file(old, last) == "hard link"
    old.unlink()  # top-k pruned it: last.ckpt keeps its bytes
    assert last.read_bytes() == b"step 5"
    assert link_file(new, last) == "hard link" and os.path.samefile(new, last)
    assert link_file(new, last) == "hard link"  # again: nothing changes, nothing left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_001.ckpt", "last.ckpt"]

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    monkeypatch.setattr(os, "symlink", full)
    monkeypatch.setattr("shutil.copyfile", full)
    old.write_bytes(b"step 15")
    with pytest.raises(OSError, match="No space left"):
        link_file(old, last)
    assert last.read_bytes() == b"step 10"  # the previous last.ckpt, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_000.ckpt", "epoch_001.ckpt", "last.ckpt"]
    with pytest.raises(FileNotFoundError):
        link_file(tmp_path / "gone.ckpt", last)  # never a link to nothing


def test_ckpt_path_last_takes_the_run_whose_last_step_was_written_last(tmp_path):
    older, newer, broken = (tmp_path / name / "checkpoints" for name in ("a", "b", "c"))
    for folder in (older, newer, broken):
        folder.mkdir(parents=True)
    (older / "epoch_000.ckpt").write_bytes(b"a")
    (newer / "last.ckpt").write_bytes(b"b")
    os.utime(older / "epoch_000.ckpt", (time.time() - 60,) * 2)
    # a link made later than the newer run's file: its step is still the older one
    os.symlink("epoch_000.ckpt", older / "last.ckpt")
    os.symlink("epoch_000.ckpt", broken / "last.ckpt")  # dangling (its file deleted by hand): skipped
    assert newest_last(tmp_path) == newer / "last.ckpt"


def test_a_scripts_scratch_folder_is_gone_when_it_exits(tmp_path):
    """attnlab.utils.atomic.scratch_folder (the benchmarks' runs and images): in the temporary folder, removed with
    what it holds at the script's exit."""
    import subprocess
    import sys

    script = ("from attnlab.utils.atomic import scratch_folder\n"
              "folder = scratch_folder('attnlab-bench-')\n"
              "(folder / 'run').mkdir()\n"
              "(folder / 'run' / 'last.ckpt').write_bytes(b'0' * 100)\n"
              "print(folder)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env=os.environ | {"TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    folder = Path(out.stdout.strip())
    assert folder.parent == tmp_path and folder.name.startswith("attnlab-bench-")
    assert not folder.exists() and not any(tmp_path.iterdir())
