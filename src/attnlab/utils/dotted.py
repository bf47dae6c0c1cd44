"""Nested dicts as one level of dotted keys."""

from __future__ import annotations

from typing import Any


def flatten(node: Any, prefix: str = "", keep_empty: bool = True) -> dict[str, Any]:
    """{"model.n_layer": 4, ...}: lists kept as values; an empty dict kept as a value unless `keep_empty` is off."""
    if not isinstance(node, dict):
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out |= flatten(v, key, keep_empty) if isinstance(v, dict) and (v or not keep_empty) else {key: v}
    return out
