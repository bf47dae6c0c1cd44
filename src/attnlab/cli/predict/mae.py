"""predict.py for MAE pretraining: reconstructions.png (original | masked | reconstruction per image of `input`; one
more grid per `batch_size` images) in the output folder."""

from __future__ import annotations

from pathlib import Path

import torch


def predict(model, cfg, run_cfg) -> Path:
    from PIL import Image

    from attnlab.data.images.base import FileImages, image_files
    from attnlab.data.images.transforms import eval_transform

    h = model.hparams
    files = image_files(cfg.get("input"))
    images = FileImages([(str(f), -1) for f in files], h.in_chans,
                        eval_transform(h.img_size, h.in_chans, dict(run_cfg.data.get("augment") or {}), normalize=True),
                        report_dir=cfg.paths.output_dir)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    batch, written = int(cfg.get("batch_size") or 64), []
    for k, start in enumerate(range(0, len(images), batch)):  # one grid per batch of images
        x = torch.stack([images[i][0] for i in range(start, min(start + batch, len(images)))]).to(model.device)
        with torch.inference_mode():
            _, pred, mask = model(x, noise=model.fixed_noise(x.shape[0], 0))
        out = out_dir / ("reconstructions.png" if k == 0 else f"reconstructions_{k + 1}.png")
        Image.fromarray(model.reconstruction_grid(x, pred, mask)).save(out)
        written.append(out)
    print(f"{len(files)} image(s): original | masked input | reconstruction written to "
          f"{', '.join(map(str, written))}", flush=True)
    return written[0]
