"""Print the run's config as a Rich tree and save it to the run directory."""

from __future__ import annotations

from pathlib import Path

import rich
import rich.syntax
import rich.tree
from omegaconf import DictConfig, OmegaConf

ORDER = ("data", "model", "optimizer", "scheduler", "callbacks", "logger", "trainer", "paths", "extras")


def print_config_tree(cfg: DictConfig, save_to: Path | None = None) -> None:
    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    keys = [k for k in ORDER if k in cfg] + [k for k in cfg if k not in ORDER and k != "hydra"]
    for key in keys:
        branch = tree.add(key, style="bold", guide_style="dim")
        if OmegaConf.is_missing(cfg, key):  # a required value the command line did not give: the app says which
            branch.add(rich.syntax.Syntax("???", "yaml"))
            continue
        node = cfg[key]
        text = OmegaConf.to_yaml(node, resolve=True) if isinstance(node, DictConfig) else str(node)
        branch.add(rich.syntax.Syntax(text, "yaml"))
    rich.print(tree)
    if save_to is not None:
        save_to.parent.mkdir(parents=True, exist_ok=True)
        with open(save_to, "w") as f:
            rich.print(tree, file=f)
