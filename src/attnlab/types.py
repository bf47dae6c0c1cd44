"""Value ranges declared on the parameters that take them (`batch_size: PositiveInt`), checked with the config
before anything is built (attnlab.cli.checks): the range moves with its parameter wherever the code goes."""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Gt, Interval

PositiveInt = Annotated[int, Ge(1)]
NonNegativeInt = Annotated[int, Ge(0)]
PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]
# dropout, drop path, label smoothing, a split's share of the data
Fraction = Annotated[float, Interval(ge=0, lt=1)]
UnitInterval = Annotated[float, Interval(ge=0, le=1)]
