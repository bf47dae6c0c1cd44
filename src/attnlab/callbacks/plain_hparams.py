"""Hyperparameters saved as plain values, so that every checkpoint loads with `weights_only=True`: each object that a
config node built (`model.net`, the optimizer and scheduler partials) is written as that node, listed under
`hparams_from_config`, and built again on load (`rebuild_hparams`) once checkpoints/trust.py admits what it names. An
object no config node built stays pickled: its checkpoints load only with `trust_checkpoint=true` (one warning says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger("attnlab")

KEY = "hparams_from_config"
PARTS = ("hyper_parameters", "datamodule_hyper_parameters")
TYPE_KEYS = {"hyper_parameters": "hparams_type", "datamodule_hyper_parameters": "datamodule_hparams_type"}


def config_nodes(model: dict[str, Any], optimizer: dict[str, Any] | None = None,
                 scheduler: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The config nodes that built a module's objects: each `model.<key>` with a `_target_`, and the optimizer and
    scheduler nodes as partials."""
    nodes = {k: v for k, v in model.items() if isinstance(v, dict) and "_target_" in v}
    for key, node in (("optimizer", optimizer), ("scheduler", scheduler)):
        if isinstance(node, dict) and node.get("_target_"):
            nodes[key] = dict(node) | {"_partial_": True}
    return nodes


def is_plain(value: Any) -> bool:
    """What `torch.load(weights_only=True)` reads: containers of numbers, strings, bytes, None, tensors, torch's dtypes
    and devices."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.device)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and is_plain(v) for k, v in value.items())
    return False


def _container(value: Any) -> Any:
    from omegaconf import Container, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value


def plain_hparams(checkpoint: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> list[str]:
    """Rewrite a checkpoint's hyperparameters as plain values (see the module doc), in place. -> the keys still
    held as objects."""
    left, built = [], []
    for part in PARTS:
        if checkpoint.get(part) is None:
            continue
        hparams = dict(_container(checkpoint[part]))
        checkpoint.pop(TYPE_KEYS[part], None)  # the container's class: nothing to rebuild from a dict
        for key, value in hparams.items():
            value = _container(value)
            if not is_plain(value) and part == "hyper_parameters" and key in nodes:
                value = nodes[key]
                built.append(key)
            elif not is_plain(value):
                left.append(f"{part}.{key} ({type(value).__name__})")
            hparams[key] = value
        checkpoint[part] = hparams
    if built:
        checkpoint[KEY] = built
    return left


def rebuild_hparams(checkpoint: dict[str, Any], instantiate: Callable[..., Any]) -> None:
    """The objects `plain_hparams` wrote as config nodes, built again (in place), each node admitted by
    checkpoints.trust first."""
    hparams = checkpoint.get("hyper_parameters") or {}
    for key in checkpoint.get(KEY) or []:
        node = hparams.get(key)
        if isinstance(node, dict) and "_target_" in node:
            from attnlab.checkpoints import trust

            trust.admit_node(node, f"hyper_parameters.{key}")
            hparams[key] = instantiate(node, _convert_="all")


class PlainHyperparameters(Callback):
    """Writes every checkpoint's hyperparameters as plain values (`plain_hparams`), from the nodes of the run's
    resolved config that built the module's objects (`config_nodes`), and without the run's secrets (attnlab.redact)."""

    def __init__(self, model: dict[str, Any], optimizer: dict[str, Any] | None = None,
                 scheduler: dict[str, Any] | None = None):
        self.nodes = config_nodes(model, optimizer, scheduler)
        self._warned = False

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        from attnlab.redact import redact

        left = plain_hparams(checkpoint, self.nodes)
        for part in PARTS:  # the hyperparameters as written: without the secrets the run was given
            if isinstance(checkpoint.get(part), dict):
                checkpoint[part] = redact(checkpoint[part])
        if left and not self._warned:
            self._warned = True
            log.warning(
                "the checkpoints keep %s pickled: no config node built %s, so loading them takes a full unpickling "
                "(trust_checkpoint=true). Give %s a config node with a _target_ (model.<key>), or leave %s out of "
                "save_hyperparameters (ignore=[...]).", ", ".join(left), "it" if len(left) == 1 else "them",
                "it" if len(left) == 1 else "each", "it" if len(left) == 1 else "them")
