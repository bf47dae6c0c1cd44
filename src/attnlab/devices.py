"""The devices a run asks for (`trainer.accelerator`, `trainer.devices`) against those the machine has."""

from __future__ import annotations

import logging

import torch
from omegaconf import OmegaConf

from attnlab.errors import UserError

log = logging.getLogger("attnlab")


def device_count(trainer_cfg) -> int:
    devices, accel = trainer_cfg.get("devices", 1), trainer_cfg.get("accelerator", "auto")
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        return len(devices)
    if devices in ("auto", -1, "-1"):
        gpus = torch.cuda.device_count() if accel in ("gpu", "cuda", "auto") else 0
        return gpus or 1
    return int(devices)



def check_devices(trainer_cfg) -> None:
    """Refuse a GPU request this machine cannot serve, before Lightning fails somewhere deeper."""
    accel, devices = str(trainer_cfg.get("accelerator", "auto")), trainer_cfg.get("devices", 1)
    precision = str(trainer_cfg.get("precision", "32-true"))
    on_cpu = accel == "cpu" or (accel == "auto" and not torch.cuda.is_available())
    if on_cpu and precision.startswith("16"):
        raise UserError(f"trainer.precision={precision} (float16) needs a GPU; this run is on the CPU, where "
                        "Lightning would switch to bf16-mixed, hundreds of times slower than 32-true on most CPUs. "
                        "Use trainer.precision=32-true on the CPU.")
    if on_cpu and precision.startswith("bf16"):
        log.warning("trainer.precision=%s on the CPU: most CPUs run bfloat16 far slower than float32 "
                    "(trainer.precision=32-true)", precision)
    if accel not in ("gpu", "cuda"):
        return
    available = torch.cuda.device_count()
    if available == 0:
        raise UserError(
            f"trainer.accelerator={accel} asks for a CUDA GPU, but this machine has none visible to PyTorch. "
            "Use trainer=cpu (or trainer=ddp_cpu for multi-process DDP on CPU), or check CUDA_VISIBLE_DEVICES and "
            "the installed torch build."
        )
    if isinstance(devices, int) and devices > available:
        raise UserError(
            f"trainer.devices={devices} but this machine has {available} GPU(s). Set trainer.devices to at most "
            f"{available} (or trainer.devices=auto for all of them)."
        )
