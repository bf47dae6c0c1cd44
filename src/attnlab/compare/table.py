"""The comparison table: one row per run (or per group of runs equal but for one key), the config keys that differ
as columns, then the final metrics; groups show mean ± std and n. Built with pandas, printed with Rich."""

from __future__ import annotations

import math
from typing import Any

from attnlab.compare.runs import Run, differing_keys, is_number
from attnlab.errors import UserError
from attnlab.lineage import flatten

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


# the columns that tell the rows apart: never folded, and repeated at the left of every part of a wide table
IDENTITY = ("run", "runs", "status", "n")


def rich_tables(df, title: str, width: int) -> list:
    """The table as Rich tables at most `width` characters wide, with run names, statuses and headers never cut:
    the columns that do not fit beside the run and status go to further parts, each led by the run column again
    (a group's runs one per line where they are too long for one). Where even the run and status columns do not
    fit, each run is printed as a list of its values."""
    text = {c: [cell(v, c) for v in df[c]] for c in df.columns}
    ident = [c for c in df.columns if c in IDENTITY]
    if "runs" in text and _width(ident, text) > width:
        text["runs"] = [s.replace(", ", ",\n") for s in text["runs"]]
    if _width(ident, text) > width:
        return [_sideways(df.columns, text, title)]
    parts, cols = [], list(ident)
    for c in (c for c in df.columns if c not in IDENTITY):
        if _width([*cols, c], text) > width and len(cols) > (len(ident) if not parts else 1):
            parts.append(cols)
            cols = ident[:1]
        cols.append(c)  # a column too wide even beside the run alone is folded there
    parts.append(cols)
    return [rich_table(cols, text, title if len(parts) == 1 else f"{title} (part {i}/{len(parts)})")
            for i, cols in enumerate(parts, 1)]


def _width(cols: list[str], text: dict[str, list[str]]) -> int:
    """Characters a Rich table of these columns takes: each column's widest line, 1 of padding each side, the
    borders."""
    from rich.cells import cell_len

    return sum(max([cell_len(c)] + [cell_len(line) for s in text[c] for line in s.split("\n")]) for c in cols) \
        + 3 * len(cols) + 1


def rich_table(cols: list[str], text: dict[str, list[str]], title: str):
    """A Rich table of the columns `cols` of `text`, its title and cells printed as they are (never markup)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title), show_lines=False)
    for col in cols:
        table.add_column(Text(col), justify="right" if col.startswith(("val/", "test/", "n")) else "left",
                         no_wrap=col in IDENTITY, overflow="fold")
    for row in zip(*(text[c] for c in cols)):
        table.add_row(*(Text(c) for c in row))  # a run folder's text, never Rich markup
    return table


def _sideways(columns, text: dict[str, list[str]], title: str):
    """Each run as lines of `column: value`, its name first: for a terminal too narrow for even the run and status
    side by side."""
    from rich.console import Group
    from rich.text import Text

    lines = [Text(title, style="italic")]
    for i in range(len(next(iter(text.values()), []))):
        lines += [Text(""), Text(text[columns[0]][i].replace("\n", " "), style="bold", overflow="fold")]
        lines += [Text(f"  {c}: {text[c][i]}", overflow="fold") for c in columns[1:]]
    return Group(*lines)


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
    la, lb = flatten(a.lineage), flatten(b.lineage)
    return [(k, _show(la.get(k, "—")), _show(lb.get(k, "—"))) for k in sorted(set(la) | set(lb))
            if la.get(k) != lb.get(k) and k not in ("cwd", "command")] + \
        [(k, la.get(k, "—"), lb.get(k, "—")) for k in ("command",) if la.get(k) != lb.get(k)]


def lineage_rows(runs: list[Run]) -> list[tuple[str, list[Any]]]:
    """(key, value per run): the summary keys, then the keys whose values differ between the runs."""
    flat = [dict(flatten(r.lineage), started=(r.lineage or {}).get("started")) for r in runs]
    differing = sorted(k for k in set().union(*flat) if len({str(f.get(k)) for f in flat}) > 1
                       and k not in LINEAGE_SUMMARY and k != "cwd")
    keys = [k for k in LINEAGE_SUMMARY if any(k in f for f in flat)] + differing
    return [(k, [_show(f.get(k, "—")) for f in flat]) for k in keys]


def _show(v: Any) -> Any:
    return str(v) if isinstance(v, (list, dict)) else v
