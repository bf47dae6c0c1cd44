"""Cache keys and atomic writes for what the data modules derive from a corpus (tokenizers, token arrays)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def cache_key(settings: Any) -> str:
    """A short stable hash of JSON-able settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_identity(path: Path) -> dict:
    """What identifies a file's content cheaply: its absolute path, size and modification time."""
    st = Path(path).stat()
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
