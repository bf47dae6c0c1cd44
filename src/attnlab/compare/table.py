"""The comparison table: one row per run (or per group of runs equal but for one key), the config keys that differ
as columns, then the final metrics; groups show mean ± std and n. Built with pandas, printed with Rich."""

from __future__ import annotations

import math
from typing import Any

from attnlab.compare.runs import Run, differing_keys, is_number
from attnlab.errors import UserError

LOWER_IS_BETTER = ("loss", "ppl", "error", "wer", "cer", "time")


def metric_names(runs: list[Run], chosen: list[str] | None = None) -> list[str]:
    """The val/ and test/ metrics the runs report (or `chosen`), in a stable order."""
    have = sorted({k for r in runs for k in r.final() if k.startswith(("val/", "test/"))
                   and not k.endswith(("_step", "_epoch"))})
    if not chosen:
        return have
    unknown = [m for m in chosen if m not in have]
    if unknown:
        raise UserError(f"--metrics {' '.join(unknown)}: no run reports {'it' if len(unknown) == 1 else 'them'}. "
                        f"The runs report: {', '.join(have) or 'no val/ or test/ metrics'}.")
    return list(chosen)


def runs_frame(runs: list[Run], keys: list[str], metrics: list[str]):
    """pandas DataFrame: run, status, the differing keys, the metrics."""
    import pandas as pd

    rows = []
    for r in runs:
        final = r.final()
        rows.append({"run": r.name, "status": r.status(), **{k: _show(r.config.get(k)) for k in keys},
                     **{m: final.get(m, math.nan) for m in metrics}})
    return pd.DataFrame(rows, columns=["run", "status", *keys, *metrics])


def group_frame(runs: list[Run], by: str, keys: list[str], metrics: list[str]):
    """Runs equal in every differing key but `by` in one row: mean, std and n of each metric, the runs listed."""
    import pandas as pd

    if not any(by in r.config for r in runs):
        raise UserError(f"--group-by {by}: no run's config has the key {by}. Keys that differ between these runs: "
                        f"{', '.join(keys) or 'none'} (nested keys are dotted, e.g. data.fold).")
    rest = grouping_keys(runs, by, keys)
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(_show(r.config.get(k)) for k in rest), []).append(r)
    rows = []
    for values, members in groups.items():
        row: dict[str, Any] = {"runs": ", ".join(m.name for m in members), "n": len(members),
                               by: ", ".join(str(_show(m.config.get(by))) for m in members)}
        row |= dict(zip(rest, values))
        for m in metrics:
            xs = [x for x in (r.final().get(m) for r in members) if is_number(x)]
            row[m] = _mean_std(xs)
        unfinished = sum(not r.finished for r in members)
        row["status"] = f"{unfinished} unfinished" if unfinished else "finished"
        rows.append(row)
    return pd.DataFrame(rows, columns=["runs", "status", "n", by, *rest, *metrics])


def grouping_keys(runs: list[Run], by: str, keys: list[str]) -> list[str]:
    """The differing keys that define a group: all but `by` and its copies (data.seed: ${seed} follows seed)."""
    return [k for k in keys if k != by and any(r.config.get(k) != r.config.get(by) for r in runs)]


def _mean_std(xs: list[float]) -> tuple[float, float, int]:
    if not xs:
        return (math.nan, math.nan, 0)
    mean = sum(xs) / len(xs)
    std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return (mean, std, len(xs))


def sort_frame(df, metric: str | None):
    """Best first: ascending for losses, perplexities and errors, descending otherwise."""
    if not metric:
        return df
    if metric not in df.columns:
        raise UserError(f"--sort {metric}: not a column of the table. Sort by one of the metrics: "
                        f"{', '.join(c for c in df.columns if c.startswith(('val/', 'test/')))}.")
    key = df[metric].map(lambda v: v[0] if isinstance(v, tuple) else v)
    ascending = any(w in metric for w in LOWER_IS_BETTER)
    return df.assign(_key=key).sort_values("_key", ascending=ascending, na_position="last").drop(columns="_key")


def cell(value: Any, column: str = "") -> str:
    """Metrics to 4 decimals (a group's as mean ± std; its n is a column), settings as written (1e-3, 0.5)."""
    if isinstance(value, tuple):
        mean, std, n = value
        return "–" if n == 0 else f"{mean:.4f} ± {std:.4f}"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.4f}" if column.startswith(("val/", "test/")) else f"{value:g}"
    return str(value)


def rich_table(df, title: str):
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in df.columns:
        table.add_column(col, justify="right" if col.startswith(("val/", "test/", "n")) else "left",
                         overflow="fold")
    for _, row in df.iterrows():
        table.add_row(*(cell(v, c) for c, v in zip(df.columns, row)))
    return table


def by_task(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs of different tasks are compared apart."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.task, []).append(r)
    return out


def diff(a: Run, b: Run) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every config key that differs, nested keys dotted."""
    return [(k, _show(a.config.get(k, "—")), _show(b.config.get(k, "—"))) for k in differing_keys([a, b])]


# the lineage shown for every run in the HTML report; any other key of it is shown where runs differ
LINEAGE_SUMMARY = ("git.commit", "git.dirty", "attnlab", "python", "packages.torch", "packages.lightning",
                   "accelerator.gpus", "accelerator.cpu", "host", "started", "status")


def lineage_diff(a: Run, b: Run) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every lineage key that differs (times left out)."""
    from attnlab.lineage import flatten

    la, lb = flatten(a.lineage), flatten(b.lineage)
    return [(k, _show(la.get(k, "—")), _show(lb.get(k, "—"))) for k in sorted(set(la) | set(lb))
            if la.get(k) != lb.get(k) and k not in ("cwd", "command")] + \
        [(k, la.get(k, "—"), lb.get(k, "—")) for k in ("command",) if la.get(k) != lb.get(k)]


def lineage_rows(runs: list[Run]) -> list[tuple[str, list[Any]]]:
    """(key, value per run): the summary keys, then the keys whose values differ between the runs."""
    from attnlab.lineage import flatten

    flat = [dict(flatten(r.lineage), started=(r.lineage or {}).get("started")) for r in runs]
    differing = sorted(k for k in set().union(*flat) if len({str(f.get(k)) for f in flat}) > 1
                       and k not in LINEAGE_SUMMARY and k != "cwd")
    keys = [k for k in LINEAGE_SUMMARY if any(k in f for f in flat)] + differing
    return [(k, [_show(f.get(k, "—")) for f in flat]) for k in keys]


def _show(v: Any) -> Any:
    return str(v) if isinstance(v, (list, dict)) else v
