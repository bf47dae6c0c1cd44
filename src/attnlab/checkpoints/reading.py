"""Finding and reading checkpoints, for every setting that names one (`ckpt_path=`, a run directory's own last.ckpt,
`model.init_from=`, Lightning's own loads). `load_checkpoint` is the one reader. Before anything in a file runs, it
refuses one that is no torch.save archive or is damaged and, unless the command trusts its files, one that asks for a
global `weights_only=True` refuses (whatever the environment says) or that names what this command may not build
(trust.py).
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from attnlab.checkpoints import trust
from attnlab.errors import UserError
from attnlab.checkpoints.sharded import is_checkpoint, is_sharded

ZIP_MAGIC = b"PK\x03\x04"
# the parts of a checkpoint, besides its run's config, that name what loading it builds: every key of hyperparameters
# Lightning reads (attnlab.checkpoints.trust.HPARAMS)
NAMING = tuple(trust.HPARAMS)


def newest_last(folder: Path) -> Path | None:
    """The newest checkpoints/last.ckpt under `folder` (any depth), or None. A last.ckpt that is a link is dated by
    the file it names; one whose file is gone is passed over."""
    found = [p for p in folder.glob("**/checkpoints/last.ckpt") if is_checkpoint(p)] if folder.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_checkpoint(given: str, key: str, what: str) -> Path:
    """`given` is a .ckpt file, or a folder: its newest checkpoints/last.ckpt. `key` is the setting that named it
    (model.init_from), `what` the kind of run expected (e.g. "an MAE pretraining run (model=mae)")."""
    path = Path(given).expanduser()
    if is_sharded(path):
        return path
    if path.is_dir():
        found = newest_last(path)
        if found is None:
            raise UserError(f"{key}={given}: no checkpoints/last.ckpt under that folder. Train {what} first, or give "
                            f"the path of its checkpoint ({key}=logs/<task>/runs/<time>/checkpoints/last.ckpt).")
        return found
    if not path.is_file():
        raise UserError(f"{key}={given} does not exist. Give the .ckpt of {what}, found in <run dir>/checkpoints/, "
                        "or a folder holding such runs (its newest last.ckpt is used).")
    return path


def check_init_from(init_from: Any) -> None:
    """`model.init_from` naming a checkpoint (a file, a sharded folder, or a folder of runs: its newest last.ckpt),
    read before anything of the run is built, so that a file that cannot be loaded safely is refused at once (the
    task reads it again for its weights). Published weights (hf:...) and a path that does not exist are left to the
    task, which names what it expects."""
    if not init_from or not isinstance(init_from, str) or init_from.startswith("hf:"):
        return
    path = Path(init_from).expanduser()
    if path.is_dir() and not is_sharded(path):
        path = newest_last(path)
    if path is not None and is_checkpoint(path):
        load_checkpoint(path, "model.init_from", mmap=not is_sharded(path))


def load_checkpoint(path: str | Path, key: str = "ckpt_path", mmap: bool = False, trusted: bool | None = None,
                    map_location: Any = "cpu") -> dict[str, Any]:
    """The checkpoint's dict (a file, or a sharded checkpoint folder read whole). `trusted`: unpickle in full and
    import what it names (default: what the command says, `trust_checkpoint`). `key` names the setting that gave
    the path, in the refusals."""
    trusted = trust.trusted() if trusted is None else trusted
    if is_sharded(path):
        ckpt = _load_sharded(Path(path), key, trusted)
    else:
        ckpt = _load_file(Path(path), key, mmap, trusted, map_location)
    if not isinstance(ckpt, dict):
        raise UserError(f"{key}: {path} holds a {type(ckpt).__name__}, not a checkpoint dict. Give a .ckpt written by "
                        "attnlab's train.py (in <run dir>/checkpoints/).")
    if not trusted:
        named = {"config": run_config(ckpt)} | {part: ckpt.get(part) for part in NAMING}
        trust.check_names({k: v for k, v in named.items() if isinstance(v, dict)}, f"{key}: {path}", trusting=False)
    return ckpt


def unsafe(key: str, path: Path, names: list[str], inside: str = "") -> UserError:
    """The refusal of a file whose pickle asks for globals beyond tensors and plain values."""
    names = sorted(names, key=lambda n: (n.startswith(("torch.", "collections.", "builtins.")), n))  # the odd first
    shown = ", ".join(names[:3]) + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")
    return UserError(
        f"{key}: {path}{inside} asks for {shown}, which only a full unpickling can build, and loading it that way can "
        "run any code as you; nothing of it was run. attnlab's own checkpoints hold only tensors and plain values, "
        f"which load safely. {trust.HOW}")


def not_a_checkpoint(key: str, path: Path, what: str) -> UserError:
    return UserError(
        f"{key}: {path} is not a PyTorch checkpoint (the zip archive torch.save writes): it is {what}. Nothing of it "
        "was run. Give a .ckpt written by attnlab's train.py (in <run dir>/checkpoints/), or the folder of a sharded "
        "checkpoint.")


def damaged(key: str, path: Path, reason: str, legacy: bool = False) -> UserError:
    kind = "torch.save's legacy format" if legacy else "the zip archive torch.save writes"
    return UserError(
        f"{key}: {path} is a damaged checkpoint: it begins as {kind}, but {reason} (a "
        "copy cut short, or a file changed after it was written). Copy it again from where it came from, or give "
        "another checkpoint of the run (its <run dir>/checkpoints/ keeps last.ckpt and the best epochs).")


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"it cannot be read ({text[:200]})"


def _global_of(e: BaseException) -> list[str]:
    """The global that torch's restricted unpickler refused, as its message names it."""
    found = re.search(r"GLOBAL ([\w.]+)|reduce for ([\w.]+)|module ([\w.]+) is blocked", str(e))
    return [next(g for g in found.groups() if g).rstrip(".")] if found else []


