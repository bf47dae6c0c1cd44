"""`python train.py --rerun <run dir>`: a run's own config trained again into a new folder, with the lineage that
differs named; a job of a sweep rerun alone."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

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
    sweep = run_cli("train.py", "-m", "seed=1,2", *TINY, env=log_env, timeout=400)
    assert sweep.returncode == 0, sweep.stdout[-2000:]
    job = next((tmp_path / "logs").rglob("multiruns/*/1"))
    record = json.loads((job / "lineage.json").read_text())
    assert record["sweep_command"].startswith("train.py -m seed=1,2 ") and "seed=2" in record["command"]
    again = run_cli("train.py", "--rerun", str(job), env=log_env, timeout=300)
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
    out = run_cli("train.py", *[a.format(tmp=tmp_path, run=run) for a in args], env=log_env, timeout=120)
    assert out.returncode == 2 and says in out.stdout and "Traceback" not in out.stdout, out.stdout[-2000:]


@pytest.mark.slow
def test_a_run_folder_records_the_accumulation_devices_and_precision_it_ran_with(tmp_path, log_env):
    """global_batch_size decides the accumulation before anything is saved: config.yaml, .hydra/config.yaml (what
    --rerun reads), the loggers' hyperparameters and lineage.json say what the run used; its rerun trains alike."""
    first = run_cli("train.py", *TINY, "global_batch_size=64", "data.batch_size=16", env=log_env, timeout=300)
    assert first.returncode == 0 and "accumulating gradients over 4 batches" in first.stdout, first.stdout[-2000:]
    [run] = _runs(tmp_path / "logs")
    for record in ("config.yaml", ".hydra/config.yaml", "csv/hparams.yaml"):
        assert "accumulate_grad_batches: 4\n" in (run / record).read_text(), record
    ran = json.loads((run / "lineage.json").read_text())["trainer"]
    assert ran | {"accelerator": "cpu"} == {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "world_size": 1,
                                            "precision": "32-true", "accumulate_grad_batches": 4,
                                            "strategy": "SingleDeviceStrategy"}, ran
    again = run_cli("train.py", "--rerun", str(run), env=log_env, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:]
    [new] = [r for r in _runs(tmp_path / "logs") if r != run]
    assert json.loads((new / "metrics.json").read_text()) == json.loads((run / "metrics.json").read_text())
    assert json.loads((new / "lineage.json").read_text())["trainer"]["accumulate_grad_batches"] == 4
