"""What the platform may call on a data module (the LightningDataModule `data._target_` names, attnlab's or a
user's), and `DataInfo`: the one contract between data and model.

Every hook is optional; the accessors below give the answer for a data module without it. attnlab's
`BaseDataModule` (attnlab.data.base) has them all.

- `info() -> DataInfo` (`Informs`): what the prepared data tells the task: its sizes (which model configs read as
  `${data.vocab_size}`) and the objects the task takes as arguments. Without it: a `DataInfo` of its `kind`.
- `use_tokenizer(tokenizer_json)` (`TakesTokenizer`): read the text with the tokenizer of the weights the run starts
  from, before `prepare_data()`. Without it: the data keeps its own.
- `test_is_validation: bool` (`SharesTestSplit`): the test split is the validation split, which the test results
  say (`metrics.json`'s `test_is_validation`). Without it: false.
- `benchmark_split: str` (`ReportsValidation`): the validation split is the benchmark's official evaluation set
  (ImageNet-1k's, ADE20K's), named in words in the summary and in `metrics.json`. Without it: nothing is said.
- `batch_size: int` (`Batched`): samples per training batch, which `optimizer.blr` scales the lr by and preflight
  searches. Without it: `optimizer.blr` is refused.
- `train_set` (`HasTrainSet`, a sized dataset): the training split, which no batch may exceed.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable


class Target(str, enum.Enum):
    """What a text's label is: one of the classes, or a score to regress (GLUE's STS-B: similarity in [0, 5])."""

    CLASSES = "classes"
    SCORES = "scores"


@dataclass(frozen=True)
class DataInfo:
    kind: str                                   # images | segmentation | text | parallel | ... (model.data_kinds)
    objective: str | None = None                # what text samples are made for: causal windows | masked sequences
    # ---- sizes (model configs read them as ${data.<name>})
    num_classes: int | None = None
    image_size: int | None = None
    channels: int | None = None
    vocab_size: int | None = None
    block_size: int | None = None
    max_length: int | None = None
    src_vocab_size: int | None = None
    tgt_vocab_size: int | None = None
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    # ---- objects the task takes as constructor arguments and keeps in its checkpoint
    class_names: list[str] | None = None
    palette: list[list[int]] | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    tokenizer: str | None = None                # a tokenizers.Tokenizer as JSON
    src_tokenizer: str | None = None
    tgt_tokenizer: str | None = None
    target: Target | None = None                # classes, or scores (a regression: num_classes is 1)
    val_names: list[str] | None = None          # several validation sets, by name (MNLI: matched, mismatched)

    SIZES: ClassVar[tuple[str, ...]] = ("num_classes", "image_size", "channels", "vocab_size", "block_size",
                                        "max_length", "src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id",
                                        "eos_id")

    def sizes(self) -> dict[str, int]:
        """The sizes the data determined (those it did not are left out)."""
        return {k: getattr(self, k) for k in self.SIZES if getattr(self, k) is not None}

    def task_arguments(self) -> dict[str, Any]:
        """The objects for the task's constructor (those the data has), as plain values."""
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name not in ("kind", "objective") and f.name not in self.SIZES
                 and getattr(self, f.name) is not None}
        return {k: v.value if isinstance(v, enum.Enum) else v for k, v in plain.items()}  # plain in checkpoints


@runtime_checkable
class Informs(Protocol):
    def info(self) -> DataInfo: ...


@runtime_checkable
class TakesTokenizer(Protocol):
    def use_tokenizer(self, tokenizer_json: str) -> None: ...


@runtime_checkable
class SharesTestSplit(Protocol):
    test_is_validation: bool


@runtime_checkable
class ReportsValidation(Protocol):
    benchmark_split: str


@runtime_checkable
class Batched(Protocol):
    batch_size: int


@runtime_checkable
class HasTrainSet(Protocol):
    train_set: Any


# ---- the accessors: the platform's one way to each hook
def info(dm: object) -> DataInfo:
    """The prepared data module's `DataInfo`; a module without `info()` tells its `kind` alone."""
    if isinstance(dm, Informs):
        return dm.info()
    kind = dm.kind if isinstance(dm, _HasKind) else ""
    return DataInfo(str(kind or ""))


def use_tokenizer(dm: object, tokenizer_json: str | None) -> bool:
    """Hand the data module the tokenizer of the weights the run starts from. -> whether it took one."""
    if tokenizer_json is None or not isinstance(dm, TakesTokenizer):
        return False
    dm.use_tokenizer(tokenizer_json)
    return True


def test_is_validation(dm: object) -> bool:
    return bool(dm.test_is_validation) if isinstance(dm, SharesTestSplit) else False


def benchmark_split(dm: object) -> str:
    return str(dm.benchmark_split or "") if isinstance(dm, ReportsValidation) else ""


def batch_size(dm: object) -> int | None:
    return int(dm.batch_size) if isinstance(dm, Batched) and dm.batch_size is not None else None


def training_samples(dm: object) -> int | None:
    """The size of the training split; None when the data module does not say."""
    if not isinstance(dm, HasTrainSet):
        return None
    try:
        return len(dm.train_set)
    except TypeError:
        return None


@runtime_checkable
class _HasKind(Protocol):
    kind: str
