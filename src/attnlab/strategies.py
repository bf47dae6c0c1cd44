"""How a strategy meets the task's network: through the network's repeated blocks (`block_classes`), each its own FSDP
unit under `trainer=fsdp`, and with `model.activation_checkpointing=true` recomputed in the backward pass (by
Lightning's FSDPStrategy under FSDP, by torch's checkpoint wrapper under any other strategy). `for_model` applies this
to a built task, and gives the FSDP strategy to build the Trainer with.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from attnlab.errors import UserError

log = logging.getLogger("attnlab")


def block_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The block types of the networks inside `model` (a task, or a network): those a network declares
    (`block_classes()`, attnlab.protocols.BlockNetwork), or for a timm network those of timm's own structure
    (attnlab.nn.factory.timm_block_classes). Empty where a network has neither."""
    from attnlab.nn.factory import timm_block_classes
    from attnlab.protocols.network import declared_blocks

    declared = declared_blocks(model)
    if declared is not None:
        return declared
    found = timm_block_classes(model)
    for child in () if found else model.children():
        found |= block_classes(child)
    return found


def _import(name: str | type) -> type:
    if not isinstance(name, str):
        return name
    from hydra.utils import get_class

    try:
        return get_class(name)
    except Exception as e:
        raise UserError(f"trainer.strategy.block_classes names {name}, which cannot be imported ({e.__cause__ or e}): "
                        "give the import path of an nn.Module class, or leave block_classes out (the network's own "
                        "block classes are used).") from e


def fsdp(sharding_strategy: str = "FULL_SHARD", activation_checkpointing: bool = False,
         state_dict_type: str = "sharded", cpu_offload: bool = False,
         block_classes: Iterable[str | type] | None = None, **kwargs: Any):
    """Lightning's FSDPStrategy with each module of `block_classes` (classes, or their import paths) as its own FSDP
    unit, and with `activation_checkpointing` each of them checkpointed."""
    from lightning.pytorch.strategies import FSDPStrategy

    classes = {_import(c) for c in block_classes or ()}
    return FSDPStrategy(
        sharding_strategy=sharding_strategy,
        auto_wrap_policy=classes or None,
        activation_checkpointing_policy=classes if activation_checkpointing and classes else None,
        state_dict_type=state_dict_type,
        cpu_offload=cpu_offload,
        **kwargs,
    )


def _fsdp_node(strategy) -> dict | None:
    """trainer.strategy as a plain dict with its `_target_`, when it is FSDP (attnlab's `fsdp`, Lightning's
    FSDPStrategy or a subclass, or the name "fsdp"); else None."""
    if strategy is None or isinstance(strategy, str):
        return {"_target_": f"{__name__}.fsdp"} if str(strategy).lower() == "fsdp" else None
    from hydra.utils import get_object
    from lightning.pytorch.strategies import FSDPStrategy

    node = strategy  # a dict, or any mapping (a config node)
    if not isinstance(node, Mapping) or not node.get("_target_"):
        return None
    try:
        target = get_object(node["_target_"])
    except Exception:
        return None  # the trainer's instantiation says what is wrong with it
    return dict(node) if target is fsdp or (inspect.isclass(target) and issubclass(target, FSDPStrategy)) else None


def is_fsdp(strategy) -> bool:
    return _fsdp_node(strategy) is not None


def fsdp_strategy(strategy, model: nn.Module, activation_checkpointing: bool = False):
    """The FSDP strategy that trainer.strategy configures, given the block classes of `model`'s network (unless
    the config names its own) and, with `activation_checkpointing`, checkpointing them. None when trainer.strategy
    is not FSDP: the trainer builds that one from its config."""
    from hydra.utils import instantiate

    node = _fsdp_node(strategy)
    if node is None:
        return None
    classes = block_classes(model)
    ours = node["_target_"] == f"{__name__}.fsdp"
    named = node.get("block_classes") if ours else node.get("auto_wrap_policy")
    if not classes and not named:
        log.info("FSDP: %s declares no block classes (attnlab.protocols.BlockNetwork): the network is one FSDP unit"
                 "%s", type(getattr(model, "net", model)).__name__,
                 ", and no activations are checkpointed" if activation_checkpointing else "")
    given: dict[str, Any] = {}
    if ours:
        given |= {} if named else {"block_classes": classes}
        given["activation_checkpointing"] = bool(node.get("activation_checkpointing") or activation_checkpointing)
    else:
        given |= {} if "auto_wrap_policy" in node else {"auto_wrap_policy": classes or None}
        if activation_checkpointing and not {"activation_checkpointing", "activation_checkpointing_policy"} & set(node):
            given["activation_checkpointing_policy"] = classes or None
    rest = {k: v for k, v in node.items() if k not in given}
    return instantiate(rest, _partial_=True)(**given)


def for_model(model: nn.Module, strategy, activation_checkpointing: bool = False):
    """What the strategy needs of a built task: under FSDP (trainer.strategy as plain values), the FSDP strategy given
    the network's block classes (`fsdp_strategy`), which checkpoints them itself; under any other strategy None, the
    blocks checkpointed here when `activation_checkpointing` asks for it."""
    if is_fsdp(strategy):
        return fsdp_strategy(strategy, model, activation_checkpointing)
    if activation_checkpointing:
        checkpoint_activations(model)
    return None


def checkpoint_activations(model: nn.Module) -> int:
    """Recompute the activations of each block of `model`'s network in the backward pass instead of keeping them
    (torch's checkpoint wrapper around every module of its block classes), for the strategies that do not
    checkpoint themselves (DDP, one device). The state dict keeps its names. -> the number of blocks wrapped: 0
    where the network declares none (logged) or its blocks are wrapped already."""
    from attnlab.compat import activation_checkpointing

    CheckpointWrapper, apply_activation_checkpointing = activation_checkpointing()

    if any(isinstance(m, CheckpointWrapper) for m in model.modules()):
        return 0
    classes = tuple(block_classes(model))
    if not classes:
        log.warning("model.activation_checkpointing=true: %s declares no block classes (attnlab.protocols."
                    "BlockNetwork): no activations are checkpointed", type(getattr(model, "net", model)).__name__)
        return 0
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, classes))
    wrapped = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
    log.info("activation checkpointing: %d blocks (%s) recompute their activations in the backward pass", wrapped,
             ", ".join(sorted(c.__name__ for c in classes)))
    return wrapped


def writes_own_checkpoints(strategy) -> bool:
    """Whether `trainer.strategy` (a name in Lightning's registry or a `_target_` node) shards the checkpoint and
    writes it itself (FSDP, DeepSpeed): such a strategy gets no atomic checkpoint IO plugin."""
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, StrategyRegistry

    if is_fsdp(strategy):
        return True
    cls = None
    if isinstance(strategy, str):
        cls = StrategyRegistry[strategy.lower()]["strategy"] if strategy.lower() in StrategyRegistry else None
    elif isinstance(strategy, Mapping) and strategy.get("_target_"):
        from hydra.utils import get_object

        try:
            cls = get_object(strategy["_target_"])
        except Exception:  # the trainer's instantiation says what is wrong with it
            return False
    return inspect.isclass(cls) and issubclass(cls, (FSDPStrategy, DeepSpeedStrategy))
