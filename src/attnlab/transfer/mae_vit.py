"""The encoder of an MAE pretraining run (model=mae) into a timm VisionTransformer, for fine-tuning and linear
probing (`model=vit model.init_from=<its checkpoint or run folder>`)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.checkpoints.reading import find_checkpoint, load_checkpoint, run_config
from attnlab.errors import UserError
from attnlab.nn.mae import SIZES

log = logging.getLogger("attnlab")

MAE_TARGET = "attnlab.tasks.mae.MAEPretrainer"


def read_mae_encoder(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """-> the encoder's state dict under timm ViT names, and the MAE model config of the run that wrote it."""
    ckpt = load_checkpoint(path, "model.init_from")
    config = run_config(ckpt) or {}
    target = config.get("model", {}).get("_target_")
    if target != MAE_TARGET:
        what = f"a checkpoint of task {target}" if target else "not a checkpoint written by attnlab's train.py"
        raise UserError(
            f"model.init_from={path} is {what}, not of an MAE pretraining run. model.init_from takes the checkpoint "
            "of a `model=mae` run (e.g. `python train.py experiment=mae_pretrain_cifar10`); to continue training "
            "a classifier from its own checkpoint use ckpt_path=<ckpt> instead."
        )
    decoder = ("decoder_", "mask_token")
    state = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()
             if k.startswith("net.") and not k.removeprefix("net.").startswith(decoder)}
    return state, config["model"]


def encoder_summary(mae_cfg: dict[str, Any]) -> tuple[str, str]:
    """-> (a description of the checkpoint's encoder, the model=vit overrides that build the same ViT)."""
    size = mae_cfg.get("size", "base")
    d, n, h = SIZES.get(size, SIZES["base"])
    dim, depth, heads = mae_cfg.get("embed_dim") or d, mae_cfg.get("depth") or n, mae_cfg.get("num_heads") or h
    patch, mlp = mae_cfg.get("patch_size"), mae_cfg.get("mlp_ratio", 4.0)
    backbone = {"tiny": "vit_tiny_patch16_224", "small": "vit_small_patch16_224", "large": "vit_large_patch16_224",
                "huge": "vit_huge_patch14_224"}.get(size, "vit_base_patch16_224")
    desc = (f"embed_dim={dim}, depth={depth}, num_heads={heads}, mlp_ratio={mlp}, patch_size={patch}, "
            f"image size {mae_cfg.get('img_size')}, with a class token")
    kwargs = f"embed_dim: {dim}, depth: {depth}, num_heads: {heads}, patch_size: {patch}"
    if mlp != 4.0:
        kwargs += f", mlp_ratio: {mlp}"
    return desc, f"model.backbone={backbone} 'model.backbone_kwargs={{{kwargs}}}'"


def _summarize(keys: list[str], limit: int = 8) -> str:
    grouped = list(dict.fromkeys(re.sub(r"^(blocks\.\d+)\..*", r"\1.*", k) for k in keys))
    more = f" (and {len(grouped) - limit} more)" if len(grouped) > limit else ""
    return ", ".join(grouped[:limit]) + more


def require_vit(net: nn.Module, backbone: str) -> None:
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(net, VisionTransformer):
        raise UserError(
            f"model.init_from loads an MAE encoder into a Vision Transformer, but model.backbone={backbone} is a "
            f"{type(net).__name__}, not a timm VisionTransformer. Use a timm ViT built like the encoder, e.g. "
            "model.backbone=vit_tiny_patch16_224 with model.backbone_kwargs for its width, depth, heads and patch "
            "size, or drop model.init_from."
        )


def load_mae_encoder(vit: nn.Module, init_from: str, backbone: str = "the backbone") -> list[str]:
    """Copy an MAE checkpoint's encoder into a timm VisionTransformer, resampling the positional embedding to the
    ViT's patch grid when the image size differs. The encoder's final norm goes to `fc_norm` when the ViT pools by
    average (timm then has no `norm`). Returns the ViT's keys left at their initialization (the head)."""
    from timm.layers import resample_abs_pos_embed

    require_vit(vit, backbone)
    path = find_checkpoint(init_from, "model.init_from", "an MAE pretraining run (`python train.py "
                           "experiment=mae_pretrain_cifar10`, or any run with model=mae)")
    state, mae_cfg = read_mae_encoder(path)
    target = vit.state_dict()
    if "norm.weight" not in target and "fc_norm.weight" in target:
        state = {re.sub(r"^norm\.", "fc_norm.", k): v for k, v in state.items()}
    pos, own = state.get("pos_embed"), target.get("pos_embed")
    if (pos is not None and own is not None and pos.shape != own.shape and pos.shape[-1] == own.shape[-1]
            and vit.num_prefix_tokens == 1 and not vit.no_embed_class and "cls_token" in target):
        state["pos_embed"] = resample_abs_pos_embed(pos, new_size=list(vit.patch_embed.grid_size), num_prefix_tokens=1)
        log.info("model.init_from: positional embedding resampled from %d to %d patches", pos.shape[1] - 1,
                 own.shape[1] - 1)
    head = {f"head.{k}" for k in vit.get_classifier().state_dict()}
    unexpected = [k for k in state if k not in target]
    missing = [k for k in target if k not in state and k not in head and not k.startswith("fc_norm.")]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(target[k].shape)}"
              for k in state if k in target and state[k].shape != target[k].shape]
    if unexpected or missing or shapes:
        desc, fix = encoder_summary(mae_cfg)
        problems = [f"keys of the checkpoint the ViT lacks: {_summarize(unexpected)}" if unexpected else "",
                    f"keys of the ViT the checkpoint lacks: {_summarize(missing)}" if missing else "",
                    f"shapes that differ (checkpoint vs ViT): {_summarize(shapes, 6)}" if shapes else ""]
        raise UserError(
            f"model.init_from={path}: the MAE encoder does not match model.backbone={backbone} — "
            + "; ".join(p for p in problems if p)
            + f". The checkpoint's encoder has {desc}. Build the same ViT, e.g. {fix} (and keep the class token)."
        )
    vit.load_state_dict(state, strict=False)
    left = sorted(set(target) - set(state))
    log.info("model.init_from: loaded the MAE encoder of %s (%d tensors); newly initialized: %s", path, len(state),
             ", ".join(left) or "nothing")
    return left
