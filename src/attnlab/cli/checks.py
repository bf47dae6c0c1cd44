"""Typed checks of the whole composed config, before any data is read or model built (`check_config`).

Every `_target_` node is checked against the constructor it names (keys it does not take, with the closest names;
values of the wrong type or outside the ranges declared on its parameters), the run keys against their types, and
optimizers and schedules are built once on a dummy parameter, so the library's own checks speak in config keys. The
problems found are reported together in one UserError.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import types
import typing
from typing import Any

import typing_extensions
from annotated_types import Ge, Interval
from omegaconf import DictConfig, ListConfig, OmegaConf

from attnlab.compat import config_node, raw_value
from attnlab.config import named_parameters
from attnlab.errors import UserError
from attnlab.protocols import task as task_hooks
from attnlab.settings import PLATFORM_GROUPS, PLATFORM_KEYS, RunSettings, split_optimizer
from attnlab.types import (Fraction, MultipleOf, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                           UnitInterval, type_hints)

# top-level nodes that are the platform's own settings, not constructors
_SKIP = {"hydra", "paths", "extras", "launcher", "hparams_search"}
_BASES = ("lightning.", "torch.nn.modules.module")  # bases whose **kwargs end the parameters a class names


class TrainerRanges(typing_extensions.TypedDict, total=False):
    """Ranges of Lightning Trainer arguments that its signature does not declare (attnlab builds the Trainer from
    trainer.*): checked on top of the Trainer's own type hints."""

    devices: PositiveInt | typing.Literal[-1] | str | list[NonNegativeInt]
    num_nodes: PositiveInt
    max_epochs: typing.Annotated[int, Ge(-1)] | None
    min_epochs: NonNegativeInt | None
    max_steps: typing.Annotated[int, Ge(-1)]
    min_steps: NonNegativeInt | None
    accumulate_grad_batches: PositiveInt
    gradient_clip_val: NonNegativeFloat | None
    log_every_n_steps: PositiveInt | None
    val_check_interval: PositiveInt | typing.Annotated[float, Interval(gt=0, le=1)] | None
    check_val_every_n_epoch: PositiveInt | None
    num_sanity_val_steps: typing.Annotated[int, Ge(-1)] | None
    limit_train_batches: NonNegativeInt | UnitInterval | None
    limit_val_batches: NonNegativeInt | UnitInterval | None
    limit_test_batches: NonNegativeInt | UnitInterval | None
    limit_predict_batches: NonNegativeInt | UnitInterval | None


class OptimizerRanges(typing_extensions.TypedDict, total=False):
    """Ranges of torch's optimizer settings that torch accepts but that cannot train (SGD with momentum=2 runs into
    NaN): momentum, dampening, betas and RMSprop's alpha are averaging factors in [0, 1)."""

    lr: NonNegativeFloat
    momentum: Fraction
    dampening: Fraction
    alpha: Fraction
    betas: tuple[Fraction, Fraction]
    weight_decay: NonNegativeFloat
    eps: PositiveFloat


# extra hints for constructors attnlab does not own, by `_target_`
EXTRA_HINTS = {"lightning.pytorch.Trainer": TrainerRanges, "lightning.Trainer": TrainerRanges,
               "pytorch_lightning.Trainer": TrainerRanges,
               **{f"torch.optim.{name}": OptimizerRanges for name in ("SGD", "Adam", "AdamW", "RMSprop", "NAdam",
                                                                      "RAdam", "Adamax", "Adagrad")}}


def check_config(cfg: DictConfig) -> None:
    problems: list[str] = []
    for key, hint in type_hints(RunSettings).items():
        problems += _check_value("", key, cfg, hint) if key in cfg else []
    for path, node in _target_nodes(cfg):
        problems += _check_node(path, node)
    for path in ("optimizer", "scheduler"):
        if not problems and isinstance(cfg.get(path), DictConfig) and cfg[path].get("_target_"):
            problems += _try_build(cfg, path)
    if problems:
        raise UserError(" ".join(problems[:6])
                        + (f" ({len(problems) - 6} more problems.)" if len(problems) > 6 else ""))


def _target_nodes(cfg: DictConfig, prefix: str = ""):
    for key in cfg:
        if not prefix and key in _SKIP:
            continue
        node = config_node(cfg, key)
        if isinstance(node, DictConfig):
            path = f"{prefix}{key}"
            if "_target_" in node:
                yield path, node
            else:
                yield from _target_nodes(node, f"{path}.")


@functools.lru_cache(maxsize=None)
def _target(target: str):
    from hydra.utils import get_object

    return get_object(target)


