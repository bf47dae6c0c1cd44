"""Sharded checkpoints: a `last.ckpt` folder as Lightning's FSDP strategy writes it (`state_dict_type="sharded"`: DCP's
`.metadata` and one `.distcp` file per rank, the rest of the checkpoint in `meta.pt`), read whole on the CPU by
`read_sharded` wherever FSDP does not read it itself. Unless the folder is trusted, nothing in it can run code when
read: `.metadata` goes through the restricted unpickler (safe_pickle.py), `meta.pt` and the values DCP stores as bytes
through `weights_only=True`.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

META = "meta.pt"  # Lightning's name for the rest of the checkpoint (lightning.fabric.utilities.load._METADATA_FILENAME)


def is_sharded(path: str | Path) -> bool:
    """A folder holding a sharded checkpoint (Lightning's test: a folder with its meta.pt)."""
    path = Path(path)
    return path.is_dir() and (path / META).is_file()


def is_checkpoint(path: str | Path) -> bool:
    """A checkpoint file, or a sharded checkpoint folder."""
    return Path(path).is_file() or is_sharded(path)


def _dcp_globals() -> dict[tuple[str, str], Any]:
    import dataclasses
    import enum
    import pathlib

    import torch
    from torch.distributed.checkpoint import metadata

    from attnlab.compat import dcp_metadata_private_names

    allowed: dict[tuple[str, str], Any] = {
        ("torch", "Size"): torch.Size,
        **dcp_metadata_private_names(),  # torch's name -> layout function, DCP's storage info
        ("collections", "OrderedDict"): __import__("collections").OrderedDict,
    }
    for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
        allowed[("pathlib", name)] = getattr(pathlib, name)
    for name, value in vars(metadata).items():  # the format's dataclasses and enums, nothing callable else
        if isinstance(value, type) and value.__module__ == metadata.__name__ and (
                dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)):
            allowed[(metadata.__name__, name)] = value
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


DCP_METADATA = "the .metadata of a torch.distributed.checkpoint folder"


def read_dcp_metadata(path: Path):
    """DCP's `.metadata` of a sharded folder, its pickle restricted to the format's own classes (UnsafeGlobal for any
    other)."""
    from attnlab.checkpoints.safe_pickle import load

    return load(Path(path) / ".metadata", _dcp_globals(), DCP_METADATA)


def _reader(path: Path, trusted: bool = False):
    from torch.distributed.checkpoint import FileSystemReader

    if trusted:  # the user trusts the folder: DCP's own reader, its metadata unpickled in full
        return FileSystemReader(path)

    class SafeReader(FileSystemReader):
        """DCP's file reader, its metadata read by read_dcp_metadata."""

        def read_metadata(self, *args, **kwargs):
            from torch.distributed.checkpoint.metadata import StorageMeta

            found = read_dcp_metadata(path)
            if getattr(found, "storage_meta", None) is None:
                found.storage_meta = StorageMeta()
            found.storage_meta.load_id = self.load_id
            return found

    return SafeReader(path)


class UnsafeBytes(Exception):
    """A value a sharded checkpoint stores as bytes (DCP's non-tensor items) that `weights_only=True` refuses."""

    def __init__(self, fqn: str, error: BaseException):
        super().__init__(f"{fqn}: {error}")
        self.fqn, self.error = fqn, error


def _planner(trusted: bool):
    """DCP's planner of a whole load; unless trusted, its non-tensor items (which DCP stores as bytes and reads back
    with a full `torch.load`) read with `weights_only=True` first (UnsafeBytes when refused)."""
    import pickle

    import torch

    from attnlab.compat import dcp_empty_planner_class

    _EmptyStateDictLoadPlanner = dcp_empty_planner_class()
    if trusted:
        return _EmptyStateDictLoadPlanner()

    class WeightsOnlyPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            try:
                plain = torch.load(value, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as e:
                raise UnsafeBytes(read_item.dest_index.fqn, e) from None
            buffer = io.BytesIO()
            torch.save(plain, buffer)  # plain values only: what DCP's own full load now reads
            buffer.seek(0)
            super().load_bytes(read_item, buffer)

    return WeightsOnlyPlanner()


def read_sharded(path: str | Path, read_meta, trusted: bool = False) -> dict[str, Any]:
    """The whole checkpoint a sharded folder holds, as one process's `torch.load` of a checkpoint file gives it:
    meta.pt's keys (read by `read_meta(path of meta.pt)`: attnlab.checkpoints' reader), `state_dict` (the model),
    `optimizer_states` (keyed by parameter index). `trusted`: `.metadata` unpickled in full (else restricted to its
    format's classes: UnsafeGlobal)."""
    import torch

    from attnlab.compat import dcp_load_whole

    path = Path(path)
    if not trusted:
        read_dcp_metadata(path)  # refused here, before meta.pt or any shard is read
    checkpoint = read_meta(path / META)
    states: dict[str, Any] = {}
    # what torch's dcp_to_torch_save does, with the reader whose metadata cannot run code
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp_load_whole(states, _reader(path, trusted), _planner(trusted))
    except CheckpointException as e:  # DCP's (a BaseException): each rank's failure, with its exception first
        causes = [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
        raise next((c for c in causes if isinstance(c, UnsafeBytes)), None) or RuntimeError(str(e)) from None
    # DCP gives back nested dicts; round trip through torch.save so the result is what a checkpoint file gives
    buffer = io.BytesIO()
    torch.save(states, buffer)
    buffer.seek(0)
    states = torch.load(buffer, map_location="cpu", weights_only=True)
    checkpoint["state_dict"] = states.pop("model")
    optimizers = sorted((k for k in states if k.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
    checkpoint["optimizer_states"] = [by_index(states[k]) for k in optimizers]
    return checkpoint


def by_index(optimizer_state: dict) -> dict:
    """An optimizer's state_dict keyed by parameter name, keyed by index as `torch.optim` keys it (the parameters
    numbered in the order of the param groups)."""
    names = [n for group in optimizer_state["param_groups"] for n in group["params"]]
    if all(isinstance(n, int) for n in names):
        return optimizer_state
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: s for n, s in optimizer_state.get("state", {}).items()},
            "param_groups": [g | {"params": [index[n] for n in g["params"]]} for g in optimizer_state["param_groups"]]}
