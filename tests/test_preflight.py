"""preflight=true: the run's cost measured before waiting for it (speed, MFU, memory, duration, largest batch), with
nothing written to checkpoints or loggers; one line per job in a multirun."""

from __future__ import annotations

import re
import time

import pytest

from conftest import FAST, compose_cfg, run_cli

QUICK = ["trainer.max_epochs=-1", "trainer.limit_val_batches=4", "trainer.limit_test_batches=4",
         "trainer.val_check_interval=20", "trainer.check_val_every_n_epoch=null", "data.num_workers=0", *FAST]


def test_preflight_measures_the_run_and_its_duration_matches_the_real_run(tmp_path, caplog):
    from attnlab.cli.training import train

    caplog.set_level("INFO", logger="attnlab")
    cfg = compose_cfg(["preflight=true", "preflight_steps=6", "trainer.max_steps=80", *QUICK], tmp_path / "pre")
    assert train(cfg) is None
    text = caplog.text
    for what in ("parameters", "samples/s", "MFU", "GiB measured", "GiB estimated", "GiB available",
                 "the configured run", "largest batch", "data.batch_size ≈"):
        assert what in text, text[-2000:]
    run = tmp_path / "pre"
    assert not list(run.rglob("*.ckpt")) and not (run / "metrics.json").exists() and not (run / "csv").exists()
    m = re.search(r"the configured run  ≈ ([\d.]+) (s|min)", text)
    predicted = float(m.group(1)) * (60 if m.group(2) == "min" else 1)

    cfg = compose_cfg(["trainer.max_steps=80", *QUICK], tmp_path / "real")
    start = time.perf_counter()
    train(cfg)
    real = time.perf_counter() - start
    # the real run adds start-up and checkpoint writes to the steps preflight times: same order of magnitude
    assert predicted / 3 < real < predicted * 4, (predicted, real)


def test_preflight_in_a_multirun_prints_one_line_per_job(tmp_path, log_env):
    out = run_cli("train.py", "-m", "preflight=true", "preflight_steps=3", "optimizer.lr=1e-3,3e-3",
                  "trainer.max_steps=50", *QUICK, env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [l for l in out.stdout.splitlines() if "preflight job" in l]
    assert len(lines) == 2 and "optimizer.lr=0.003" in lines[1] or "optimizer.lr=3e-3" in lines[1], lines
    assert all("samples/s" in l and "run ≈" in l and "largest data.batch_size" in l for l in lines)
    assert not list((tmp_path / "logs").rglob("*.ckpt"))


def test_the_largest_batch_on_cpu_comes_from_the_estimate():
    from attnlab.cli.preflight import _largest_batch_cpu
    from attnlab.memory import GiB, MemoryEstimate

    est = MemoryEstimate("CPU", {"process": 1 * GiB, "gradients": GiB // 4, "optimizer state": GiB // 2,
                                 "activations": 2 * GiB}, available=8 * GiB)
    # 2 GiB of activations for 64 samples; 8 - 1.75 GiB left for them -> 200 samples
    assert _largest_batch_cpu(est, 64) == 200
    assert _largest_batch_cpu(MemoryEstimate("CPU", {"process": GiB}, available=None), 64) is None
