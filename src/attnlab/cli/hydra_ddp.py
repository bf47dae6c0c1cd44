"""DDP ranks of a multirun job: Lightning re-executes the script once per extra rank, and
`pin_subprocess_ranks_to_job` makes that command a single run of the current job (its own overrides, an Optuna
trial's parameters among them) in the job's directory: one directory per job, never one per rank."""

from __future__ import annotations

import sys

from omegaconf import open_dict, read_write


def pin_subprocess_ranks_to_job() -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return
    # hydra.mode=RUN: a config that sets MULTIRUN itself (hparams_search=...) would make each rank a sweep of its own
    sys.argv = [sys.argv[0], *hc.overrides.task, "hydra.mode=RUN"]
    with read_write(hc), open_dict(hc):
        hc.run.dir = hc.runtime.output_dir
