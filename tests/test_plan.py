"""The plan of a run (cli/plan.py): decided once from the checked config and recorded as decided. The precision
follows the accelerator the plan decides (a GPU preset's mixed precision on CPUs becomes 32-true, a precision given
on the command line is kept); .hydra/config.yaml keeps what was asked, and config.yaml, the loggers'
hyperparameters and lineage.json (its `decided`) say what ran."""

from __future__ import annotations

import json

import pytest
import yaml

from attnlab.errors import UserError
from conftest import compose_cfg, run_cli
from test_rerun import TINY


@pytest.mark.slow
def test_a_gpu_presets_mixed_precision_becomes_32_true_on_cpus_unless_given(tmp_path, log_env):
    ddp_on_cpu = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=1", "data.num_workers=0", *TINY]
    out = run_cli("train.py", *ddp_on_cpu, f"hydra.run.dir={tmp_path / 'preset'}", env=log_env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "trainer.precision=32-true: the run is on the CPU (the preset's bf16-mixed is for GPUs" in out.stdout
    run = tmp_path / "preset"
    assert yaml.safe_load((run / ".hydra/config.yaml").read_text())["trainer"]["precision"] == "bf16-mixed"  # asked
    for record in ("config.yaml", "csv/hparams.yaml"):  # what the run used
        assert yaml.safe_load((run / record).read_text())["trainer"]["precision"] == "32-true", record
    lineage = json.loads((run / "lineage.json").read_text())
    assert lineage["trainer"]["precision"] == "32-true"
    assert lineage["decided"] == {"trainer.precision": {
        "asked": "bf16-mixed", "decided": "32-true", "on": "cpu",
        "why": "the run is on the CPU (the preset's bf16-mixed is for GPUs)"}}, lineage["decided"]

    given = run_cli("train.py", *ddp_on_cpu, "trainer.precision=bf16-mixed", f"hydra.run.dir={tmp_path / 'given'}",
                    env=log_env, timeout=300)
    assert given.returncode == 0, given.stdout[-3000:]
    assert "trainer.precision=bf16-mixed on the CPU: most CPUs run bfloat16 far slower" in given.stdout
    assert yaml.safe_load((tmp_path / "given" / "config.yaml").read_text())["trainer"]["precision"] == "bf16-mixed"
    given_lineage = json.loads((tmp_path / "given" / "lineage.json").read_text())
    assert given_lineage["trainer"]["precision"] == "bf16-mixed" and given_lineage["decided"] == {}


def test_the_plan_decides_each_fact_once(tmp_path):
    """Devices, precision, accumulation, sharding and weight averaging from one reading of the config; each
    decision applied to cfg.trainer (so that what is saved and built after it reads the value the run uses) and
    recorded with what was asked and why."""
    from attnlab.cli.plan import make_plan

    cfg = compose_cfg(["trainer=ddp_cpu", "global_batch_size=64", "data.batch_size=16"], tmp_path)
    plan = make_plan(cfg)
    t = plan.trainer
    assert (t.accelerator, t.on_gpu, t.devices, t.num_nodes, t.processes) == ("cpu", False, 2, 1, 2)
    assert t.accumulate_grad_batches == 2 and cfg.trainer.accumulate_grad_batches == 2
    assert plan.decided == {"trainer.accumulate_grad_batches": {
        "asked": 1, "decided": 2, "on": "cpu",
        "why": "global_batch_size=64 over data.batch_size=16 x 2 device(s) x 1 node(s)"}}
    auto = make_plan(compose_cfg(["trainer=ddp", "trainer.accelerator=cpu"], tmp_path))
    assert (auto.trainer.devices, auto.trainer.precision) == (1, "32-true")
    assert {k: (v["asked"], v["decided"]) for k, v in auto.decided.items()} == {
        "trainer.precision": ("bf16-mixed", "32-true"), "trainer.devices": ("auto", 1)}
    assert not t.sharded and not t.writes_own_checkpoints and not plan.averages_weights
    fsdp = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.precision=32-true"]
    sharded = make_plan(compose_cfg(fsdp, tmp_path))
    assert sharded.trainer.sharded and sharded.trainer.writes_own_checkpoints and not sharded.averages_weights
    assert make_plan(compose_cfg(["trainer=ddp_cpu", "callbacks=ema"], tmp_path)).averages_weights
    with pytest.raises(UserError, match=r"callbacks=ema .* FSDP's sharded weights cannot be averaged"):
        make_plan(compose_cfg([*fsdp, "callbacks=ema"], tmp_path))  # refused before anything is built


def test_cfg_job_stays_free_of_torch(tmp_path):
    """`--cfg job` prints the composed config and imports no torch: the plan is made where the run starts, not
    where Hydra composes."""
    import subprocess
    import sys

    from conftest import ROOT

    out = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "train.py"), "trainer=multinode",
                          "trainer.accelerator=cpu", "--cfg", "job"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "num_nodes: 2" in out.stdout, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time")}
    assert len(imported) > 100 and not imported & {"torch", "lightning", "attnlab.cli.plan"}, sorted(imported)[:50]
