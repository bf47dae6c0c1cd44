"""launcher.timeout_min=auto and launcher.mem_gb=auto from what an earlier job of the same config measured on the
same partition (attnlab.cli.slurm.estimates): the driver and the job name the config alike, a step measured on
another partition is not used, and the time limit is the estimate within the partition's limit."""

from __future__ import annotations

from omegaconf import OmegaConf

from attnlab.cli.slurm import estimates as sizing
from attnlab.utils import job_costs as estimates
from attnlab.cli.slurm.cluster import NodeKind, Partition
from attnlab.cli.slurm.fit import AUTO, Fit, Settings


def _fit(limit=None) -> Fit:
    part = Partition("gpu", [NodeKind(2, 16, 64 * 1024, 4, "a100")], time_limit_min=limit)
    return Fit(part, 1, 4, 4, 4, limit or 1440, 120, 4)


def test_the_driver_and_the_job_name_the_same_config_alike():
    typed = ["model=vit", "test=false", "seed=1", "trainer.max_epochs=3", "launcher.partition=gpu"]
    in_job = ["model=vit", "test=False", "seed=2", "launcher.timeout_min=7", "trainer.devices=4",
              "hydra.sweep.dir='/runs/x'", "trainer.max_epochs=30"]
    assert estimates.fingerprint("train", typed) == estimates.fingerprint("train", in_job)
    assert estimates.fingerprint("train", typed) != estimates.fingerprint("train", typed + ["data.batch_size=64"])
    assert estimates.fingerprint("train", typed) != estimates.fingerprint("other", typed)


def test_the_time_limit_and_memory_come_from_the_same_partitions_measurement(tmp_path):
    variant = ["model=vit"]
    key = estimates.fingerprint("train", variant)
    estimates.record(tmp_path, "cpu", key, estimates.Measured(10, 0.5, 100, 3.0, "7"))  # another partition's nodes
    cfg = OmegaConf.create({"trainer": {"max_epochs": 3, "max_steps": -1}})
    job = _fit()
    sizing.size(job, Settings(mem_gb=AUTO), [cfg], [variant], "train", tmp_path)
    assert job.timeout_min == 1440 and "no earlier job of this config on gpu" in job.timeout_from
    assert job.mem_gb is None and "SLURM's default" in job.mem_from

    estimates.record(tmp_path, "gpu", key, estimates.Measured(30, 0.8, 100, 6.0, "9"))
    job = _fit()
    sizing.size(job, Settings(mem_gb=AUTO), [cfg], [variant], "train", tmp_path)
    # (30 s + 300 steps x 0.8 s) x 1.25 + 2 min = 7.6 min
    assert job.timeout_min == 8 and job.signal_delay_s == 96 and "estimated from job 9 on gpu" in job.timeout_from
    assert job.mem_gb == 9 and "peak 6.0 GB measured by job 9" in job.mem_from  # 6 x 1.25 + 1
    assert job.overrides()["launcher.timeout_min"] == 8 and job.overrides()["launcher.mem_gb"] == 9

    job = _fit(limit=5)  # the estimate is longer than the partition allows: its limit, requeued at it
    sizing.size(job, Settings(mem_gb=None), [cfg], [variant], "train", tmp_path)
    assert job.timeout_min == 5 and "the partition's limit (the estimate, 8 min, is longer)" in job.timeout_from
    assert "launcher.mem_gb" not in job.overrides()

    job = _fit()  # a time limit of one's own is kept
    sizing.size(job, Settings(timeout_min=30), [cfg], [variant], "train", tmp_path)
    assert job.timeout_min == 1440 and job.timeout_from == ""


def test_two_variants_whose_estimates_round_to_the_same_minutes_are_sized(tmp_path):
    """Two variants with records of their own that give the same time limit: the longer is taken, no comparison of
    the records themselves."""
    variants = [["model=vit"], ["model=vit_small"]]
    cfgs = [OmegaConf.create({"trainer": {"max_epochs": 3, "max_steps": -1}})] * 2
    for variant, job_id in zip(variants, ("9", "10")):
        estimates.record(tmp_path, "gpu", estimates.fingerprint("train", variant),
                         estimates.Measured(30, 0.8, 100, 6.0, job_id))
    job = _fit()
    sizing.size(job, Settings(mem_gb=AUTO), cfgs, variants, "train", tmp_path)
    assert job.timeout_min == 8 and "estimated from job" in job.timeout_from and job.mem_gb == 9


def test_the_users_own_signal_lead_time_limit_and_memory_are_kept(tmp_path):
    variant = ["model=vit"]
    estimates.record(tmp_path, "gpu", estimates.fingerprint("train", variant),
                     estimates.Measured(30, 0.8, 100, 6.0, "9"))
    cfg = OmegaConf.create({"trainer": {"max_epochs": 3, "max_steps": -1}})
    job = _fit()
    job.signal_delay_s = 600  # launcher.signal_delay_s=600, as fit() checked it against the partition's limit
    sizing.size(job, Settings(signal_delay_s=600, mem_gb=AUTO), [cfg], [variant], "train", tmp_path)
    # (30 s + 300 steps x 0.8 s) x 1.25 = 337.5 s of work, then the user's 600 s lead: 16 min; at least twice the lead
    assert job.signal_delay_s == 600 and job.timeout_min == 20 and job.overrides()["launcher.signal_delay_s"] == 600
    job = _fit()
    job.signal_delay_s, job.mem_gb = 30, 12
    sizing.size(job, Settings(signal_delay_s=30, timeout_min=45, mem_gb=12), [cfg], [variant], "train", tmp_path)
    assert (job.signal_delay_s, job.timeout_min, job.mem_gb, job.mem_from) == (30, 1440, 12, "")
