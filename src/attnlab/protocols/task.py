"""What the platform may call on a task: the LightningModule `model._target_` names, attnlab's or a user's.

Every hook is optional: a LightningModule that defines none trains, tests, evaluates and predicts (with a
`predictor`) like attnlab's own tasks. attnlab's `BaseTask` (attnlab.tasks.base) has the instance hooks with neutral
answers. Class-level hooks are called on the task class before a task exists:

- `net_settings(settings) -> {name: (inspect.Parameter, value)}` (`NetworkSettings`): the settings of the network
  `model.net` names, which the class's `**kwargs` carry to it; the config checks check them like arguments.
- `init_tokenizer(init_from) -> str | None` (`ReadsInitTokenizer`): the tokenizer (JSON) of the weights
  `model.init_from` names, which the data then reads its text with.
- `init_settings(init_from) -> dict` (`ReadsInitSettings`): the network settings those weights fix (an `hf:`
  folder's sizes), written into `model.*` before the task is built.
- `predictor: str` (`Predicts`): the dotted path of a function `predict(model, cfg, run_cfg)` for predict.py.

Instance hooks:

- `check_data(info: DataInfo)` (`ChecksData`): refuse data the model cannot take (a vocabulary larger than its
  embedding, another tokenizer than its checkpoint's), once, where the task meets the data.
- `batch_size_of(batch) -> int` (`CountsBatch`): samples in a batch. Without it: the leading dimension of the
  batch's first tensor.
- `tokens_of(batch) -> int | Tensor` (`CountsTokens`): tokens in a batch. Without it: no tokens/s.
- `flops_per_sample() -> float | None` (`CountsFlops`): training FLOPs per sample (`perf/mfu`). Without it: no MFU.
- `flops_of(batch) -> float` (`CountsBatchFlops`): training FLOPs of one batch, for batches that vary in shape.
  Without it: `flops_per_sample() x batch_size_of(batch)`.
- `decode_cfg: dict` (`Decodes`): the decoding settings eval.py's `decode.*` update. Without it: `decode.*` is
  refused.
- `net: nn.Module`: the network export.py writes. Without it: export.py refuses the checkpoint.
- `tokenizer_json: str | tuple[str | None, ...] | None` (`CarriesTokenizer`): the tokenizer(s) written beside the
  exported weights, and read by eval.py.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from attnlab.protocols.data import DataInfo


# ---- class-level hooks
@runtime_checkable
class NetworkSettings(Protocol):
    @classmethod
    def net_settings(cls, settings: dict) -> dict[str, tuple[inspect.Parameter, Any]]: ...


@runtime_checkable
class ReadsInitTokenizer(Protocol):
    @classmethod
    def init_tokenizer(cls, init_from: str) -> str | None: ...


@runtime_checkable
class ReadsInitSettings(Protocol):
    @classmethod
    def init_settings(cls, init_from: str) -> dict[str, Any]: ...


@runtime_checkable
class Predicts(Protocol):
    predictor: str


# ---- instance hooks
@runtime_checkable
class ChecksData(Protocol):
    def check_data(self, info: DataInfo) -> None: ...


@runtime_checkable
class CountsBatch(Protocol):
    def batch_size_of(self, batch: Any) -> int: ...


@runtime_checkable
class CountsTokens(Protocol):
    def tokens_of(self, batch: Any) -> int | torch.Tensor: ...


@runtime_checkable
class CountsFlops(Protocol):
    def flops_per_sample(self) -> float | None: ...


@runtime_checkable
class CountsBatchFlops(Protocol):
    def flops_of(self, batch: Any) -> float: ...


@runtime_checkable
class Decodes(Protocol):
    decode_cfg: dict


@runtime_checkable
class CarriesTokenizer(Protocol):
    tokenizer_json: str | tuple[str | None, ...] | None


# ---- the accessors: the platform's one way to each hook
def net_settings(task_cls: type, settings: dict) -> dict[str, tuple[inspect.Parameter, Any]]:
    return task_cls.net_settings(settings) if isinstance(task_cls, NetworkSettings) else {}


def init_tokenizer(task_cls: type, init_from: str) -> str | None:
    return task_cls.init_tokenizer(init_from) if isinstance(task_cls, ReadsInitTokenizer) else None


def init_settings(task_cls: type, init_from: str) -> dict[str, Any]:
    return dict(task_cls.init_settings(init_from)) if isinstance(task_cls, ReadsInitSettings) else {}


def predictor(task_cls: type) -> str | None:
    """The dotted path of the task class's predict function, where it names one."""
    return str(task_cls.predictor) if isinstance(task_cls, Predicts) and task_cls.predictor else None


def check_data(task: Any, info: DataInfo) -> Any:
    """The task's own check of the data it meets. -> the task."""
    if isinstance(task, ChecksData):
        task.check_data(info)
    return task


def batch_size_of(task: Any, batch: Any) -> int:
    return int(task.batch_size_of(batch)) if isinstance(task, CountsBatch) else leading_size(batch)


def tokens_of(task: Any, batch: Any) -> int | torch.Tensor:
    return task.tokens_of(batch) if isinstance(task, CountsTokens) else 0


def flops_per_sample(task: Any) -> float | None:
    """Training FLOPs per sample; None when unknown or when counting fails (FLOP counts are best effort)."""
    if not isinstance(task, CountsFlops):
        return None
    try:
        return task.flops_per_sample()
    except Exception:  # an exotic backbone must not stop training
        return None


def flops_of(task: Any, batch: Any, per_sample: float) -> float:
    if isinstance(task, CountsBatchFlops):
        return task.flops_of(batch)
    return per_sample * batch_size_of(task, batch)


def decode_settings(task: Any) -> dict | None:
    """The task's decoding settings (updated in place by `decode.*`); None for a task that does not decode."""
    return task.decode_cfg if isinstance(task, Decodes) else None


def network(task: Any) -> nn.Module | None:
    # looked up as nn.Module serves a submodule, through __getattr__: a Protocol's isinstance does not see it there
    # from Python 3.12 on (it reads attributes with inspect.getattr_static)
    net = getattr(task, "net", None)
    return net if isinstance(net, nn.Module) else None


def tokenizers(task: Any) -> dict[str, str]:
    """The tokenizers a task carries, by the file name they are written under (`tokenizer`, or `src_tokenizer` and
    `tgt_tokenizer` for translation)."""
    carried = task.tokenizer_json if isinstance(task, CarriesTokenizer) else None
    named = ({"tokenizer": carried} if isinstance(carried, str)
             else dict(zip(("src_tokenizer", "tgt_tokenizer"), carried or ())))
    return {k: v for k, v in named.items() if v}


def leading_size(batch: Any) -> int:
    """The leading dimension of a batch's first tensor (0 when it has none)."""
    from lightning_utilities.core.apply_func import apply_to_collection

    found: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor, found.append)
    return (int(found[0].shape[0]) if found[0].dim() else 0) if found else 0

