"""The platform's own settings, declared once with their types and defaults: the platform keys of a config group's
node, attnlab's and not its constructor's (`ModelKeys`, `OptimizerKeys`, `DataKeys`: a node that leaves one out gets
its default, and they are taken off before it is instantiated unless its constructor names them), and the entry
configs' own top-level keys (`RunSettings`); and where the packaged configs are (`CONF_DIR`).

Nothing here imports torch, so `train.py --help` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Interval

from attnlab.types import DecodeSettings, NonNegativeFloat, PositiveInt, UnitInterval

# the configs: conf/ at the repository's top level in a checkout (and an editable install), attnlab/conf inside an
# installed wheel (pyproject.toml ships conf/ there)
_PACKAGED_CONF = Path(__file__).resolve().parent / "conf"
CONF_DIR = _PACKAGED_CONF if _PACKAGED_CONF.is_dir() else Path(__file__).resolve().parents[2] / "conf"


# ---- the platform keys of each config group
@dataclass(frozen=True)
class ModelKeys:
    """The platform keys of `model`: the data kinds a model trains on (`data.kind`), the metric that names the best
    checkpoint and its direction, `torch.compile` of the training step, the activation checkpointing of the
    network's blocks (attnlab.strategies)."""

    data_kinds: list[str] = field(default_factory=list)
    monitor: str = "val/loss"
    monitor_mode: Literal["min", "max"] = "min"
    compile: bool = False
    activation_checkpointing: bool = False


@dataclass(frozen=True)
class OptimizerKeys:
    """attnlab's optimizer options: `blr` (lr = blr x effective batch / 256, with `lr: null`) and `layer_decay`
    (layer-wise lr decay, attnlab.optim.param_groups). None: not used."""

    blr: NonNegativeFloat | None = None
    layer_decay: UnitInterval | None = None


@dataclass(frozen=True)
class DataKeys:
    """The platform keys of `data`: its kind (what `model.data_kinds` lists) and its name."""

    kind: str | None = None
    name: str | None = None


PLATFORM_GROUPS: dict[str, type] = {"model": ModelKeys, "optimizer": OptimizerKeys, "data": DataKeys}


# group -> {key: default}; a default of None is not written into a node that leaves the key out
PLATFORM_KEYS: dict[str, dict[str, Any]] = {g: dataclasses.asdict(cls()) for g, cls in PLATFORM_GROUPS.items()}


def split_optimizer(node: dict) -> tuple[dict, OptimizerKeys]:
    """An optimizer node (resolved, or a partial's keywords) -> (the optimizer's own arguments, attnlab's options)."""
    own = {k: v for k, v in node.items() if k not in PLATFORM_KEYS["optimizer"]}
    options = OptimizerKeys(**{k: node[k] for k in PLATFORM_KEYS["optimizer"] if k in node})
    return own, options


# ---- the run keys of the entry configs
@dataclass(frozen=True)
class RunSettings:
    """The entry configs' own top-level keys (train.yaml, eval.yaml), checked like a constructor's arguments."""

    seed: Annotated[int, Interval(ge=0, le=2**32 - 1)] = 42  # numpy's seed range
    train: bool = True
    test: bool = True
    resume: bool = True
    ckpt_path: str | None = None
    global_batch_size: PositiveInt | None = None
    task_name: str = "train"
    optimized_metric: str | None = None
    preflight: bool = False
    preflight_steps: PositiveInt = 10
    split: Literal["test", "val"] = "test"
    decode: DecodeSettings | None = None
    trust_checkpoint: bool = False  # attnlab.checkpoints.trust

    @classmethod
    def of(cls, cfg: Any) -> RunSettings:
        """The run keys of a composed config (a DictConfig, resolved), the defaults above for those it leaves
        out or leaves missing (`ckpt_path: ???`)."""
        from omegaconf import DictConfig, OmegaConf

        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in cfg or OmegaConf.is_missing(cfg, f.name):
                continue
            value = cfg[f.name]
            values[f.name] = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
        return cls(**values)
