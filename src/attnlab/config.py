"""Config-time helpers: OmegaConf resolvers and the model/data compatibility check.

Nothing here imports torch, so `train.py --cfg job` and `--help` stay fast.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from attnlab.errors import UserError

# the packaged configs (package data: a wheel installs them beside the code)
CONF_DIR = Path(__file__).resolve().parent / "conf"


def patch_size_for(image_size: int) -> int:
    """Patch size giving a 4x4 to 16x16 token grid: 2 px up to 16 px images, 4 px up to 64 px, else 16 px."""
    image_size = int(image_size)
    return 2 if image_size <= 16 else 4 if image_size <= 64 else 16


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("patch_size_for"):
        OmegaConf.register_new_resolver("patch_size_for", patch_size_for)
    if not OmegaConf.has_resolver("cwd"):  # unlike ${hydra:runtime.cwd}, also resolvable for a sweep's directory
        OmegaConf.register_new_resolver("cwd", os.getcwd)


def _group_options(group: str) -> dict[str, dict]:
    options = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        options[path.stem] = yaml.safe_load(path.read_text()) or {}
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
    import inspect

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