def _load_file(path: Path, key: str, mmap: bool, trusted: bool, map_location: Any) -> Any:
    import torch

    with open(path, "rb") as fh:
        head = fh.read(4)
    if not head.startswith(ZIP_MAGIC[:2]):  # "PK": a zip archive, whole or not
        return _load_other(path, key, trusted, map_location)
    try:
        with zipfile.ZipFile(path) as zf:
            records = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise damaged(key, path, "its list of files, at the end, is missing or corrupted "
                                 f"({' '.join(str(e).split())[:120]})") from None
    if len(records) != 1:
        raise not_a_checkpoint(key, path, "a zip archive without the data.pkl of torch.save's")
    broken = _broken_record(path)
    if broken:
        raise damaged(key, path, broken)
    if not trusted:
        try:  # every global torch's restricted unpickler would refuse, read without running anything
            names = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        except Exception:  # a pickle torch's scan cannot follow: its unpickler below names what it refuses
            names = []
        if names:
            raise unsafe(key, path, names)
    try:
        return torch.load(path, map_location=map_location, weights_only=not trusted, mmap=mmap)
    except pickle.UnpicklingError as e:
        if trusted:
            raise damaged(key, path, _reason(e)) from None
        with zipfile.ZipFile(path) as zf:
            raise _refused(key, path, e, zf.read(records[0])) from None
    except Exception as e:  # a record cut short, a bad checksum, a storage that is not there
        raise damaged(key, path, _reason(e)) from None


def _refused(key: str, path: Path, e: BaseException, pickled: bytes) -> UserError:
    """What torch's restricted unpickler refused: the globals it asks for (named by torch, or read from its opcodes,
    for a pickle protocol torch's scan cannot follow), or the pickle as a whole."""
    from attnlab.checkpoints.safe_pickle import globals_in

    names = _global_of(e)
    if not names:
        try:
            from attnlab.compat import weights_only_globals

            admitted = weights_only_globals()
        except Exception:
            admitted = set()
        names = [n for n in globals_in(pickled, every=True) if n not in admitted]
    if names:
        return unsafe(key, path, names)
    return UserError(
        f"{key}: {path} holds a pickle that torch's restricted unpickler cannot read ({_detail(e)}): only a full "
        f"unpickling could load it, and that can run any code as you; nothing of it was run. {trust.HOW}")


