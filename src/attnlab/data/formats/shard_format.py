"""The format of attnlab's image shards, as a reader checks it: where each split lives, the conversion's record
(`attnlab_shards.json`), and the one layout of samples it reads, `(image file bytes, class index)`. A shard folder from
elsewhere is read only if its index declares that layout: a serializer that unpickles (LitData's `pickle`, and its
`graph`, whose metadata is a pickle) could run any code while reading, so such a shard is refused, as attnlab refuses
checkpoints that need unpickling, and those serializers are replaced by ones that refuse whatever the index says, also
for remote shards (`safe_serializers`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from attnlab.errors import UserError

log = logging.getLogger("attnlab")

META = "attnlab_shards.json"
LAYOUT = ["bytes", "int"]                   # the data_format of the index of every split this module writes
PICKLING = ("pickle", "graph")              # LitData serializers whose deserialize unpickles
REMOTE = ("s3://", "gs://", "r2://", "azure://", "hf://")


def is_remote(root: str) -> bool:
    return str(root).startswith(REMOTE)


def split_dir(root: str, split: str) -> str:
    return f"{str(root).rstrip('/')}/{split}"


def litdata():
    """LitData, imported on first use (no version check on PyPI from a cluster's compute nodes)."""
    os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
    logging.getLogger("litdata").setLevel(max(logging.WARNING, logging.getLogger("litdata").level))
    try:
        import litdata as ld
    except ImportError as e:
        raise UserError("data.format=shards and `python -m attnlab.data.prepare shards` need LitData: "
                        "pip install 'litdata>=0.2.76,<0.3'.") from e
    return ld


# ---- refusing what unpickles
def _refused_serializer():
    from litdata.streaming.serializers import Serializer

    class RefusedSerializer(Serializer):
        """Stands in for a serializer that unpickles: refuses the shard when its index names it."""

        def setup(self, data_format: Any) -> None:
            raise UserError(pickle_refusal(str(data_format), "these shards"))

        def serialize(self, data: Any):
            raise UserError(pickle_refusal("pickle", "these samples"))

        def deserialize(self, data: bytes) -> Any:
            raise UserError(pickle_refusal("pickle", "these shards"))

        def can_serialize(self, data: Any) -> bool:
            return False

    return RefusedSerializer


def safe_serializers() -> dict:
    """LitData's serializers, those that unpickle replaced by ones that refuse (StreamingDataset(serializers=...))."""
    cls = _refused_serializer()
    return {name: cls() for name in PICKLING}


def pickle_refusal(data_format: str, where: str) -> str:
    return (f"{where} declare their samples in LitData's `{data_format}` format, which is read by unpickling: a "
            "shard file can then run any code on this machine, so attnlab does not read it (the same rule as for "
            "checkpoints that need unpickling). Convert the images again with `python -m attnlab.data.prepare "
            "shards <image folder> <out>`, which stores each image's file bytes and class index and nothing that "
            "unpickles.")


def check_index(index: dict, where: str) -> None:
    """Refuse a split whose index.json declares samples that unpickle, or anything but attnlab's layout."""
    config = index.get("config") or {}
    formats = [str(f) for f in config.get("data_format") or []]
    pickling = [f for f in formats if f.split(":")[0] in PICKLING]
    if pickling:
        raise UserError(pickle_refusal(pickling[0], where))
    if formats != LAYOUT or config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
        raise UserError(f"{where} hold samples of LitData formats {formats} ({config.get('item_loader')}), not the "
                        f"(image file bytes, class index) samples of attnlab's image shards ({LAYOUT}). Convert the "
                        "images with `python -m attnlab.data.prepare shards <image folder> <out>` and point "
                        "data.root at <out>.")
    if config.get("encryption"):
        raise UserError(f"{where} are encrypted, which attnlab's image shards are not: convert the images again.")


def read_json(root: str, name: str) -> dict | None:
    """A JSON file of a shard folder, local or remote (through LitData's downloaders); None when it is absent."""
    path = f"{str(root).rstrip('/')}/{name}"
    if not is_remote(root):
        return json.loads(Path(path).read_text()) if Path(path).is_file() else None
    import tempfile

    from litdata.streaming.downloader import get_downloader

    litdata()
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, os.path.basename(name))
        try:
            get_downloader(str(root), tmp, []).download_file(path, local)
        except Exception as e:  # absent, or no credentials: said by the caller with what it looked for
            log.debug("cannot fetch %s: %s", path, e)
            return None
        return json.loads(Path(local).read_text()) if os.path.isfile(local) else None


def read_meta(root: str) -> dict:
    """The conversion's record of a shard folder, each split's index checked."""
    meta = read_json(root, META)
    if meta is None:
        where = "cannot be read (is the URL right, and are its credentials set?)" if is_remote(root) else \
            "does not exist" if not Path(root).exists() else f"holds no {META}"
        raise UserError(f"data.format=shards: {root} {where}. Convert an image folder into shards first: `python -m "
                        f"attnlab.data.prepare shards <image folder> {root}` (an interrupted conversion leaves no "
                        f"{META}: run it again).")
    for split in meta.get("splits", {}):
        index = read_json(split_dir(root, split), "index.json")
        if index is None:
            raise UserError(f"{split_dir(root, split)} holds no index.json, which {META} lists: the shards are "
                            "incomplete. Convert the images again.")
        check_index(index, f"the shards of {split_dir(root, split)}")
    return meta
