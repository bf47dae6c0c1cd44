"""Hydra sweep overrides -> Optuna distributions, in the syntax of Hydra's own Optuna sweeper:

    optimizer.lr: tag(log, interval(1e-4, 1e-2))   -> FloatDistribution(log=True)
    model.n_layer: choice(2, 4, 6)                  -> CategoricalDistribution
    model.depth: range(2, 8, 2)                     -> IntDistribution(step=2)
    data.batch_size: 64                             -> a fixed value
"""

from __future__ import annotations

from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution


def _choices(override: Override) -> CategoricalDistribution:
    return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))


def distribution(override: Override) -> BaseDistribution | str:
    """The distribution of one override, or its value as a string where it is not a sweep."""
    if not override.is_sweep_override():
        return override.get_value_element_as_str()
    value: Any = override.value()
    if override.is_choice_sweep():
        return _choices(override)
    if override.is_range_sweep():
        if value.shuffle:
            return _choices(override)
        if any(isinstance(v, float) for v in (value.start, value.stop, value.step)):
            return FloatDistribution(value.start, value.stop - value.step, step=value.step)
        return IntDistribution(int(value.start), int(value.stop) - int(value.step), step=int(value.step))
    if override.is_interval_sweep():
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    raise ValueError(f"{override.input_line}: not a sweep Optuna can sample (choice, range or interval)")


def search_space(arguments: list[str]) -> tuple[dict[str, BaseDistribution], dict[str, str]]:
    """({key: distribution} to sample, {key: value} fixed) from `key=value` overrides; later ones win."""
    sampled: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(arguments):
        key = override.get_key_element()
        sampled.pop(key, None), fixed.pop(key, None)
        value = distribution(override)
        (sampled if isinstance(value, BaseDistribution) else fixed)[key] = value
    return sampled, fixed


def grid(space: dict[str, BaseDistribution]) -> dict[str, list]:
    """The values of each (discrete) distribution, for optuna.samplers.GridSampler."""
    out = {}
    for key, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            out[key] = list(dist.choices)
        elif isinstance(dist, (IntDistribution, FloatDistribution)) and dist.step is not None and not dist.log:
            n = int(round((dist.high - dist.low) / dist.step)) + 1
            out[key] = [dist.low + i * dist.step for i in range(n)]
        else:
            raise ValueError(f"{key}: a grid search needs choice() or range() values, not a continuous interval")
    return out
