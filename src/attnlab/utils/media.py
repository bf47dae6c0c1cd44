"""Task media: images shown as they were before normalization, and sample tables and images for W&B (a no-op
when no WandbLogger is attached)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("attnlab")


def denormalize(image: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """(C, H, W) normalized tensor -> uint8 RGB (H, W, 3)."""
    m = torch.tensor(mean, dtype=torch.float32)[:, None, None]
    s = torch.tensor(std, dtype=torch.float32)[:, None, None]
    img = (image.detach().float().cpu() * s + m).clamp(0, 1)
    arr = (img * 255).round().byte().permute(1, 2, 0).numpy()
    return np.repeat(arr, 3, axis=-1) if arr.shape[-1] == 1 else arr


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


def log_image(trainer, key: str, image: Any, caption: str | None = None) -> None:
    """One image (a uint8 (H, W[, C]) array or a file path) under `key` in W&B; a no-op without a WandbLogger."""
    log_images(trainer, key, [(image, caption)], single=True)


def log_images(trainer, key: str, images: list[tuple[Any, str | None]], single: bool = False) -> None:
    """(image, caption) pairs as one media panel under `key` in W&B; a no-op without a WandbLogger."""
    lg = wandb_logger(trainer)
    if lg is None or not images:
        return
    import wandb

    panel = [wandb.Image(str(im) if isinstance(im, Path) else im, caption=caption) for im, caption in images]
    lg.experiment.log({key: panel[0] if single else panel, "trainer/global_step": trainer.global_step})


def run_dir(trainer) -> Path | None:
    """The run's own folder, where a task writes its media and a data module its reports: the trainer's
    `default_root_dir`, unless that is merely the current directory (a Trainer made without one, outside a Hydra
    run): then its logger's version folder (lightning_logs/version_N), or None without a logger."""
    root = Path(trainer.default_root_dir).resolve()
    if root != Path.cwd().resolve() or root == hydra_run_dir():  # Hydra's run dir is the cwd where it changes to it
        return root
    logged = [lg.log_dir for lg in getattr(trainer, "loggers", []) if isinstance(getattr(lg, "log_dir", None), str)]
    return Path(logged[0]) if logged and Path(logged[0]).resolve() != root else None


def run_folder(trainer, sub: str = "") -> Path | None:
    """`run_dir`'s `sub` folder, created; None (said once) where the trainer has no run folder: nothing is written."""
    global _no_folder_said
    root = run_dir(trainer)
    if root is None:
        if not _no_folder_said:
            log.warning("the task's media and plots are not written: the Trainer has no run folder (give it "
                        "default_root_dir=<run dir>, as train.py does, or a logger), and the current directory %s is "
                        "not one", Path.cwd())
            _no_folder_said = True
        return None
    out = root / sub
    out.mkdir(parents=True, exist_ok=True)
    return out


_no_folder_said = False


def hydra_run_dir() -> Path | None:
    """The run directory of the Hydra run in progress, or None."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return Path(HydraConfig.get().runtime.output_dir).resolve() if HydraConfig.initialized() else None
    except Exception:  # a config composed without Hydra's runtime section
        return None


def save_media(trainer, key: str, image: Any, caption: str | None = None) -> Path | None:
    """A validation image (uint8 array) written to <run dir>/media/val_epoch<E>_step<S>.png and sent to W&B under
    `key`; returns the file (None where the trainer has no run folder: `run_folder`)."""
    from PIL import Image

    out = run_folder(trainer, "media")
    path = None
    if out is not None:
        path = out / f"val_epoch{trainer.current_epoch:03d}_step{trainer.global_step:06d}.png"
        Image.fromarray(image).save(path)
    log_image(trainer, key, image, caption)
    return path


def panel_grid(rows: list[list[Any]], height: int = 96, pad: int = 2) -> Any:
    """Rows of uint8 RGB panels (H, W, 3), each scaled (nearest) to `height` px, on a white background with `pad` px
    between panels: -> one uint8 (rows * (height + pad) + pad, ..., 3) array."""
    from PIL import Image

    scaled = [[np.asarray(Image.fromarray(p).resize((max(1, round(p.shape[1] * height / p.shape[0])), height),
                                                    Image.NEAREST)) for p in row] for row in rows]
    width = max(sum(p.shape[1] + pad for p in row) + pad for row in scaled)
    grid = np.full((len(scaled) * (height + pad) + pad, width, 3), 255, dtype=np.uint8)
    for i, row in enumerate(scaled):
        x, y = pad, pad + i * (height + pad)
        for p in row:
            grid[y:y + height, x:x + p.shape[1]] = p
            x += p.shape[1] + pad
    return grid
