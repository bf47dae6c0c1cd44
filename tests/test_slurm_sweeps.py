"""Sweeps on the real SLURM cluster (tools/slurm-cluster.sh): a multirun array gives one folder and one results row
per job; a cancelled job is one line and the driver exits non-zero after gathering the others, with or without
accounting; Optuna trials run as separate jobs reporting to the study (the pruner's view), and a killed driver run
again continues the study."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import DATA_DIR, ROOT, docs_command
from slurm_cluster import slurm

TINY = ["launcher=slurm", "launcher.partition=debug", "trainer=cpu", "+trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1", "callbacks.progress_bar=null", "extras.print_config=false",
        "data.num_workers=0"]


def _driver(args: list[str], log_env: dict, out: Path) -> subprocess.Popen:
    env = os.environ | {"PYTHONUNBUFFERED": "1", "ATTNLAB_DATA_DIR": str(DATA_DIR)} | log_env
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", *args], cwd=out.parent, env=env,
                            stdout=open(out, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(pattern: str, out: Path, proc: subprocess.Popen, timeout: float = 240) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, out.read_text())
        if found:
            return found
        assert proc.poll() is None, out.read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not seen in {timeout} s:\n{out.read_text()[-3000:]}")


def _finish(proc: subprocess.Popen, out: Path, timeout: float = 300) -> tuple[int, str]:
    try:
        return proc.wait(timeout=timeout), out.read_text()
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the sweep driver did not return within {timeout} s:\n{out.read_text()[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("accounting", [True, pytest.param(False, marks=pytest.mark.slurm_without_accounting)],
                         ids=["accounting", "no accounting"])
def test_a_cancelled_job_is_one_line_and_the_others_are_gathered(accounting, slurm_cluster, tmp_path, log_env):
    """Two jobs as one array: one finishes, the other is cancelled while it runs. Two folders, the finished job's
    results row, one line naming the cancelled job with its log, no warning repeated at every poll, exit status 1 —
    and the driver returns, with accounting (sacct) or without (squeue alone knows the job is gone)."""
    slurm_cluster(accounting=accounting)
    out = tmp_path / "driver.log"
    proc = _driver(["trainer.max_epochs=1,2000", *TINY], log_env, out)
    job = _wait_for(r"job (\d+_1) \(#1: trainer.max_epochs=2000\): running", out, proc).group(1)
    _wait_for(r"job \d+_0 \(#0: trainer.max_epochs=1\): completed", out, proc)
    slurm("scancel", job)
    code, text = _finish(proc, out)
    assert code == 1, text[-3000:]
    cancelled = [ln for ln in text.splitlines() if f"job {job} (#1: trainer.max_epochs=2000): cancelled" in ln]
    assert len(cancelled) == 1 and ".submitit" in cancelled[0], text[-3000:]
    assert "1 of 2 SLURM jobs of this sweep did not complete" in text and "Traceback" not in text
    assert "sacct" not in text.lower().replace("(sacct", "")  # no warning of submitit's at every poll
    (sweep,) = (tmp_path / "logs").glob("train/multiruns/*")
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1"]
    rows = pd.read_csv(sweep / "results.csv")
    assert sorted(rows["job"]) == [0], rows
    for state in ("pending", "running", "completed"):
        assert f"): {state}" in text


@pytest.mark.slow
def test_optuna_trials_run_as_separate_jobs_and_a_killed_driver_continues_the_study(slurm_cluster, tmp_path,
                                                                                      log_env):
    """docs/sweeps.md's Optuna sweep on SLURM as the page shows it (hydra.sweeper.n_jobs=2), with a median pruner:
    two trials at once, each its own SLURM job reporting its validations to the study (what a pruner decides on);
    the driver killed mid-sweep cancels its jobs, and the same command continues the study to its total."""
    optuna = pytest.importorskip("optuna")
    slurm_cluster(accounting=True)
    shown = docs_command("docs/sweeps.md", "python train.py -m launcher=slurm hparams_search=")
    assert shown[:3] == ["python", "train.py", "-m"] and "hydra.sweeper.n_jobs=2" in shown, shown
    args = [*shown[3:], "hydra.sweeper.pruner=median", *(a for a in TINY if a not in shown)]
    n_trials = int(next(a for a in shown if a.startswith("hydra.sweeper.n_trials=")).split("=")[1])
    out = tmp_path / "first.log"
    proc = _driver(args, log_env, out)
    _wait_for(r"job \d+ \(#\d+[^)]*\): running(.|\n)*job \d+ \(#\d+[^)]*\): running", out, proc)  # two at once
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    first = out.read_text()
    assert "cancelling its SLURM jobs" in first, first[-3000:]
    mine = sorted(set(re.findall(r"job (\d+) \(#", first)))
    time.sleep(2)
    states = slurm("squeue", "-h", "-t", "all", "-o", "%T", "-j", ",".join(mine), check=False).stdout.split()
    assert not {"RUNNING", "PENDING"} & set(states), states  # the driver's jobs are gone from the cluster

    again = tmp_path / "second.log"
    code, text = _finish(_driver(args, log_env, again), again)
    assert code == 0, text[-3000:]
    (db,) = (tmp_path / "logs").glob("*/optuna/vit_digits.db")
    study = optuna.load_study(study_name="vit_digits", storage=f"sqlite:///{db}")
    done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(done) == n_trials, [t.state for t in study.trials]
    assert all(t.intermediate_values for t in done)  # each job reported to its trial: the pruner's view
    stopped = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert stopped and all(any(d.user_attrs.get("rerun_of") == t.number and d.params == t.params for d in done)
                           for t in stopped)  # each cancelled trial ran again with its parameters
    job_ids = set(re.findall(r"job (\d+) \(#", first + text))
    assert len(job_ids) >= n_trials  # every trial its own SLURM job
