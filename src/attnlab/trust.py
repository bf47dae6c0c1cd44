"""What a file from elsewhere may make attnlab run: nothing, unless the user says they trust it.

A checkpoint, a run folder or a Hugging Face folder can come from anywhere (a colleague, a paper's page, a shared
project folder), and so can what it names. Two things guard every entry point:

- Unpickling: checkpoints are loaded with `weights_only=True` (attnlab.checkpoints), other pickles through a
  restricted unpickler (utils/safe_pickle.py): a file that asks for any other global is refused before anything in it
  runs.
- Names: a checkpoint's config and hyperparameters, or a run folder's `.hydra/config.yaml` (`--rerun`), name what
  attnlab would import and build: `_target_`s (the task, its network, the optimizer and schedule, the data module),
  `extras.imports`, and the dotted paths of `model.net` / `model.backbone`. Importing or calling them is running code
  too. Only these are imported or built (`check_names`): attnlab's own classes and modules; what attnlab's packaged
  configs name (torch's optimizers, Lightning's callbacks, ...); and what the user's own command names: the config
  folders it composes from (`--config-dir`, `hydra.searchpath`), its command-line overrides and its composed config
  (`extras.imports` included, whose modules admit what they define). Anything else is refused, naming it.

`trust_checkpoint=true` on the command line (`TRUST_KEY`) lifts both for that command: files are unpickled in full,
and what they name is imported and built. It is read from the command's own config, never from a file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from attnlab.errors import UserError

TRUST_KEY = "trust_checkpoint"
HOW = (f"If you trust where the file came from, add {TRUST_KEY}=true to the command: the file is then unpickled in "
       "full, and the modules and classes its config names (_target_s, extras.imports) are imported and built.")
# keys whose value may be the dotted path of a class or function of the user's (attnlab.nn.registry, nn/factory.py)
DOTTED_KEYS = ("net", "backbone")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")

_command: dict[str, Any] = {"trusted": False, "names": frozenset()}


def from_command(cfg: Any, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """What this command trusts (every entry point's `begin`; `--rerun`'s own command line): its `trust_checkpoint`
    key, and the names its own composed config and `overrides` (key=value) hold."""
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else dict(cfg or {})
    _command["trusted"] = node.get(TRUST_KEY) is True
    names = {name for _, _, name in names_in({k: v for k, v in node.items() if k != "hydra"})}
    names |= {name for arg in overrides for name in _DOTTED.findall(str(arg).partition("=")[2])}
    _command["names"] = frozenset(names)


def trusted() -> bool:
    """Whether this command trusts the files it is given (`trust_checkpoint=true`)."""
    return bool(_command["trusted"])


def set_trusted(on: bool) -> None:
    _command["trusted"] = bool(on)


def names_in(node: Any, where: str = "") -> Iterator[tuple[str, str, str]]:
    """(key, "module" or "callable", name) for each thing a config names to import or build: `_target_`s,
    `extras.imports`, the dotted paths of `net` / `backbone` (a timm model name is none)."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            here = f"{where}.{key}" if where else str(key)
            if key == "_target_" and isinstance(value, str):
                yield here, "callable", value
            elif key == "imports" and where.rsplit(".", 1)[-1] in ("extras", "") and isinstance(value, (list, tuple)):
                yield from ((f"{here}[{i}]", "module", str(m)) for i, m in enumerate(value))
            elif key in DOTTED_KEYS and isinstance(value, str) and _DOTTED.fullmatch(value) and not _timm(value):
                yield here, "callable", value
            else:
                yield from names_in(value, here)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from names_in(value, f"{where}[{i}]")


def _timm(name: str) -> bool:
    try:
        import timm

        return timm.is_model(name)
    except ImportError:
        return False


@functools.lru_cache(maxsize=None)
def _folder_names(folder: str, stamp: float) -> frozenset[str]:
    """Every name the YAML files of a config folder hold (attnlab's packaged configs, a user's --config-dir)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    names = set()
    for path in sorted(Path(folder).rglob("*.yaml")):
        try:
            names |= {name for _, _, name in names_in(yaml.load(path.read_text(), Loader=loader))}
        except (OSError, yaml.YAMLError, UnicodeDecodeError):  # Hydra says what is wrong with it where it composes
            continue
    return frozenset(names)


def _folder(folder: str | Path) -> frozenset[str]:
    path = Path(folder)
    return _folder_names(str(path), path.stat().st_mtime) if path.is_dir() else frozenset()


def named_by_user() -> frozenset[str]:
    """What this command may import and build besides attnlab's own: the names of attnlab's packaged configs, of the
    config folders the command composes from, of its overrides and of its composed config."""
    from attnlab.config import CONF_DIR

    names = set(_folder(CONF_DIR)) | set(_command["names"])
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get() if HydraConfig.initialized() else None
    except Exception:
        hydra = None
    if hydra is not None:
        for source in hydra.runtime.get("config_sources") or []:
            if source.get("schema") == "file" and source.get("provider") != "hydra":
                names |= _folder(source["path"])
        for override in list(hydra.overrides.get("task") or []):
            names |= set(_DOTTED.findall(str(override).partition("=")[2]))
    return frozenset(names)


def _allowed(kind: str, name: str, named: frozenset[str]) -> bool:
    from attnlab.config import current_target

    name = current_target(name) if kind == "callable" else name
    if kind == "module":  # a named module, attnlab's, or a package of what is named (imported with it)
        return name == "attnlab" or name.startswith("attnlab.") or any(
            n == name or n.startswith(name + ".") for n in named)
    if name in named or name.rsplit(".", 1)[0] in named:  # named, or defined in a module the user imports
        return True
    if name.startswith("attnlab."):  # attnlab's own classes (its functions only where its configs name them)
        try:
            found = _attnlab_object(name)
        except (ImportError, AttributeError):  # nothing of that name (renamed since): nothing to run; its builder
            return True  # says so
        return isinstance(found, type)
    return False


def _attnlab_object(name: str) -> Any:
    """What a dotted name of attnlab's own is: its longest importable module, then attributes."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            found = getattr(found, part)
        return found
    raise ImportError(name)


def refused_name(node: Any, trusting: bool | None = None) -> tuple[str, str, str] | None:
    """The first (key, kind, name) of `node` that this command may not import or build; None when all may be (or
    when it trusts its files: `trusting`, by default the command's trust_checkpoint)."""
    if trusted() if trusting is None else trusting:
        return None
    named = None
    for where, kind, name in names_in(node):
        if name.startswith("attnlab.") and kind == "module":
            continue
        named = named if named is not None else named_by_user()
        if not _allowed(kind, name, named):
            return where, kind, name
    return None


def check_names(node: Any, source: str, trusting: bool | None = None) -> None:
    """Refuse a file's config (`source`: what the user gave, e.g. `ckpt_path: <path>`) that names a module or a
    callable this command may not import or build."""
    found = refused_name(node, trusting)
    if found is None:
        return
    where, kind, name = found
    what = f"the module {name}" if kind == "module" else f"{name}"
    module = name if kind == "module" else name.rsplit(".", 1)[0]
    verb = "import" if kind == "module" else "import and call"
    raise UserError(
        f"{source} names {what} ({where}), which attnlab would {verb}, but which is neither attnlab's own nor named "
        "by this command's configs or command line. Importing or calling what a file from elsewhere names can run "
        "any code as you: nothing of it was imported. If it is your own code, name it in this command: the config "
        f"folder that names it (--config-dir, hydra.searchpath), or extras.imports=[{module}]. {HOW}")
