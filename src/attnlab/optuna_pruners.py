"""`hydra.sweeper.pruner`: Optuna's pruners by name (`median`, `percentile`, `successive_halving`, `hyperband`,
`threshold`, `patient`, `wilcoxon`, `nop`) with their settings, or any pruner by `_target_`.

    hydra.sweeper.pruner=median
    hydra.sweeper.pruner={name: median, n_warmup_steps: 200}
    hydra.sweeper.pruner={_target_: optuna.pruners.HyperbandPruner, min_resource: 100, max_resource: 2000}

Shared by the sweeper and the jobs (which open the study with the same pruner)."""

from __future__ import annotations

from typing import Any

from attnlab.errors import UserError

NAMES = {"median": "MedianPruner", "percentile": "PercentilePruner", "successive_halving": "SuccessiveHalvingPruner",
         "hyperband": "HyperbandPruner", "threshold": "ThresholdPruner", "patient": "PatientPruner",
         "wilcoxon": "WilcoxonPruner", "nop": "NopPruner"}


def make_pruner(spec: Any):
    """None (no pruning), a name, {name: ..., <settings>} or {_target_: ..., <settings>}."""
    if spec is None:
        return None
    import optuna

    if hasattr(spec, "items") and not isinstance(spec, dict):  # a DictConfig
        from omegaconf import OmegaConf

        spec = OmegaConf.to_container(spec, resolve=True)
    settings = dict(spec) if isinstance(spec, dict) else {"name": spec}
    if "_target_" in settings:
        from hydra.utils import instantiate

        return instantiate(settings)
    name = str(settings.pop("name", ""))
    if name not in NAMES:
        raise UserError(f"hydra.sweeper.pruner={name or spec}: not a pruner attnlab knows. Use one of "
                        f"{', '.join(NAMES)} (with its settings: {{name: median, n_warmup_steps: 5}}), or "
                        "{_target_: <a pruner class>, ...}, or null for none.")
    try:
        return getattr(optuna.pruners, NAMES[name])(**settings)
    except TypeError as e:
        raise UserError(f"hydra.sweeper.pruner={name} does not take these settings ({e}); see "
                        f"optuna.pruners.{NAMES[name]} for the ones it takes.") from None
