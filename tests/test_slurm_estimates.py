"""launcher.timeout_min=auto and launcher.mem_gb=auto from what an earlier job of the same key measured on the same
partition (attnlab.cli.slurm.estimates): the driver and the job compute the key alike from the composed config, a
step measured on another partition is not used, the time limit is the estimate within the partition's limit, and
the values the user gave are kept."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from attnlab.cli.slurm import estimates as sizing
from attnlab.cluster.nodes import NodeKind, Partition
from attnlab.cli.slurm.fit import AUTO, Fit, Settings
from attnlab.cluster import costs as estimates

KIND = NodeKind(2, 16, 64 * 1024, 4, "a100")
CODE = '["1.0", "abc", null]'


def _fit(limit=None) -> Fit:
    part = Partition("gpu", [KIND], time_limit_min=limit)
    return Fit(part, 1, 4, 4, 4, limit or 1440, 120, 4)


def _cfg(**trainer):
    return OmegaConf.create({"trainer": {"max_epochs": 3, "max_steps": -1, **trainer}, "model": {"depth": 4}})


def _key(cfg, **kw) -> str:
    return estimates.fingerprint(cfg, **({"devices": 4, "nodes": 1, "node": estimates.node_type(KIND), "code": CODE}
                                         | kw))


def _size(job, s, cfgs, tmp_path, overrides=()):
    sizing.size(job, s, cfgs, list(overrides), tmp_path, code=CODE)


def test_the_time_limit_and_memory_come_from_the_same_partitions_measurement(tmp_path):
    cfg = _cfg()
    estimates.record(tmp_path, "cpu", _key(cfg), estimates.Measured(10, 0.5, 100, 3.0, "7"))  # another partition
    job = _fit()
    _size(job, Settings(mem_gb=AUTO), [cfg], tmp_path)
    assert job.timeout_min == 1440 and "no earlier job of this config on gpu" in job.timeout_from
    assert job.mem_gb is None and "SLURM's default" in job.mem_from

    estimates.record(tmp_path, "gpu", _key(cfg), estimates.Measured(30, 0.8, 100, 6.0, "9"))
    job = _fit()
    _size(job, Settings(mem_gb=AUTO), [cfg], tmp_path)
    # (30 s + 300 steps x 0.8 s) x 1.25 + 2 min = 7.6 min
    assert job.timeout_min == 8 and job.signal_delay_s == 96 and "estimated from job 9 on gpu" in job.timeout_from
    assert job.mem_gb == 9 and "peak 6.0 GB" in job.mem_from and "by job 9" in job.mem_from  # 6 x 1.25 + 1
    assert job.overrides()["launcher.timeout_min"] == 8 and job.overrides()["launcher.mem_gb"] == 9

    job = _fit(limit=5)  # the estimate is longer than the partition allows: its limit, requeued at it
    _size(job, Settings(mem_gb=None), [cfg], tmp_path)
    assert job.timeout_min == 5 and "the partition's limit (the estimate, 8 min, is longer)" in job.timeout_from
    assert "launcher.mem_gb" not in job.overrides()

    job = _fit()  # a time limit of one's own is kept
    _size(job, Settings(timeout_min=30), [cfg], tmp_path)
    assert job.timeout_min == 1440 and job.timeout_from == ""


def test_two_variants_whose_estimates_round_to_the_same_minutes_are_sized(tmp_path):
    """Two variants with records of their own that give the same time limit: the longer is taken, no comparison of
    the records themselves."""
    cfgs = [_cfg(), _cfg(precision="bf16-mixed")]
    for cfg, job_id in zip(cfgs, ("9", "10")):
        estimates.record(tmp_path, "gpu", _key(cfg), estimates.Measured(30, 0.8, 100, 6.0, job_id))
    job = _fit()
    _size(job, Settings(mem_gb=AUTO), cfgs, tmp_path)
    assert job.timeout_min == 8 and "estimated from job" in job.timeout_from and job.mem_gb == 9


def test_the_users_own_signal_lead_time_limit_and_memory_are_kept(tmp_path):
    cfg = _cfg()
    estimates.record(tmp_path, "gpu", _key(cfg), estimates.Measured(30, 0.8, 100, 6.0, "9"))
    job = _fit()
    job.signal_delay_s = 600  # launcher.signal_delay_s=600, as fit() checked it against the partition's limit
    _size(job, Settings(signal_delay_s=600, mem_gb=AUTO), [cfg], tmp_path)
    # (30 s + 300 steps x 0.8 s) x 1.25 = 337.5 s of work, then the user's 600 s lead: 16 min; at least twice the lead
    assert job.signal_delay_s == 600 and job.timeout_min == 20 and job.overrides()["launcher.signal_delay_s"] == 600
    job = _fit()
    job.signal_delay_s, job.mem_gb = 30, 12
    _size(job, Settings(signal_delay_s=30, timeout_min=45, mem_gb=12), [cfg], tmp_path)
    assert (job.signal_delay_s, job.timeout_min, job.mem_gb, job.mem_from) == (30, 1440, 12, "")


def test_every_job_of_a_sweep_must_be_known(tmp_path):
    """A swept value that changes a step (`model.depth=4,8`) is a job of its own: sized only when each is known,
    from the longest; a swept seed or learning rate is not looked up."""
    cfg = _cfg()
    overrides = ["model.depth=4,8", "seed=1,2", "optimizer.lr=0.1,0.2"]
    jobs, why = sizing.sweep_jobs([cfg], overrides)
    assert why == "" and [j.model.depth for j in jobs] == [4, 8]
    estimates.record(tmp_path, "gpu", _key(cfg), estimates.Measured(30, 0.8, 100, 6.0, "9"))
    job = _fit()
    _size(job, Settings(mem_gb=AUTO), [cfg], tmp_path, overrides)
    assert job.timeout_min == 1440 and job.mem_gb is None  # depth 8 has no record yet
    estimates.record(tmp_path, "gpu", _key(jobs[1]), estimates.Measured(30, 1.6, 100, 10.0, "10"))
    job = _fit()
    _size(job, Settings(mem_gb=AUTO), [cfg], tmp_path, overrides)
    assert job.timeout_min == 13 and "job 10" in job.timeout_from and job.mem_gb == 14  # 30 + 300 x 1.6; 10 GB


def test_a_sweepers_search_is_listed_or_not_estimated():
    cfg = OmegaConf.create({"model": {"depth": 4, "label_smoothing": 0.1}, "optimizer": {"lr": 0.1},
                            "hydra": {"sweeper": {"params": {"optimizer.lr": "interval(3e-4, 5e-3)",
                                                             "+model.width": "choice(64, 128)"}}}})
    jobs, why = sizing.sweep_jobs([cfg], [])
    assert why == "" and [j.model.width for j in jobs] == [64, 128]  # the learning rate's range changes no step
    cfg.hydra.sweeper.params["model.label_smoothing"] = "interval(0.0, 0.2)"
    jobs, why = sizing.sweep_jobs([cfg], [])
    assert jobs == [] and "model.label_smoothing is searched over a range" in why
    job = _fit()
    sizing.size(job, Settings(), [cfg], [], "/nonexistent", code=CODE)
    assert job.timeout_from.startswith("the partition's limit: model.label_smoothing is searched over a range")


@pytest.mark.parametrize("both_known, expected", [(False, 1440), (True, 8)])
def test_a_kind_of_node_that_could_run_the_job_and_has_no_record_is_not_guessed(tmp_path, both_known, expected):
    """A partition of two kinds of node: the job may land on either, so both must be known."""
    other = NodeKind(2, 16, 64 * 1024, 4, "v100")
    job = _fit()
    job.partition.nodes.append(other)
    cfg = _cfg()
    estimates.record(tmp_path, "gpu", _key(cfg), estimates.Measured(30, 0.8, 100, 6.0, "9"))
    if both_known:
        estimates.record(tmp_path, "gpu", _key(cfg, node=estimates.node_type(other)),
                         estimates.Measured(30, 0.5, 100, 6.0, "11"))
    _size(job, Settings(), [cfg], tmp_path)
    assert job.timeout_min == expected
