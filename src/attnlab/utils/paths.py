"""Where a path is: `is_under(path, root)`, with links resolved."""

from __future__ import annotations

from pathlib import Path


def is_under(path: Path, root: Path) -> bool:
    """Whether `path` is `root` or inside it, links resolved; False where either cannot be resolved."""
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except (ValueError, OSError):
        return False
