"""DDP on 2 CPU processes (gloo) optimizes exactly like one process with the same global batch."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

COMMON = ["trainer.max_epochs=2", "data.augment=null", "test=false", "extras.print_config=false",
          "callbacks.progress_bar=null", "trainer.limit_train_batches=12"]


def test_ddp_cpu_matches_one_process_with_the_same_global_batch(tmp_path, log_env):
    single = run_cli("train.py", *COMMON, "data.batch_size=32", "trainer.limit_train_batches=12",
                     f"hydra.run.dir={tmp_path}/single", env=log_env)
    assert single.returncode == 0, single.stdout[-3000:]
    ddp = run_cli("train.py", *COMMON, "trainer=ddp_cpu", "data.batch_size=16", f"hydra.run.dir={tmp_path}/ddp",
                  env=log_env)
    assert ddp.returncode == 0, ddp.stdout[-3000:]
    one = json.loads((tmp_path / "single" / "metrics.json").read_text())
    two = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    # each global step sees the same 32 samples, split 16 + 16 across the ranks; gradients are averaged
    assert two["val/loss"] == pytest.approx(one["val/loss"], abs=2e-3)
    assert two["val/acc"] == pytest.approx(one["val/acc"], abs=1 / 180 + 1e-6)
