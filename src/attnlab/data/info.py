"""The one contract between data and model: `DataInfo`, what a prepared data module tells the task, once.

A data module returns it from `info()` after `setup()`. Its sizes are written into the run's `data` config, where a
model config interpolates them in plain sight (`vocab_size: ${data.vocab_size}`); its objects (tokenizers as JSON,
class names, palette, normalization) are constructor arguments of the task, which keeps them in its checkpoint, so
`Task.load_from_checkpoint(path)` rebuilds the model alone. An entry point that meets a task and data built
separately (eval.py, a resumed run) hands the info to `task.check_data(info)`, which refuses data the model cannot
take. Text normalization (lowercasing, accents) is inside the tokenizer (its `normalizer`), so prediction encodes
text as training did without reading the data config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


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

    SIZES: ClassVar[tuple[str, ...]] = ("num_classes", "image_size", "channels", "vocab_size", "block_size",
                                        "max_length", "src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id",
                                        "eos_id")

    def sizes(self) -> dict[str, int]:
        """The sizes the data determined (those it did not are left out)."""
        return {k: getattr(self, k) for k in self.SIZES if getattr(self, k) is not None}

    def task_arguments(self) -> dict[str, Any]:
        """The objects for the task's constructor (those the data has)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("kind", "objective") and f.name not in self.SIZES and getattr(self, f.name) is not None}
