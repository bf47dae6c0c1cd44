"""Optuna sweeps that survive: the study in SQLite under logs/<task>/optuna/, continued by the same command after a
SIGTERM between trials and a SIGKILL during one, with finished trials kept, job numbers going on and the killed
trial run again; and the refusals of a study that cannot be continued."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from conftest import DATA_DIR, ROOT, run_cli, run_here
from test_cli import QUICK

optuna = pytest.importorskip("optuna")
TRIALS = 5  # the second command has three to run: a kill during its second still finds one running if that ends fast
SWEEP = ["-m", "hparams_search=vit_digits_optuna", f"hydra.sweeper.n_trials={TRIALS}", *QUICK]


def _rows(logs: Path) -> pd.DataFrame:
    tables = [pd.read_csv(p).assign(sweep=p.parent.name) for p in sorted(logs.rglob("results.csv"))]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["job", "sweep"])


def _run_until(log_env: dict, out: Path, stop, sig: int) -> int:
    """Start the sweep; send `sig` as soon as stop() holds; the process's exit code."""
    env = os.environ | {"PYTHONUNBUFFERED": "1", "ATTNLAB_DATA_DIR": str(DATA_DIR)} | log_env
    with open(out, "w") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *SWEEP], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while proc.poll() is None and not stop() and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(sig)
        return proc.wait(timeout=120)


def _study(logs: Path):
    (db,) = logs.glob("*/optuna/vit_digits.db") or [None]
    if db is None:
        raise ValueError("no study yet")
    return optuna.load_study(study_name="vit_digits", storage=f"sqlite:///{db}")


@pytest.mark.slow
def test_a_stopped_optuna_sweep_continues_where_it_stopped(tmp_path, log_env):
    logs = tmp_path / "logs"
    # 1. SIGTERM between trials: once the study holds two finished ones
    def two_finished() -> bool:  # read with sqlite3 itself: polled every 50 ms, optuna's load_study would take a core
        try:
            (db,) = logs.glob("*/optuna/vit_digits.db")
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.01)) as con:
                (n,), = con.execute("SELECT count(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED', 'FAIL')")
            return n >= 2
        except (ValueError, sqlite3.Error):  # no database yet, or one being created (no tables, locked)
            return False

    _run_until(log_env, tmp_path / "a.log", two_finished, signal.SIGTERM)
    first = _rows(logs)
    assert len(first) == 2, (tmp_path / "a.log").read_text()[-3000:]
    # 2. the same command again; SIGKILL during its second trial (as soon as its job folder exists: the trial is
    # then running in the study; later trials of a process take about a second here)
    def training_again() -> bool:
        rows = _rows(logs)
        return len(rows) > len(first) and any(
            p.name.isdigit() and int(p.name) > rows["job"].max() for p in logs.glob("*/multiruns/*/*"))

    rc = _run_until(log_env, tmp_path / "b.log", training_again, signal.SIGKILL)
    second = (tmp_path / "b.log").read_text()
    assert rc == -signal.SIGKILL, second[-3000:]
    assert "Continuing Optuna study 'vit_digits'" in second and f"{len(first)} of {TRIALS} trials finished" in second
    # 3. and again, to the end
    out = run_here("train.py", *SWEEP, env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "was interrupted" in out.stdout

    study = _study(logs)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(complete) == TRIALS  # the total asked for, over the three commands
    assert failed and all(t.user_attrs.get("interrupted") for t in failed)  # at least the killed one
    space = set(complete[0].params)
    for t in failed:  # each interrupted trial ran again with its parameters (one killed while drawing them: not)
        reruns = [c for c in complete if c.user_attrs.get("rerun_of") == t.number]
        assert [r.params for r in reruns] == ([t.params] if set(t.params) == space else [])
    # a seeded sampler does not draw its first points again in a continued study
    drawn = [tuple(sorted(t.params.items())) for t in complete if "rerun_of" not in t.user_attrs]
    assert len(set(drawn)) == len(drawn), drawn
    rows = _rows(logs)
    done_first = rows[rows["sweep"] == rows["sweep"].min()]
    # finished trials were not run again: every completed trial has one row, and the job numbers never repeat
    assert rows["job"].is_unique and len(rows) == TRIALS, rows
    assert sorted(rows["job"]) == sorted(t.number for t in complete)
    assert rows["job"].max() > done_first["job"].max()
    best = yaml.safe_load(next(iter(sorted(logs.rglob("optimization_results.yaml")))).read_text())
    assert best["n_trials_complete"] == TRIALS and best["best_value"] == pytest.approx(study.best_value)
    assert best["best_value"] == pytest.approx(rows["value"].max())

    # 4. a study that cannot be continued: another sweep holds it, or the search now goes the other way
    from filelock import FileLock

    (db,) = logs.glob("*/optuna/vit_digits.db")
    with FileLock(str(db) + ".lock"):
        held = run_cli("train.py", *SWEEP, f"hydra.sweeper.n_trials={TRIALS + 1}", env=log_env)
    assert held.returncode != 0 and "Another sweep is running the Optuna study 'vit_digits'" in held.stdout
    assert "hydra.sweeper.study_name=<name>" in held.stdout and "Traceback" not in held.stdout
    flipped = run_here("train.py", *SWEEP, "hydra.sweeper.direction=minimize", f"hydra.sweeper.n_trials={TRIALS + 1}",
                       env=log_env)
    assert flipped.returncode != 0 and "was started to maximize" in flipped.stdout, flipped.stdout[-2000:]
    assert len(_study(logs).trials) == len(study.trials)  # nothing ran


def test_a_trial_stopped_while_drawing_its_parameters_is_replaced_and_a_whole_one_runs_again(tmp_path):
    """Each parameter of a trial is one write to the study: a kill between two leaves a trial holding part of a
    configuration. It never trained; a new trial takes its place, while a trial with all its parameters runs again."""
    from optuna.distributions import FloatDistribution

    from hydra_plugins.attnlab_optuna_sweeper._impl import OptunaSweeperImpl

    url = f"sqlite:///{tmp_path}/study.db"
    space = {"optimizer.lr": FloatDistribution(1e-4, 1e-2), "optimizer.weight_decay": FloatDistribution(0.0, 0.1)}
    study = optuna.create_study(study_name="s", storage=url)
    whole = study.ask(space)                                    # drawn, then killed while training
    part = study.ask()
    part.suggest_float("optimizer.lr", 1e-4, 1e-2)              # killed before its second parameter
    sweeper = OptunaSweeperImpl(storage=url, study_name="s", n_trials=4)
    sweeper._load(url, space)
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.state for t in trials[:2]] == [optuna.trial.TrialState.FAIL] * 2
    queued = [t for t in trials[2:] if t.state == optuna.trial.TrialState.WAITING]
    assert [(t.system_attrs["fixed_params"], t.user_attrs["rerun_of"]) for t in queued] == [(whole.params, whole.number)]


