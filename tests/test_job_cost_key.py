"""The key of a run's cost (attnlab.cluster.costs.fingerprint): what changes a step changes it, what does not
leaves it alone; the job (from its `.hydra/config.yaml`) and the driver (from its composition of the sweep) compute
the same key; a sweep sized by `launcher=slurm`'s own path (fit_command_line) with a made-up partition."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from attnlab.callbacks import job_cost
from attnlab.callbacks.run_metadata import RunMetadata
from attnlab.cli import slurm as driver
from attnlab.cli.hydra_errors import check_composes
from attnlab.lineage import code_record
from attnlab.cluster.nodes import Cluster, NodeKind, Partition, parse_sinfo
from attnlab.config import CONF_DIR
from attnlab.cluster import costs as estimates

KIND = NodeKind(2, 8, 16000, 0, "")
NODE = estimates.node_type(KIND)
READ_CONFIG = job_cost.composed_config


def _compose(tmp_path, *overrides: str):
    cfg = check_composes(["launcher=slurm", "trainer=cpu", "data=cifar10", f"paths.data_dir={tmp_path / 'data'}",
                          f"paths.cache_dir={tmp_path / 'cache'}", *overrides], CONF_DIR, "train").configs[0]
    assert cfg is not None, overrides
    return cfg


def _with(cfg, override: str):
    """`cfg` with one value override applied as Hydra applies it (group overrides are composed)."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = copy.deepcopy(cfg)
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides([override]), cfg)
    return cfg


def _key(cfg, **kw) -> str:
    return estimates.fingerprint(cfg, **({"devices": 1, "nodes": 1, "node": NODE, "code": "c1"} | kw))


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data" / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    (folder / "data_batch_1").write_bytes(b"x" * 1000)
    return folder


def test_the_key_changes_with_what_changes_a_step_and_not_with_the_rest(tmp_path, data):
    cfg = _compose(tmp_path)
    base = _key(cfg)
    assert _key(_compose(tmp_path)) == base
    assert _key(_compose(tmp_path, "logger=tensorboard")) == base and _key(_compose(tmp_path, "model=resnet50")) != base
    same = ["seed=7", "tags=[a,b]", f"paths.log_dir={tmp_path / 'logs'}", "optimizer.lr=0.1", "trainer.max_epochs=3",
            "trainer.max_steps=100", "task_name=other", "callbacks.progress_bar.refresh_rate=1",
            "launcher.timeout_min=7", "launcher.signal_delay_s=600", "trainer.devices=4", "extras.print_config=false",
            "test=false", "data.seed=3", "optimizer.weight_decay=0.0"]
    for override in same:
        assert _key(_with(cfg, override)) == base, override
    changed = ["+model.backbone_kwargs.depth=8", "data.batch_size=64", "trainer.precision=bf16-mixed",
               "data.image_size=64", "trainer.limit_train_batches=10", "extras.float32_matmul_precision=medium"]
    for override in changed:
        assert _key(_with(cfg, override)) != base, override
    for kw in ({"devices": 2}, {"nodes": 2}, {"node": estimates.node_type(NodeKind(1, 8, 16000, 1, "a100"))},
               {"node": estimates.node_type(NodeKind(1, 16, 16000, 0, ""))}, {"code": "c2"}):
        assert _key(cfg, **kw) != base, kw
    (data / "data_batch_2").write_bytes(b"x" * 10)  # the dataset grew
    assert _key(cfg) != base
    (data / "data_batch_2").unlink()
    assert _key(cfg) == base
    (tmp_path / "cache" / "slurm").mkdir(parents=True)  # the estimates themselves live in the cache: not data
    (tmp_path / "cache" / "slurm" / "estimates.json").write_text("{}")
    assert _key(cfg) == base


def test_a_folders_size_counts_its_first_entries_breadth_first(tmp_path):
    for i in range(5):
        (tmp_path / f"c{i}").mkdir()
        for j in range(3):
            (tmp_path / f"c{i}" / f"f{j}").write_bytes(b"x" * (i + 1))
    assert estimates._tree_size(tmp_path) == [15, 45]
    assert estimates._tree_size(tmp_path, limit=8) == [3, 3]  # 5 folders, then 3 files of the first
    assert estimates._tree_size(tmp_path / "c1" / "f0") == [1, 2]


