"""The one-time extraction of image-net.org's ILSVRC2012 archives into `train/<wnid>/` and `val/<wnid>/`.

Atomic and resumable: everything is written under `<out>/.imagenet_prepare/`, each training class into a folder of its
own renamed into place once it holds every image meta.mat lists for it, each validation image under a temporary name
renamed once whole. When the counts match meta.mat's (`num_train_images`, and the ground truth's 50 per class), the two
trees are renamed to `<out>/train` and `<out>/val` and `imagenet_prepared.json` is written last: a tree without it is
never read. An interrupted preparation resumes where it stopped (the classes and files already whole are kept). A file
lock (`<out>/.imagenet_prepare.lock`) keeps two processes (the ranks of a job, two jobs on shared storage) from
preparing together: the first prepares, the others wait and then read what it made.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attnlab.data.formats.imagenet_archives import (DEVKIT_TAR, MARKER, STAGING, TRAIN_TAR, VAL_NAME, VAL_TAR, Devkit,
                                            display_names, read_devkit)
from attnlab.errors import UserError

log = logging.getLogger("attnlab")
LOCK = ".imagenet_prepare.lock"
CHUNK = 1 << 20


def prepare_imagenet(root: str | Path, out: str | Path | None = None, workers: int | None = None,
                     progress: bool | None = None) -> Path:
    """Extract the three archives in `root` into `out` (default `root`) unless done already -> `out`. `progress`:
    a progress bar (None: where stderr is a terminal)."""
    from filelock import FileLock, Timeout

    root, out = Path(root), Path(out or root)
    absent = [name for name in (TRAIN_TAR, VAL_TAR, DEVKIT_TAR) if not (root / name).is_file()]
    if absent and not (out / MARKER).is_file():
        raise UserError(f"{root} lacks {', '.join(absent)}: the preparation needs the three ILSVRC2012 files from "
                        f"image-net.org ({TRAIN_TAR}, {VAL_TAR}, {DEVKIT_TAR}) side by side in one folder.")
    cannot_write = UserError(
        f"cannot write to {out}: ImageNet is extracted there (about 150 GB). Give a folder you can write to: "
        f"data.prepared=<dir>, or `python -m attnlab.data.prepare imagenet {root} --out <dir>` and then "
        "data.root=<dir>.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(out / LOCK))
        try:
            lock.acquire(timeout=0.5)
        except Timeout:  # another process holds it: it prepares, this one waits and reads what it made
            log.info("another process is preparing ImageNet in %s: waiting for it (lock %s)", out, out / LOCK)
            lock.acquire()
    except PermissionError:
        raise cannot_write from None
    try:
        if not (out / MARKER).is_file():
            _prepare(root, out, workers or _workers(), progress)
    finally:
        lock.release()
    return out


def wait_for_preparation(out: Path, give_up_s: float = 600.0, poll_s: float = 2.0) -> None:
    """Another process (local rank 0) prepares the tree at `out`: wait until its marker is there. A lock that nobody
    holds while no marker comes for `give_up_s` means nobody prepares: refused with what to run."""
    from filelock import FileLock, Timeout

    idle_since = time.monotonic()
    while not (out / MARKER).is_file():
        try:
            with FileLock(str(out / LOCK), timeout=poll_s):
                pass
        except Timeout:  # held: the preparation runs
            idle_since = time.monotonic()
            continue
        if (out / MARKER).is_file():  # the preparation ended while this process waited for the lock
            return
        if time.monotonic() - idle_since > give_up_s:
            raise UserError(f"waited {give_up_s:.0f} s for ImageNet to be prepared in {out} by another process, and "
                            "none is preparing it: run `python -m attnlab.data.prepare imagenet <folder of the "
                            f"archives> --out {out}` once, then start the run again.")
        time.sleep(poll_s)


def _workers() -> int:
    from attnlab.utils.cpus import usable_cpus

    return max(1, min(8, usable_cpus()))


def _prepare(root: Path, out: Path, workers: int, progress: bool | None) -> None:
    from tqdm.auto import tqdm

    kit = read_devkit(root / DEVKIT_TAR)
    stage = out / STAGING
    moving = (stage / "moving").is_file()  # both trees were whole: only the renames were left
    for part in ("train", "val"):
        if (out / part).exists() and not moving:
            raise UserError(f"{out / part} exists and was not extracted by attnlab (there is no {out / MARKER}): "
                            f"read it as it is with data.root={out} (after moving the archives elsewhere), or move "
                            "it away, or extract elsewhere with --out <dir> (data.prepared=<dir>).")
    if not moving:
        fresh = not stage.exists()
        stage.mkdir(parents=True, exist_ok=True)
        if fresh:
            _check_space(root, out)
        total = kit.expected_train + len(kit.val_ids)
        log.info("preparing ImageNet-1k once: extracting %s and %s (%d classes, %d + %d images) into %s",
                 TRAIN_TAR, VAL_TAR, len(kit.classes), kit.expected_train, len(kit.val_ids), out)
        with tqdm(total=total, unit=" images", desc="extracting ImageNet", disable=None if progress is None
                  else not progress, smoothing=0.05) as bar:
            train_problems = _extract_train(root / TRAIN_TAR, stage / "train", kit, workers, bar)
            val_problems = _extract_val(root / VAL_TAR, stage / "val", kit, bar)
        if train_problems or val_problems:
            raise UserError(_count_message(kit, train_problems, val_problems))
        (stage / "moving").write_text("")
    for part in ("train", "val"):
        if (stage / part).exists():
            os.replace(stage / part, out / part)
    names = display_names([(s.wnid, s.words, s.parent_words) for s in kit.classes])
    marker = {"source": f"{TRAIN_TAR}, {VAL_TAR}, {DEVKIT_TAR} in {root}", "train": kit.expected_train,
              "val": len(kit.val_ids), "classes": [[s.wnid, n, s.words] for s, n in zip(kit.classes, names)]}
    from attnlab.utils.atomic import write_text

    write_text(out / MARKER, json.dumps(marker, indent=1))
    shutil.rmtree(stage, ignore_errors=True)
    log.info("ImageNet-1k prepared in %s: %d training images in %d classes, %d validation images", out,
             kit.expected_train, len(kit.classes), len(kit.val_ids))


def _check_space(root: Path, out: Path) -> None:
    need = sum((root / name).stat().st_size for name in (TRAIN_TAR, VAL_TAR))
    free = shutil.disk_usage(out).free
    if free < need:
        raise UserError(f"extracting ImageNet needs about {need / 1e9:.1f} GB in {out}, which has "
                        f"{free / 1e9:.1f} GB free: free some space, or extract elsewhere with --out <dir> "
                        "(data.prepared=<dir>).")


def _copy(src, dest: Path) -> None:
    """A file from a tar written under a temporary name, renamed once whole."""
    tmp = dest.with_name(f".{dest.name}.partial")
    with open(tmp, "wb") as fh:
        shutil.copyfileobj(src, fh, CHUNK)
    os.replace(tmp, dest)


def _safe_name(member: tarfile.TarInfo) -> str | None:
    """The file name a tar member is written under (its base name), or None for what is not a plain file."""
    name = Path(member.name).name
    return name if member.isfile() and name and not name.startswith(".") else None


def _extract_train(tar_path: Path, dest: Path, kit: Devkit, workers: int, bar) -> dict[str, str]:
    """Each class's inner tar into dest/<wnid>, on `workers` threads; -> {wnid: what is wrong} for the classes not
    whole (their folders stay unfinished and are extracted again next time)."""
    dest.mkdir(exist_ok=True)
    try:
        with tarfile.open(tar_path) as outer:
            inner = {Path(m.name).name.removesuffix(".tar"): m for m in outer.getmembers()
                     if m.isfile() and m.name.endswith(".tar")}
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(f"cannot read {tar_path} ({type(e).__name__}: {e}): download it again.") from None
    problems: dict[str, str] = {}
    todo = []
    for s in kit.classes:
        if (dest / s.wnid).is_dir():
            bar.update(s.num_train_images)
        elif s.wnid not in inner:
            problems[s.wnid] = f"no {s.wnid}.tar in the archive"
        else:
            todo.append(s)
    local, opened = threading.local(), []

    def one(s) -> tuple[str, str | None]:
        if not hasattr(local, "tar"):  # a TarFile per thread: they are not thread-safe
            local.tar = tarfile.open(tar_path)
            opened.append(local.tar)
        partial = dest / f".{s.wnid}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        n = 0
        try:
            with tarfile.open(fileobj=local.tar.extractfile(inner[s.wnid]), mode="r|") as tar:
                for m in tar:
                    name = _safe_name(m)
                    if name:
                        _copy(tar.extractfile(m), partial / name)
                        n += 1
                        bar.update(1)
        except (tarfile.TarError, EOFError) as e:
            return s.wnid, f"{s.wnid}.tar is damaged ({type(e).__name__}: {e})"
        if n != s.num_train_images:
            return s.wnid, f"{n:,} of {s.num_train_images:,} images"
        os.replace(partial, dest / s.wnid)
        return s.wnid, None

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for wnid, problem in pool.map(one, todo):
                if problem:
                    problems[wnid] = problem
    finally:
        for tar in opened:
            tar.close()
    return problems


def _extract_val(tar_path: Path, dest: Path, kit: Devkit, bar) -> dict[str, str]:
    """Each validation image into dest/<wnid of its ground truth>/ (the files already whole are kept); -> {wnid or
    file: what is wrong}."""
    wnids = kit.val_wnids()
    for w in set(wnids):
        (dest / w).mkdir(parents=True, exist_ok=True)
    seen: Counter = Counter()
    strays: list[str] = []
    try:
        with tarfile.open(tar_path) as tar:
            for m in tar:
                name = _safe_name(m)
                match = VAL_NAME.match(name or "")
                if not match or not 1 <= int(match[1]) <= len(wnids):
                    if name:
                        strays.append(name)
                    continue
                wnid = wnids[int(match[1]) - 1]
                target = dest / wnid / name
                if not (target.is_file() and target.stat().st_size == m.size):
                    _copy(tar.extractfile(m), target)
                seen[wnid] += 1
                bar.update(1)
    except (tarfile.TarError, EOFError) as e:
        raise UserError(f"cannot read {tar_path} ({type(e).__name__}: {e}): download it again.") from None
    expected = Counter(wnids)
    problems = {w: f"{seen[w]:,} of {n:,} validation images" for w, n in sorted(expected.items()) if seen[w] != n}
    if strays:
        problems[strays[0]] = (f"{len(strays):,} files of {VAL_TAR} have no line in the ground truth "
                               f"({', '.join(strays[:3])})")
    return problems


def _count_message(kit: Devkit, train: dict[str, str], val: dict[str, str]) -> str:
    words = {s.wnid: s.words.split(",")[0] for s in kit.classes}

    def listed(problems: dict[str, str]) -> str:
        items = [f"{k} ({words[k]}): {v}" if k in words else v for k, v in list(problems.items())[:10]]
        return "; ".join(items) + (f"; and {len(problems) - 10:,} more" if len(problems) > 10 else "")

    parts = []
    if train:
        short = sum(s.num_train_images for s in kit.classes if s.wnid in train)
        parts.append(f"{TRAIN_TAR} does not hold every training image meta.mat lists ({kit.expected_train:,} in "
                     f"{len(kit.classes):,} classes; {len(train):,} classes, {short:,} images, are not whole): "
                     f"{listed(train)}")
    if val:
        parts.append(f"{VAL_TAR} does not match the devkit's ground truth ({len(kit.val_ids):,} images): "
                     f"{listed(val)}")
    return (". ".join(parts) + ". The archive is incomplete or damaged: download it again (image-net.org lists its "
            "MD5) and rerun; what was extracted whole is kept.")
