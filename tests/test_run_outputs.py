"""What a run writes stays in its run folder: never in the working directory, and never tracked in git."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT

# what runs write (attnlab's run folders, Lightning's, W&B's, Hydra's), wherever it would sit in the repository
RUN_OUTPUT = re.compile(r"""(^|/)(media/.*\.(png|jpe?g|gif)$          # validation pictures, confusion matrices
                              |alignments/.*\.png$
                              |[^/]*\.ckpt$                           # checkpoints
                              |(logs|lightning_logs|wandb|outputs|multirun|\.hydra|csv)/  # run and logger folders
                              |(metrics\.(csv|json)|lineage\.(json|diff)|config_tree\.log|predictions\.csv)$
                              |[^/]*tfevents[^/]*$
                              |val_epoch\d+_step\d+\.png$)""", re.X)


def test_no_run_output_is_tracked_in_git():
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout (an unpacked source archive): no tracked files to check")
    tracked = [p for p in listed.stdout.split("\0") if p and RUN_OUTPUT.search(p)]
    assert not tracked, (f"run outputs are tracked in git: {', '.join(tracked)}. They belong in their run folder "
                         "(logs/...): `git rm --cached` them")


def _pairs(root: Path) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.png")
        Image.fromarray(rng.choice(np.array([0, 1, 2], np.uint8), (32, 32)), "L").save(root / "masks" / f"im{i}.png")
    return root


@pytest.mark.parametrize("where", ["no run folder", "lightning's logger", "run folder"])
def test_validation_pictures_go_to_the_run_folder_never_the_working_directory(tmp_path, monkeypatch, where):
    """A Trainer built without default_root_dir (in a notebook, or for Lightning's lr_find, as a range test of the
    membrane recipe was) falls back to the current directory: a checkout, where media/ got committed."""
    import lightning as L

    from attnlab.data.segmentation.datamodule import SegFolderDataModule
    from attnlab.tasks.segmentation import Segmenter

    checkout, run = tmp_path / "checkout", tmp_path / "run"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    dm = SegFolderDataModule(root=str(_pairs(tmp_path / "data")), classes=["a", "b", "c"], image_size=32,
                             val_fraction=0.25, batch_size=2)
    task = Segmenter(arch="unet", num_classes=3, in_chans=3, img_size=32, base_channels=4, depth=2,
                     optimizer={"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01})
    trainer = L.Trainer(max_steps=2, limit_val_batches=1, num_sanity_val_steps=0, enable_checkpointing=False,
                        logger=where == "lightning's logger", enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", **({"default_root_dir": run} if where == "run folder" else {}))
    trainer.fit(task, datamodule=dm)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.png") if "data" not in p.parts)
    assert not (checkout / "media").exists()
    if where == "no run folder":
        assert written == []
    elif where == "lightning's logger":  # its version folder (ignored by git, as lightning_logs/)
        assert written and all(re.fullmatch(r"checkout/lightning_logs/version_0/media/val_epoch\d+_step\d+\.png", p)
                               for p in written), written
    else:
        assert written == ["run/media/val_epoch000_step000001.png", "run/media/val_epoch001_step000002.png"]
