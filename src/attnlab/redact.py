"""Secrets never reach a run folder (which people copy, share and publish) nor the terminal. An override that names or
holds a secret (`is_secret_key`, or a secret's value) is taken off the command line before Hydra sees it
(`take_secret_overrides`) and given back in memory only (`restore`). In what attnlab writes from the config and in
every log line, a secret key's value and every known secret value (`secret_values`) is `MASK` (`redact`, `redact_logs`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from typing import Any

SECRET_ENV = "ATTNLAB_SECRET_OVERRIDES"
MASK = "<redacted>"
ENV_SET = "hydra.job.env_set."  # an override of Hydra's that sets an environment variable of the job
# a key names a secret when one of its words (snake_case, camelCase, kebab-case, UPPER_CASE alike) is one of these
_SECRET_WORDS = frozenset({"secret", "secrets", "password", "passwd", "pwd", "passphrase", "credential",
                           "credentials", "pat", "apikey", "accesskey", "secretkey", "authtoken"})
# or when its last word is `key` or `token`, unless the word before it makes it a noun of its own: a vocabulary's
# token (pad_token, cls_token), a sort or cache key
_NOUNS = frozenset({"pad", "bos", "eos", "unk", "mask", "cls", "sep", "start", "end", "special", "sort", "cache",
                    "parent", "sample", "image", "label", "text", "input", "target", "column", "monitor", "metric",
                    "dict", "hash", "primary", "group", "seq", "class", "type", "data", "batch", "row", "file",
                    "split", "field", "prompt", "padding", "new", "max", "min", "num", "n", "id"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_MIN_LENGTH = 6  # shorter values ("1", "true") are no secrets worth a search through every string


def is_secret_key(key: str) -> bool:
    """Whether a config key (dotted: its last part counts) or an environment variable names a key, a token, a
    secret, a password, a credential or a PAT, in any style (`api_key`, `githubToken`, `AWS_SECRET_ACCESS_KEY`)."""
    words = [w.lower() for w in _WORD.findall(str(key).lstrip("+~").rsplit(".", 1)[-1])]
    if not words:
        return False
    if _SECRET_WORDS & set(words):
        return True
    return words[-1] in ("key", "token") and (len(words) == 1 or words[-2] not in _NOUNS)


def _parsed(arg: str) -> tuple[str, Any] | None:
    """(key, value) of an override as Hydra's own parser reads it (a dict, a list, a string, ...); None when it is
    no plain key=value (Hydra says what is wrong with it)."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        override = OverridesParser.create().parse_override(arg)
        return override.key_or_group, override.value()
    except Exception:
        return None


def _holds_secret(value: Any, values: list[str]) -> bool:
    if isinstance(value, dict):
        return any(is_secret_key(k) or _holds_secret(v, values) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_holds_secret(v, values) for v in value)
    return isinstance(value, str) and any(v in value for v in values)


def take_secret_overrides(argv: list[str]) -> list[str]:
    """The command line without its secret overrides, which are kept in this process's environment for `restore`
    (and for the processes it starts): key=value whose key names a secret, whose value (a dict or list, at any depth)
    holds a key that does, or that holds the value of a secret of the environment."""
    kept, taken, values = [], [], secret_values()
    for arg in argv:
        key, sep, value = arg.partition("=")
        secret = False
        if sep and not arg.startswith("-"):
            secret = is_secret_key(key) or any(v in value for v in values)
            if not secret and value[:1] in "{[":
                parsed = _parsed(arg)
                secret = parsed is not None and _holds_secret(parsed[1], values)
        (taken if secret else kept).append(arg)
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
    """The secret overrides taken off the command line, set in the composed config (in memory only); Hydra's
    `hydra.job.env_set.<NAME>` set in this process's environment."""
    from omegaconf import OmegaConf, open_dict

    for arg in _stored():
        if arg.startswith("~"):
            continue
        parsed = _parsed(arg)
        key, value = parsed if parsed is not None else (arg.partition("=")[0].lstrip("+"), arg.partition("=")[2])
        if key.startswith(ENV_SET):
            os.environ[key[len(ENV_SET):]] = str(value)
        elif not key.startswith("hydra."):
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, force_add=True)


def secret_values() -> list[str]:
    """The secrets this process knows: the values of the secret overrides and of the environment's secrets."""
    return _values(os.environ.get(SECRET_ENV) or "", tuple(sorted(os.environ.items())))


@functools.lru_cache(maxsize=8)
def _values(stored: str, environment: tuple[tuple[str, str], ...]) -> list[str]:
    """secret_values, once per state of the environment (a log line asks for them too)."""
    values = set()
    for arg in _stored():
        parsed = _parsed(arg)
        values |= set(_leaves(parsed[1] if parsed is not None else arg.partition("=")[2].strip("'\"")))
    values |= {v for k, v in environment if k != SECRET_ENV and is_secret_key(k)}
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


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [str(value)] if value is not None else []


class _RedactingFilter(logging.Filter):
    """A log record's text with the secrets' values masked (on every handler of the run's logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        values = secret_values()
        if values:
            text = record.getMessage()
            masked = redact_text(text, values)
            if masked != text:
                record.msg, record.args = masked, ()
        return True


def redact_logs() -> None:
    """Every handler of the root and attnlab loggers (the console, the run's log file) masks the secrets' values."""
    for logger in (logging.getLogger(), logging.getLogger("attnlab")):
        for handler in logger.handlers:
            if not any(isinstance(f, _RedactingFilter) for f in handler.filters):
                handler.addFilter(_RedactingFilter())
