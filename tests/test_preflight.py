"""preflight=true: the run's cost measured before waiting for it (speed, MFU, memory, duration, largest batch), with
nothing written to checkpoints or loggers; one line per job in a multirun."""

from __future__ import annotations

import re
import time

import pytest
from lightning.pytorch.callbacks import Callback

from conftest import FAST, compose_cfg, run_cli, run_here

QUICK = ["trainer.max_epochs=-1", "trainer.limit_val_batches=4", "trainer.limit_test_batches=4",
         "trainer.val_check_interval=20", "trainer.check_val_every_n_epoch=null", "data.num_workers=0", *FAST]


@pytest.mark.slow
def test_preflight_measures_the_run_and_writes_nothing(tmp_path, caplog):
    """The report names every number it promises, and the run it measured leaves no checkpoint, metrics or log
    behind (how its duration compares with the real run's is the next test's)."""
    from attnlab.cli.training import train

    caplog.set_level("INFO", logger="attnlab")
    cfg = compose_cfg(["preflight=true", "preflight_steps=6", "trainer.max_steps=80", *QUICK], tmp_path / "pre")
    assert train(cfg) is None
    text = caplog.text
    for what in ("parameters", "samples/s", "MFU", "GiB measured", "GiB estimated", "GiB available",
                 "the configured run", "largest batch", "data.batch_size ≈"):
        assert what in text, text[-2000:]
    assert re.search(r"the configured run  ≈ [\d.]+ (s|min) \([\d.]+ (s|min) training \+ [\d.]+ (s|min) validation "
                     r"\+ [\d.]+ (s|min) test\)", text), text[-2000:]
    run = tmp_path / "pre"
    assert not list(run.rglob("*.ckpt")) and not (run / "metrics.json").exists() and not (run / "csv").exists()