_VERIFIED: set[tuple[str, int, int]] = set()  # files whose records all read whole, by path, size and time


def _broken_record(path: Path) -> str | None:
    """What is damaged in a checkpoint's zip archive: a record that does not read whole with its checksum (torch's
    reader checks none: cut-short or corrupted weights would load as they are); None when it is whole. Each file is
    checked once per process."""
    stat = path.stat()
    seen = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if seen in _VERIFIED:
        return None
    name = "?"
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                name = info.filename
                with zf.open(info) as fh:
                    while fh.read(1 << 24):
                        pass
    except Exception as e:
        return f"its record {name} does not read whole ({' '.join(str(e).split())[:120]})"
    _VERIFIED.add(seen)
    return None


def _detail(e: BaseException) -> str:
    """The line of torch's refusal that says what it refused (its message wraps it in advice)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    own = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation",
                                                         "Please file an issue", "(1)", "(2)", "In PyTorch"))]
    return (own or lines or [type(e).__name__])[-1][:200]


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of torch.save's legacy format (PyTorch < 1.6)


def _is_legacy(head: bytes) -> bool:
    import io
    import pickletools

    try:
        return any(op.name in ("LONG1", "LONG4", "LONG", "INT") and arg == LEGACY_MAGIC
                   for op, arg, _ in pickletools.genops(io.BytesIO(head)))
    except Exception:
        return False


def _load_other(path: Path, key: str, trusted: bool, map_location: Any) -> Any:
    """A file that is not a zip archive: torch.save's legacy format (PyTorch < 1.6, recognized by its first pickle,
    the format's magic number), read as a checkpoint (by torch's restricted unpickler when not trusted); or no
    checkpoint at all (a bare pickle, a text file, an empty file), never unpickled, trusted or not."""
    import torch

    from attnlab.checkpoints.safe_pickle import globals_in

    with open(path, "rb") as fh:
        head = fh.read(1 << 20)
    if not head:
        raise not_a_checkpoint(key, path, "an empty file")
    if _is_legacy(head[:64]):
        try:
            return torch.load(path, map_location=map_location, weights_only=not trusted)
        except pickle.UnpicklingError as e:
            if trusted:
                raise damaged(key, path, _reason(e), legacy=True) from None
            raise _refused(key, path, e, head) from None
        except Exception as e:
            raise damaged(key, path, _reason(e), legacy=True) from None
    names = globals_in(head)
    if names:
        raise not_a_checkpoint(key, path, f"a bare pickle that asks for {', '.join(names[:3])}, which would run code "
                                          "when loaded")
    raise not_a_checkpoint(key, path, "a file of another kind")


def _load_sharded(path: Path, key: str, trusted: bool) -> dict[str, Any]:
    from attnlab.checkpoints.safe_pickle import UnsafeGlobal
    from attnlab.checkpoints.sharded import UnsafeBytes, read_sharded

    def read_meta(meta: Path) -> Any:  # its names are checked with the whole checkpoint's
        return _load_file(meta, key, False, trusted, "cpu")

    try:
        return read_sharded(path, read_meta, trusted)
    except UnsafeGlobal as e:
        raise unsafe(key, path, [e.name], inside=" (its .metadata, torch.distributed.checkpoint's)") from None
    except UnsafeBytes as e:
        raise unsafe(key, path, _global_of(e.error) or [_detail(e.error)],
                     inside=f" (its value {e.fqn}, which its shards store as bytes)") from None
    except UserError:
        raise
    except Exception as e:  # a shard cut short or missing, a .metadata that is no pickle
        raise UserError(
            f"{key}: {path} is a damaged sharded checkpoint: its .metadata or one of its .distcp shards cannot be "
            f"read ({' '.join(str(e).split())[:200]}). Copy the whole folder again from where it came from, or give "
            "another checkpoint of the run.") from None


def run_config(ckpt: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved config of the run that wrote a checkpoint (None for a checkpoint of another program)."""
    meta = ckpt.get("attnlab")
    return (meta or {}).get("config") if isinstance(meta, dict) else None