@pytest.mark.parametrize("case", ["damaged", "no_trials"])
def test_a_study_that_cannot_run_is_one_paragraph_and_its_database_is_left_as_it_was(case, tmp_path, capsys):
    from omegaconf import OmegaConf

    from hydra_plugins.attnlab_optuna_sweeper._impl import OptunaSweeperImpl

    db = tmp_path / "study.db"
    db.write_bytes(b"SQLite format 3\x00" + b"\x07" * 300 if case == "damaged" else b"")  # cut short by a full disk
    before = db.read_bytes()
    sweeper = OptunaSweeperImpl(storage=f"sqlite:///{db}", n_trials=0 if case == "no_trials" else 4,
                                params={"optimizer.lr": "interval(1e-4, 1e-2)"})
    sweeper.config = OmegaConf.create({"task_name": "t", "paths": {"log_dir": str(tmp_path)}})
    with pytest.raises(SystemExit) as stop:
        sweeper.sweep([])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    if case == "damaged":
        assert f"The Optuna study database {db} cannot be read" in err and f"mv {db} {db}.damaged" in err, err
    else:
        assert "hydra.sweeper.n_trials=0: a sweep needs at least one trial" in err, err
    assert db.read_bytes() == before


def test_a_study_database_another_process_is_creating_is_waited_for_not_called_damaged(tmp_path, monkeypatch):
    """Two processes opening one new SQLite study at once (a second sweep, optuna-dashboard, a notebook's
    load_study) race to write its schema: the loser's first open fails on the version row the winner wrote."""
    import sqlalchemy.exc
    from omegaconf import OmegaConf

    from hydra_plugins.attnlab_optuna_sweeper import _impl

    real, calls = optuna.create_study, []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise sqlalchemy.exc.IntegrityError("INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_impl.optuna, "create_study", racing)
    monkeypatch.setattr(_impl.time, "sleep", lambda s: None)
    sweeper = _impl.OptunaSweeperImpl(storage=f"sqlite:///{tmp_path / 'study.db'}", n_trials=4,
                                      params={"optimizer.lr": "interval(1e-4, 1e-2)"})
    sweeper.config = OmegaConf.create({"task_name": "t", "paths": {"log_dir": str(tmp_path)}})
    study = sweeper._load(f"sqlite:///{tmp_path / 'study.db'}", {})
    assert len(calls) == 2 and study.trials == []


@pytest.mark.slow
def test_a_pruner_stops_hopeless_trials_and_they_count_as_pruned(tmp_path, log_env):
    import optuna

    # a threshold no short run reaches: every trial is pruned at its first validation, and the sweep still ends
    out = run_here("train.py", "-m", "hparams_search=vit_digits_optuna", "hydra.sweeper.n_trials=2",
                   "hydra.sweeper.pruner={name: threshold, lower: 0.999}", "trainer.max_epochs=3",
                   "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "extras.print_config=false",
                   "callbacks.progress_bar=null", env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    db = tmp_path / "logs" / "train" / "optuna" / "vit_digits.db"
    study = optuna.load_study(study_name="vit_digits", storage=f"sqlite:///{db}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.PRUNED] * 2
    assert all(t.last_step == 2 for t in study.trials)  # reported at the first validation, stopped there
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    rows = pd.read_csv(sweep / "results.csv")
    assert list(rows["state"]) == ["pruned", "pruned"] and list(rows["step"]) == [2, 2]
    assert not list(sweep.rglob("metrics.json")) and not list(sweep.rglob("epoch_*.ckpt"))  # no test pass, no ckpt
    from attnlab.compare import compare

    (table,) = compare([str(sweep)])
    assert set(table["status"]) == {"pruned (step 2)"}


@pytest.mark.slow
def test_ddp_trials_of_an_optuna_sweep_train_one_configuration_on_every_rank(tmp_path, log_env):
    out = run_cli("train.py", "-m", "hparams_search=vit_digits_optuna", "hydra.sweeper.n_trials=2", "trainer=ddp_cpu",
                  "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                  "trainer.limit_test_batches=1", "extras.print_config=false", "callbacks.progress_bar=null",
                  env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [j.name for j in jobs] == ["0", "1"]  # one run folder per trial, none per rank
    rows = pd.read_csv(sweep / "results.csv")
    assert sorted(rows["job"]) == [0, 1]  # reported once (rank 0)
    for job in jobs:
        assert (job / "train_ddp_process_1.log").exists()  # the second rank trained in the trial's folder
        cfg = yaml.safe_load((job / "config.yaml").read_text())
        ckpt = torch.load(job / "checkpoints" / "last.ckpt", weights_only=False)
        assert ckpt["attnlab"]["config"]["optimizer"]["lr"] == cfg["optimizer"]["lr"]
        # rank 1 ran the trial's own command (its parameters, as a single run, not a sweep of its own): a rank with
        # another depth (+model.backbone_kwargs.depth is searched) could not have trained in step with rank 0
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        assert f"optimizer.lr={cfg['optimizer']['lr']}" in " ".join(overrides)


@pytest.mark.slow
def test_parallel_trials_start_as_soon_as_one_ends_with_the_cores_divided(tmp_path, log_env):
    import optuna

    # seeded: trial 0 trains 60 epochs, trials 1 and 2 one epoch each; two at a time, trial 2 is asked for when
    # trial 1 ends, while trial 0 still runs (a batch barrier would wait for trial 0)
    out = run_cli("train.py", "-m", "hydra/sweeper=optuna", "launcher=local", "hydra.sweeper.n_trials=3",
                  "hydra.sweeper.n_jobs=2", "hydra.sweeper.direction=maximize", "hydra.sweeper.study_name=par",
                  "hydra.sweeper.sampler={_target_: optuna.samplers.RandomSampler, seed: 8}",
                  "trainer.max_epochs=choice(1,60)", "optimized_metric=val/acc_best", "logger=null",
                  "trainer.limit_train_batches=4", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
                  "extras.print_config=false", "callbacks.progress_bar=null", env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]
    study = optuna.load_study(study_name="par", storage=f"sqlite:///{tmp_path}/logs/train/optuna/par.db")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert [t.params["trainer.max_epochs"] for t in study.trials] == [60, 1, 1]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    lineage = {int(p.parent.name): json.loads(p.read_text()) for p in sweep.glob("*/lineage.json")}
    assert sorted(lineage) == [0, 1, 2]
    first, second, third = study.trials
    assert second.datetime_complete <= third.datetime_start < first.datetime_complete  # no wait for the batch
    assert lineage[1]["ended"] <= lineage[2]["started"]
    assert all(r["accelerator"]["torch_threads"] == 1 for r in lineage.values())  # 2 cores shared by 2 trials
