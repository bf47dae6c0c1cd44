"""Text from a file from elsewhere (a run folder's config, lineage or metrics), made safe to show: no control
characters (a terminal's escape sequences), and for Rich, no markup (`[link=...]`)."""

from __future__ import annotations

import re
from typing import Any

# C0 controls but tab and newline, DEL, C1 controls (ESC-free CSI among them), and the bidirectional overrides that
# reorder what a terminal shows
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(value: Any) -> str:
    """`value` as text without control characters."""
    return _CONTROL.sub("", str(value))
