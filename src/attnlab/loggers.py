"""Logger factories with the platform's defaults."""

from __future__ import annotations

import logging
import netrc
import os
from typing import Any

log = logging.getLogger(__name__)


def netrc_path() -> str:
    """The netrc file `wandb login` writes and W&B reads: $NETRC, else ~/.netrc, else ~/_netrc (Windows)."""
    if os.environ.get("NETRC"):
        return os.path.expanduser(os.environ["NETRC"])
    home = os.path.expanduser("~")
    unix, windows = os.path.join(home, ".netrc"), os.path.join(home, "_netrc")
    return windows if not os.path.exists(unix) and os.path.exists(windows) else unix


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc(netrc_path()).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


# W&B's folders under HOME (cache, settings, artifact staging) and the variables that move them
_WANDB_HOME_FOLDERS = {"WANDB_CACHE_DIR": ".cache/wandb", "WANDB_CONFIG_DIR": ".config/wandb",
                       "WANDB_DATA_DIR": ".local/share/wandb"}


def _wandb_folders_writable(save_dir: str) -> None:
    """Where HOME cannot be written (a read-only or missing home on a cluster node, a container's user without one),
    W&B's folders go into the run folder (<run dir>/wandb/{cache,config,data}) instead of failing at its first
    write; a variable the user set is left alone."""
    from pathlib import Path

    moved = []
    for var, rel in _WANDB_HOME_FOLDERS.items():
        if os.environ.get(var) or _writable(Path(os.path.expanduser("~")) / rel):
            continue
        os.environ[var] = str(Path(save_dir).absolute() / "wandb" / var.split("_")[1].lower())
        moved.append(var)
    if moved:
        log.info("W&B: %s cannot be written: its folders are in %s (%s)", os.path.expanduser("~"),
                 Path(save_dir).absolute() / "wandb", ", ".join(moved))


def _writable(folder) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".attnlab-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def wandb_logger(project: str = "attnlab", offline: bool = False, log_samples: int = 16, resume_id: str | None = None,
                 tags: list[str] | None = None, **kwargs: Any):
    """Lightning's WandbLogger that never prompts: with no API key (or WANDB_MODE=offline) it logs offline
    under save_dir/wandb, to be uploaded later with `wandb sync`. `resume_id` continues an existing run.
    `log_model=True` logs the checkpoints (best, last) as a model artifact at the end of training (`"all"`: at every
    save), online or offline."""
    from lightning.pytorch.loggers import WandbLogger

    if not offline and (os.environ.get("WANDB_MODE") in ("offline", "dryrun") or not wandb_has_credentials()):
        offline = True
        log.warning("W&B: no API key found (WANDB_API_KEY or `wandb login`): logging offline; "
                    "upload later with `wandb sync <run dir>/wandb/offline-run-*`.")
    os.environ.setdefault("WANDB_SILENT", "true")
    _wandb_folders_writable(kwargs.get("save_dir") or ".")
    if resume_id:
        kwargs |= {"id": resume_id, "resume": "allow"}
    if offline:  # wandb's own offline mode: Lightning's `offline=True` refuses log_model, but an offline run records
        kwargs["mode"] = "offline"  # its model artifacts too, and `wandb sync` uploads them with the run
        os.environ["WANDB_MODE"] = "offline"  # as Lightning's offline=True does (an empty value is refused)
    logger = WandbLogger(project=project, tags=list(tags or []), **kwargs)
    logger.log_samples = int(log_samples)  # read by the tasks' sample-prediction tables
    return logger


def csv_logger(save_dir: str, name: str = "csv", version: str | int | None = "", append: bool = False,
               **kwargs: Any):
    """Lightning's CSVLogger; with `append` it continues an existing metrics.csv instead of replacing it. For a
    resumed run, rows logged between the last checkpoint and the interruption then appear twice: the later ones are
    the resumed run's."""
    from lightning.pytorch.loggers import CSVLogger

    from attnlab.compat import appending_csv_logger

    if not append:
        return CSVLogger(save_dir=save_dir, name=name, version=version, **kwargs)
    return appending_csv_logger(save_dir=save_dir, name=name, version=version, **kwargs)
