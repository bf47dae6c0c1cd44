"""W&B sweep files: each parses, optimizes a metric its task logs, and expands into command lines Hydra accepts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, compose_cfg, run_here

SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


def sample(params: dict, rng: random.Random) -> dict:
    """One parameter set the way a W&B agent draws it."""
    out = {}
    for key, spec in params.items():
        if "value" in spec:
            out[key] = spec["value"]
        elif "values" in spec:
            out[key] = rng.choice(spec["values"])
        else:
            lo, hi = float(spec["min"]), float(spec["max"])
            out[key] = rng.uniform(lo, hi)
    return out


def command_line(sweep: dict, params: dict) -> list[str]:
    """Expand `command` as the agent does: ${args_no_hyphens} becomes key=value items."""
    args = []
    for item in sweep["command"]:
        if item == "${args_no_hyphens}":
            args += [f"{k}={v}" for k, v in params.items()]
        elif item == "${program}":
            args.append(sweep["program"])
        elif item not in ("${env}", "${interpreter}"):
            args.append(item)
    return args


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_file_is_valid_and_composes(path: Path, tmp_path):
    sweep = yaml.safe_load(path.read_text())
    assert sweep["method"] in ("bayes", "random", "grid")
    assert sweep["command"][-1] == "${args_no_hyphens}" and "-m" not in sweep["command"]
    assert (ROOT / sweep["program"]).exists()
    rng = random.Random(0)
    for _ in range(3):
        args = command_line(sweep, sample(sweep["parameters"], rng))
        assert args[0] == sweep["program"]
        cfg = compose_cfg(args[1:], tmp_path)  # Hydra accepts every key (each exists in the config)
        assert "hparams_search" not in [a.split("=")[0] for a in args]
        # the sweep optimizes the best-so-far of the metric the task monitors (read from the run summary)
        assert sweep["metric"]["name"] == f"{cfg.model.monitor}_best"
        assert sweep["metric"]["goal"] == ("maximize" if cfg.model.monitor_mode == "max" else "minimize")


@pytest.mark.slow
def test_one_sweep_command_runs(tmp_path, log_env):
    sweep = yaml.safe_load((ROOT / "sweeps" / "vit_digits.yaml").read_text())
    args = command_line(sweep, sample(sweep["parameters"], random.Random(1)))
    out = run_here(args[0], *[a for a in args[1:] if not a.startswith("logger=")], "debug=fdr", env=log_env)
    assert out.returncode == 0, out.stdout[-3000:]


def test_a_parameter_missing_from_the_config_is_refused(log_env):
    out = run_here("train.py", "optimizer.no_such_option=1", "debug=fdr", env=log_env)
    assert out.returncode == 2 and "optimizer.no_such_option=1: optimizer=adamw (conf/optimizer/adamw.yaml) has no " \
                                   "key 'no_such_option'" in out.stdout, out.stdout[-2000:]


SEARCHES = sorted((ROOT / "conf" / "hparams_search").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SEARCHES, ids=lambda p: p.stem)
def test_optuna_search_optimizes_the_task_metric_over_keys_that_exist(path: Path, tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from attnlab.config import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(config_name="train", overrides=[f"hparams_search={path.stem}"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert cfg.optimized_metric == f"{cfg.model.monitor}_best"
    assert sweeper.direction == ("maximize" if cfg.model.monitor_mode == "max" else "minimize")
    for key in sweeper.params:
        if not key.startswith("+"):  # `+key` adds a key; every other one must already be in the config
            assert OmegaConf.select(cfg, key, default="__missing__") != "__missing__", f"{path.stem}: {key}"
