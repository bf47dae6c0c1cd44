"""`launcher=slurm`: the job fitted to its partition before Hydra composes and submits anything.

For a SLURM multirun, `fit_command_line` fits the job's resources to the partition from the run's own settings, has
SLURM judge the batch script (`sbatch --test-only`), and returns the command line with the fitted values as
overrides of the run's own keys (`launcher.cpus_per_task=1 ... trainer.devices=1`), which each job's config then
holds. What sbatch would refuse is one paragraph naming the setting."""

from __future__ import annotations

import os
import sys
from typing import Any

from attnlab.errors import UserError
from attnlab.utils.dotted import select

# hydra.launcher.<key> -> the run's own key that conf/launcher/slurm.yaml maps it from
LAUNCHER_KEYS = {k: f"launcher.{k}" for k in ("partition", "account", "qos", "gpus_per_node", "tasks_per_node",
                                               "cpus_per_task", "mem_gb", "timeout_min", "signal_delay_s",
                                               "max_num_timeout")} | {"nodes": "trainer.num_nodes"}
# keys whose value decides the job's resources: the same for every job of a sweep (the launcher reads them once)
RESOURCE_KEYS = ("trainer.accelerator", "trainer.devices", "trainer.num_nodes")
# options that may make a command a multirun without -m (an Optuna search sets hydra.mode: MULTIRUN)
MULTIRUN_KEYS = ("hydra.mode=", "hparams_search=", "experiment=", "hydra/sweeper=")
AUTO_WHEN_NULL = ("tasks_per_node", "cpus_per_task", "timeout_min", "signal_delay_s")


def fit_command_line(argv: list[str], composed) -> list[str]:
    """argv with the fitted SLURM resources appended (or put in place of the user's own values), or argv unchanged
    where the command is not a SLURM multirun. `composed`: argv as cli/hydra_errors.check_composes composed it."""
    if composed is None:
        return argv
    args, overrides = composed.args, composed.overrides
    may_sweep = args.multirun or any(o.lstrip("+").startswith(MULTIRUN_KEYS) for o in overrides)
    variants, cfgs = composed.variants, composed.configs
    if not may_sweep or args.cfg or not cfgs or cfgs[0] is None or not _is_slurm(cfgs[0]):
        return argv
    if not args.multirun and "MULTIRUN" not in str(cfgs[0].hydra.get("mode")):  # a single run trains here
        return argv
    given = _given(overrides)
    from attnlab.cluster.nodes import read_cluster
    from attnlab.cli.slurm.fit import fit

    cluster = read_cluster()
    fits = [(v, c, fit(settings(c, given), cluster)) for v, c in zip(variants, cfgs) if c is not None]
    _check_same(fits)
    _, cfg, job = fits[0]
    from attnlab.cli.slurm.estimates import size

    cache_dir = select(cfg, "paths.cache_dir") or os.environ.get("ATTNLAB_CACHE_DIR")
    size(job, settings(cfg, given), [c for _, c, _ in fits], overrides, cache_dir)
    where = _targets(cfg)  # launcher.<key>, or hydra.launcher.<key> where the config sets that itself
    fitted = {where.get(k, k): v for k, v in job.overrides().items() if k in given or _changes(cfg, where.get(k, k), v)}
    params = _launcher_params(cfg, fitted)
    from attnlab.cli.slurm.sbatch import test_only

    named = {f"hydra.launcher.{k}": v for k, v in params.items()} | job.overrides()
    test_only(params, named | {"trainer.num_nodes": job.nodes, "launcher.mem_gb": params.get("mem_gb"),
                               "launcher.account": params.get("account"), "launcher.qos": params.get("qos")})
    print(f"attnlab: {job.describe()}", file=sys.stderr, flush=True)
    return _with(argv, fitted)


