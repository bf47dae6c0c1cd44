"""Files written whole or not at all (`atomic_path`): a full disk, a read-only folder, Ctrl-C or a kill never leaves a
half-written file under the final name, nor a temporary file behind."""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside `path` (same folder, so the rename is atomic), unique to this process. When the block
    ends without an error the file is flushed to disk and renamed onto `path`; when it raises (OSError ENOSPC,
    KeyboardInterrupt, ...), the temporary file is removed and the error goes on. `suffix` ends the temporary name
    for writers that insist on one (`np.save` adds `.npy`, `np.savez` `.npz`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{suffix}")
    _in_flight.add(tmp)
    try:
        yield tmp
        _fsync(tmp)
        _replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        _name_file(e, tmp)
        raise
    finally:
        _in_flight.discard(tmp)


def _replace(tmp: Path, path: Path) -> None:
    """os.replace, also over a folder (a sharded checkpoint's last.ckpt replaced by a file): the folder is renamed
    aside first and removed once the new file is in place, so a kill leaves one of the two under the name."""
    if not path.is_dir() or path.is_symlink():
        os.replace(tmp, path)
        return
    aside = path.with_name(f".{path.name}.{os.getpid()}.replaced")
    os.replace(path, aside)
    os.replace(tmp, path)
    shutil.rmtree(aside, ignore_errors=True)


_in_flight: set[Path] = set()  # the temporary files of this process's writes that have not ended yet


def remove_unfinished() -> list[Path]:
    """Remove the temporary files of the writes still under way: what a process that must end at once (os._exit, no
    unwinding) calls last, so that it leaves no half-written file behind. -> the files removed."""
    removed = []
    for tmp in list(_in_flight):
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass
    _in_flight.clear()
    return removed


def _name_file(err: BaseException, file: Path) -> None:
    """Give the first OSError without a file name in `err`'s chain (ENOSPC from `write` or `close`, however deep a
    library wrapped it) the name of the file being written."""
    from attnlab.errors import causes

    for e in causes(err):
        if isinstance(e, OSError) and e.errno is not None and not e.filename:
            e.filename = str(file)
            return


def link_file(source: str | os.PathLike, link: str | os.PathLike) -> str:
    """Make `link` name the file `source` names, in one rename over the previous `link` (a kill leaves the old one or
    the new one, never none): a hard link (no second copy on disk, and it keeps the bytes when `source` is deleted),
    else a relative symbolic link, else (a filesystem with neither) a copy. Returns "hard link", "symlink" or "copy"."""
    source, link = Path(source), Path(link)
    if not source.is_file():
        raise FileNotFoundError(errno.ENOENT, "no file to link to", str(source))
    if link.exists() and not link.is_symlink() and os.path.samefile(source, link):
        return "hard link"  # already: a rename between two names of one file would leave the temporary behind
    relative = os.path.relpath(source, link.parent)
    makers = (("hard link", lambda tmp: os.link(source, tmp)), ("symlink", lambda tmp: os.symlink(relative, tmp)))
    for kind, make in makers:
        try:
            with atomic_path(link) as tmp:
                tmp.unlink(missing_ok=True)  # left by a killed process of the same id
                make(tmp)
        except OSError:  # links unsupported here (FAT, some network filesystems) or not permitted
            continue
        return kind
    with atomic_path(link) as tmp:
        shutil.copyfile(source, tmp)
    return "copy"


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def _fsync(path: Path) -> None:
    if path.is_dir():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_claimed: dict[str, str] = {}


def claim_folder(path: str) -> str:
    """A folder of this process's own: `path` created exclusively, or `path_2`, `path_3`, ... where another process
    holds it (two runs started in the same second). The same path always gets the same answer, within this process
    and in the processes it starts (through the environment they inherit)."""
    inherited = os.environ.get(_claim_key(path))
    if path not in _claimed and inherited and Path(inherited).is_dir():
        _claimed[path] = inherited
    if path not in _claimed:
        base = Path(path)
        base.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while True:
            candidate = base if n == 1 else base.with_name(f"{base.name}_{n}")
            try:
                candidate.mkdir()
                break
            except FileExistsError:
                n += 1
        _claimed[path] = str(candidate)
        os.environ[_claim_key(path)] = str(candidate)
    return _claimed[path]


def _claim_key(path: str) -> str:
    import hashlib

    return "ATTNLAB_CLAIMED_" + hashlib.sha1(str(Path(path).absolute()).encode()).hexdigest()[:16]


def scratch_folder(prefix: str) -> Path:
    """A new folder in the system's temporary folder, removed with all it holds when the process exits (a script's
    working files: a benchmark's runs and images)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
