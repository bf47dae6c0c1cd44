"""predict.py for segmentation: <name>_mask.png (class indices in a palette PNG) next to each image of `input` (a
file or a folder), at the scale evaluation used and written at the image's own size."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("attnlab")


def predict(model, cfg, run_cfg) -> list[Path]:
    from attnlab.data.images.base import image_files
    from attnlab.data.segmentation.datamodule import channels_of, open_image
    from attnlab.tasks.seg_media import palette_png

    files = image_files(cfg.get("input"), skip_suffix="_mask")
    h = model.hparams
    mean = torch.tensor(model.mean, dtype=torch.float32)[:, None, None]
    std = torch.tensor(model.std, dtype=torch.float32)[:, None, None]
    resize = (run_cfg.get("data") or {}).get("eval_resize") if run_cfg is not None else None
    written = []
    with torch.inference_mode():
        for path in files:
            img = open_image(path)
            if channels_of(img.mode) != h.in_chans:
                log.warning("%s has %d channel(s), the model takes %d: converting it", path,
                            channels_of(img.mode), h.in_chans)
            arr = np.array(img.convert("L" if h.in_chans == 1 else "RGB"))
            x = torch.from_numpy(arr.reshape(*arr.shape[:2], -1)).permute(2, 0, 1).float() / 255.0
            x = ((x - mean) / std)[None].to(model.device)  # (1, C, H, W)
            H, W = x.shape[-2:]
            if resize and min(H, W) != resize:  # the scale evaluation used, then back to the image's own size
                scale = resize / min(H, W)
                x = F.interpolate(x, size=(round(H * scale), round(W * scale)), mode="bilinear", align_corners=False)
            logits = model.infer(x)
            if logits.shape[-2:] != (H, W):
                logits = F.interpolate(logits, size=(H, W), mode="bilinear", align_corners=False)
            mask = logits.argmax(1)[0].cpu().numpy()  # (H, W)
            out = path.with_name(f"{path.stem}_mask.png")
            palette_png(mask, model.palette).save(out)
            counts = np.bincount(mask.ravel(), minlength=h.num_classes) / mask.size
            share = ", ".join(f"{n} {100 * c:.1f}%" for n, c in zip(model.class_names, counts) if c > 0)
            print(f"{path} -> {out} ({share})", flush=True)
            written.append(out)
    return written
