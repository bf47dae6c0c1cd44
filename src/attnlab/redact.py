"""Secrets never reach a run folder, which people copy, share and publish.

A key, token or password given on the command line (an override whose last key names one, e.g.
`+logger.wandb.settings.api_key=...`, `+data.hf_token=...`) is taken off the command line before Hydra sees it
(`take_secret_overrides`, first thing in every entry point), so Hydra's `.hydra/` files, a sweep's folder names,
`--cfg` and the lineage's command never hold it; the run's config gets it back in memory (`restore`, at the end of
`begin`), where the constructors that need it read it. The processes a run starts itself (DDP's, which compose from
the run folder's `.hydra/config.yaml`) find it in their environment (`ATTNLAB_SECRET_OVERRIDES`).

What attnlab writes from the config (`config.yaml`, the checkpoints' run config, the loggers' hyperparameters: W&B's
config, the CSV logger's hparams.yaml) goes through `redact`: the value of every key that names a secret, and every
occurrence of a secret's value anywhere (those given on the command line, and the environment's own: WANDB_API_KEY,
HF_TOKEN, any variable whose name ends in _KEY, _TOKEN, _PASSWORD or _SECRET), is replaced by `MASK`.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

SECRET_ENV = "ATTNLAB_SECRET_OVERRIDES"
MASK = "<redacted>"
# the last key of a setting that holds a secret: api_key, apikey, access_key, hf_token, auth_token, token, key,
# password, db_password, client_secret (not max_tokens, pad_token, sort_key: nouns of their own)
_SECRET_KEY = re.compile(r"(?:(?:api|access|secret|private|auth|hf|wandb|bearer|client|refresh|session)_?)?"
                         r"(?:key|token)|[a-z0-9_]*(?:password|passwd|secret)", re.IGNORECASE)
_SECRET_ENV_NAME = re.compile(r".*(?:_KEY|_TOKEN|PASSWORD|_SECRET)$|^(?:HF_TOKEN|WANDB_API_KEY)$")
_MIN_LENGTH = 6  # shorter values ("1", "true") are no secrets worth a search through every string


def is_secret_key(key: str) -> bool:
    """Whether a config key (dotted: its last part counts) names a key, a token or a password."""
    return bool(_SECRET_KEY.fullmatch(str(key).lstrip("+~").rsplit(".", 1)[-1]))


def take_secret_overrides(argv: list[str]) -> list[str]:
    """The command line without its secret overrides (key=value whose key names a secret), which are kept in this
    process's environment for `restore` (and for the processes it starts)."""
    kept, taken = [], []
    for arg in argv:
        key, sep, _ = arg.partition("=")
        (taken if sep and not arg.startswith("-") and is_secret_key(key) else kept).append(arg)
    if taken:
        os.environ[SECRET_ENV] = json.dumps(_stored() + taken)
    return kept


def _stored() -> list[str]:
    try:
        found = json.loads(os.environ.get(SECRET_ENV) or "[]")
        return [str(a) for a in found] if isinstance(found, list) else []
    except ValueError:
        return []


def restore(cfg: Any) -> None:
    """The secret overrides taken off the command line, set in the composed config (in memory only)."""
    from omegaconf import OmegaConf, open_dict

    for arg in _stored():
        key, _, value = arg.partition("=")
        if key.startswith("~"):
            continue
        parsed = OmegaConf.create(f"v: {value}").v if value else value
        with open_dict(cfg):
            OmegaConf.update(cfg, key.lstrip("+"), parsed, force_add=True)


def secret_values() -> list[str]:
    """The secrets this process knows: the values of the secret overrides and of the environment's secrets."""
    values = {arg.partition("=")[2].strip("'\"") for arg in _stored()}
    values |= {v for k, v in os.environ.items() if _SECRET_ENV_NAME.fullmatch(k) and k != SECRET_ENV}
    return sorted((v for v in values if len(v) >= _MIN_LENGTH), key=len, reverse=True)


def redact(node: Any, values: list[str] | None = None) -> Any:
    """A copy of a config (dicts, lists, values) without its secrets (see the module doc)."""
    values = secret_values() if values is None else values
    if isinstance(node, dict):
        return {k: (MASK if is_secret_key(k) and v not in (None, "") else redact(v, values)) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(redact(v, values) for v in node)
    if isinstance(node, str):
        return redact_text(node, values)
    return node


def redact_text(text: str, values: list[str] | None = None) -> str:
    for value in secret_values() if values is None else values:
        text = text.replace(value, MASK)
    return text