@pytest.mark.slow
def test_preflight_in_a_multirun_prints_one_line_per_job(tmp_path, log_env):
    out = run_here("train.py", "-m", "preflight=true", "preflight_steps=3", "optimizer.lr=1e-3,3e-3",
                   "trainer.max_steps=50", *QUICK, env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [line for line in out.stdout.splitlines() if "preflight job" in line]
    assert len(lines) == 2 and "optimizer.lr=0.003" in lines[1] or "optimizer.lr=3e-3" in lines[1], lines
    assert all("samples/s" in line and "run ≈" in line and "largest data.batch_size" in line for line in lines)
    assert not list((tmp_path / "logs").rglob("*.ckpt"))


def test_the_largest_batch_on_cpu_comes_from_the_estimate():
    from attnlab.cli.preflight import _largest_batch_estimated
    from attnlab.memory import GiB, MemoryEstimate

    est = MemoryEstimate("CPU", {"process": 1 * GiB, "gradients": GiB // 4, "optimizer state": GiB // 2,
                                 "activations": 2 * GiB}, available=8 * GiB)
    # 2 GiB of activations for 64 samples; 8 - 1.75 GiB left for them -> 200 samples
    assert _largest_batch_estimated(est, 64) == 200
    assert _largest_batch_estimated(MemoryEstimate("CPU", {"process": GiB}, available=None), 64) is None


@pytest.mark.slow
def test_preflight_under_ddp_gives_the_largest_batch_from_the_estimate(tmp_path, log_env):
    """Lightning's batch-size finder refuses distributed strategies: under DDP (here 2 CPU processes over gloo) the
    largest batch per process comes from the memory estimate."""
    out = run_cli("train.py", "trainer=ddp_cpu", "preflight=true", "preflight_steps=2", "trainer.max_steps=20",
                  *QUICK, f"hydra.run.dir={tmp_path / 'run'}", env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    m = re.search(r"largest batch +data.batch_size ≈ (\d+) \(from the memory estimate for each of 2 processes"
                  r"(; the whole training split fits)?; now (\d+)\)", out.stdout)
    assert m and int(m.group(1)) > int(m.group(3)), out.stdout[-3000:]
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("start, tried, found", [(60, [60, 120, 90], 90), (200, [200, 100, 150], 100),
                                                 (100, [100, 200, 150], 100), (1, [1], None)])
def test_the_search_on_one_gpu_starts_at_the_estimate_and_tries_a_few_sizes(start, tried, found):
    """On one GPU the estimate's size is tried for real, then doubled while it fits and bisected once one runs out
    of memory: three sizes at most (here a GPU that fits 100 samples, and one that fits none)."""
    import torch

    from attnlab.cli.preflight import SEARCH_TRIALS, _largest_batch_gpu

    limit = 100 if found else 0
    sizes = []

    class Trainer:
        global_step = 0

        def fit(self, model, datamodule):
            sizes.append(datamodule.batch_size)
            if datamodule.batch_size > limit:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            self.global_step = 2

    class Data:
        batch_size = 8

    assert _largest_batch_gpu(lambda max_steps: Trainer(), torch.nn.Linear(2, 2), Data(), start) == found
    assert sizes == tried and len(sizes) <= SEARCH_TRIALS == 3


def test_the_search_stops_at_the_training_split():
    """No batch is larger than the training split: a GPU that fits more tries the split's size once."""
    import torch

    from attnlab.cli.preflight import _largest_batch_gpu

    sizes = []

    class Trainer:
        global_step = 2

        def fit(self, model, datamodule):
            sizes.append(datamodule.batch_size)

    class Data:
        batch_size = 8

    assert _largest_batch_gpu(lambda max_steps: Trainer(), torch.nn.Linear(2, 2), Data(), 5000, limit=1258) == 1258
    assert sizes == [1258]



class TrainClock(Callback):
    """A user's callback: the seconds from the first training batch to the end of training (validation included)."""

    started = seconds = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0 and trainer.global_step == 0:
            TrainClock.started = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        TrainClock.seconds = time.perf_counter() - TrainClock.started


@pytest.mark.slow
def test_preflight_of_a_run_with_a_global_batch_times_its_real_steps(tmp_path, caplog):
    """global_batch_size=256 over batches of 64 accumulates 4 batches a step: preflight counts 4 x max_steps batches,
    as the run trains them (it read 1 before the plan decided the accumulation), and its estimate of the training
    and validation matches the run's time for them: within 20% on a quiet machine, and here within 2x (the other
    workers' load moves a 25-step timing by up to that; a miscount of the accumulated batches is 4x). The estimate
    and the run are timed one after the other on a machine the other test workers share: a pair that a neighbour's
    burst set further apart is timed again, once."""
    from attnlab.cli.training import train

    caplog.set_level("INFO", logger="attnlab")
    steps = ["global_batch_size=256", "data.batch_size=64", "trainer.max_steps=80", "test=false"]
    pairs = []
    for attempt in range(2):
        caplog.clear()
        train(compose_cfg(["preflight=true", "preflight_steps=25", *steps, *QUICK], tmp_path / f"pre{attempt}"))
        m = re.search(r"the configured run  ≈ [\d.]+ (?:s|min) \(([\d.]+) (s|min) training(?: \+ ([\d.]+) (s|min) "
                      r"validation)?", caplog.text)
        assert m, caplog.text[-2000:]
        predicted = sum(float(v) * (60 if unit == "min" else 1) for v, unit in ((m[1], m[2]), (m[3], m[4])) if v)
        train(compose_cfg([*steps, *QUICK, f"+callbacks.clock._target_={__name__}.TrainClock"],
                          tmp_path / f"real{attempt}"))
        pairs.append((predicted, TrainClock.seconds))
        print(f"\npreflight: {predicted:.1f} s; the run: {TrainClock.seconds:.1f} s")
        if 1 / 2 < TrainClock.seconds / predicted < 2:
            break
    assert 1 / 2 < pairs[-1][1] / pairs[-1][0] < 2, pairs


def test_a_pass_over_several_validation_sets_counts_the_batches_of_each():
    """MNLI validates on two sets (a list of loaders): preflight prices the batches of both, each limited as
    Lightning limits it, not the number of loaders."""
    from torch.utils.data import DataLoader

    from attnlab.cli.preflight import _batches

    matched, mismatched = DataLoader(range(96), batch_size=8), DataLoader(range(40), batch_size=8)
    assert _batches([matched, mismatched], None) == 12 + 5
    assert _batches([matched, mismatched], 4) == 4 + 4
    assert _batches([matched, mismatched], 0.5) == 6 + 2
    assert _batches(matched, 1.0) == 12
