"""How Lightning writes and reads a run's checkpoints (its checkpoint IO plugin): each file written beside its final
name and renamed onto it, and read as attnlab reads every checkpoint (reading.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from fsspec.utils import get_protocol
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from attnlab.utils.atomic import atomic_path


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written beside their final name and renamed onto it, on the checkpoint's own disk (Lightning's
    writer stages a local file in TMPDIR and copies it over); object storage is left to Lightning's writer."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None or get_protocol(str(path)) != "file":  # object storage: Lightning's writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:  # a full disk or a kill leaves the previous checkpoint, and no temporary
            self.write(checkpoint, tmp)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        """A checkpoint as attnlab reads every checkpoint (checkpoints.reading.load_checkpoint): restricted to
        tensors and plain values unless the command trusts its files (`trust_checkpoint=true`), whatever Lightning
        passes as `weights_only` and whatever the environment says; a sharded checkpoint folder is read whole."""
        from attnlab.checkpoints import trust
        from attnlab.checkpoints.reading import load_checkpoint

        if get_protocol(str(path)) != "file":  # object storage: Lightning's reader, as restricted
            return super().load_checkpoint(path, map_location=map_location, weights_only=not trust.trusted())
        return load_checkpoint(path, map_location=map_location if map_location is not None else "cpu")

    def write(self, checkpoint, file: Path) -> None:
        with open(file, "wb") as fh:
            torch.save(checkpoint, fh)