def settings(cfg, given: set[str]):
    """The run's settings that decide its resources (fit.Settings), from its composed config: `hydra.launcher.<key>`
    set to a value of its own (not the launcher.* key slurm.yaml maps) counts as given."""
    from omegaconf import OmegaConf

    from attnlab.cli.slurm.fit import AUTO, Settings

    raw = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    values: dict[str, Any] = {}
    for hydra_key, key in LAUNCHER_KEYS.items():
        own = raw.get(hydra_key, "${" + key + "}")
        if own == "${" + key + "}":
            values[key] = select(cfg, key)
        else:
            values[key] = select(cfg, f"hydra.launcher.{hydra_key}")
            given = given | {key}
    nodes = select(cfg, "trainer.num_nodes")
    if values["trainer.num_nodes"] != nodes:  # hydra.launcher.nodes of its own
        raise UserError(f"hydra.launcher.nodes={values['trainer.num_nodes']} but trainer.num_nodes={nodes}: Lightning "
                        f"refuses a node count other than SLURM's. Set trainer.num_nodes={values['trainer.num_nodes']} "
                        "alone (launcher=slurm asks SLURM for trainer.num_nodes nodes).")
    own = {}
    for key in LAUNCHER_KEYS.values():
        name = key.split(".", 1)[1]
        if key.startswith("launcher."):  # null: auto, except for the GPUs (null: none) and the names
            own[name] = AUTO if values[key] is None and name in AUTO_WHEN_NULL else values[key]
    return Settings(accelerator=str(select(cfg, "trainer.accelerator", "auto")),
                    devices=select(cfg, "trainer.devices", 1), num_nodes=values["trainer.num_nodes"] or 1,
                    num_workers=select(cfg, "data.num_workers", 0) or 0, given=given, **own)


def _targets(cfg) -> dict[str, str]:
    """{the run's own key: the key its fitted value is written to}: `hydra.launcher.<key>` where that is not the
    interpolation of the launcher.* key (`hydra/launcher=submitit_slurm` without launcher=slurm, or given itself)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    return {key: f"hydra.launcher.{hydra_key}" for hydra_key, key in LAUNCHER_KEYS.items()
            if key.startswith("launcher.") and raw.get(hydra_key, "${" + key + "}") != "${" + key + "}"}


def _is_slurm(cfg) -> bool:
    target = str((cfg.hydra.get("launcher") or {}).get("_target_", ""))
    return target.endswith("SlurmLauncher")


def _given(overrides: list[str]) -> set[str]:
    """The keys the command line sets (`hydra.launcher.<key>` as the run's own key); a sweep over a key that decides
    the job's resources is refused."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = set()
    for text, o in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        key = o.key_or_group
        if key.startswith("hydra.launcher."):
            key = LAUNCHER_KEYS.get(key.split(".", 2)[2], key)
        resource = key in RESOURCE_KEYS or key.startswith(("launcher.", "hydra.launcher."))
        if o.is_sweep_override() and resource:
            raise UserError(f"{text}: launcher=slurm asks SLURM for the same resources for every job of a sweep "
                            "(Hydra's submitit launcher reads them once), so this setting cannot vary within one. Run "
                            f"one sweep per value ({key}=<value> in each).")
        given.add(key)
    return given


def _check_same(fits: list) -> None:
    first = fits[0][2]
    for variant, _, other in fits[1:]:
        if other.overrides() != first.overrides() or other.nodes != first.nodes:
            swept = next((a for a, b in zip(variant, fits[0][0]) if a != b), " ".join(variant))
            raise UserError(f"{swept}: the jobs of this sweep would need different SLURM resources ({first.describe()}"
                            f" / {other.describe()}), and launcher=slurm asks for the same for every job of a sweep "
                            "(Hydra's submitit launcher reads them once). Run one sweep per choice.")


def _changes(cfg, key: str, value: Any) -> bool:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(cfg, key, default="<missing>") != value
    except Exception:  # an interpolation that resolves only in the job
        return True


def _launcher_params(cfg, fitted: dict[str, Any]) -> dict[str, Any]:
    """hydra.launcher resolved with the fitted values, as the submitit launcher will read it (without its folder and
    job name, which name the sweep's files)."""
    from omegaconf import OmegaConf, open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        for key, value in fitted.items():
            OmegaConf.update(cfg, key, value, force_add=True)
    params = {}
    for key in cfg.hydra.launcher:
        if key in ("submitit_folder", "name"):
            continue
        value = OmegaConf.select(cfg.hydra.launcher, str(key), throw_on_resolution_failure=False)
        params[str(key)] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return params


def _with(argv: list[str], fitted: dict[str, Any]) -> list[str]:
    """argv with each fitted `key=value` in place of the user's own (the checked value), else appended."""
    out, done = [], set()
    for arg in argv:
        key = arg.lstrip("+").partition("=")[0]
        if key in fitted and "=" in arg and key not in done:
            out.append(f"{key}={_value(fitted[key])}")
            done.add(key)
        elif key not in fitted or "=" not in arg:
            out.append(arg)
    return out + [f"{k}={_value(v)}" for k, v in fitted.items() if k not in done]


def _value(value: Any) -> str:
    return "null" if value is None else str(value)
