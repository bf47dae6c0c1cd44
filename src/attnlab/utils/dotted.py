"""Nested dicts as one level of dotted keys, and a dotted key's value in a config."""

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


def select(cfg: Any, key: str, default: Any = None) -> Any:
    """The value of the dotted `key` in the config `cfg`, as plain values (a node as a dict or list, not resolved);
    `default` where it is missing, null, or does not resolve here (an interpolation that resolves only in the job,
    such as hydra:runtime)."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, key)
        value = OmegaConf.to_container(value, resolve=False) if OmegaConf.is_config(value) else value
    except Exception:
        return default
    return default if value is None else value
