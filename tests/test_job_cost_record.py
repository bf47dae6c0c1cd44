"""What a SLURM job records for the next jobs of its key (callbacks/job_cost.py): an attempt that ran out of its
time limit records its own rate (its whole time over its steps) in place of the estimate that proved too short."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import OmegaConf

from attnlab.cluster.outcome import FINISHED, RUNNING, AttemptEnd, Cause, Outcome
from attnlab.callbacks import job_cost
from attnlab.callbacks.run_metadata import RunMetadata
from attnlab.cli.slurm import estimates as sizing
from attnlab.cluster.nodes import NodeKind, Partition
from attnlab.cli.slurm.fit import Fit, Settings
from attnlab.cluster import costs as estimates

CFG = OmegaConf.create({"trainer": {"max_epochs": 3, "max_steps": -1}})
KIND = NodeKind(1, 16, 64 * 1024, 4, "a100")
KEY = estimates.fingerprint(CFG, devices=4, nodes=1, node=estimates.node_type(KIND), code="c")


def _trainer(tmp_path, end: AttemptEnd, step: int):
    metadata = RunMetadata({"paths": {"cache_dir": str(tmp_path)}})
    metadata.lineage = end.record()
    cost = job_cost.JobCost()
    cost.startup_s, cost.first_step, cost.where = 40.0, 100, (str(tmp_path), "gpu", KEY)
    return SimpleNamespace(callbacks=[metadata, cost], global_step=step, num_training_batches=100,
                           accumulate_grad_batches=1, is_global_zero=True, num_devices=4), cost


def _recorded(tmp_path) -> estimates.Measured | None:
    return estimates.lookup(tmp_path, "gpu", KEY)


@pytest.fixture
def sized_8_min(tmp_path, monkeypatch):
    """The record that sized the job at 8 minutes (30 s + 300 steps x 0.8 s, +25% and 2 min)."""
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    estimates.record(tmp_path, "gpu", KEY, estimates.Measured(30, 0.8, 100, 6.0, "7"))
    monkeypatch.setattr(estimates, "process_age_s", lambda: 600.0)  # the attempt ran 10 minutes


def _size(tmp_path) -> Fit:
    job = Fit(Partition("gpu", [KIND]), 1, 4, 4, 4, 1440, 120, 4)
    sizing.size(job, Settings(), [CFG], [], tmp_path, code="c")
    return job


@pytest.mark.parametrize("status", [AttemptEnd(Outcome.REQUEUED, Cause.TIME_LIMIT),
                                    AttemptEnd(Outcome.STOPPED, Cause.TIME_LIMIT)], ids=str)
def test_an_attempt_that_ran_out_of_time_records_its_own_rate(tmp_path, sized_8_min, status):
    trainer, cost = _trainer(tmp_path, status, step=400)  # 300 steps in its 600 s
    cost.on_exception(trainer, None, SIGTERMException())
    m = _recorded(tmp_path)
    assert m.ran_out and m.step_s == 2.0 and m.job == "9" and m.startup_s == 40.0
    job = _size(tmp_path)  # the next sweep: 40 s + 300 steps x 2 s, +25% and 2 min
    assert job.timeout_min == 16 and "job 9 on gpu (which ran out of time" in job.timeout_from

    # the requeued attempt of the same job finishes faster: the rate that proved too short is kept
    trainer, cost = _trainer(tmp_path, FINISHED, step=400)
    cost.record(trainer, 0.9)
    assert _recorded(tmp_path).step_s == 2.0 and _recorded(tmp_path).ran_out
    # a later job of the key measures afresh
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_JOB_ID", "12")
        cost.record(trainer, 0.9)
    assert _recorded(tmp_path).step_s == 0.9 and not _recorded(tmp_path).ran_out


@pytest.mark.parametrize("status", [AttemptEnd(Outcome.REQUEUED, Cause.PREEMPTED),
                                    AttemptEnd(Outcome.STOPPED, Cause.SIGTERM), RUNNING], ids=str)
def test_a_preemption_or_a_plain_stop_is_not_a_time_limit(tmp_path, sized_8_min, status):
    trainer, cost = _trainer(tmp_path, status, step=400)
    cost.on_exception(trainer, None, SIGTERMException())
    cost.on_exception(trainer, None, ValueError("a bug"))
    assert _recorded(tmp_path).step_s == 0.8 and not _recorded(tmp_path).ran_out


def test_a_sigterm_at_the_jobs_end_time_and_the_warning_of_a_users_own_script(tmp_path, sized_8_min, monkeypatch):
    import time

    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 5))
    trainer, cost = _trainer(tmp_path, AttemptEnd(Outcome.STOPPED, Cause.SIGTERM), step=250)  # SLURM's SIGTERM at the limit: 150 steps in 600 s
    cost.on_exception(trainer, None, SIGTERMException())
    assert _recorded(tmp_path).step_s == 4.0
    cost.on_exception(trainer, None, SIGTERMException())  # once per attempt

    monkeypatch.setenv("SLURM_JOB_ID", "13")  # a batch script of the user's own: USR1 is the time limit's warning
    for preempted, step_s in ((True, 4.0), (False, 2.0)):
        monkeypatch.setattr("attnlab.cluster.slurm_job.being_preempted", lambda: preempted)
        trainer, cost = _trainer(tmp_path, AttemptEnd(Outcome.REQUEUED, Cause.SLURM_WARNING), step=400)
        cost.on_exception(trainer, None, SIGTERMException())
        assert _recorded(tmp_path).step_s == step_s and _recorded(tmp_path).job == ("13" if not preempted else "9")
