"""Strategy factories: FSDP that wraps each transformer block of the task's network as its own unit."""

from __future__ import annotations

from typing import Any


def fsdp(sharding_strategy: str = "FULL_SHARD", activation_checkpointing: bool = False,
         state_dict_type: str = "sharded", cpu_offload: bool = False, block_classes: list[str] | None = None,
         **kwargs: Any):
    """Lightning FSDPStrategy. The blocks wrapped are `block_classes` (import paths), or by default the
    transformer blocks of timm and of attnlab's own models."""
    import importlib

    from lightning.pytorch.strategies import FSDPStrategy

    names = block_classes or [
        "timm.models.vision_transformer.Block",
        "timm.models.swin_transformer.SwinTransformerBlock",
    ]
    classes = set()
    for name in names:
        module, _, cls = name.rpartition(".")
        try:
            classes.add(getattr(importlib.import_module(module), cls))
        except (ImportError, AttributeError):
            continue
    return FSDPStrategy(
        sharding_strategy=sharding_strategy,
        auto_wrap_policy=classes or None,
        activation_checkpointing_policy=classes if activation_checkpointing else None,
        state_dict_type=state_dict_type,
        cpu_offload=cpu_offload,
        **kwargs,
    )
