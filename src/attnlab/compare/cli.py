"""attnlab-compare RUN_OR_SWEEP_DIR... [--sort METRIC] [--group-by KEY] [--metrics M ...] [--report out.html]
attnlab-compare --diff RUN_A RUN_B
attnlab-compare --glue SWEEP_DIR... [--seeds]

Puts runs side by side from their folders alone (config.yaml, metrics.json, csv/metrics.csv): one row per run, the
config keys that differ between them as columns, the final metrics; `--group-by seed` folds runs equal but for the
seed into one row with mean ± std and n. Runs of different tasks get a table each; unfinished runs are marked with
their last logged step. `--glue` lays runs of data=glue out as GLUE's leaderboard does, a row per folder, with the
GLUE score (attnlab.compare.glue); `--seeds` gives each cell's mean ± std over seeds."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.compare.runs import Run, differing_keys, find_runs
from attnlab.compare.table import (by_task, diff, group_frame, grouping_keys, lineage_diff, metric_names,
                                   rich_table, rich_tables, runs_frame, sort_frame)
from attnlab.errors import UserError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnlab-compare", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="run directories, multirun/sweep directories, or globs")
    p.add_argument("--sort", metavar="METRIC", help="sort by this metric, best first (e.g. val/acc_best)")
    p.add_argument("--group-by", metavar="KEY", help="fold runs equal but for KEY (e.g. seed, data.fold)")
    p.add_argument("--metrics", nargs="+", metavar="M", help="only these metrics (default: every val/ and test/)")
    p.add_argument("--report", type=Path, metavar="HTML", help="also write a self-contained HTML report")
    p.add_argument("--diff", nargs=2, metavar=("RUN_A", "RUN_B"), help="the config keys two runs differ in")
    p.add_argument("--glue", action="store_true", help="the GLUE table: a row per folder, with the GLUE score")
    p.add_argument("--seeds", action="store_true", help="with --glue: mean ± std over the seeds of each setting")
    return p


def glue(paths: list[str], seeds: bool = False, console=None) -> list:
    """Print the GLUE table of the folders, a row each; returns its rows."""
    from rich.console import Console
    from rich.text import Text

    from attnlab.compare.glue import glue_table, markdown

    rows = glue_table(paths, seeds)
    (console or Console()).print(Text(markdown(rows)))
    return rows


def compare(paths: list[str], sort: str | None = None, group_by: str | None = None,
            metrics: list[str] | None = None, report: Path | None = None, console=None) -> list:
    """Print the tables (one per task); returns their DataFrames. Writes `report` when given."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    runs = find_runs(paths)
    frames, sections = [], []
    for task, task_runs in by_task(runs).items():
        keys = differing_keys(task_runs)
        names = metric_names(task_runs, metrics)
        if group_by:
            df = group_frame(task_runs, group_by, keys, names)
            groups = _groups(task_runs, group_by, keys)
        else:
            df = runs_frame(task_runs, keys, names)
            groups = {r.name: [r] for r in task_runs}
        df = sort_frame(df, sort)
        title = f"{task}: {len(task_runs)} run(s)" + (f", grouped by {group_by}" if group_by else "")
        for table in rich_tables(df, title, console.width):
            console.print(table)
        frames.append(df)
        sections.append((title, df, groups, keys))
    if report:
        from attnlab.compare.report import write_report

        console.print(Text(f"report: {write_report(report, sections)}"))
    return frames


def _groups(runs: list[Run], by: str, keys: list[str]) -> dict[str, list[Run]]:
    rest = grouping_keys(runs, by, keys)
    out: dict[str, list[Run]] = {}
    for r in runs:
        label = ", ".join(f"{k}={r.config.get(k)}" for k in rest) or "all"
        out.setdefault(label, []).append(r)
    return out


def show_diff(a: str, b: str, console=None) -> list[tuple]:
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    runs = find_runs([a]), find_runs([b])
    for path, found in zip((a, b), runs):
        if len(found) != 1:
            raise UserError(f"--diff {path}: give one run directory (it holds {len(found)} runs).")
    a_run, b_run = runs[0][0], runs[1][0]
    rows = diff(a_run, b_run)
    console.print(_diff_table(f"config keys that differ: A={a_run.name}, B={b_run.name}", rows)
                  if rows else "the two runs have the same config")
    if a_run.lineage is None or b_run.lineage is None:
        missing = [r.name for r in (a_run, b_run) if r.lineage is None]
        console.print(Text(f"no lineage.json in {', '.join(missing)} (runs of attnlab before lineage was recorded)"))
        return rows
    lineage_rows_ = lineage_diff(a_run, b_run)
    console.print(_diff_table("lineage that differs (code, environment, machine)", lineage_rows_) if lineage_rows_
                  else "the two runs have the same lineage (code, environment, machine)")
    return rows + [(f"lineage.{k}", va, vb) for k, va, vb in lineage_rows_]


def _diff_table(title: str, rows: list[tuple]):
    """A table of (key, value in A, value in B)."""
    return rich_table(["key", "A", "B"], {c: [str(r[i]) for r in rows] for i, c in enumerate(("key", "A", "B"))}, title)


def main(argv: list[str] | None = None) -> int:
    """Bad input (no runs, an unknown key or metric) stops with one paragraph and exit code 2."""
    from attnlab.errors import fail_before_hydra

    args = parser().parse_args(argv)
    if not args.diff and not args.runs:
        parser().error("give run or multirun directories (or --diff RUN_A RUN_B)")
    if args.seeds and not args.glue:
        parser().error("--seeds goes with --glue (elsewhere: --group-by seed)")
    if args.diff:
        fail_before_hydra(show_diff, *args.diff)
    elif args.glue:
        fail_before_hydra(glue, args.runs, args.seeds)
    else:
        fail_before_hydra(compare, args.runs, args.sort, args.group_by, args.metrics, args.report)
    return 0
