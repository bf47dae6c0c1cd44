"""Attention weights of timm ViT-style models (ViT, DeiT, model=vit, an MAE encoder), recomputed from each attention
module's input and projections since timm's fused attention never exposes them, and attention rollout (Abnar &
Zuidema, 2020): `attention_maps(model, x)` -> `rollout(maps)` -> `patch_relevance(relevance, net)`, a (B, h, w) grid.
"""

from __future__ import annotations

import torch
from torch import nn


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of a timm ViT-style network, in forward order."""
    return [m for m in model.modules() if all(hasattr(m, a) for a in ("qkv", "num_heads", "scale", "q_norm", "k_norm"))]


def _weights(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    B, N, _ = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)


@torch.no_grad()
def attention_maps(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Runs `model(x)` once in eval mode and returns each block's attention weights, (B, heads, N, N) each."""
    modules = attention_modules(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no timm-style attention modules (with qkv, num_heads, scale)")
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: maps.append(_weights(mod, args[0]))) for m in modules]
    was_training = model.training
    try:
        model.eval()
        model(x)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return maps


def rollout(maps: list[torch.Tensor], head_fusion: str = "mean") -> torch.Tensor:
    """Attention rollout: each block's head-fused attention, with the residual connection as 0.5 I, rows
    renormalized, multiplied through the blocks. Returns (B, N, N): row i is how much each input token flows
    into token i at the output."""
    fuse = {"mean": lambda a: a.mean(1), "max": lambda a: a.amax(1), "min": lambda a: a.amin(1)}[head_fusion]
    result = None
    for a in maps:
        a = fuse(a.float())
        a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], device=a.device)
        a = a / a.sum(-1, keepdim=True)
        result = a if result is None else a @ result
    return result


def patch_relevance(relevance: torch.Tensor, net: nn.Module) -> torch.Tensor:
    """(B, h, w) relevance of each image patch for the prediction: the class token's row of the rollout, or, for a
    network that average-pools its tokens (global_pool=avg), the mean of the patch rows. Normalized to sum to 1."""
    prefix = int(getattr(net, "num_prefix_tokens", 0))
    pooled_by_token = getattr(net, "cls_token", None) is not None and getattr(net, "global_pool", "token") == "token"
    rows = relevance[:, 0, prefix:] if pooled_by_token else relevance[:, prefix:, prefix:].mean(1)
    h, w = net.patch_embed.grid_size
    grid = rows.reshape(-1, h, w)
    return grid / grid.sum((-2, -1), keepdim=True)
