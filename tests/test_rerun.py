"""`python train.py --rerun <run dir>`: a run's own config trained again into a new folder, with the lineage that
differs named; a job of a sweep rerun alone; what the run asked decided again on this machine, with the decisions
that differ from the run's named."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import yaml

from conftest import compose_cfg, run_cli, run_here

TINY = ["trainer.max_epochs=2", "+trainer.limit_train_batches=4", "+trainer.limit_val_batches=2",
        "callbacks.progress_bar=null", "extras.print_config=false"]


def _runs(root):
    return sorted(p.parent for p in root.rglob("metrics.json"))


@pytest.mark.slow
def test_rerun_trains_the_same_config_again_into_a_new_folder_with_the_same_metrics(tmp_path, log_env):
    first = run_cli("train.py", *TINY, env=log_env, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:]
    [run] = _runs(tmp_path / "logs")
    # the run came from another torch and another CPU: one warning line each
    record = json.loads((run / "lineage.json").read_text())
    record["packages"]["torch"], record["accelerator"]["cpu"] = "2.0.0", "Another CPU"
    (run / "lineage.json").write_text(json.dumps(record))

    again = run_cli("train.py", "--rerun", str(run), env=log_env, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:]
    [new] = [r for r in _runs(tmp_path / "logs") if r != run]
    assert json.loads((new / "metrics.json").read_text()) == json.loads((run / "metrics.json").read_text())
    warned = [line for line in again.stdout.splitlines() if "differs from the run's" in line]
    assert len(warned) == 2 and "packages.torch" in warned[1] and "2.0.0 ->" in warned[1], warned
    assert "accelerator.cpu" in warned[0] and "Another CPU" in warned[0]
    assert json.loads((new / "lineage.json").read_text())["rerun_of"] == str(run)
    # the rerun can be rerun in turn, with a key changed on purpose
    third = run_cli("train.py", f"--rerun={new / 'checkpoints'}", "seed=7", env=log_env, timeout=300)
    assert third.returncode == 0, third.stdout[-2000:]
    [last] = [r for r in _runs(tmp_path / "logs") if r not in (run, new)]
    assert "seed: 7" in (last / "config.yaml").read_text()
    assert json.loads((last / "metrics.json").read_text()) != json.loads((run / "metrics.json").read_text())


@pytest.mark.slow
def test_rerun_of_a_sweep_job_reproduces_that_job(tmp_path, log_env):
    sweep = run_here("train.py", "-m", "seed=1,2", *TINY, env=log_env, timeout=400)
    assert sweep.returncode == 0, sweep.stdout[-2000:]
    job = next((tmp_path / "logs").rglob("multiruns/*/1"))
    record = json.loads((job / "lineage.json").read_text())
    assert record["sweep_command"].startswith("train.py -m seed=1,2 ") and "seed=2" in record["command"]
    again = run_here("train.py", "--rerun", str(job), env=log_env, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:]
    [new] = list((tmp_path / "logs").rglob("runs/*/metrics.json"))
    assert json.loads(new.read_text()) == json.loads((job / "metrics.json").read_text())
    assert "sweep_command" not in json.loads((new.parent / "lineage.json").read_text())


@pytest.mark.parametrize("args, says", [
    (["--rerun"], "--rerun needs the run folder to train again"),
    (["--rerun", "{tmp}/nowhere"], "not a run folder of attnlab (no .hydra/config.yaml"),
    (["--rerun", "{run}", "model=swin"], "model=swin would choose another model config"),
    (["--rerun", "{run}", "optimizer.no_such=1"], "optimizer.no_such is not a key of the run's config"),
    (["--rerun", "{run}", "-m"], "-m cannot go with it"),
])
def test_rerun_refuses_what_it_cannot_do_in_one_paragraph(args, says, tmp_path, log_env):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("task_name: train\nseed: 1\nmodel: {lr: 1}\noptimizer: {lr: 1}\n")
    out = run_here("train.py", *[a.format(tmp=tmp_path, run=run) for a in args], env=log_env, timeout=120)
    assert out.returncode == 2 and says in out.stdout and "Traceback" not in out.stdout, out.stdout[-2000:]


@pytest.mark.slow
def test_a_run_folder_records_the_accumulation_devices_and_precision_it_ran_with(tmp_path, log_env):
    """global_batch_size decides the accumulation before anything is saved: config.yaml, the loggers'
    hyperparameters and lineage.json say what the run used, .hydra/config.yaml (what --rerun reads) what it asked;
    its rerun decides alike and trains alike."""
    first = run_here("train.py", *TINY, "global_batch_size=64", "data.batch_size=16", env=log_env, timeout=300)
    assert first.returncode == 0 and "accumulating gradients over 4 batches" in first.stdout, first.stdout[-2000:]
    [run] = _runs(tmp_path / "logs")
    for record in ("config.yaml", "csv/hparams.yaml"):
        assert "accumulate_grad_batches: 4\n" in (run / record).read_text(), record
    assert "accumulate_grad_batches: 1\n" in (run / ".hydra/config.yaml").read_text()
    decided = json.loads((run / "lineage.json").read_text())["decided"]
    assert decided["trainer.accumulate_grad_batches"]["decided"] == 4, decided
    ran = json.loads((run / "lineage.json").read_text())["trainer"]
    assert ran | {"accelerator": "cpu"} == {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "world_size": 1,
                                            "precision": "32-true", "accumulate_grad_batches": 4,
                                            "strategy": "SingleDeviceStrategy"}, ran
    again = run_here("train.py", "--rerun", str(run), env=log_env, timeout=300)
    assert again.returncode == 0 and "rerun: trainer." not in again.stdout, again.stdout[-2000:]
    [new] = [r for r in _runs(tmp_path / "logs") if r != run]
    assert json.loads((new / "metrics.json").read_text()) == json.loads((run / "metrics.json").read_text())
    assert json.loads((new / "lineage.json").read_text())["trainer"]["accumulate_grad_batches"] == 4



def _rerun_here(run, tmp_path, monkeypatch, *extra, gpu=False):
    """What `train.py --rerun <run> [extra]` does up to its plan, in this process (Hydra's state as in a rerun: its
    only task override is task_name); gpu: on a machine where the plan's device check finds a GPU.
    -> (the plan, the config, the new run folder)."""
    from attnlab import devices
    from attnlab.cli import rerun
    from attnlab.cli.app import begin
    from attnlab.cli.plan import plan_training

    monkeypatch.setattr(rerun, "_run_dir", None)
    monkeypatch.setattr(rerun, "_asked", [])
    monkeypatch.setenv("ATTNLAB_LOG_DIR", str(tmp_path / "logs"))
    if gpu:
        monkeypatch.setattr(devices, "uses_gpu", lambda accelerator: accelerator in ("auto", "gpu", "cuda"))
        monkeypatch.setattr(devices, "check_devices", lambda *a: None)
    out = tmp_path / "again"
    (out / ".hydra").mkdir(parents=True)
    compose_cfg(["task_name=train"], out)
    cfg = rerun.config(run, list(extra), out)
    begin(cfg)
    return plan_training(cfg), cfg, out


def _decision_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("rerun: trainer.")]


@pytest.mark.slow
def test_a_rerun_decides_again_on_its_machine_and_says_where_it_differs(tmp_path, log_env, monkeypatch, caplog):
    """A run on the CPU of a preset that asks for bf16-mixed on all devices (trainer=ddp), the accelerator left to
    the machine: .hydra/config.yaml keeps what it asked, config.yaml and lineage.json what its plan decided (32-true,
    one device). Its rerun (here in this process, up to the plan) decides again: on a GPU, bf16-mixed, with one line
    saying so; on the CPU, the same; a precision given on purpose is kept; a run of before (its decisions written
    into .hydra/config.yaml, no `decided`) is rerun as it is."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("the first run is to be made on a machine without a GPU")
    run = tmp_path / "run"
    first = run_cli("train.py", "trainer=ddp", "trainer.accelerator=auto", "data.num_workers=0", *TINY,
                    f"hydra.run.dir={run}", env=log_env, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:]
    asked = yaml.safe_load((run / ".hydra/config.yaml").read_text())["trainer"]
    assert (asked["precision"], asked["devices"]) == ("bf16-mixed", "auto")
    for record in ("config.yaml", "csv/hparams.yaml"):
        used = yaml.safe_load((run / record).read_text())["trainer"]
        assert (used["precision"], used["devices"]) == ("32-true", 1), record
    lineage = json.loads((run / "lineage.json").read_text())
    assert {k: (v["asked"], v["decided"], v["on"]) for k, v in lineage["decided"].items()} == {
        "trainer.precision": ("bf16-mixed", "32-true", "cpu"), "trainer.devices": ("auto", 1, "cpu")}
    assert lineage["trainer"]["precision"] == "32-true"
    caplog.set_level(logging.INFO, logger="attnlab")
    line = "rerun: trainer.precision: the original run used 32-true (decided on cpu), this one bf16-mixed (as asked)"

    # on a GPU: what was asked, decided again
    with monkeypatch.context() as m:
        plan, cfg, out = _rerun_here(run, tmp_path / "gpu", m, gpu=True)
        assert plan.trainer.on_gpu and plan.trainer.precision == cfg.trainer.precision == "bf16-mixed"
        assert "trainer.precision" not in plan.decided and _decision_lines(caplog) == [line]
        # the rerun's own .hydra/config.yaml keeps what was asked, for a rerun of it in turn
        assert yaml.safe_load((out / ".hydra/config.yaml").read_text())["trainer"]["precision"] == "bf16-mixed"

    # on the CPU: the same decisions, no line; a precision given on purpose is given, as on the run's command line
    caplog.clear()
    with monkeypatch.context() as m:
        plan, _, _ = _rerun_here(run, tmp_path / "cpu", m)
        assert plan.trainer.precision == "32-true" and _decision_lines(caplog) == []
    with monkeypatch.context() as m:
        plan, _, _ = _rerun_here(run, tmp_path / "given", m, "trainer.precision=bf16-mixed")
        assert plan.trainer.precision == "bf16-mixed" and "trainer.precision" not in plan.decided
        assert _decision_lines(caplog) == [line]

    # a run of before: its .hydra/config.yaml holds the decision, its lineage no `decided`
    old = tmp_path / "old"
    shutil.copytree(run, old)
    hydra_config = old / ".hydra/config.yaml"
    hydra_config.write_text(hydra_config.read_text().replace("precision: bf16-mixed", "precision: 32-true"))
    del lineage["decided"]
    (old / "lineage.json").write_text(json.dumps(lineage))
    caplog.clear()
    with monkeypatch.context() as m:
        plan, _, _ = _rerun_here(old, tmp_path / "old_gpu", m, gpu=True)
        assert plan.trainer.precision == "32-true" and _decision_lines(caplog) == []
