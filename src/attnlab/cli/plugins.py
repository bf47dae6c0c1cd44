"""The Hydra plugins (launchers, sweepers) that a command line's options need, checked before Hydra composes: a
missing one is named with the pip package that installs it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from attnlab.errors import UserError

# Hydra's launcher and sweeper configs -> (the module that registers them, its pip package)
PLUGINS = {
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "optuna": ("optuna", "optuna"),  # the sweeper itself ships with attnlab (hydra_plugins.attnlab_optuna_sweeper)
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
    "ray": ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher"),
    "rq": ("hydra_plugins.hydra_rq_launcher", "hydra-rq-launcher"),
    "ax": ("hydra_plugins.hydra_ax_sweeper", "hydra-ax-sweeper"),
    "nevergrad": ("hydra_plugins.hydra_nevergrad_sweeper", "hydra-nevergrad-sweeper"),
}
_OVERRIDE = re.compile(r"override\s+/?hydra/(launcher|sweeper)\s*:\s*([\w.-]+)")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def required_plugins(argv: list[str], conf_dir: Path) -> list[tuple[str, str, str, str]]:
    """(the command-line item, the Hydra launcher/sweeper config, module, pip package) for each plugin that the
    group options on the command line (`launcher=`, `hparams_search=`, `hydra/launcher=`, `hydra/sweeper=`) need."""
    needed = []
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or not value:
            continue
        if key in ("hydra/launcher", "hydra/sweeper"):
            names = [value]
        elif key in ("launcher", "hparams_search"):
            path = conf_dir / key / f"{value}.yaml"
            names = [m.group(2) for m in _OVERRIDE.finditer(path.read_text())] if path.is_file() else []
        else:
            continue
        needed += [(arg, name, *PLUGINS[name]) for name in names if name in PLUGINS]
    return needed


def check_plugins(argv: list[str], conf_dir: Path) -> None:
    for arg, name, module, package in required_plugins(argv, conf_dir):
        if not _installed(module):
            raise UserError(
                f"{arg} runs through Hydra's '{name}' plugin, which is not installed (no module {module}). "
                f"Install it with `pip install {package}` (it is among attnlab's dependencies: `pip install -e .` "
                "installs it), or run without this option."
            )
