"""How a process of a job ends when it cannot unwind: the status of a run stopped by a signal, and the immediate exit
that leaves nothing half done."""

from __future__ import annotations

import os
import signal
import sys

STOPPED = 128 + signal.SIGTERM  # the status of a run stopped by a signal: not finished


def end_at_once(code: int, wandb_wait_s: float = 10.0) -> None:
    """End the process now, without unwinding (a step or a collective may never return), leaving nothing half
    done that can be ended: the temporary file of a write under way (a checkpoint) is removed, and a W&B run is
    marked ended with `code` (failed), waiting at most `wandb_wait_s` for it."""
    import threading

    from attnlab.utils.atomic import remove_unfinished

    remove_unfinished()
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        finishing = threading.Thread(target=wandb.finish, kwargs={"exit_code": code}, daemon=True)
        finishing.start()
        finishing.join(wandb_wait_s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
