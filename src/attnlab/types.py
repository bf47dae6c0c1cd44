"""Value ranges and settings types declared on the parameters that take them (`batch_size: PositiveInt`), checked
with the config before anything is built: the range moves with its parameter wherever the code goes."""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

from annotated_types import Ge, Gt, Interval
from pydantic import AfterValidator, ConfigDict
from typing_extensions import TypedDict

PositiveInt = Annotated[int, Ge(1)]
NonNegativeInt = Annotated[int, Ge(0)]
PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]
# dropout, drop path, label smoothing, a split's share of the data
Fraction = Annotated[float, Interval(ge=0, lt=1)]
UnitInterval = Annotated[float, Interval(ge=0, le=1)]


@dataclass(frozen=True)
class MultipleOf:
    """A relation to another setting of the same constructor:
    `img_size: Annotated[PositiveInt, MultipleOf("patch_size")]` refuses an image size the patch size does not
    divide."""

    key: str


def _codec(name: str) -> str:
    try:
        codecs.lookup(name)
    except LookupError:
        raise ValueError("not a text encoding Python knows (e.g. utf-8, latin-1, cp1252, utf-16)") from None
    return name


# the name of a text encoding: utf-8, latin-1, cp1252, ...
Encoding = Annotated[str, AfterValidator(_codec)]


class DecodeSettings(TypedDict, total=False):
    """Decoding settings (a translation model's `decode`, eval.py's and predict.py's `decode`); None keeps the
    model's own."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    beam_size: PositiveInt | None          # test and prediction; 1: greedy
    val_beam_size: NonNegativeInt | None   # validation BLEU; 0 or 1: greedy
    length_penalty: float | None           # score / length**penalty
    max_len: PositiveInt | None            # output tokens at most
    max_len_a: NonNegativeFloat | None     # and at most a x source length + b
    max_len_b: NonNegativeInt | None


def type_hints(obj: Any) -> dict[str, Any]:
    """The type hints of a class or function, with their `Annotated` ranges; empty where one cannot be evaluated
    here (those parameters go unchecked)."""
    try:
        return get_type_hints(obj, include_extras=True)
    except Exception:
        return {}
