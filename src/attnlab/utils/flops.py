"""Model FLOPs and device peak FLOP/s, for the model FLOPs utilization (`perf/mfu`)."""

from __future__ import annotations

import functools
import time

import torch
from torch import nn

# dense bf16 tensor-core peaks (FLOP/s) of common accelerators; fp32 matmuls run at a fraction of these
_GPU_BF16_PEAK = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 125e12, "L40S": 362e12, "L4": 121e12,
    "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12,
}


def training_flops_per_sample(net: nn.Module, sample_shape: tuple[int, ...], dtype=torch.float32) -> float:
    """Forward FLOPs of one sample counted by torch's FlopCounterMode, times 3 for forward + backward."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.utils.flop_counter import FlopCounterMode

    if any(isinstance(m, FullyShardedDataParallel) for m in net.modules()):
        # running FSDP units outside the root's forward corrupts their state (see callbacks.Throughput.setup)
        raise RuntimeError("FLOPs are not counted through FSDP-wrapped modules: count them before wrapping")
    param = next(net.parameters())
    x = torch.zeros((1, *sample_shape), device=param.device, dtype=dtype)
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            net(x)
    finally:
        net.train(was_training)
    return 3.0 * counter.get_total_flops()


@functools.lru_cache(maxsize=None)
def measured_cpu_peak(n: int = 1024, seconds: float = 0.15, dtype: torch.dtype = torch.float32) -> float:
    """Matmul FLOP/s of this CPU in `dtype` (the autocast dtype of the run's precision) with torch's current thread
    count: the fastest of the n x n matmuls timed within `seconds` (measured once per process and dtype)."""
    g = torch.Generator().manual_seed(0)  # not the global generator: a run draws the same numbers with or without MFU
    a, b = torch.randn(n, n, dtype=dtype, generator=g), torch.randn(n, n, dtype=dtype, generator=g)
    a @ b
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def device_peak_flops(device: torch.device, precision: str = "32-true") -> float | None:
    if device.type == "cpu":
        dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(str(precision).split("-")[0], torch.float32)
        return measured_cpu_peak(dtype=dtype)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in _GPU_BF16_PEAK.items():
            if key in name:
                if "16" in str(precision):
                    return peak
                # fp32 matmuls (torch.set_float32_matmul_precision): TF32 at "high", half the bf16 peak; bf16 at
                # "medium"; plain fp32 at "highest", about a sixteenth on tensor-core GPUs
                return peak * {"medium": 1.0, "high": 0.5}.get(torch.get_float32_matmul_precision(), 1 / 16)
    return None
