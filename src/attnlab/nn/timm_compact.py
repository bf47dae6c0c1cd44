"""Compact ViT registered with timm, sized for small images (digits, MNIST, CIFAR) trained from scratch.

Registered under timm's model registry, so `timm.create_model("vit_compact", img_size=32)` works like any timm model.
"""

from __future__ import annotations

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from attnlab.config import patch_size_for

_TIMM_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


@register_model
def vit_compact(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """4 blocks, 96 dims, 4 heads, MLP ratio 2, average-pooled tokens; the patch size follows img_size (2 px up to
    16 px, 4 px up to 64 px, else 16 px)."""
    if pretrained:
        raise ValueError("vit_compact has no pretrained weights; set model.pretrained=false")
    for k in _TIMM_KWARGS:
        kwargs.pop(k, None)
    img_size = kwargs.pop("img_size", 32)
    args = dict(patch_size=patch_size_for(img_size), embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0,
                class_token=False, global_pool="avg")
    return VisionTransformer(img_size=img_size, **(args | kwargs))
