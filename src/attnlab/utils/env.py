"""What a process reads of its environment: settings it needs before, or outside, its config, and the versions of
the packages installed."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path


def seconds(name: str, default: float) -> float:
    """$name as a number of seconds (at least 0), `default` where it is unset; a value that is not a number is said,
    in one line on stderr, and `default` is used."""
    value = os.environ.get(name, "")
    try:
        return max(0.0, float(value)) if value else default
    except ValueError:
        print(f"attnlab: {name}={value!r} is not a number of seconds; waiting {default:g} s", file=sys.stderr)
        return default


def package_versions(names) -> dict[str, str]:
    """{name: installed version} of those of `names` that are installed."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def hwm_bytes(pid: int | str = "self", root: str | os.PathLike = "/") -> int:
    """A process's peak resident memory in bytes as Linux keeps it (VmHWM of /proc/<pid>/status); 0 where it cannot
    be read (no /proc, or the process has ended)."""
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", (Path(root) / "proc" / str(pid) / "status").read_text(), re.M)
    except OSError:
        return 0
    return int(found.group(1)) * 1024 if found else 0
