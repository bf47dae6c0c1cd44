"""python predict.py ckpt_path=<path|last> input=<file|folder> (images) — each task defines what it predicts."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from attnlab.config import CONF_DIR, register_resolvers

register_resolvers()


FREE_TEXT = ("text", "prompt")


def quote_free_text(argv: list[str]) -> list[str]:
    """`text=Ein Mann fährt Fahrrad.` as the shell passes it (quotes gone) is not a valid Hydra value (spaces,
    non-ASCII letters, punctuation): quote the free-text options so any sentence or prompt goes through."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+~") in FREE_TEXT and not (value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1):
            value = "'" + value.replace("'", "\\'") + "'"
            arg = f"{key}={value}"
        out.append(arg)
    return out


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="predict")
def _main(cfg: DictConfig):
    from attnlab.cli.app import run_app

    return run_app(predict, cfg)


def main():
    from attnlab.cli.app import check_output_paths, fail_before_hydra, null_groups

    sys.argv[1:] = null_groups(sys.argv[1:], CONF_DIR)

    sys.argv = quote_free_text(sys.argv)
    fail_before_hydra(check_output_paths, sys.argv[1:])
    return _main()


def predict(cfg: DictConfig):
    import torch
    from omegaconf import OmegaConf

    from attnlab.cli import builders

    from attnlab.errors import UserError

    ckpt = builders.required_checkpoint(cfg, "predict.py")
    device = str(cfg.get("device", "auto"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device}, but this machine has no CUDA GPU visible to PyTorch: use device=cpu "
                        "(or device=auto, which takes a GPU when there is one).")
    meta = builders.read_run_metadata(ckpt)
    model = builders.load_task(ckpt, meta)
    model = model.to(device).eval()
    return model.predict_cli(cfg, OmegaConf.create(meta["config"]))


if __name__ == "__main__":
    main()
