"""One registry of attnlab's networks, next to timm's: every task names its network with `model.net` and the rest
of its `model.*` settings that the network takes are the network's.

    @register_network("gpt", config=GPTConfig)      # a class built from a settings dataclass
    class GPT(nn.Module): ...

    @register_network("unet")                       # or a function whose keyword parameters are the settings
    def unet(num_classes: int, in_chans: int = 3, base_channels: int = 64, ...) -> nn.Module: ...

`create_network(name, settings)` builds it from the settings it knows and hands the others back (the task's own);
`network_settings(name)` gives the parameters and type hints the config checks validate `model.*` against. A name
with a dot is the import path of a user's class or function (`model.net=mypkg.nets.MyNet`), used the same way.
Every module of `attnlab.nn` is imported on the first lookup, so a new network file registers itself.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.errors import UserError
from attnlab.types import type_hints


@dataclass(frozen=True)
class NetworkSpec:
    name: str
    build: Callable[..., nn.Module]
    config: type | None = None  # a dataclass `build` takes as its one argument; None: build's keywords

    def settings(self) -> dict[str, tuple[inspect.Parameter, Any]]:
        """The network's settings: {name: (parameter, type hint)}."""
        if self.config is not None:
            hints = type_hints(self.config)
            return {f.name: (inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                               default=_field_default(f)), hints.get(f.name, inspect.Parameter.empty))
                    for f in dataclasses.fields(self.config) if f.init}
        target = self.build.__init__ if inspect.isclass(self.build) else self.build
        hints = type_hints(target)
        return {n: (p, hints.get(n, inspect.Parameter.empty)) for n, p in inspect.signature(target).parameters.items()
                if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    def create(self, settings: dict) -> tuple[nn.Module, dict]:
        """(the network built from the settings it knows, the other settings)."""
        known = self.settings()
        mine = {k: v for k, v in settings.items() if k in known}
        rest = {k: v for k, v in settings.items() if k not in known}
        return (self.build(self.config(**mine)) if self.config is not None else self.build(**mine)), rest


_NETWORKS: dict[str, NetworkSpec] = {}
_loaded = False


def register_network(name: str, config: type | None = None):
    """Class or function decorator: the network `model.net=<name>` builds."""
    def decorate(build):
        _NETWORKS[name] = NetworkSpec(name, build, config)
        return build
    return decorate


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        for module in sorted(set(_builtin_index().values())):
            importlib.import_module(module)
        _loaded = True


_REGISTERED = re.compile(r'^@register_network\("([\w.-]+)"', re.M)


@functools.lru_cache(maxsize=None)
def _builtin_index() -> dict[str, str]:
    """{network name: the attnlab.nn module registering it}, read from the modules' source without importing them:
    building one network imports its own module only (a GPT run does not import timm and torchvision)."""
    import attnlab.nn

    index = {}
    for info in pkgutil.iter_modules(attnlab.nn.__path__):
        spec = importlib.util.find_spec(f"attnlab.nn.{info.name}")
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            for name in _REGISTERED.findall(Path(spec.origin).read_text(encoding="utf-8")):
                index[name] = f"attnlab.nn.{info.name}"
    return index


def list_networks() -> list[str]:
    _load_builtin()
    return sorted(_NETWORKS)


def network_spec(name: str) -> NetworkSpec:
    """The registered network, or a user's class (with a `config_class` dataclass, or keyword settings) or function
    by import path."""
    if name not in _NETWORKS and name in _builtin_index():
        importlib.import_module(_builtin_index()[name])
    if name in _NETWORKS:
        return _NETWORKS[name]
    _load_builtin()
    if "." in str(name):
        from hydra.utils import get_object

        from attnlab.checkpoints import trust

        own = next((s for s in _NETWORKS.values() if f"{s.build.__module__}.{s.build.__qualname__}" == name), None)
        if own is not None:  # a registered network by its exact qualified name (older checkpoints name it so)
            return own
        trust.admit("callable", name)  # a user's network: named by the command (a file's only if it says so too)
        try:
            obj = get_object(name)
        except Exception as e:
            raise UserError(f"model.net={name} is neither one of attnlab's networks ({', '.join(list_networks())}) "
                            f"nor an importable class or function ({e.__cause__ or e}). Check the dotted path; its "
                            "package must be installed, on PYTHONPATH or in the working directory.") from e
        known = next((s for s in _NETWORKS.values() if s.build is obj), None)
        return known or NetworkSpec(name, obj, getattr(obj, "config_class", None))
    raise UserError(f"model.net={name} is not one of attnlab's networks: use one of {', '.join(list_networks())}, "
                    "or the import path of your own nn.Module class or function (model.net=mypkg.nets.MyNet).")


def create_network(name: str, settings: dict) -> tuple[nn.Module, dict]:
    return network_spec(name).create(settings)


def network_settings(name: str) -> dict[str, tuple[inspect.Parameter, Any]]:
    return network_spec(name).settings()


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else inspect.Parameter.empty
