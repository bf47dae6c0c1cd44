"""Saying when the loader sets the pace: preflight's loader line on an image task (the loader alone against the
model's steps, and what to do when the loader is slower), and the data wait the throughput callback logs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image

from attnlab.cli.loader_pace import LoaderPace
from conftest import FAST, compose_cfg


def _tree(root: Path, n: int = 16) -> Path:
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            small = rng.integers(0, 255, (8, 10, 3), dtype=np.uint8)
            Image.fromarray(small).resize((200, 150), Image.BICUBIC).save(root / c / f"{i}.jpg", quality=90)
    return root


RUN = ["data=imagefolder", "data.image_size=32", "data.batch_size=4", "data.num_workers=0", "data.val_fraction=0.25",
       "data.test_fraction=0", "trainer.max_epochs=-1", "trainer.limit_val_batches=1", "test=false", *FAST]


def test_preflight_of_an_image_task_times_the_loader_against_the_model(tmp_path, caplog, monkeypatch):
    from attnlab.cli import preflight
    from attnlab.cli.training import train

    timers, timer = [], preflight.StepTimer
    monkeypatch.setattr(preflight, "StepTimer", lambda *a: timers.append(timer(*a)) or timers[-1])
    caplog.set_level("INFO", logger="attnlab")
    root = _tree(tmp_path / "images")
    assert train(compose_cfg(["preflight=true", "preflight_steps=3", "trainer.max_steps=20", f"data.root={root}",
                              *RUN], tmp_path / "pre")) is None
    # the batches it says it timed are those it timed
    assert len(timers[0].batch_s) == 3 and "3 timed training batches after" in caplog.text
    line = next(line for line in caplog.text.splitlines() if "data loader" in line)
    assert "images/s from the training loader alone (0 workers, data.num_workers) against" in line, line
    assert "images/s taken by the model" in line and ("sets the pace" in line), line


def test_the_loader_line_says_by_how_much_and_what_to_do():
    slow = LoaderPace(loader_s=250.0, model_s=1000.0, workers=2, cpus=16, decoder="pillow")
    line = slow.line()
    assert "the loader sets the pace, 4.0x slower than the model" in line
    assert "about 8 would keep up (data.num_workers=8)" in line
    for remedy in ("data.format=shards", "reduced-size decoding", "attnlab[fast]", "data.decode=gpu"):
        assert remedy in line, remedy
    assert "this machine has 4 CPUs" in LoaderPace(250.0, 1000.0, 2, 4, "simplejpeg").line()
    assert "attnlab[fast]" not in LoaderPace(250.0, 1000.0, 2, 4, "simplejpeg").line()
    no_opencv = LoaderPace(250.0, 1000.0, 2, 4, "simplejpeg", warps="pillow").line()
    assert "attnlab[fast]' (OpenCV: RandAugment's rotations" in no_opencv and "simplejpeg:" not in no_opencv
    on_shards = LoaderPace(250.0, 1000.0, 2, 16, "simplejpeg", shards=True).line()
    assert "data.format=shards" not in on_shards and "reduced-size decoding" in on_shards
    in_memory = LoaderPace(250.0, 1000.0, 2, 16, "pillow", files=False).line()
    assert "lighter augmentation" in in_memory and "decoding" not in in_memory
    fast = LoaderPace(loader_s=900.0, model_s=300.0, workers=4, cpus=8).line()
    assert "the model sets the pace (the loader has 3.0x its rate)" in fast and "What helps" not in fast


def test_training_logs_the_time_each_step_waited_for_data(tmp_path):
    from attnlab.cli.training import train

    root = _tree(tmp_path / "images")
    train(compose_cfg(["trainer.max_steps=6", "trainer.log_every_n_steps=2", "logger=csv", f"data.root={root}",
                       "callbacks.model_checkpoint=null", *RUN], tmp_path / "run"))
    (metrics,) = (tmp_path / "run").rglob("metrics.csv")
    rows = [r for r in csv.DictReader(open(metrics)) if r.get("perf/data_wait_s")]
    assert len(rows) >= 2, open(metrics).read()[:2000]
    for r in rows:
        assert float(r["perf/data_wait_s"]) > 0 and 0 < float(r["perf/data_wait_frac"]) < 1


def test_a_batch_of_encoded_images_counts_its_images():
    """With data.decode=gpu the loader hands over (the JPEGs' bytes in one tensor, labels): the loader's images/s
    counts the images, not the batch."""
    import torch

    from attnlab.cli.loader_pace import _samples
    from attnlab.data.images.device_decode import EncodedBatch

    jpegs = [torch.full((n,), 255, dtype=torch.uint8) for n in (700, 900, 800)]
    assert _samples((EncodedBatch.of(jpegs), torch.tensor([0, 1, 0]))) == 3
    assert _samples((torch.zeros(5, 3, 8, 8), torch.zeros(5))) == 5


def test_a_validation_within_a_window_counts_neither_as_training_nor_as_waiting(monkeypatch):
    """A window of two batches with a 100 s validation (and its checkpoint) between them: samples/s is that of the
    two training batches, and the validation is no wait for data."""
    from types import SimpleNamespace

    import torch

    from attnlab.callbacks import throughput

    clock, logged = [0.0], {}
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: clock[0])
    task = SimpleNamespace(device=torch.device("cpu"), log_dict=lambda metrics, **_: logged.update(metrics))
    trainer, batch = SimpleNamespace(world_size=1), (torch.zeros(4, 3), torch.zeros(4))
    cb = throughput.Throughput(log_every_n_steps=2)
    cb.on_train_epoch_start(trainer, task)
    for start, end, validation_s in ((0.0, 1.0, 100.0), (101.5, 102.5, 0.0)):
        clock[0] = start
        cb.on_train_batch_start(trainer, task, batch, 0)
        clock[0] = end
        cb.on_train_batch_end(trainer, task, None, batch, 0)
        if validation_s:
            cb.on_validation_start(trainer, task)
            clock[0] += validation_s
    assert logged["perf/samples_per_s"] == 8 / 2.0  # the two batches' 2 s: the clock stops until the next batch
    assert logged["perf/data_wait_s"] == 0.0
