"""python predict.py ckpt_path=<path|last> input=<file|folder> (images) — each task defines what it predicts."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from attnlab.config import CONF_DIR, register_resolvers

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="predict")
def main(cfg: DictConfig):
    from attnlab.cli.app import run_app

    return run_app(predict, cfg)


def predict(cfg: DictConfig):
    import torch
    from omegaconf import OmegaConf

    from attnlab.cli import builders

    ckpt = builders.resolve_checkpoint(cfg.ckpt_path, cfg.paths.log_dir)
    meta = builders.read_run_metadata(ckpt)
    model = builders.load_task(ckpt, meta)
    device = cfg.get("device", "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    return model.predict_cli(cfg, OmegaConf.create(meta["config"]))


if __name__ == "__main__":
    main()
