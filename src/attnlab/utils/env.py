"""Settings read from the environment: those a process needs before, or outside, its config."""

from __future__ import annotations

import os
import sys


def seconds(name: str, default: float) -> float:
    """$name as a number of seconds (at least 0), `default` where it is unset; a value that is not a number is said,
    in one line on stderr, and `default` is used."""
    value = os.environ.get(name, "")
    try:
        return max(0.0, float(value)) if value else default
    except ValueError:
        print(f"attnlab: {name}={value!r} is not a number of seconds; waiting {default:g} s", file=sys.stderr)
        return default