def _signature(fn, settings: dict) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """(parameters by name, their type hints, whether unknown keywords are accepted). A class's own parameters, those
    of the network its **kwargs fill (a task's `net_settings`: the network `model.net` names), and those of the bases
    the rest reach."""
    if not inspect.isclass(fn):
        sig = inspect.signature(fn)
        return dict(sig.parameters), type_hints(fn), any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    params, hints = {}, {}

    def add(init) -> inspect.Signature:
        sig = inspect.signature(init)
        init_hints = type_hints(init)
        for name, p in sig.parameters.items():
            if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in params:
                params[name] = p
                hints[name] = init_hints.get(name, inspect.Parameter.empty)
        return sig

    network = task_hooks.net_settings(fn, settings)
    for klass in inspect.getmro(fn):
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            sig = add(init)
        except (TypeError, ValueError):
            return params, hints, True
        if klass is fn:  # the settings of the network model.net names
            for name, (p, hint) in network.items():
                if name not in params:
                    params[name], hints[name] = p.replace(kind=inspect.Parameter.KEYWORD_ONLY), hint
        if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            return params, hints, False
        if klass.__module__.startswith(_BASES) or not klass.__module__.startswith("attnlab"):
            return params, hints, True  # **kwargs that go somewhere we do not follow
    return params, hints, True


def _check_node(path: str, node: DictConfig) -> list[str]:
    target = node._target_
    group = path.split(".")[0]
    try:
        fn = _target(target)
    except Exception as e:
        return [f"{path}._target_={target} cannot be imported ({e.__cause__ or e}): check the dotted path; its package "
                "must be importable (installed, on PYTHONPATH, in the working directory, or in extras.imports)."]
    try:
        settings = {str(k): raw_value(node, k) for k in node}  # raw: enough to pick a network config
        params, hints, open_ended = _signature(fn, settings)
    except (TypeError, ValueError):
        return []
    if target in EXTRA_HINTS:
        hints = hints | typing.get_type_hints(EXTRA_HINTS[target], include_extras=True)
    platform = set(PLATFORM_KEYS.get(group, {})) if path == group else set()
    taken = named_parameters(fn) if inspect.isclass(fn) else set(params)
    problems = []
    for key in node:
        key = str(key)
        if key.startswith("_"):
            continue
        if key in platform - taken:
            hint = type_hints(PLATFORM_GROUPS[group]).get(key, inspect.Parameter.empty)
            problems += _check_value(path, key, node, hint)
            continue
        if key not in params:
            if not open_ended:
                close = difflib.get_close_matches(key, list(params), n=3, cutoff=0.6)
                takes = f"; it takes {', '.join(sorted(params))}" if len(params) <= 12 else ""
                hint = f" Did you mean {' or '.join(close)}?" if close else ""
                problems.append(f"{path}.{key} is not a setting of {target}{takes}.{hint} Remove it "
                                f"(~{path}.{key} on the command line) or fix its name.")
            continue
        problems += _check_value(path, key, node, hints.get(key, inspect.Parameter.empty))
    return problems


def _check_value(path: str, key: str, node: DictConfig, hint) -> list[str]:
    """The problem with the value of `key` in `node` against its type hint: [] or [the message]."""
    if hint is inspect.Parameter.empty or hint is Any:
        return []
    raw = config_node(node, key)
    try:
        value = OmegaConf.to_container(node, resolve=True)[key] if isinstance(raw, (DictConfig, ListConfig)) \
            else node[key]
    except Exception:
        return []  # an interpolation resolved later (e.g. from Hydra's runtime)
    if value is None and OmegaConf.is_interpolation(node, key) and "data." in str(raw_value(node, key)):
        return []  # found by the data (num_classes of a folder) once it is read
    if value is None and path == "optimizer" and key == "lr" and node.get("blr") is not None:
        return []  # blr x effective batch / 256, once the batch is known
    if isinstance(value, dict) and "_target_" in value:
        return []  # built by its own node
    adapter = _adapter(hint)
    if adapter is None:
        return []
    from pydantic import ValidationError

    try:
        adapter.validate_python(value)
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "extra_forbidden":  # a key a settings dict does not take
            known = sorted(_locate_fields(hint))
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=2, cutoff=0.6)
            return [f"{_name(path, key, node)}.{err['loc'][-1]} is not one of its settings ({', '.join(known)})."
                    + (f" Did you mean {' or '.join(close)}?" if close else "") + " Remove it or fix its name."]
        where, item_hint = _locate(hint, err.get("loc", ()))
        if item_hint is not hint:  # a field of a settings dict: its value and its type
            value, hint = err.get("input", value), item_hint
        msg = "not one of the accepted values" if err["type"] == "literal_error" else err["msg"]
        fix = "Give it a value of that kind."
        accepted = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()
        if OmegaConf.is_interpolation(node, key) and len(accepted) == 1 and not where:  # the one value it takes
            source = str(raw_value(node, key)).strip("${}")
            fix = (f"Add {source}={accepted[0]} to the command line ({path}.{key} reads it), or choose a "
                   f"{path} config made for {source}={value}.")
        return [f"{_name(path, key, node)}{where}={value!r} is refused: {msg[0].lower()}{msg[1:]} (expected "
                f"{_type_name(hint)}). {fix}"]
    for other in (m.key for m in _metadata(hint) if isinstance(m, MultipleOf)):
        divisor = node.get(other)
        if isinstance(value, int) and isinstance(divisor, int) and divisor > 0 and value % divisor:
            return [f"{_name(path, key, node)}={value} is refused: it must be a multiple of "
                    f"{_name(path, other, node)}={divisor}. Change one of them."]
    return []


