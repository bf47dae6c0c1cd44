"""`attnlab-compare --report out.html`: one self-contained page (PNGs embedded) with the comparison table, the
learning curve of each metric against the step for every run or group (a group: its mean, with a min–max band),
the config keys that differ, and links to each run's media."""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

from attnlab.compare.runs import Run
from attnlab.compare.table import cell, lineage_rows
from attnlab.utils.atomic import write_text

CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 24px}
td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}th{background:#f3f3f3}td.num{text-align:right}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots img{width:460px;border:1px solid #eee}h2{margin-top:28px}"""


def curve_names(runs: list[Run], limit: int = 12) -> list[str]:
    """train/loss first, then the val/ metrics the runs log more than once."""
    names: list[str] = []
    for r in runs:
        if r.curves is None:
            continue
        for col in r.curves.columns:
            if col.startswith(("train/loss", "val/")) and not col.endswith("_best") and r.curves[col].notna().sum() > 1:
                names.append(col)
    ordered = sorted(set(names), key=lambda c: (not c.startswith("train/"), c))
    return ordered[:limit]


def _series(run: Run, metric: str):
    if run.curves is None or metric not in run.curves or "step" not in run.curves:
        return None
    s = run.curves[["step", metric]].dropna()
    return s.groupby("step")[metric].last() if not s.empty else None


def plot(groups: dict[str, list[Run]], metric: str) -> str:
    """A PNG (base64) of `metric` against the step: one line per group (its mean), a min–max band when the
    group has several runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
    for label, runs in groups.items():
        series = [s for s in (_series(r, metric) for r in runs) if s is not None]
        if not series:
            continue
        frame = pd.concat(series, axis=1).sort_index().interpolate(limit_area="inside")
        mean = frame.mean(axis=1)
        (line,) = ax.plot(mean.index, mean.values, label=f"{label} (n={len(series)})" if len(series) > 1 else label)
        if len(series) > 1:
            ax.fill_between(frame.index, frame.min(axis=1), frame.max(axis=1), alpha=0.2, color=line.get_color())
    ax.set_xlabel("step")
    ax.set_title(metric)
    ax.grid(alpha=0.3)
    if len(groups) <= 12:
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _html_table(df) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for _, row in df.iterrows():
        tds = "".join(f'<td class="{"num" if str(c).startswith(("val/", "test/")) else ""}">'
                      f"{html.escape(cell(v, str(c)))}</td>" for c, v in zip(df.columns, row))
        body.append(f"<tr>{tds}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def write_report(out: Path, sections: list[tuple[str, object, dict[str, list[Run]], list[str]]]) -> Path:
    """sections: (title, table DataFrame, {group label: runs}, differing keys), one per task."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>attnlab compare</title><style>{CSS}</style>"
             "</head><body><h1>attnlab compare</h1>"]
    for title, df, groups, keys in sections:
        runs = [r for rs in groups.values() for r in rs]
        parts.append(f"<h2>{html.escape(title)}</h2>{_html_table(df)}")
        metrics = curve_names(runs)
        if metrics:
            parts.append("<h3>Learning curves</h3><div class='plots'>")
            parts += [f"<img alt='{html.escape(m)}' src='data:image/png;base64,{plot(groups, m)}'>" for m in metrics]
            parts.append("</div>")
        if keys:
            head = "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
            rows = "".join(f"<tr><th>{html.escape(k)}</th>" + "".join(
                f"<td>{html.escape(str(r.config.get(k, '—')))}</td>" for r in runs) + "</tr>" for k in keys)
            parts.append(f"<h3>Config keys that differ</h3><table><tr><th>key</th>{head}</tr>{rows}</table>")
        if any(r.lineage for r in runs):
            head = "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
            rows = "".join(f"<tr><th>{html.escape(k)}</th>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in values)
                           + "</tr>" for k, values in lineage_rows(runs))
            parts.append(f"<h3>Lineage</h3><table><tr><th>key</th>{head}</tr>{rows}</table>")
        media = [(r, m) for r in runs for m in r.media]
        if media:
            parts.append("<h3>Media</h3><ul>")
            parts += [f"<li>{html.escape(r.name)}: <a href='{html.escape(_link(m, out))}'>"
                      f"{html.escape(m.name)}</a></li>" for r, m in media]
            parts.append("</ul>")
    parts.append("</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, "\n".join(parts))
    return out


def _link(path: Path, page: Path) -> str:
    try:
        return os.path.relpath(path, page.parent.resolve())
    except ValueError:  # another drive
        return path.as_uri()
