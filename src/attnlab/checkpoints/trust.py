"""What a file from elsewhere (a checkpoint, a run folder given to `--rerun`, a Hugging Face folder) may make attnlab
import and build, decided by `decide`: a module only if it is attnlab's own or in the command's own `extras.imports`; a
callable only if the table of what attnlab's and the user's config folders name holds it (`buildable`), the command's
own config gives it at the same key, or a module of its `extras.imports` defines it. A file's interpolations may read
only the environment variables attnlab's packaged configs read. `trust_checkpoint=true`, read from the command's own
config and never from a file, lifts all of it. A `_target_` that moved is read under its current name
(`current_target`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.errors import UserError

TRUST_KEY = "trust_checkpoint"
HOW = (f"If you trust where the file came from, add {TRUST_KEY}=true to the command: the file is then unpickled in "
       "full, and the modules and classes its config names (_target_s, extras.imports) are imported and built.")
# keys whose value may be the dotted path of a class or function of the user's (attnlab.nn.registry, nn/factory.py)
DOTTED_KEYS = ("net", "backbone")
NAME_KEYS = ("_target_", *DOTTED_KEYS)
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_ENV = re.compile(r"\$\{\s*oc\.env\s*:\s*([^,}\s]*)")
# where a checkpoint's hyperparameters sit in the run's config: Lightning reads all four keys (`_load_state` merges
# the two older ones into the task's arguments), and attnlab's tasks take the optimizer and schedule as their own
HPARAMS = {"hyper_parameters": "model", "hparams": "model", "module_arguments": "model",
           "datamodule_hyper_parameters": "data"}
_OWN_NODES = ("optimizer", "scheduler")

# what moved, by the names that configs and checkpoints written before the move give it: classes by their whole
# `_target_`, modules (attnlab.data's flat modules, now in subpackages by what they hold) by their dotted path
MOVED_TARGETS = {f"attnlab.data.segmentation.{name}": f"attnlab.data.segmentation.benchmarks.{name}"
                 for name in ("ADE20KDataModule", "VOCDataModule")}
MOVED_MODULES = {f"attnlab.data.{old}": f"attnlab.data.{new}" for old, new in (
    ("cifar", "images.cifar"), ("digits", "images.digits"), ("mnist", "images.mnist"),
    ("imagefolder", "images.imagefolder"), ("imagenet", "images.imagenet"), ("images", "images.base"),
    ("transforms", "images.transforms"), ("file_transforms", "images.file_transforms"),
    ("warp_ops", "images.warp_ops"), ("device_decode", "images.device_decode"),
    ("text", "text.corpus"), ("text_sources", "text.sources"), ("token_arrays", "text.token_arrays"),
    ("tokenizers", "text.tokenizers"), ("lm_datasets", "text.lm_datasets"),
    ("text_classification", "text.classification"), ("glue", "text.glue"),
    ("translation", "translation.datamodule"), ("parallel_text", "translation.parallel_text"),
    ("parallel_sets", "translation.parallel_sets"),
    ("segmentation", "segmentation.datamodule"), ("seg_transforms", "segmentation.transforms"),
    ("seg_benchmarks", "segmentation.benchmarks"),
    ("shards", "formats.shards"), ("shard_format", "formats.shard_format"), ("shard_loader", "formats.shard_loader"),
    ("imagenet_archives", "formats.imagenet_archives"), ("imagenet_prepare", "formats.imagenet_prepare"))}


def current_target(target: str) -> str:
    """The current name of a `_target_` that MOVED_TARGETS or MOVED_MODULES maps; any other name is returned as is."""
    target = str(target)
    if target in MOVED_TARGETS:
        return MOVED_TARGETS[target]
    if any(target.startswith(now + ".") for now in MOVED_MODULES.values()):
        return target
    module = max((m for m in MOVED_MODULES if target.startswith(m + ".")), key=len, default=None)
    return target if module is None else MOVED_MODULES[module] + target[len(module):]


@dataclass
class Command:
    """What this command says: whether it trusts its files, the (key, name) pairs its own config gives, the modules
    its own extras.imports lists. `active`: set by an entry point (library code calling a builder directly is the
    user's own code, and admits what it is given)."""

    trusted: bool = False
    named: frozenset[tuple[str, str]] = frozenset()
    imports: frozenset[str] = frozenset()
    active: bool = False
    sealed: bool = False  # set by --rerun: the composed config is the run folder's, not the user's


_command = Command()


def from_command(cfg: Any, overrides: list[str] | tuple[str, ...] = (), seal: bool = False) -> None:
    """Record what this command says: its `trust_checkpoint` key, and the names its composed config `cfg` and its
    `overrides` (key=value) give. Once a call with `seal` (--rerun, from its own command line alone) has recorded
    them, calls without it change nothing."""
    global _command
    if _command.sealed and not seal:
        return
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else dict(cfg or {})
    node = {k: v for k, v in node.items() if k != "hydra"}
    for arg in overrides:
        key, _, value = str(arg).lstrip("+").partition("=")
        if key.rsplit(".", 1)[-1] in NAME_KEYS and _DOTTED.fullmatch(value.strip()):
            _set(node, key, value.strip())
        elif key == "extras.imports":
            _set(node, key, [m.strip(" '\"") for m in value.strip("[]").split(",") if m.strip()])
    named = {(where, name) for where, kind, name in names_in(node) if kind == "callable"}
    imports = (node.get("extras") or {}).get("imports") if isinstance(node.get("extras"), dict) else None
    _command = Command(trusted=node.get(TRUST_KEY) is True, named=frozenset(named),
                       imports=frozenset(str(m) for m in imports or []), active=True, sealed=seal)


def _set(node: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
    node[last] = value


def reset() -> None:
    """No command (between the commands one process runs: tests, notebooks)."""
    global _command
    _command = Command()


def trusted() -> bool:
    """Whether this command trusts the files it is given (`trust_checkpoint=true`)."""
    return _command.trusted


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
    import timm

    return timm.is_model(name)


# ---- the table

@functools.lru_cache(maxsize=None)
def _folder_names(folder: str, stamp: float) -> tuple[frozenset[str], frozenset[str]]:
    """(every name the YAML files of a config folder give, every environment variable they read)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    names, env = set(), set()
    for path in sorted(Path(folder).rglob("*.yaml")):
        try:
            text = path.read_text()
            names |= {name for _, _, name in names_in(yaml.load(text, Loader=loader))}
            env |= set(_ENV.findall(text))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):  # Hydra says what is wrong with it where it composes
            continue
    return frozenset(names), frozenset(env)


def _folder(folder: str | Path) -> tuple[frozenset[str], frozenset[str]]:
    path = Path(folder)
    return _folder_names(str(path), path.stat().st_mtime) if path.is_dir() else (frozenset(), frozenset())


def _config_folders() -> list[str]:
    """attnlab's packaged configs, and the config folders this command composes from."""
    from hydra.core.hydra_config import HydraConfig

    from attnlab.settings import CONF_DIR

    folders = [str(CONF_DIR)]
    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    for source in (hydra.runtime.get("config_sources") or []) if hydra is not None else []:
        if source.get("schema") == "file" and source.get("provider") != "hydra":
            folders.append(str(source["path"]))
    return folders


def buildable() -> frozenset[str]:
    """The table: every name attnlab's packaged configs and the user's config folders give (a renamed `_target_`
    under its current name)."""
    names = set()
    for folder in _config_folders():
        names |= _folder(folder)[0]
    return frozenset(current_target(n) for n in names)


@functools.lru_cache(maxsize=None)
def _qualified(names: frozenset[str]) -> frozenset[str]:
    """The exact `__module__.__qualname__` of each name of the table that resolves."""
    found = set()
    for name in names:
        obj = _resolve(name)
        if obj is not None:
            found.add(_qualname(obj))
    return frozenset(found)


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def _resolve(name: str) -> Any:
    """The object a dotted name names (Hydra's lookup: its modules imported as needed), or None."""
    from hydra.utils import get_object

    try:
        return get_object(name)
    except Exception:
        return None


# ---- the rule

def decide(kind: str, name: str, key: str | None = None) -> bool:
    """Whether this command may import (`kind` "module") or build ("callable") `name`, which a file from elsewhere
    gives at `key` (the run config's dotted key; None: at any key)."""
    if _command.trusted:
        return True
    if not isinstance(name, str):  # no name at all: nothing attnlab would build
        return False
    name = current_target(name) if kind == "callable" else name
    if kind == "module":  # attnlab's own modules, and those the command itself imports
        return name == "attnlab" or name.startswith("attnlab.") or name in _command.imports
    if any(name == n and (key is None or key == k) for k, n in _command.named):
        return True
    module = next((m for m in _command.imports if name.startswith(m + ".")), None)
    if module is not None:  # defined in a module the command imports (imported by it already)
        obj = _resolve(name)
        return obj is not None and getattr(obj, "__module__", None) == module and _qualname(obj) == name
    table = buildable()
    return name in table or name in _qualified(table)  # as the table names it, or as its object's exact name


def admit(kind: str, name: str, key: str | None = None) -> None:
    """What a builder calls before it imports or builds a name: refused (UserError) when an entry point's command
    does not admit it (`decide`); a builder called outside any entry point builds what its caller gives."""
    if _command.active and not decide(kind, name, key):
        raise refusal(key or "a config", kind, name, "the config being built")


def target_class(target: str | None, group: str) -> type:
    """The class a config group's `_target_` names (its current name), admitted by the command and imported; a
    UserError otherwise."""
    if not target:
        raise UserError(f"the {group} config has no _target_: give the class to build ({group}._target_="
                        "mypkg.module.ClassName), or pick one of attnlab's configs.")
    from hydra.utils import get_class

    admit("callable", target, f"{group}._target_")
    try:
        return get_class(current_target(target))
    except Exception as e:
        raise UserError(
            f"{group}._target_={target} cannot be imported ({e.__cause__ or e}). Check the dotted path; the package "
            "that holds it must be importable: installed, on PYTHONPATH, in the working directory, or listed in "
            "extras.imports."
        ) from e


def admit_node(node: Any, where: str) -> None:
    """`admit` for every name of a config node about to be built (`where`: its key in the run config)."""
    if _command.active:
        for here, kind, name in names_in(node, where):
            admit(kind, name, config_key(here))


def config_key(where: str) -> str:
    """The run config's key for a key of a checkpoint's parts (`config.model.net` -> `model.net`,
    `hyper_parameters.net` -> `model.net`, `hyper_parameters.optimizer._target_` -> `optimizer._target_`)."""
    part, _, rest = where.partition(".")
    if part == "config":
        return rest
    if part in HPARAMS and rest:
        return rest if HPARAMS[part] == "model" and rest.split(".")[0] in _OWN_NODES else f"{HPARAMS[part]}.{rest}"
    return where


def refused_name(node: Any, trusting: bool | None = None) -> tuple[str, str, str] | None:
    """The first (key, kind, name) of `node` that this command may not import or build; None when all may be (or
    when it trusts its files: `trusting`, by default the command's trust_checkpoint)."""
    if trusted() if trusting is None else trusting:
        return None
    for where, kind, name in names_in(node):
        if not decide(kind, name, config_key(where)):
            return where, kind, name
    return None


def _strings(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _strings(value, f"{where}[{i}]")
    elif isinstance(node, str) and "${" in node:
        yield where, node


def refusal(source: str, kind: str, name: str, where: str) -> UserError:
    name = name if isinstance(name, str) else repr(name)[:80]
    what = f"the module {name}" if kind == "module" else f"{name}"
    module = name if kind == "module" else name.rsplit(".", 1)[0]
    verb = "import" if kind == "module" else "import and call"
    return UserError(
        f"{source} names {what} ({where}), which attnlab would {verb}, but which is neither in the table of what "
        "attnlab builds nor given by this command's own config at that key. Importing or calling what a file from "
        "elsewhere names can run any code as you: nothing of it was imported. If it is your own code, name it in "
        f"this command: extras.imports=[{module}], or the config folder that names it (--config-dir). {HOW}")


def check_names(node: Any, source: str, trusting: bool | None = None) -> None:
    """Refuse a file's config (`source`: what the user gave, e.g. `ckpt_path: <path>`) that names a module or a
    callable this command may not import or build, or whose interpolations read the environment."""
    if trusted() if trusting is None else trusting:
        return
    found = refused_name(node, trusting=False)
    if found is not None:
        where, kind, name = found
        raise refusal(source, kind, name, where)
    from attnlab.settings import CONF_DIR

    allowed = _folder(CONF_DIR)[1]  # the environment variables attnlab's packaged configs read
    env = next(((w, v) for w, value in _strings(node) for v in _ENV.findall(value) if v not in allowed), None)
    if env is not None:
        where, variable = env
        raise UserError(
            f"{source} reads the environment variable {variable} (${{oc.env:{variable}}}, at {where}), which none "
            "of attnlab's configs reads: a file from elsewhere that resolved it would copy your environment's value "
            f"into this run's files. Nothing of it was resolved. Remove the interpolation from the file. {HOW}")
