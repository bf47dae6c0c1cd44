"""The command line composed once before Hydra runs it, so that a group option that does not exist, a key not in the
config or a config file that is not valid YAML is answered by one paragraph: which group or key, the closest valid
names, and where options come from. Any other error is left to Hydra's own run."""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.errors import UserError

# Hydra's flags that make it do something other than run the app
OTHER_MODES = ("help", "hydra_help", "info", "shell_completion", "experimental_rerun", "config_path")


@dataclass(frozen=True)
class Composed:
    """The command line as Hydra reads it, and the config of each of its variants (`_variants`; None for one that
    does not compose for another reason than those translated here: Hydra's own run says why)."""

    args: argparse.Namespace
    overrides: list[str]
    variants: list[list[str]]
    configs: list[Any]

    @property
    def mode(self) -> str | None:
        """The run mode the config sets (`hydra.mode`: RUN, MULTIRUN, or "" where it sets none); None where the
        command line did not compose."""
        cfg = self.configs[0] if self.configs else None
        if cfg is None:
            return None
        mode = cfg.hydra.get("mode")
        return mode.name if hasattr(mode, "name") else str(mode or "")


def check_composes(argv: list[str], conf_dir: Path, config_name: str) -> Composed | None:
    """Compose `argv` as Hydra will (each value of a sweep's group choices once); raise a UserError for an option
    that is not there, a key that is not in the config, or a config file that is not valid YAML. None where the
    command line asks Hydra for something other than a run (--help, --info, ...)."""
    from attnlab.compat import hydra_args_parser

    args, rest = hydra_args_parser().parse_known_args(argv)  # Hydra's own parser; rest: the flags it does not know
    overrides = [*args.overrides, *rest]
    if any(getattr(args, m, None) for m in OTHER_MODES) or any(o.startswith("-") for o in overrides):
        return None
    config_dir = Path(args.config_dir).expanduser().absolute() if args.config_dir else None
    variants = _variants(overrides)
    configs = [_compose(variant, conf_dir, args.config_name or config_name, config_dir) for variant in variants]
    return Composed(args, overrides, variants, configs)


def _variants(overrides: list[str]) -> list[list[str]]:
    """The command line without sweeps: the first value of each, plus one line per other value of a swept group."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra's own message for a line it cannot parse is clear (it names the override)
        return []
    first, swept = [], []
    for text, o in zip(overrides, parsed):
        if not o.is_sweep_override():
            first.append(text)
            continue
        try:
            values = list(o.sweep_string_iterator())
        except Exception:  # interval(...) and other sweeps without a list of values: a sweeper's business
            continue
        first.append(f"{o.get_key_element()}={values[0]}")
        if "." not in o.key_or_group:  # a group's options: each is looked up
            swept += [(len(first) - 1, f"{o.get_key_element()}={v}") for v in values[1:]]
    lines = [first]
    for i, text in swept:
        lines.append(first[:i] + [text] + first[i + 1:])
    return lines


def _compose(overrides: list[str], conf_dir: Path, config_name: str, config_dir: Path | None) -> Any:
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException, MissingConfigException

    extra = []
    if config_dir is not None:
        if any(o.lstrip("+").startswith("hydra.searchpath=") for o in overrides):
            return  # both: Hydra's order of the two is its own; its run answers
        extra = [f"hydra.searchpath=[file://{config_dir}]"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir)):
            return compose(config_name=config_name, overrides=[*overrides, *extra], return_hydra_config=True)
    except MissingConfigException as e:
        raise _missing_option(e, conf_dir, config_dir) from None
    except ConfigCompositionException as e:
        err = _not_in_struct(e, overrides, conf_dir, config_name, extra)
        if err is not None:
            raise err from None
    except yaml.YAMLError as e:
        raise _bad_yaml(e) from None
    except Exception:  # anything else: Hydra's own run says it
        pass
    finally:
        GlobalHydra.instance().clear()


def _missing_option(e, conf_dir: Path, config_dir: Path | None) -> UserError:
    missing = e.missing_cfg_file or ""
    group, _, option = missing.rpartition("/")
    if not group:
        return UserError(f"{str(e).splitlines()[0]}. The configs are read from {conf_dir}"
                         + (f" and --config-dir {config_dir}" if config_dir else "") + ".")
    options = sorted(e.options or [])
    close = difflib.get_close_matches(option, options, n=3, cutoff=0.5)
    where = f"attnlab's configs ({conf_dir / group}/*.yaml)" + (
        f" and your --config-dir ({config_dir / group}/*.yaml)" if config_dir else
        "; your own go in a folder given with --config-dir (<dir>/" + group + "/<name>.yaml)")
    return UserError(
        f"{group}={option}: the config group '{group}' has no option '{option}'."
        + (f" Did you mean {' or '.join(close)}?" if close else "")
        + f" Its options: {', '.join(options) or 'none'}. Options come from {where}.")


def _not_in_struct(e, overrides: list[str], conf_dir: Path, config_name: str, extra: list[str]) -> UserError | None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    cause = e.__cause__
    full_key = getattr(cause, "full_key", None)
    if "not in struct" not in str(cause) or not full_key:
        return None
    bad = next((o for o in overrides if o.split("=", 1)[0] == str(e).split("'")[1]), None)
    if bad is None:
        return None
    parent_key, _, name = str(full_key).rpartition(".")
    rest = [o for o in overrides if o is not bad]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir)):
            cfg = compose(config_name=config_name, overrides=[*rest, *extra], return_hydra_config=True)
        choice = cfg.hydra.runtime.choices.get(parent_key) if parent_key else None
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        keys = sorted(str(k) for k in parent.keys()) if parent is not None and hasattr(parent, "keys") else []
    except Exception:
        keys, choice = [], None
    close = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
    node = (f"{parent_key}={choice} (conf/{parent_key}/{choice}.yaml)" if choice else
            f"the {parent_key} config" if parent_key else "the config")
    value = bad.split("=", 1)[1]
    return UserError(
        f"{bad}: {node} has no key '{name}'."
        + (f" Did you mean {' or '.join(f'{parent_key}.{k}' if parent_key else k for k in close)}?" if close else "")
        + (f" Its keys: {', '.join(keys)}." if keys and not close else "")
        + f" To add a key it does not have (a constructor argument the YAML leaves out), write +{bad.split('=')[0]}="
        f"{value}.")


def _bad_yaml(e) -> UserError:
    mark = getattr(e, "problem_mark", None)
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    return UserError(f"{where} is not valid YAML: {problem}" + (f" ({context})" if context else "")
                     + ". Fix the file there (a missing bracket, quote or colon, or a tab used for indentation) and "
                     "run the same command again.")
