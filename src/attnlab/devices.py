"""The devices a run asks for (`trainer.accelerator`, `trainer.devices`) against those the machine has: plain values
in, a device count or a refusal out."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from attnlab.errors import UserError

log = logging.getLogger("attnlab")
GPU_ACCELERATORS = ("gpu", "cuda")


def uses_gpu(accelerator: str) -> bool:
    """Whether a run with this `trainer.accelerator` runs on CUDA GPUs (`auto`: when this machine has one)."""
    return accelerator in GPU_ACCELERATORS or (accelerator == "auto" and torch.cuda.is_available())


def device_count(accelerator: str, devices: Any) -> int:
    """The devices per node that `trainer.devices` asks for (`auto` or -1: every GPU, else 1)."""
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return len(devices)
    if devices in ("auto", -1, "-1"):
        gpus = torch.cuda.device_count() if accelerator in (*GPU_ACCELERATORS, "auto") else 0
        return gpus or 1
    return int(devices)


def check_devices(accelerator: str, devices: Any, precision: str) -> None:
    """Refuse a GPU request this machine cannot serve, and float16 precision on the CPU (bf16 there is warned about),
    before Lightning fails somewhere deeper."""
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and precision.startswith("16"):
        raise UserError(f"trainer.precision={precision} (float16) needs a GPU; this run is on the CPU, where "
                        "Lightning would switch to bf16-mixed, hundreds of times slower than 32-true on most CPUs. "
                        "Use trainer.precision=32-true on the CPU.")
    if on_cpu and precision.startswith("bf16"):
        log.warning("trainer.precision=%s on the CPU: most CPUs run bfloat16 far slower than float32 "
                    "(trainer.precision=32-true)", precision)
    if accelerator not in GPU_ACCELERATORS:
        return
    available = torch.cuda.device_count()
    if available == 0:
        raise UserError(
            f"trainer.accelerator={accelerator} asks for a CUDA GPU, but this machine has none visible to PyTorch. "
            "Use trainer=cpu (or trainer=ddp_cpu for multi-process DDP on CPU), or check CUDA_VISIBLE_DEVICES and "
            "the installed torch build."
        )
    if isinstance(devices, int) and devices > available:
        raise UserError(
            f"trainer.devices={devices} but this machine has {available} GPU(s). Set trainer.devices to at most "
            f"{available} (or trainer.devices=auto for all of them)."
        )