def _metadata(hint) -> list:
    """The Annotated metadata of a hint, or of the members of an Optional / union hint."""
    if typing.get_origin(hint) is typing.Annotated:
        return list(typing.get_args(hint)[1:])
    return [m for member in typing.get_args(hint) for m in _metadata(member)]


def _name(path: str, key: str, node: DictConfig) -> str:
    """The key the user set: `seed (as data.seed)` for an interpolation."""
    name = f"{path}.{key}" if path else key
    if OmegaConf.is_interpolation(node, key):
        name = f"{str(raw_value(node, key)).strip('${}')} (as {name})"
    return name


def _locate_fields(hint) -> dict[str, Any]:
    """The fields of a TypedDict hint (or of the TypedDict in an Optional hint)."""
    for member in (hint, *typing.get_args(hint)):
        if typing_extensions.is_typeddict(member):
            return typing.get_type_hints(member, include_extras=True)
    return {}


def _locate(hint, loc: tuple) -> tuple[str, Any]:
    """Where in the value an error points (`[0]` of a list, `.beam_size` of a settings dict) and, for a dict's field,
    its hint; the tags pydantic adds for the members of a union are left out."""
    where = ""
    for part in loc:
        if isinstance(part, int):
            where += f"[{part}]"
            members = typing.get_args(hint) if typing.get_origin(hint) in (tuple, list) else ()
            if members and members[-1] is not Ellipsis and part < len(members):  # tuple[Fraction, Fraction]
                hint = members[part]
            elif members:  # list[X], tuple[X, ...]
                hint = members[0]
            continue
        fields = _locate_fields(hint)
        if part in fields:
            where, hint = f"{where}.{part}", fields[part]
    return where, hint


@functools.lru_cache(maxsize=None)
def _adapter_cached(hint):
    from pydantic import ConfigDict, TypeAdapter

    return TypeAdapter(hint, config=ConfigDict(arbitrary_types_allowed=True))


def _adapter(hint):
    try:
        return _adapter_cached(hint)
    except Exception:  # a type pydantic cannot check (a tensor, a callable): left to the constructor
        return None


def _type_name(hint) -> str:
    """`int or None`, `one of 'a', 'b', 16`, `float >= 0`: the expected value as a user reads it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        ops = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
        limits = [f"{sign} {getattr(m, op)}" for m in args[1:] for op, sign in ops.items()
                  if getattr(m, op, None) is not None]
        return f"{_type_name(args[0])} {' and '.join(limits)}".strip()
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (typing.Union, types.UnionType):
        literals = [repr(a) for arg in args for a in typing.get_args(arg) if typing.get_origin(arg) is typing.Literal]
        others = [_type_name(a) for a in args if typing.get_origin(a) is not typing.Literal]
        return " or ".join(([f"one of {', '.join(literals)}"] if literals else []) + others)
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def _try_build(cfg: DictConfig, path: str) -> list[str]:
    """Build the optimizer (or the schedule, on an SGD) for one dummy parameter: the library's own checks of
    ranges (a negative lr, betas outside [0, 1)) then name the config key."""
    import torch
    from hydra.utils import instantiate

    node = OmegaConf.to_container(cfg[path], resolve=True)
    if path == "optimizer":
        node, _ = split_optimizer(node)
    if path == "optimizer" and node.get("lr") is None:
        node["lr"] = 1e-3  # from optimizer.blr, known once the batch size is
    param = torch.nn.Parameter(torch.zeros(1))
    try:
        factory = instantiate(node)
        if path == "optimizer":
            factory([param])
        else:
            factory(optimizer=torch.optim.SGD([param], lr=0.1), total_steps=100)
    except (ValueError, TypeError, AssertionError, UserError) as e:
        from hydra.core.hydra_config import HydraConfig

        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
        name = choices.get(path) or node.get("_target_")
        settings = ", ".join(f"{k}={v}" for k, v in node.items() if not k.startswith("_"))
        return [f"{path}={name} refuses its settings ({settings}): "
                f"{str(e).splitlines()[0]}. Fix the {path}.* value it names."]
    return []
