"""`hydra/sweeper=optuna`: Optuna's ask-and-tell over Hydra jobs, with a study that survives the sweep.

The study lives in SQLite at `<paths.log_dir>/<task_name>/optuna/<study_name>.db` (or `storage:` any Optuna storage
URL; `storage: memory` keeps nothing). Running the same command again continues it: finished trials are not rerun,
`n_trials` is the total the study should reach, job numbers go on from the last trial's, and a trial whose process
was stopped (SIGTERM, Ctrl-C, SIGKILL, a lost node) is marked failed and run again with the same parameters. One
sweep at a time holds a study (a file lock beside the database), so the trials it finds running were interrupted.

The search space keeps the shape of Hydra's own Optuna sweeper: `params:` of `choice(...)`, `range(...)`,
`interval(...)`, `tag(log, interval(...))` or fixed values, merged with sweeps given on the command line.
"""

# (no `from __future__ import annotations`: Hydra execs plugin modules outside sys.modules, where a dataclass
# cannot resolve string annotations)
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

# Hydra imports every module of every plugin package at start-up (not those named with a leading underscore), so
# this one holds the config and a front: Optuna (and the sweeper's code) is imported when a sweep is set up.


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.attnlab_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    _recursive_: bool = False  # the sampler stays a config: a continued study reseeds it
    sampler: Any = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler", "seed": None})
    direction: Any = "minimize"  # or maximize, or a list of them for several objectives
    storage: Optional[str] = None  # default sqlite:///<paths.log_dir>/<task_name>/optuna/<study_name>.db
    study_name: Optional[str] = None  # default: the run's task_name
    n_trials: int = 20  # the study's total: a continued study runs what is missing
    n_jobs: int = 1  # trials launched together (in parallel with a parallel launcher)
    max_failure_rate: float = 0.0
    # prune hopeless trials: median, percentile, successive_halving, hyperband, threshold, nop, with settings
    # ({name: median, n_warmup_steps: 5}) or {_target_: ...}; each job reports optimized_metric at every validation
    pruner: Any = None
    params: Optional[Dict[str, Any]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="attnlab")


class OptunaSweeper(Sweeper):
    def __init__(self, **kwargs: Any) -> None:
        from ._impl import OptunaSweeperImpl

        self._impl = OptunaSweeperImpl(**kwargs)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self._impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list) -> None:
        return self._impl.sweep(arguments)
