"""Platform overhead on image classification: images/s of a train.py run against a bare PyTorch loop that trains
the same model on the same batches, measured in one process, alternating, so machine noise hits both.

    python benchmarks/classification_overhead.py [--epochs 6] [--repeats 3] [overrides ...]
    python benchmarks/classification_overhead.py --epochs 3 experiment=vit_cifar10 trainer.limit_train_batches=8

Prints one markdown row per repeat and the median ratio ours / bare (1.0 = no overhead). Both are timed in steady
state: from the start of the second epoch to the end, so one-off setup (loop construction, the FLOP count and
CPU peak measurement behind perf/mfu) is left out of both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import torch
import torch.nn.functional as F

from attnlab.cli import builders
from attnlab.cli.plan import make_plan
from attnlab.config import compose_run


def _cfg(overrides: list[str], out: Path, epochs: int):
    return compose_run([f"trainer.max_epochs={epochs}", "trainer.limit_val_batches=0", "trainer.num_sanity_val_steps=0",
                        "test=false", "callbacks.model_summary=null", "extras.print_config=false", *overrides], out,
                       log_dir=out / "logs", cache_dir=out.parent / "cache")


def bare(overrides: list[str], epochs: int, out: Path) -> float:
    """The same task network, optimizer param groups, schedule and DataLoader, in a plain loop."""
    cfg = _cfg(overrides, out, epochs)
    torch.manual_seed(cfg.seed)
    dm = builders.build_datamodule(cfg.data)
    model = builders.build_task(cfg, dm)
    net = model.net
    loader = dm.train_dataloader()
    limit = cfg.trainer.get("limit_train_batches")
    per_epoch = min(len(loader), int(limit)) if limit and limit > 1 else len(loader)
    steps = epochs * per_epoch

    class _T:  # what configure_optimizers reads from the trainer
        estimated_stepping_batches = steps
        model = net

    model._trainer = _T()
    dm.trainer = SimpleNamespace(training=True)  # what the data module's device-side step reads (random erasing)
    conf = model.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    smoothing = cfg.model.label_smoothing
    mixup = model.mixup
    net.train()
    n, start = 0, time.perf_counter()
    for epoch in range(epochs):
        if epoch == 1:
            n, start = 0, time.perf_counter()
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i == per_epoch:
                break
            x, y = dm.on_after_batch_transfer((x, y), 0)  # uint8 images -> normalized float, as the trainer does
            if mixup is not None:  # soft targets, smoothed by mixup itself
                x, y_soft = mixup(x, y)
                loss = F.cross_entropy(net(x), y_soft)
            else:
                loss = F.cross_entropy(net(x), y, label_smoothing=smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            n += x.shape[0]
    return n / (time.perf_counter() - start)


def ours(overrides: list[str], epochs: int, out: Path) -> float:
    """train.py's own code path (callbacks, loggers, progress bar as configured), fit time only."""
    cfg = _cfg(overrides, out, epochs)
    plan = make_plan(cfg)
    dm = builders.build_datamodule(cfg.data)
    model = builders.build_task(cfg, dm)
    loggers = builders.build_loggers(cfg)
    clock = _SteadyClock()
    trainer = builders.build_trainer(cfg, plan, builders.build_callbacks(cfg, bool(loggers)) + [clock], loggers)
    trainer.fit(model, datamodule=dm)
    return (trainer.global_step - clock.step) * dm.batch_size / (time.perf_counter() - clock.start)


class _SteadyClock(L.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            self.start, self.step = time.perf_counter(), trainer.global_step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args()
    if args.epochs < 2:
        p.error("--epochs must be 2 or more: both loops are timed from the start of their second epoch")
    ratios = []
    print("| repeat | bare images/s | train.py images/s | ratio |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            b = bare(args.overrides, args.epochs, Path(tmp) / f"b{r}")
            o = ours(args.overrides, args.epochs, Path(tmp) / f"o{r}")
            ratios.append(o / b)
            print(f"| {r} | {b:.0f} | {o:.0f} | {o / b:.3f} |", flush=True)
    print(f"median ratio train.py / bare loop: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
