"""At the end of a multirun, the comparison of its jobs (attnlab.compare), next to its results.csv: grouped by
`seed` when the sweep varies the seed, by `data.fold` when it runs the folds of a cross-validation, so that the
mean ± std over seeds or folds is printed by itself. A sweep of GLUE tasks also gets its table, glue.md and
glue.csv (attnlab.compare.glue)."""

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
            _glue(sweep, runs, seeds=by == "seed")
            if len(runs) < 2:
                return
            compare([str(sweep)], group_by=by, console=Console(width=160))
        except Exception as e:  # the jobs' results stand; only their summary is missing
            log.warning("the comparison of the jobs in %s failed (%s: %s); run attnlab-compare %s", sweep,
                        type(e).__name__, e, sweep)


def _glue(sweep: Path, runs: list, seeds: bool) -> None:
    from attnlab.compare.glue import glue_row, glue_task, markdown, write_glue_files

    if not any(glue_task(r) for r in runs):
        return
    row = glue_row(sweep.name, runs, seeds)
    if row.cells:
        md, table = write_glue_files(sweep, [row])
        log.info("GLUE:\n%s(written to %s and %s)", markdown([row]), md, table)
