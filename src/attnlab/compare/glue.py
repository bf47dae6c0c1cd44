"""The GLUE table: runs of `data=glue` as the leaderboard prints them. One row per set of runs (a sweep folder),
the tasks in GLUE's order, each cell the task's metrics x100 to one decimal, joined by "/" as the leaderboard joins
them (MRPC and QQP F1/accuracy, STS-B Pearson/Spearman, MNLI matched/mismatched), and the GLUE score.

- A task's numbers are its run's `test/` metrics: the best checkpoint on GLUE's labelled validation set (the test
  split here), else the last `val/` ones.
- Of several runs of a task (a sweep over the learning rate, as the BERT paper's), the row takes the one with the
  best validation value of the task's ranked metric (`val/<metric>_best`), as the paper chose on the dev set.
- With `seeds`, runs equal but for the seed are one setting: the best setting by its mean, its cells mean±std, the
  score's spread that of the per-seed scores.
- The score is the leaderboard's: the mean over the nine tasks (WNLI counted) of each task's mean of its metrics.
  AX, the diagnostic, is shown apart and not counted. A row without all nine says over how many tasks it is.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.compare.runs import Run, differing_keys, find_runs
from attnlab.compare.table import grouping_keys
from attnlab.data.text.glue_tasks import LEADERBOARD, TASKS
from attnlab.errors import UserError

HEADERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI-m/mm",
           "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI", "ax": "AX"}


def glue_task(run: Run) -> str | None:
    """The GLUE task a run trained or evaluated on; None for a run of other data."""
    target, task = str(run.config.get("data._target_", "")), run.config.get("data.task")
    return str(task) if target.endswith(".GlueDataModule") and task in TASKS else None


def scores_of(run: Run, task: str) -> list[float] | None:
    """The task's metrics of a run, in GLUE's order (x100); None when the run lacks one."""
    final = run.final()
    values = []
    for m in TASKS[task].metrics:
        value = final.get(f"test/{m}", final.get(f"val/{m}"))
        if value is None:
            return None
        values.append(100.0 * float(value))
    return values


def _ranked(run: Run, task: str) -> float:
    final, metric = run.final(), TASKS[task].metrics[0]
    value = final.get(f"val/{metric}_best", final.get(f"test/{metric}", final.get(f"val/{metric}")))
    return float("-inf") if value is None else float(value)


@dataclass
class Row:
    name: str
    cells: dict[str, list[list[float]]] = field(default_factory=dict)  # task -> per seed, its metrics

    def mean(self, task: str) -> list[float]:
        return [statistics.fmean(xs) for xs in zip(*self.cells[task])]

    def std(self, task: str) -> list[float]:
        return [statistics.stdev(xs) if len(xs) > 1 else 0.0 for xs in zip(*self.cells[task])]

    @property
    def counted(self) -> list[str]:
        return [t for t in LEADERBOARD if t in self.cells]

    def score(self) -> float | None:
        """The GLUE score of the tasks the row has: the mean of each task's mean of its metrics."""
        tasks = self.counted
        return statistics.fmean(statistics.fmean(self.mean(t)) for t in tasks) if tasks else None

    def score_std(self) -> float:
        """The spread of the per-seed scores, where every task has the same number of seeds."""
        seeds = {len(self.cells[t]) for t in self.counted}
        if len(seeds) != 1 or seeds == {1}:
            return 0.0
        per_seed = [statistics.fmean(statistics.fmean(self.cells[t][i]) for t in self.counted)
                    for i in range(seeds.pop())]
        return statistics.stdev(per_seed)


def glue_row(name: str, runs: list[Run], seeds: bool = False) -> Row:
    """The row of one set of runs: per task the best run (or, with seeds, the best setting's runs)."""
    row = Row(name)
    by_task: dict[str, list[Run]] = {}
    for run in runs:
        task = glue_task(run)
        if task is not None and scores_of(run, task) is not None:
            by_task.setdefault(task, []).append(run)
    for task, task_runs in by_task.items():
        if seeds:
            # a setting: the keys the runs differ in, but the seed and its copies (data.seed: ${seed})
            keys = grouping_keys(task_runs, "seed", differing_keys(task_runs))
            settings: dict[tuple, list[Run]] = {}
            for run in task_runs:
                settings.setdefault(tuple(str(run.config.get(k)) for k in keys), []).append(run)
            best = max(settings.values(), key=lambda rs: statistics.fmean(_ranked(r, task) for r in rs))
        else:
            best = [max(task_runs, key=lambda r: _ranked(r, task))]
        row.cells[task] = [scores_of(r, task) for r in best]
    return row


def cell(row: Row, task: str) -> str:
    """A task's cell as the leaderboard prints it: `88.9/84.8`; with seeds `88.9±0.4/84.8±0.3`; `–` when absent."""
    if task not in row.cells:
        return "–"
    seeds = len(row.cells[task]) > 1
    return "/".join(f"{m:.1f}±{s:.1f}" if seeds else f"{m:.1f}" for m, s in zip(row.mean(task), row.std(task)))


def score_cell(row: Row) -> str:
    score = row.score()
    if score is None:
        return "–"
    text = f"{score:.1f}" + (f"±{row.score_std():.1f}" if row.score_std() else "")
    n = len(row.counted)
    return text if n == len(LEADERBOARD) else f"{text} ({n} of {len(LEADERBOARD)} tasks)"


def columns(rows: list[Row]) -> list[str]:
    return [*LEADERBOARD, *(["ax"] if any("ax" in r.cells for r in rows) else [])]


def markdown(rows: list[Row]) -> str:
    tasks = columns(rows)
    lines = ["| | Score | " + " | ".join(HEADERS[t] for t in tasks) + " |",
             "|---|---:|" + "---:|" * len(tasks)]
    lines += [f"| {r.name} | {score_cell(r)} | " + " | ".join(cell(r, t) for t in tasks) + " |" for r in rows]
    note = ("Score: the mean over the nine tasks of each task's mean of its metrics (the leaderboard's; WNLI "
            "counted, AX not). Each cell: GLUE's validation set, the best run of the task.")
    return "\n".join(lines) + "\n\n" + note + "\n"


def csv_text(rows: list[Row]) -> str:
    tasks = columns(rows)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["name", "score", *tasks, "tasks"])
    for r in rows:
        score = r.score()
        writer.writerow([r.name, "" if score is None else f"{score:.2f}", *(cell(r, t) for t in tasks),
                         len(r.counted)])
    return out.getvalue()


def glue_table(paths: list[str], seeds: bool = False) -> list[Row]:
    """A row per path (a sweep folder, or a folder of runs); refused where a path holds no GLUE run."""
    rows = []
    for path in paths:
        row = glue_row(Path(path).name or path, find_runs([path]), seeds)
        if not row.cells:
            raise UserError(f"{path} holds no finished run of data=glue: the GLUE table is made of runs of "
                            "`python train.py -m experiment=bert_glue data.task=cola,sst2,...` (their folders "
                            "with metrics.json).")
        rows.append(row)
    return rows


def write_glue_files(folder: Path, rows: list[Row]) -> tuple[Path, Path]:
    """glue.md and glue.csv in `folder`, written whole (atomic)."""
    from attnlab.utils import atomic

    md, table = folder / "glue.md", folder / "glue.csv"
    atomic.write_text(md, markdown(rows))
    atomic.write_text(table, csv_text(rows))
    return md, table
