"""Faults met by a run that are not bugs (a full disk, a read-only folder, shared memory too small for the loader's
workers, a checkpoint whose weights do not fit the network), told as one paragraph: what was being done where, the
fix, and where there is one, the last good checkpoint to resume from."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from omegaconf import DictConfig

from attnlab.errors import UserError, causes
from attnlab.utils.paths import is_under

_FULL = {errno.ENOSPC, errno.EDQUOT}
_NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}


def _shared_memory_full(message: str) -> bool:
    """What torch says when the DataLoader's workers cannot share a batch: /dev/shm too small (Docker's default is
    64 MB): "unable to allocate shared memory", "unable to write to file </torch_...>", a worker "killed by signal:
    Bus error"."""
    m = message.lower()
    return "shared memory" in m or "/dev/shm" in m or "</torch_" in m or ("dataloader worker" in m and "bus error" in m)


def explain(err: BaseException, cfg: DictConfig | None) -> UserError | None:
    """The paragraph for a fault of the machine, or None for any other error (it keeps its traceback)."""
    for e in causes(err):
        if isinstance(e, OSError) and e.errno is not None and (e.errno in _FULL or e.errno in _NOT_WRITABLE):
            if e.filename and str(e.filename).startswith("/dev/shm"):
                return _shared_memory(cfg)
            return _os_error(e, cfg)
        if isinstance(e, RuntimeError) and _shared_memory_full(str(e)):
            return _shared_memory(cfg)
        if isinstance(e, RuntimeError) and "Error(s) in loading state_dict" in str(e):
            return _weights_do_not_fit(e, cfg)
    return None


def _os_error(e: OSError, cfg: DictConfig | None) -> UserError:
    # a copy or move (shutil.move of a file staged elsewhere) names its source first: the destination is the file
    # that could not be written, on the disk that is full
    target = e.filename2 or e.filename
    file = Path(str(target)) if target else None
    where = _setting_for(file, cfg)
    folder = file.parent if file is not None else None
    what = f"writing {_final_name(file)}" if file is not None else "writing a file"
    if e.errno in _FULL:
        disk = _disk(folder)
        msg = (f"the disk is full ({os.strerror(e.errno)}) while {what}" + (f": {disk}" if disk else "")
               + f". Free space there, or point {where} at a disk with room, then run the same command again.")
    else:
        msg = (f"{what} failed: {folder or 'the folder'} is read-only or not writable for this user "
               f"({os.strerror(e.errno)}). Point {where} at a folder you can write to, then run the same command "
               "again.")
    msg += " No half-written file was left behind."
    return UserError(msg + _resume_hint(cfg))


def _shared_memory(cfg: DictConfig | None) -> UserError:
    shm = _existing(Path("/dev/shm"))
    try:
        free = _size(shutil.disk_usage(shm).free)
    except (OSError, TypeError):
        free = ""
    msg = ("the data loader's worker processes ran out of shared memory (/dev/shm"
           + (f", {free} free" if free else "") + ") to hand batches to the training process. Set "
           "data.num_workers=0 (batches made in the training process), use fewer workers or a smaller "
           "data.batch_size, or give the machine a larger /dev/shm (docker run --shm-size=8g; on Kubernetes an "
           "emptyDir with medium: Memory mounted at /dev/shm).")
    return UserError(msg + _resume_hint(cfg))


def _weights_do_not_fit(e: RuntimeError, cfg: DictConfig | None) -> UserError:
    """torch's refusal of weights that do not fit (keys it does not know, or shapes of another size)."""
    given = (cfg or {}).get("ckpt_path")
    where = f"ckpt_path: {given}" if given else "the checkpoint this run continues from"
    detail = " ".join(str(e).split())[:300]
    return UserError(f"{where} holds weights that do not fit the network this run builds ({detail}). The file was "
                     "changed after its run wrote it, or another program or config wrote it: give a checkpoint of "
                     "this model as attnlab's train.py wrote it (<run dir>/checkpoints/).")


def _final_name(file: Path) -> Path:
    """The file a temporary name stands for (`.last.ckpt.123.tmp` -> `last.ckpt`)."""
    name = file.name
    if ".tmp" in name:
        name = name.split(".tmp")[0].lstrip(".")
        parts = name.rsplit(".", 1)
        if len(parts) == 2 and parts[1].isdigit():  # the process id
            name = parts[0]
    return file.with_name(name)


def _setting_for(file: Path | None, cfg: DictConfig | None) -> str:
    """The setting that decides where that file goes."""
    paths = (cfg or {}).get("paths") or {}
    for key, env in (("cache_dir", "ATTNLAB_CACHE_DIR"), ("log_dir", "ATTNLAB_LOG_DIR"),
                     ("data_dir", "ATTNLAB_DATA_DIR")):
        try:
            root = paths.get(key)
        except Exception:  # an interpolation that cannot resolve here
            root = None
        if file is not None and root and is_under(file, Path(str(root))):
            return f"paths.{key} (or {env})"
    return "paths.log_dir and paths.cache_dir (or ATTNLAB_LOG_DIR and ATTNLAB_CACHE_DIR)"


def _disk(folder: Path | None) -> str:
    """The filesystem holding `folder` (its mount point) with its free and total space, as measured after the
    unfinished file was removed: "the filesystem mounted at /scratch has 3 MiB free of 10 MiB"."""
    folder = _existing(folder)
    try:
        usage, mount = shutil.disk_usage(folder), folder.resolve()
        while mount.parent != mount and mount.parent.stat().st_dev == mount.stat().st_dev:
            mount = mount.parent
    except (OSError, TypeError, AttributeError):
        return ""
    return (f"the filesystem mounted at {mount} has {_size(usage.free)} free of {_size(usage.total)} (the unfinished "
            "file removed)")


def _existing(folder: Path | None) -> Path | None:
    while folder is not None and not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def _resume_hint(cfg: DictConfig | None) -> str:
    """The sentence naming the run's last good checkpoint (its last.ckpt, else its newest), or nothing."""
    try:
        out = Path(str(cfg.paths.output_dir))
    except Exception:
        return ""
    found = [p for p in (out / "checkpoints").glob("*.ckpt") if p.is_file() and p.stat().st_size > 0]
    if not found:
        return ""
    last = out / "checkpoints" / "last.ckpt"
    ckpt = last if last in found else max(found, key=lambda p: p.stat().st_mtime)
    return f" The last good checkpoint is {ckpt}: ckpt_path={ckpt} resumes from it."
