"""Logger factories with the platform's defaults."""

from __future__ import annotations

import logging
import netrc
import os
from typing import Any

log = logging.getLogger(__name__)


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_logger(project: str = "attnlab", offline: bool = False, log_samples: int = 16, resume_id: str | None = None,
                 tags: list[str] | None = None, **kwargs: Any):
    """Lightning's WandbLogger that never prompts: with no API key (or WANDB_MODE=offline) it logs offline
    under save_dir/wandb, to be uploaded later with `wandb sync`. `resume_id` continues an existing run."""
    from lightning.pytorch.loggers import WandbLogger

    if not offline and (os.environ.get("WANDB_MODE") in ("offline", "dryrun") or not wandb_has_credentials()):
        offline = True
        log.warning("W&B: no API key found (WANDB_API_KEY or `wandb login`): logging offline; "
                    "upload later with `wandb sync <run dir>/wandb/offline-run-*`.")
    os.environ.setdefault("WANDB_SILENT", "true")
    if resume_id:
        kwargs |= {"id": resume_id, "resume": "allow"}
    logger = WandbLogger(project=project, offline=offline, tags=list(tags or []), **kwargs)
    logger.log_samples = int(log_samples)  # read by the tasks' sample-prediction tables
    return logger
