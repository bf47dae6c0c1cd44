"""predict.py for image classifiers: the top-k classes of each image of `input` (a file or a folder), printed and
written to predictions.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import torch


def predict(model, cfg, run_cfg) -> list[dict]:
    from attnlab.data.images.base import FileImages, image_files
    from attnlab.data.images.transforms import eval_transform

    files = image_files(cfg.get("input"))
    h, data = model.hparams, run_cfg.data
    images = FileImages([(str(f), -1) for f in files], h.in_chans,
                        eval_transform(h.img_size, h.in_chans, dict(data.get("augment") or {}), normalize=True),
                        report_dir=cfg.paths.output_dir)
    names = list(h.class_names or [str(i) for i in range(h.num_classes)])
    k = min(int(cfg.get("top_k") or 5), h.num_classes)
    rows = []
    loader = torch.utils.data.DataLoader(images, batch_size=int(cfg.get("batch_size", 64)))
    with torch.inference_mode():
        for x, _ in loader:
            probs = model(x.to(model.device)).float().softmax(-1)
            top_p, top_i = probs.topk(k, dim=-1)
            for p_row, i_row in zip(top_p.tolist(), top_i.tolist()):
                path = files[len(rows)]
                rows.append({"file": str(path), "top": [(names[i], p) for i, p in zip(i_row, p_row)]})
                ranked = "  ".join(f"{j + 1}. {names[i]} {p:.3f}" for j, (i, p) in enumerate(zip(i_row, p_row)))
                print(f"{path}: {ranked}", flush=True)
    out = Path(cfg.paths.output_dir) / "predictions.csv"
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file"] + [c for j in range(k) for c in (f"class_{j + 1}", f"prob_{j + 1}")])
        for r in rows:
            w.writerow([r["file"]] + [v for name, p in r["top"] for v in (name, f"{p:.6f}")])
    return rows
