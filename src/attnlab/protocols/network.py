"""What the platform may call on a network (the `nn.Module` a task builds with `model.net`, attnlab's or a user's).

Every hook is optional: the platform does without it where a network has none.

- `block_classes() -> set[type[nn.Module]]` (`BlockNetwork` below): the types of the network's repeated blocks,
  each an FSDP unit under `trainer=fsdp` and checkpointed under `model.activation_checkpointing=true`
  (`attnlab.strategies`). A timm network needs none: its blocks are read from its `group_matcher()`.
- `no_weight_decay() -> set[str]` (timm's convention): names of parameters trained without weight decay
  (`attnlab.optim.param_groups`).
- `group_matcher(coarse: bool) -> dict` (timm's convention): the layers numbered from the input up, for
  `optimizer.layer_decay`.
- `get_classifier() -> nn.Module` (timm's convention): the head `model.freeze_backbone=true` keeps training.
- `regresses: bool` (class attribute): built with one output (`num_classes=1`), the head predicts a score, which a
  task may train with a regression loss (GLUE's STS-B). A network without it is refused for such data.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class BlockNetwork(Protocol):
    """A network made of repeated blocks (a Transformer's layers), which it names."""

    def block_classes(self) -> set[type[nn.Module]]:
        """The block types: each module of one of them is a unit of FSDP sharding and of activation
        checkpointing. Its forward must take and return tensors only through its arguments and result (no state
        kept between calls in training), as a Transformer block's does."""
        ...


def declared_blocks(net: object) -> set[type[nn.Module]] | None:
    """The block types `net` declares (`BlockNetwork`); None when it declares none."""
    return set(net.block_classes()) if isinstance(net, BlockNetwork) else None


def regresses(net: object) -> bool:
    """Whether `net` declares that its head, built with one output, predicts a score (`regresses = True`)."""
    return bool(getattr(net, "regresses", False))
