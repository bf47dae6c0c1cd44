"""SIGTERM during training: the first one saves `last.ckpt` at the end of the current step and stops (Lightning's
handler, with ModelCheckpoint.on_exception); a second one, or the first when the current step has already run for
`patience_s` seconds (a run too large for the machine, a hung collective), stops the process at once, naming the
checkpoint that the last save left. A run stopped by SIGTERM ends with status 143 (128 + SIGTERM), as a process
killed by it would, so that a scheduler or pipeline does not record a preempted run as finished."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class SignalGuard(Callback):
    def __init__(self, patience_s: float = 30.0):
        self.patience_s = patience_s
        self.received = 0
        self.step_started: float | None = None
        self._trainer = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # before Lightning registers its own handler, which calls the one it finds after its own
        self._trainer = trainer
        if stage == "fit" and hasattr(signal, "SIGTERM"):
            previous = signal.getsignal(signal.SIGTERM)
            if previous in (signal.SIG_DFL, signal.SIG_IGN, None):
                signal.signal(signal.SIGTERM, self.on_sigterm)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_started = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step_started = None

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit" and signal.getsignal(signal.SIGTERM) == self.on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def on_sigterm(self, signum, frame) -> None:
        self.received += 1
        running = time.monotonic() - self.step_started if self.step_started is not None else 0.0
        if self.received == 1 and running < self.patience_s:
            return  # Lightning stops after this step and saves last.ckpt
        why = "a second SIGTERM" if self.received > 1 else f"SIGTERM while a step has run for {running:.0f} s"
        self.stop_now(why)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Lightning's stop on SIGTERM is a SystemExit without a code (status 0, as if the run had finished): say
        what was saved and give it SIGTERM's status. attnlab's ModelCheckpoint writes last.ckpt in this same round
        of on_exception hooks (Lightning calls checkpoint callbacks last)."""
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if not isinstance(exception, SIGTERMException):
            return
        ckpt = getattr(trainer, "checkpoint_callback", None)
        if ckpt is not None and getattr(ckpt, "save_last", False) and getattr(ckpt, "dirpath", None):
            last = Path(ckpt.dirpath) / "last.ckpt"
            kept = f"step {trainer.global_step} is saved in {last}; resume from it with ckpt_path={last}"
        else:
            kept = "no checkpoint is configured (callbacks.model_checkpoint), so nothing was saved"
        os.write(2, f"\nattnlab: stopped on SIGTERM: {kept}. Exit status {128 + signal.SIGTERM} "
                    "(preempted, not finished).\n".encode())
        exception.code = 128 + signal.SIGTERM

    def last_checkpoint(self) -> str | None:
        ckpt = getattr(self._trainer, "checkpoint_callback", None)
        path = getattr(ckpt, "last_model_path", "") or ""
        if not path and getattr(ckpt, "dirpath", None):
            path = str(Path(ckpt.dirpath) / "last.ckpt")
        return path if path and Path(path).is_file() else None

    def stop_now(self, why: str) -> None:
        last = self.last_checkpoint()
        kept = (f"the last checkpoint is {last}; resume from it with ckpt_path={last}" if last
                else "no checkpoint had been saved yet")
        os.write(2, f"\nattnlab: stopped at once on {why}: the current step is lost; {kept}.\n".encode())
        os._exit(128 + signal.SIGTERM)