def test_the_code_is_the_lineages_commits():
    from attnlab import lineage

    record = code_record()
    commit = (lineage._git(__import__("pathlib").Path.cwd(), with_diff=False)[0] or {}).get("commit")
    assert commit and commit in estimates.code_version(record)
    assert estimates.code_version({**record, "git": {"commit": "0" * 40}}) != estimates.code_version(record)


def test_the_jobs_node_is_the_one_sinfo_describes_to_the_driver(monkeypatch):
    line = "debug*|up|1-00:00:00|1|8|16000|(null)\n"
    seen = []

    def sinfo(argv, **kw):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=line, stderr="")

    monkeypatch.setattr(estimates.subprocess, "run", sinfo)
    env = {"SLURMD_NODENAME": "n1", "SLURM_JOB_PARTITION": "debug"}
    assert estimates.job_node_type(env) == estimates.node_type(parse_sinfo(line)["debug"].nodes[0]) == NODE
    assert list(seen[0][:6]) == ["sinfo", "-h", "-N", "-n", "n1", "-p"]  # -a with -p: sinfo refuses both
    assert estimates.job_node_type({}) is None


def _job(tmp_path, monkeypatch, argv: list[str], job_id: str):
    """What the job of `argv` (one job's overrides, as submitit runs it) computes: its own composition saved as
    Hydra saves it, read back by JobCost."""
    cfg = check_composes([a for a in argv if a != "-m"], CONF_DIR, "train").configs[0]
    assert cfg is not None
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    saved = tmp_path / f"job{job_id}" / ".hydra" / "config.yaml"
    saved.parent.mkdir(parents=True)
    OmegaConf.save(task, saved)
    monkeypatch.setattr(job_cost, "composed_config", lambda: READ_CONFIG(saved))
    monkeypatch.setattr(estimates, "job_node_type", lambda env=None: NODE)
    monkeypatch.setenv("SLURM_JOB_PARTITION", "debug")
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    metadata = RunMetadata({"paths": {"cache_dir": str(tmp_path / "cache")}})
    metadata.lineage = code_record()
    trainer = SimpleNamespace(callbacks=[metadata], num_devices=1, num_nodes=1, is_global_zero=True, global_step=0,
                              num_training_batches=100, accumulate_grad_batches=1)
    return trainer


def test_a_sweep_is_sized_from_its_jobs_own_records(tmp_path, monkeypatch):
    """The driver's path of `launcher=slurm` (fit_command_line) with a made-up partition: each job of a sweep over
    data.batch_size records under the key the job computes; the next sweep finds both, whose estimates give the same
    time limit (no comparison of the records), and keeps the user's signal lead."""
    part = Partition("debug", [KIND], time_limit_min=1440, default=True)
    monkeypatch.setattr("attnlab.cluster.nodes.read_cluster", lambda: Cluster({"debug": part}))
    monkeypatch.setattr("attnlab.cli.slurm.sbatch.test_only", lambda params, named: None)
    common = ["launcher=slurm", "trainer=cpu", f"paths.cache_dir={tmp_path / 'cache'}", "launcher.timeout_min=auto",
              "launcher.mem_gb=auto", "trainer.max_epochs=3"]
    argv = ["-m", *common, "data.batch_size=16,32", "launcher.signal_delay_s=300"]
    first = driver.fit_command_line(list(argv), check_composes(list(argv), CONF_DIR, "train"))
    assert "launcher.timeout_min=1440" in first
    for batch, job_id in (("16", "21"), ("32", "22")):
        job = [a if not a.startswith("data.batch_size=") else f"data.batch_size={batch}" for a in first]
        trainer = _job(tmp_path, monkeypatch, job, job_id)
        cost = job_cost.JobCost()
        cost.startup_s, cost.where = 30.0, job_cost.where_recorded(trainer)
        assert cost.where is not None
        cost.record(trainer, 0.8)  # 30 s + 300 steps x 0.8 s: the same minutes for both
    second = driver.fit_command_line(list(argv), check_composes(list(argv), CONF_DIR, "train"))
    # (30 + 300 x 0.8) x 1.25 = 337.5 s, then the user's 300 s lead: 11 min
    assert "launcher.timeout_min=11" in second and "launcher.signal_delay_s=300" in second, second
    assert any(a.startswith("launcher.mem_gb=") for a in second)

