"""Learning-rate schedules, each with a linear warmup. Configured as `_partial_`; the task passes the optimizer
and the total number of optimizer steps, and gets back Lightning's lr_scheduler config (dict or list of dicts)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from attnlab.types import NonNegativeFloat, UnitInterval


def _warmup_steps(warmup: float, total_steps: int) -> int:
    return int(warmup * total_steps) if 0 < warmup < 1 else int(warmup)


def _schedule(optimizer: Optimizer, total_steps: int, warmup: float, decay) -> dict:
    warm = _warmup_steps(warmup, total_steps)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / (warm + 1)
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        return decay(progress)

    return {"scheduler": LambdaLR(optimizer, factor), "interval": "step", "frequency": 1, "name": "lr"}


def cosine(optimizer: Optimizer, total_steps: int, warmup: NonNegativeFloat = 0.05,
           min_lr_ratio: UnitInterval = 0.0) -> dict:
    return _schedule(
        optimizer, total_steps, warmup,
        lambda t: min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)),
    )


def linear(optimizer: Optimizer, total_steps: int, warmup: NonNegativeFloat = 0.05,
           min_lr_ratio: UnitInterval = 0.0) -> dict:
    return _schedule(optimizer, total_steps, warmup, lambda t: 1 - (1 - min_lr_ratio) * t)


def constant(optimizer: Optimizer, total_steps: int, warmup: NonNegativeFloat = 0) -> dict:
    return _schedule(optimizer, total_steps, warmup, lambda t: 1.0)


def noam(optimizer: Optimizer, total_steps: int, d_model: int = 512, warmup: float = 4000, scale: float = 1.0) -> dict:
    """Vaswani et al.: lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); set optimizer.lr=1."""
    warm = max(1, _warmup_steps(warmup, total_steps))

    def factor(step: int) -> float:
        s = step + 1
        return scale * d_model**-0.5 * min(s**-0.5, s * warm**-1.5)

    return {"scheduler": LambdaLR(optimizer, factor), "interval": "step", "frequency": 1, "name": "lr"}


def plateau(
    optimizer: Optimizer, total_steps: int, monitor: str = "val/loss", mode: str = "min",
    factor: float = 0.5, patience: int = 3, warmup: float = 0,
) -> list[dict]:
    schedulers = [{
        "scheduler": ReduceLROnPlateau(optimizer, mode=mode, factor=factor, patience=patience),
        "interval": "epoch", "monitor": monitor, "strict": True, "name": "lr",
    }]
    warm = _warmup_steps(warmup, total_steps)
    if warm > 0:
        schedulers.insert(0, {"scheduler": _LinearWarmup(optimizer, warm), "interval": "step", "name": "lr_warmup"})
    return schedulers


class _LinearWarmup(LRScheduler):
    """Ramps the lr up over `steps` optimizer steps, then leaves it to the other scheduler (e.g. ReduceLROnPlateau)."""

    def __init__(self, optimizer: Optimizer, steps: int):
        self.steps = steps
        super().__init__(optimizer)

    def step(self, epoch=None) -> None:
        self.last_epoch += 1
        if self.last_epoch <= self.steps:
            f = (self.last_epoch + 1) / (self.steps + 1)
            for g, lr in zip(self.optimizer.param_groups, self.base_lrs):
                g["lr"] = lr * f
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]


def onecycle(optimizer: Optimizer, total_steps: int, pct_start: float = 0.3, div_factor: float = 25.0,
             final_div_factor: float = 1e4) -> dict:
    """Smith's one-cycle policy with torch OneCycleLR's cosine phases: from lr/div_factor up to lr over pct_start
    of the steps, then down to lr/(div_factor*final_div_factor). The peak is the optimizer's lr. A LambdaLR, so a
    resumed run with more steps stretches the schedule instead of failing."""
    start, end = 1.0 / div_factor, 1.0 / (div_factor * final_div_factor)
    up = max(1.0, pct_start * total_steps - 1)

    def cos(a: float, b: float, t: float) -> float:
        return b + (a - b) / 2.0 * (1 + math.cos(math.pi * min(1.0, t)))

    def factor(step: int) -> float:
        if step <= up:
            return cos(start, 1.0, step / up)
        return cos(1.0, end, (step - up) / max(1.0, total_steps - 1 - up))

    return {"scheduler": LambdaLR(optimizer, factor), "interval": "step", "frequency": 1, "name": "lr"}
