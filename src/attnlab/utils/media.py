"""Task media (sample tables, images) for W&B: a no-op when no WandbLogger is attached."""

from __future__ import annotations

from typing import Any

import torch


def wandb_logger(trainer):
    for lg in getattr(trainer, "loggers", []):
        if type(lg).__name__ == "WandbLogger":
            return lg
    return None


def samples_wanted(trainer) -> int:
    """How many samples the W&B logger asks the task to log per validation epoch (0 without W&B)."""
    lg = wandb_logger(trainer)
    return int(getattr(lg, "log_samples", 16)) if lg is not None and trainer.is_global_zero else 0


def to_display(img: torch.Tensor) -> Any:
    """(C, H, W) normalized tensor -> uint8 (H, W[, C]) array scaled to the image's own range."""
    img = img.detach().float().cpu()
    img = (img - img.min()) / (img.max() - img.min()).clamp_min(1e-8)
    arr = (img * 255).round().byte().permute(1, 2, 0).numpy()
    return arr[..., 0] if arr.shape[-1] == 1 else arr


def log_table(trainer, key: str, columns: list[str], rows: list[list[Any]], images: list | None = None) -> None:
    """A W&B table under `key`, plus its images as a captioned media panel under `<key>_images`."""
    lg = wandb_logger(trainer)
    if lg is None or not rows:
        return
    import wandb

    payload = {key: wandb.Table(columns=columns, data=rows), "trainer/global_step": trainer.global_step}
    if images:
        payload[f"{key}_images"] = images
    lg.experiment.log(payload)
