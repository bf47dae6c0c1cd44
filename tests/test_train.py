"""Training runs in-process through the same `train(cfg)` as train.py: presets, experiments, resume, failures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnlab.cli.training import train
from attnlab.errors import UserError
from attnlab.tasks.classification import ImageClassifier
from conftest import FAST, compose_cfg


def _ckpt(tmp_path: Path, name="last.ckpt") -> Path:
    return tmp_path / "checkpoints" / name


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["vit_digits", "swin_digits", "vit_cifar10"])
def test_fast_dev_run_of_each_experiment(tmp_path, small_data, experiment):
    cfg = compose_cfg([f"experiment={experiment}", "debug=fdr", "data.batch_size=8", *FAST], tmp_path,
                      data_dir=small_data)  # CIFAR-10: the small PNG zips
    train(cfg)  # one batch of train, val and test
    assert not list(tmp_path.rglob("*.ckpt"))  # a smoke test leaves no checkpoint for ckpt_path=last to find


def test_imagenet_experiment_stops_at_the_missing_files(tmp_path):
    cfg = compose_cfg(["experiment=swin_imagenet", "debug=fdr", *FAST], tmp_path)
    with pytest.raises(UserError, match="ImageNet-1k not found"):
        train(cfg)


@pytest.mark.slow
def test_any_timm_backbone_by_name(tmp_path):
    cfg = compose_cfg(["model.backbone=resnet18", "debug=fdr", *FAST], tmp_path)
    train(cfg)
    cfg = compose_cfg(["model.backbone=not_a_model_xyz", "debug=fdr", *FAST], tmp_path)
    with pytest.raises(UserError, match="not a timm model"):
        train(cfg)
    cfg = compose_cfg(["model.backbone=convnext_tiny", "debug=fdr", *FAST], tmp_path)  # digits are 8 px
    with pytest.raises(UserError, match="convnext_tiny cannot take 8 px images .*data=cifar10"):
        train(cfg)


@pytest.mark.slow
def test_overfit_preset_memorizes_its_batches(tmp_path):
    cfg = compose_cfg(["debug=overfit", "data.augment=null", "test=false", *FAST], tmp_path)
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["train/acc"] == 1.0 and metrics["train/loss_epoch"] < 0.7  # label smoothing 0.1 floor ~0.5


@pytest.mark.slow
def test_limit_and_profiler_presets(tmp_path):
    train(compose_cfg(["debug=limit", "trainer.max_epochs=2", "trainer.detect_anomaly=false", *FAST],
                      tmp_path / "limit"))
    train(compose_cfg(["debug=profiler", "trainer.limit_train_batches=5", "trainer.limit_val_batches=2",
                       "trainer.limit_test_batches=2", *FAST], tmp_path / "prof"))


@pytest.mark.slow
def test_resume_continues_from_the_saved_step(tmp_path):
    base = ["trainer.limit_train_batches=5", "trainer.limit_val_batches=2", "test=false", *FAST]
    first = tmp_path / "first"
    train(compose_cfg([*base, "trainer.max_epochs=2"], first))
    saved = torch.load(_ckpt(first), weights_only=False)
    assert saved["global_step"] == 10 and saved["epoch"] == 1

    second = tmp_path / "second"
    train(compose_cfg([*base, "trainer.max_epochs=3", f"ckpt_path={_ckpt(first)}"], second))
    resumed = torch.load(_ckpt(second), weights_only=False)
    assert resumed["global_step"] == 15 and resumed["epoch"] == 2
    df = pd.read_csv(second / "csv" / "metrics.csv")
    assert df["epoch"].dropna().min() == 2  # nothing re-trained
    # the schedule went on where it stopped instead of restarting its warmup
    lr_before = saved["lr_schedulers"][0]["last_epoch"]
    assert resumed["lr_schedulers"][0]["last_epoch"] == lr_before + 5


@pytest.mark.slow
def test_ckpt_path_last_finds_the_newest_run(tmp_path):
    base = ["trainer.limit_train_batches=3", "trainer.limit_val_batches=1", "test=false", *FAST]
    cfg = compose_cfg([*base, "trainer.max_epochs=1"], tmp_path)
    logs = Path(cfg.paths.log_dir)
    run_dir = logs / "train" / "runs" / "2026-01-01_00-00-00"
    cfg.paths.output_dir = str(run_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(run_dir / "checkpoints")
    train(cfg)
    cfg2 = compose_cfg([*base, "trainer.max_epochs=2", "ckpt_path=last"], tmp_path / "again")
    cfg2.paths.log_dir = str(logs)
    train(cfg2)
    assert torch.load(tmp_path / "again" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    cfg = compose_cfg([f"ckpt_path={tmp_path}/nope.ckpt", *FAST], tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        train(cfg)
    cfg = compose_cfg(["ckpt_path=last", *FAST], tmp_path)
    with pytest.raises(UserError, match="no last.ckpt under"):
        train(cfg)


def test_checkpoint_of_another_task_is_refused(tmp_path):
    base = ["trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.max_epochs=1", "test=false",
            *FAST]
    train(compose_cfg(base, tmp_path / "a"))
    ckpt = torch.load(_ckpt(tmp_path / "a"), weights_only=False)
    ckpt["attnlab"]["config"]["model"]["_target_"] = "attnlab.tasks.language_model.CausalLM"
    torch.save(ckpt, tmp_path / "other.ckpt")
    cfg = compose_cfg([*base, f"ckpt_path={tmp_path}/other.ckpt"], tmp_path / "b")
    with pytest.raises(UserError, match="was trained by task attnlab.tasks.language_model.CausalLM"):
        train(cfg)
    torch.save({"state_dict": {}}, tmp_path / "foreign.ckpt")
    cfg = compose_cfg([*base, f"ckpt_path={tmp_path}/foreign.ckpt"], tmp_path / "c")
    with pytest.raises(UserError, match="not written by attnlab"):
        train(cfg)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    step = ImageClassifier.training_step

    def poisoned(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        return loss * float("nan") if self.global_step >= 45 else loss

    monkeypatch.setattr(ImageClassifier, "training_step", poisoned)
    cfg = compose_cfg(["trainer.max_epochs=3", *FAST], tmp_path)
    with pytest.raises(UserError) as err:
        train(cfg)
    msg = str(err.value)
    assert "at step 46" in msg and "epoch 1" in msg and str(_ckpt(tmp_path)) in msg
    kept = torch.load(_ckpt(tmp_path), weights_only=False)
    assert kept["global_step"] == 39  # the end of epoch 0, written before the loss broke
    assert all(torch.isfinite(v).all() for v in kept["state_dict"].values() if v.is_floating_point())


@pytest.mark.slow
def test_optimizer_and_scheduler_choices_train(tmp_path):
    for i, (opt, sched) in enumerate([("sgd", "cosine"), ("adam", "plateau"), ("adamw", "linear")]):
        cfg = compose_cfg([f"optimizer={opt}", f"scheduler={sched}", "scheduler.warmup=2", "trainer.max_epochs=2",
                           "trainer.limit_train_batches=4", "trainer.limit_val_batches=2", "test=false", *FAST],
                          tmp_path / str(i))
        value = train(cfg)
        assert value is not None and not math.isnan(value)


def test_gpu_requests_the_machine_cannot_serve_say_what_to_use(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = compose_cfg(["trainer=gpu", "trainer.max_epochs=1", *FAST], tmp_path)
    with pytest.raises(UserError, match="asks for a CUDA GPU, but this machine has none.*trainer=cpu"):
        train(cfg)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = compose_cfg(["trainer=ddp", "trainer.devices=8", "trainer.max_epochs=1", *FAST], tmp_path)
    with pytest.raises(UserError, match="trainer.devices=8 but this machine has 2 GPU"):
        train(cfg)


def test_a_checkpoint_without_the_running_loss_mean_still_loads():
    """Checkpoints written before tasks saved their running training-loss mean load with its initial state."""
    from attnlab.tasks.classification import ImageClassifier

    task = ImageClassifier(num_classes=10, img_size=8, in_chans=1)
    old = {k: v for k, v in task.state_dict().items() if not k.startswith("train_loss_mean.")}
    assert len(old) < len(task.state_dict())
    task.load_state_dict(old, strict=True)


@pytest.mark.parametrize(("max_epochs", "max_steps", "expected"), [
    (10, -1, "Epoch 3/9"), (-1, 5000, "Epoch 3 · step budget 5000"), (None, 200, "Epoch 3 · step budget 200")])
def test_progress_bar_describes_the_budget(max_epochs, max_steps, expected):
    import lightning as L

    from attnlab.callbacks import ProgressBar

    bar = ProgressBar()
    trainer = L.Trainer(max_epochs=max_epochs, max_steps=max_steps, callbacks=[bar], logger=False,
                        enable_checkpointing=False)
    bar.setup(trainer, None, "fit")
    assert bar._get_train_description(3).strip() == expected


def test_no_progress_bar_callback_means_no_bar(tmp_path):
    from attnlab.cli import builders
    from attnlab.cli.plan import make_plan
    from conftest import compose_cfg

    for overrides, has_bar in ((["callbacks.progress_bar=null"], False), ([], True)):
        cfg = compose_cfg(["model=vit", "data=digits", *overrides], tmp_path)
        trainer = builders.build_trainer(cfg, make_plan(cfg), builders.build_callbacks(cfg), [])
        assert (trainer.progress_bar_callback is not None) == has_bar, overrides


def test_no_model_checkpoint_callback_means_no_checkpoint_written(tmp_path):
    """callbacks.model_checkpoint=null: the run writes no checkpoint at all (not Lightning's default writer's)."""
    cfg = compose_cfg(["callbacks.model_checkpoint=null", "trainer.max_epochs=1", "trainer.limit_train_batches=3",
                       "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", *FAST], tmp_path)
    train(cfg)
    assert (tmp_path / "metrics.json").is_file()
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_run_trains_the_same_weights_whatever_ran_before_it_in_the_process(tmp_path):
    """The same config twice in one process (a notebook, the jobs of a sweep under Hydra's basic launcher) trains the
    same weights: what a run measures once per process (the CPU's matmul peak behind perf/mfu) draws no numbers
    from the global generator that the data order and dropout come from."""
    from attnlab.utils.flops import measured_cpu_peak

    measured_cpu_peak.cache_clear()  # the first run measures it, the second reads it back
    base = ["trainer.limit_train_batches=3", "trainer.limit_val_batches=1", "trainer.max_epochs=1", "test=false", *FAST]
    for name in ("first", "second"):
        train(compose_cfg(base, tmp_path / name))
    first, second = (torch.load(_ckpt(tmp_path / name), weights_only=False)["state_dict"] for name in ("first", "second"))
    assert all(torch.equal(first[k], second[k]) for k in first if k.startswith("net."))


def test_ema_validates_saves_and_resumes_the_average_of_the_weights(tmp_path, caplog):
    """callbacks=ema: the checkpoints' state_dict (what eval, predict and init_from load) is the moving average and
    the raw weights ride along for resuming; with decay 1 the average stays at its first update, the weights after
    the first optimizer step; the memory estimate counts the copy."""
    base = ["scheduler=constant", "trainer.limit_train_batches=5", "trainer.limit_val_batches=2", "test=false",
            *FAST]  # a schedule that does not depend on the run's length: the first step is the same in both runs
    with caplog.at_level("INFO", logger="attnlab"):
        train(compose_cfg([*base, "callbacks=ema", "callbacks.ema.decay=1.0", "trainer.max_epochs=2"],
                          tmp_path / "ema"))
    assert "averaged weights" in caplog.text
    train(compose_cfg([*base, "trainer.max_steps=1", "trainer.max_epochs=-1"], tmp_path / "one_step"))
    ema = torch.load(_ckpt(tmp_path / "ema"), weights_only=False)
    one = torch.load(_ckpt(tmp_path / "one_step"), weights_only=False)
    assert ema["global_step"] == 10 and one["global_step"] == 1
    nets = [k for k in one["state_dict"] if k.startswith("net.")]
    assert all(torch.equal(ema["state_dict"][k], one["state_dict"][k]) for k in nets)
    assert not all(torch.equal(ema["current_model_state"][k], one["state_dict"][k]) for k in nets)

    train(compose_cfg([*base, "callbacks=ema", "callbacks.ema.decay=1.0", "trainer.max_epochs=3",
                       f"ckpt_path={_ckpt(tmp_path / 'ema')}"], tmp_path / "resumed"))
    resumed = torch.load(_ckpt(tmp_path / "resumed"), weights_only=False)
    assert resumed["global_step"] == 15  # the raw weights went on training; the average kept its first update
    assert all(torch.equal(resumed["state_dict"][k], one["state_dict"][k]) for k in nets)
    assert not all(torch.equal(resumed["current_model_state"][k], ema["current_model_state"][k]) for k in nets)


@pytest.mark.slow
def test_a_finished_run_started_again_in_its_directory_keeps_its_results(tmp_path, small_data):
    base = ["trainer.limit_train_batches=3", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2",
            "trainer.max_epochs=1", *FAST]
    first = train(compose_cfg(base, tmp_path))
    before = (tmp_path / "metrics.json").read_text()
    again = train(compose_cfg(base, tmp_path))                      # e.g. a requeued job that had finished
    assert again == first and (tmp_path / "metrics.json").read_text() == before
    with pytest.raises(UserError, match=r"model differs from this one \(model.label_smoothing: 0.1 -> 0.2\).*"
                                        r"resume=false"):
        train(compose_cfg([*base, "model.label_smoothing=0.2"], tmp_path))
    with pytest.raises(UserError, match=r"holds a run of task .*ImageClassifier.*CausalLM.*own directory"):
        train(compose_cfg(["experiment=gpt_shakespeare_char_cpu", *base], tmp_path, data_dir=small_data))
    assert (tmp_path / "metrics.json").read_text() == before


@pytest.mark.parametrize(("overrides", "message"), [
    (["train=false"], r"train=false tests a trained model, but no ckpt_path was given"),
    (["trainer=cpu", "trainer.precision=16-mixed"], r"trainer.precision=16-mixed \(float16\) needs a GPU"),
    (["experiment=gpt_shakespeare_char_cpu", "scheduler=onecycle"],
     r"scheduler=onecycle does not take warmup, min_lr_ratio .*~scheduler.warmup ~scheduler.min_lr_ratio"),
])
def test_settings_that_cannot_work_are_refused_before_training(tmp_path, small_data, overrides, message):
    with pytest.raises(UserError, match=message):
        train(compose_cfg([*overrides, "debug=fdr", *FAST], tmp_path, data_dir=small_data))


@pytest.mark.parametrize("matmul, share", [("medium", 1.0), ("high", 0.5), ("highest", 1 / 16)])
def test_the_mfu_of_an_fp32_run_on_a_gpu_is_against_its_matmul_precisions_peak(monkeypatch, matmul, share):
    """perf/mfu's peak on a GPU: the bf16 tensor-core peak for 16-bit precisions; for 32-true that of the matmul
    precision the run sets (extras.float32_matmul_precision): TF32 at high, bf16 at medium, plain fp32 at highest."""
    import torch

    from attnlab.utils.flops import device_peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmul)
    try:
        assert device_peak_flops(torch.device("cuda"), "bf16-mixed") == 989e12
        assert device_peak_flops(torch.device("cuda"), "32-true") == 989e12 * share
    finally:
        torch.set_float32_matmul_precision(before)
