"""Learning-rate schedules, each with a linear warmup. Configured as `_partial_`; the task passes the optimizer
and the total number of optimizer steps, and gets back Lightning's lr_scheduler config (dict or list of dicts)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau


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


def cosine(optimizer: Optimizer, total_steps: int, warmup: float = 0.05, min_lr_ratio: float = 0.0) -> dict:
    return _schedule(
        optimizer, total_steps, warmup,
        lambda t: min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)),
    )


def linear(optimizer: Optimizer, total_steps: int, warmup: float = 0.05, min_lr_ratio: float = 0.0) -> dict:
    return _schedule(optimizer, total_steps, warmup, lambda t: 1 - (1 - min_lr_ratio) * t)


def constant(optimizer: Optimizer, total_steps: int, warmup: float = 0) -> dict:
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


class _LinearWarmup:
    """Ramps the lr up over `steps` optimizer steps, then leaves it to the other scheduler (e.g. ReduceLROnPlateau)."""

    def __init__(self, optimizer: Optimizer, steps: int):
        self.optimizer, self.steps, self.last_step = optimizer, steps, 0
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self._apply()

    def _apply(self) -> None:
        if self.last_step <= self.steps:
            f = (self.last_step + 1) / (self.steps + 1)
            for g, lr in zip(self.optimizer.param_groups, self.base_lrs):
                g["lr"] = lr * f

    def step(self, *_args) -> None:
        self.last_step += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"last_step": self.last_step, "base_lrs": self.base_lrs, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


def onecycle(optimizer: Optimizer, total_steps: int, pct_start: float = 0.3, div_factor: float = 25.0,
             final_div_factor: float = 1e4) -> dict:
    """Smith's one-cycle policy (torch OneCycleLR): warm up from lr/div_factor over pct_start of the steps,
    then cosine-anneal to lr/(div_factor*final_div_factor). The peak is the optimizer's lr."""
    from torch.optim.lr_scheduler import OneCycleLR

    peaks = [g["lr"] for g in optimizer.param_groups]
    sched = OneCycleLR(optimizer, max_lr=peaks, total_steps=total_steps, pct_start=pct_start,
                       div_factor=div_factor, final_div_factor=final_div_factor, cycle_momentum=False)
    return {"scheduler": sched, "interval": "step", "frequency": 1, "name": "lr"}
