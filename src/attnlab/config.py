"""Config-time helpers: a composed config prepared (user imports, moved `_target_`s, platform keys), the OmegaConf
resolvers, the model/data and schedule checks, and `compose_run`.

Nothing here imports torch at import time, so `train.py --cfg job` and `--help` stay fast.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.errors import UserError
from attnlab.checkpoints.trust import current_target
# PLATFORM_KEYS is also imported from here by users (docs/your-code.md)
from attnlab.settings import CONF_DIR, PLATFORM_KEYS  # noqa: F401

def prepare(cfg: DictConfig) -> None:
    """Prepare a composed config in place: import the user's modules, rename moved `_target_`s, fill in the platform
    keys a node leaves out, and refuse scheduler keys the chosen schedule does not take. Cheap and idempotent."""
    import_user_modules((cfg.get("extras") or {}).get("imports"))
    rename_moved_targets(cfg)
    apply_platform_defaults(cfg)
    check_schedule_keys(cfg)


def rename_moved_targets(cfg: DictConfig) -> None:
    """Rename each moved `_target_` of the config in place (`current_target`), so that a config of an older layout (a
    run folder's, given to --rerun) builds, and records, the current names."""
    def moved(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "_target_" and isinstance(value, str) and current_target(value) != value:
                    yield [*path, key], current_target(value)
                else:
                    yield from moved(value, [*path, key])
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from moved(value, [*path, i])

    for path, name in list(moved(OmegaConf.to_container(cfg, resolve=False), [])):
        node = cfg
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = name


def apply_platform_defaults(cfg: DictConfig) -> None:
    """Give each config group's node the platform keys it leaves out, those whose default is not None."""
    for group, keys in PLATFORM_KEYS.items():
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            continue
        with open_dict(node):
            for key, default in keys.items():
                if default is not None and key not in node:
                    node[key] = default


def named_parameters(cls: type) -> set[str]:
    """The keyword arguments that a class's constructor, or one of its bases' it passes **kwargs on to, names."""
    names = set()
    for klass in inspect.getmro(cls):
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names - {"self"}


def constructor_kwargs(group: str, node: dict, cls: type) -> tuple[dict, dict]:
    """Split a resolved node (without `_target_`) into the constructor's arguments and the platform keys it does
    not take."""
    platform = {k for k in PLATFORM_KEYS.get(group, {}) if k in node}
    taken = platform & named_parameters(cls)
    return ({k: v for k, v in node.items() if k not in platform or k in taken},
            {k: node[k] for k in platform - taken})


def import_user_modules(modules: list[str] | None) -> None:
    """`extras.imports`: the user's modules, imported before anything is built (timm registrations, their own
    networks, tasks and data modules). The working directory is importable, as under `python -m`."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules or []:
        try:
            importlib.import_module(str(name))
        except ImportError as e:
            raise UserError(
                f"extras.imports names the module {name}, which cannot be imported ({e}). Install the package that "
                f"holds it (pip install -e <your package>), add its folder to PYTHONPATH, or run from the folder "
                "that holds it."
            ) from e


def patch_size_for(image_size: int) -> int:
    """Patch size giving a 4x4 to 16x16 token grid: 2 px up to 16 px images, 4 px up to 64 px, else 16 px."""
    image_size = int(image_size)
    return 2 if image_size <= 16 else 4 if image_size <= 64 else 16


def _cpu_has_bf16_units() -> bool:
    """AVX512-BF16 or AMX (Linux's /proc/cpuinfo flags): bf16 matmuls there run at about twice fp32's FLOP/s, on other
    CPUs they are emulated and much slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def fast_precision(accelerator: str = "auto") -> str:
    """`${fast_precision:${trainer.accelerator}}`: "bf16-mixed" where the device computes bf16 natively (a CUDA GPU
    with bf16, a CPU with AVX512-BF16 or AMX), else "32-true"."""
    if str(accelerator) in ("auto", "gpu", "cuda"):
        import torch

        if torch.cuda.is_available():
            return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
        if str(accelerator) != "auto":
            return "32-true"
    if str(accelerator) in ("auto", "cpu"):
        return "bf16-mixed" if _cpu_has_bf16_units() else "32-true"
    return "32-true"


def register_resolvers() -> None:
    from attnlab.data.text import glue_tasks
    from attnlab.cluster import launch

    resolvers = {
        "fast_precision": fast_precision,
        "patch_size_for": patch_size_for,
        # a run directory of its own, even for runs started in one second; one for all the ranks of a torchrun or srun
        "claim_dir": launch.claim_run_folder,
        "rank_zero_only": launch.rank_zero_only,  # .hydra/ from rank 0 alone
        "rank_suffix": launch.rank_suffix,  # train_rank1.log, ...
        "glue_monitor": lambda task: glue_tasks.monitor_of(str(task)),  # the metric GLUE ranks a task by
        "cwd": os.getcwd,  # unlike ${hydra:runtime.cwd}, also resolvable for a sweep's directory
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def _group_options(group: str) -> dict[str, dict]:
    options, loader = {}, getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        options[path.stem] = yaml.load(path.read_text(), Loader=loader) or {}
    return options


def _data_kind(options: dict[str, dict], name: str) -> str | None:
    node = options.get(name, {})
    if "kind" in node:
        return node["kind"]
    for parent in node.get("defaults", []) or []:
        if isinstance(parent, str) and parent != "_self_":
            return _data_kind(options, parent)
    return None


def check_compatible(cfg: DictConfig) -> None:
    """Refuse a model/data pair whose kinds do not match, naming the data configs the model can use."""
    accepts = list(cfg.model.get("data_kinds") or [])
    kind = cfg.data.get("kind")
    if not accepts or kind in accepts:
        return
    from hydra.core.hydra_config import HydraConfig

    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model_name = choices.get("model", cfg.model.get("_target_"))
    data_name = choices.get("data", kind)
    data_options = _group_options("data")
    compatible = [n for n in data_options if _data_kind(data_options, n) in accepts]
    raise UserError(
        f"model={model_name} cannot train on data={data_name}: the model takes data of kind {accepts}, "
        f"but data={data_name} is of kind '{kind}'. Compatible data configs for model={model_name}: "
        f"{', '.join(compatible) or 'none'}. Pick one of them (e.g. data={compatible[0] if compatible else '...'}) "
        f"or a model that takes '{kind}' data."
    )


def check_schedule_keys(cfg: DictConfig) -> None:
    """Refuse scheduler settings the chosen schedule does not take (an experiment's cosine `warmup` left over after
    `scheduler=onecycle`, a typo), before any data is prepared."""
    from hydra.utils import get_method

    sched = cfg.get("scheduler")
    if not sched or not sched.get("_target_"):
        return
    params = inspect.signature(get_method(sched._target_)).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    extra = [k for k in sched if not str(k).startswith("_") and k not in params]
    if extra:
        from hydra.core.hydra_config import HydraConfig

        name = HydraConfig.get().runtime.choices.get("scheduler") if HydraConfig.initialized() else sched._target_
        takes = [k for k in params if k not in ("optimizer", "total_steps")]
        raise UserError(
            f"scheduler={name} does not take {', '.join(extra)} (it takes {', '.join(takes)}); an experiment config "
            f"may have set it for its own schedule. Remove it on the command line ("
            + " ".join(f"~scheduler.{k}" for k in extra) + ") or choose a schedule that takes it."
        )


def compose_run(overrides: list[str], run_dir: str | Path, config_name: str = "train", *,
                data_dir: str | Path | None = None, log_dir: str | Path | None = None,
                cache_dir: str | Path | None = None) -> DictConfig:
    """The config `python <config_name>.py <overrides>` would run, with its run directory at `run_dir`, for notebooks,
    benchmarks and tests: `attnlab.cli.training.train(compose_run([...], run_dir))` trains as train.py does.
    `data_dir`, `log_dir` and `cache_dir` set `paths.*` (left out, they are what the config composes to)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
        cfg.hydra.job.num = 0
    HydraConfig().set_config(cfg)  # what ${hydra:...} in the config reads
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)
        for key, value in (("data_dir", data_dir), ("log_dir", log_dir), ("cache_dir", cache_dir)):
            if value is not None:
                cfg.paths[key] = str(value)
        del cfg.hydra
    return cfg
