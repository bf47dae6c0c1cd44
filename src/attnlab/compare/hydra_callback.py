"""At the end of a multirun, the comparison of its jobs (attnlab.compare), next to its results.csv: grouped by
`seed` when the sweep varies the seed, by `data.fold` when it runs the folds of a cross-validation, so that the
mean ± std over seeds or folds is printed by itself."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("attnlab")
GROUP_KEYS = ("seed", "data.fold")


class CompareAtMultirunEnd(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rich.console import Console

        from attnlab.compare.cli import compare
        from attnlab.compare.runs import differing_keys, find_runs

        sweep = Path(config.hydra.sweep.dir)
        try:
            runs = find_runs([str(sweep)])
            varied = differing_keys(runs)
            by = next((k for k in GROUP_KEYS if k in varied), None)
            if len(runs) < 2:
                return
            compare([str(sweep)], group_by=by, console=Console(width=160))
        except Exception as e:  # the jobs' results stand; only their summary is missing
            log.warning("the comparison of the jobs in %s failed (%s: %s); run attnlab-compare %s", sweep,
                        type(e).__name__, e, sweep)
