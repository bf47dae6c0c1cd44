"""Finding and reading the checkpoints attnlab writes, for every setting that names one: `ckpt_path=` (train.py's
resume, eval.py, predict.py) and `model.init_from=` (weights from another run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.errors import UserError
from attnlab.utils.sharded import is_checkpoint, is_sharded


def newest_last(folder: Path) -> Path | None:
    """The newest checkpoints/last.ckpt under `folder` (any depth), or None. A last.ckpt that is a link is dated by
    its file, written when its step was saved (a symbolic link made later does not make its run the newer one);
    one whose file is gone is passed over."""
    found = [p for p in folder.glob("**/checkpoints/last.ckpt") if is_checkpoint(p)] if folder.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_checkpoint(given: str, key: str, what: str) -> Path:
    """`given` is a .ckpt file, or a folder: its newest checkpoints/last.ckpt. `key` is the setting that named it
    (model.init_from), `what` the kind of run expected (e.g. "an MAE pretraining run (model=mae)")."""
    path = Path(given).expanduser()
    if is_sharded(path):
        return path
    if path.is_dir():
        found = newest_last(path)
        if found is None:
            raise UserError(f"{key}={given}: no checkpoints/last.ckpt under that folder. Train {what} first, or give "
                            f"the path of its checkpoint ({key}=logs/<task>/runs/<time>/checkpoints/last.ckpt).")
        return found
    if not path.is_file():
        raise UserError(f"{key}={given} does not exist. Give the .ckpt of {what}, found in <run dir>/checkpoints/, "
                        "or a folder holding such runs (its newest last.ckpt is used).")
    return path


def read_checkpoint(path: str | Path, key: str = "ckpt_path", mmap: bool = False) -> dict[str, Any]:
    """The checkpoint's dict. Checkpoints attnlab wrote are read with weights_only=False: a user's LightningModule
    may keep its network among its hyperparameters."""
    try:
        if is_sharded(path):  # a folder of torch.distributed.checkpoint shards, read whole
            from attnlab.utils.sharded import read_sharded

            return read_sharded(path)
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except Exception as e:
        raise UserError(f"{key}: cannot read {path}: {e}. The file is not a PyTorch checkpoint or is "
                        "truncated.") from e
    if not isinstance(ckpt, dict):
        raise UserError(f"{key}: {path} holds a {type(ckpt).__name__}, not a checkpoint dict.")
    return ckpt


def run_config(ckpt: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved config of the run that wrote a checkpoint (None for a checkpoint of another program)."""
    meta = ckpt.get("attnlab")
    return (meta or {}).get("config") if isinstance(meta, dict) else None
