"""Masked-autoencoder pretraining on images (labels ignored), and loading its encoder into a timm ViT.

`model=mae` trains `attnlab.nn.mae.MaskedAutoencoderViT`; `model=vit model.init_from=<its checkpoint>` fine-tunes
(or, with `model.freeze_backbone=true`, linearly probes) the encoder as a timm VisionTransformer.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Annotated, Any

import torch
from annotated_types import Interval
from torch import nn
from torchmetrics import MeanMetric

from attnlab.errors import UserError
from attnlab.nn.mae import SIZES, mae_vit
from attnlab.tasks.base import BaseTask
from attnlab.types import MultipleOf, PositiveInt
from attnlab.utils.media import log_image, panel_grid
from attnlab.utils.seg_media import denormalize

log = logging.getLogger("attnlab")

MAE_TARGET = "attnlab.tasks.mae.MAEPretrainer"


class MAEPretrainer(BaseTask):
    """Logs `train/loss`, `val/loss`, `val/loss_best` (and `test/loss`): the pixel MSE on masked patches.

    Validation and test mask each batch with the same seeded noise every epoch, so `val/loss` is comparable across
    epochs. Each validation epoch writes an original | masked input | reconstruction grid of the first
    `media_images` validation images to `<run dir>/media/` (and to W&B when it logs).
    """

    def __init__(
        self,
        size: str = "base",
        patch_size: PositiveInt = 16,
        img_size: Annotated[PositiveInt, MultipleOf("patch_size")] = 224,
        in_chans: int = 3,
        embed_dim: int | None = None,
        depth: int | None = None,
        num_heads: int | None = None,
        mlp_ratio: float = 4.0,
        decoder_dim: int = 512,
        decoder_depth: int = 8,
        decoder_heads: int = 16,
        mask_ratio: Annotated[float, Interval(gt=0, lt=1)] = 0.75,
        norm_pix_loss: bool = True,
        media_images: int = 8,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        class_names: list[str] | None = None,  # given by image data; the labels are not used
        **base: Any,
    ):
        super().__init__(**({"monitor": "val/loss", "monitor_mode": "min"} | base))
        self.save_hyperparameters(ignore=["class_names"])
        self.net = mae_vit(size, embed_dim, depth, num_heads, img_size=img_size, patch_size=patch_size,
                           in_chans=in_chans, mlp_ratio=mlp_ratio, decoder_dim=decoder_dim,
                           decoder_depth=decoder_depth, decoder_heads=decoder_heads, mask_ratio=mask_ratio,
                           norm_pix_loss=norm_pix_loss)
        self.mean = list(mean or [0.5] * in_chans)
        self.std = list(std or [0.5] * in_chans)
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self._media: tuple[torch.Tensor, ...] | None = None

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None = None):
        return self.run_net(x, noise=noise)  # loss, pred (B, L, p*p*C), mask (B, L)

    def training_step(self, batch, batch_idx):
        x = batch[0]  # (B, C, H, W); labels ignored
        loss, _, _ = self(x)
        self.log_train_loss(loss, x.shape[0], epoch_mean=True)
        return loss

    def fixed_noise(self, n: int, batch_idx: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(batch_idx)
        return torch.rand(n, self.net.patch_embed.num_patches, generator=gen).to(self.device)  # (B, L)

    def _eval_step(self, batch, batch_idx: int, metric: MeanMetric):
        x = batch[0]
        loss, pred, mask = self(x, noise=self.fixed_noise(x.shape[0], batch_idx))
        metric.update(loss, x.shape[0])
        return x, pred, mask

    def validation_step(self, batch, batch_idx):
        x, pred, mask = self._eval_step(batch, batch_idx, self.val_loss)
        if batch_idx == 0 and self.hparams.media_images:
            n = self.hparams.media_images
            self._media = (x[:n].detach(), pred[:n].detach(), mask[:n].detach())

    def on_validation_epoch_end(self):
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log_best(loss)
        if not self.trainer.sanity_checking and self.trainer.is_global_zero and self._media is not None:
            self._save_media()
        self._media = None

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, self.test_loss)

    def on_test_epoch_end(self):
        self.log("test/loss", self.test_loss.compute(), sync_dist=True)
        self.test_loss.reset()

    def reconstruction_grid(self, x: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor):
        """One row per image: original | masked input | reconstruction, as a uint8 (H', W', 3) array."""
        masked, recon = self.net.reconstruct(x.float(), pred.float(), mask.float())
        rows = [[denormalize(im, self.mean, self.std) for im in triple] for triple in zip(x, masked, recon)]
        return panel_grid(rows, height=max(96, x.shape[-1]))

    def _save_media(self) -> Path:
        from PIL import Image

        grid = self.reconstruction_grid(*self._media)
        out = Path(self.trainer.default_root_dir) / "media"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"val_epoch{self.current_epoch:03d}_step{self.global_step:06d}.png"
        Image.fromarray(grid).save(path)
        log_image(self.trainer, "val/reconstructions", grid,
                  "original | masked input | reconstruction (predicted masked patches + the visible ones)")
        return path

    def flops_per_sample(self) -> float | None:
        from attnlab.utils.flops import training_flops_per_sample

        h = self.hparams
        return training_flops_per_sample(self.net, (h.in_chans, h.img_size, h.img_size))

# ---- fine-tuning: the MAE encoder into a timm ViT

def find_mae_checkpoint(init_from: str) -> Path:
    """`init_from` is a .ckpt file, or a folder: the newest checkpoints/last.ckpt under it (e.g. logs/<task_name>)."""
    path = Path(init_from).expanduser()
    if path.is_dir():
        found = sorted(path.glob("**/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise UserError(
                f"model.init_from={init_from}: no checkpoints/last.ckpt under that folder. Pretrain first "
                "(`python train.py experiment=mae_pretrain_cifar10`, or any run with model=mae), or give the path of "
                "an MAE checkpoint (model.init_from=logs/<task>/runs/<time>/checkpoints/last.ckpt)."
            )
        return found[-1]
    if not path.is_file():
        raise UserError(
            f"model.init_from={init_from} does not exist. Give the .ckpt of an MAE pretraining run (model=mae), "
            "found in <run dir>/checkpoints/, or a folder holding such runs (its newest last.ckpt is used)."
        )
    return path


def read_mae_encoder(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """-> the encoder's state dict under timm ViT names, and the MAE model config of the run that wrote it."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise UserError(f"model.init_from: cannot read {path}: {e}. The file is not a PyTorch checkpoint or is "
                        "truncated.") from e
    meta = ckpt.get("attnlab") if isinstance(ckpt, dict) else None
    target = ((meta or {}).get("config") or {}).get("model", {}).get("_target_")
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
    return state, meta["config"]["model"]


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
    path = find_mae_checkpoint(init_from)
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
