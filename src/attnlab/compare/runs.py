"""Finding and reading runs for `attnlab-compare`: each run directory's `config.yaml` (the resolved config),
`metrics.json` (written when the run finished), `csv/metrics.csv` (the logged curves), `lineage.json` and the names
of its `media/` files, nothing else, so copied folders compare as well as the originals."""

from __future__ import annotations

import glob
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.cluster.outcome import AttemptEnd, Outcome
from attnlab.errors import UserError
from attnlab.utils.dotted import flatten

log = logging.getLogger("attnlab")

# config keys that say where a run is or how it printed, not what it computed
NOT_SETTINGS = ("paths.", "hydra.", "extras.", "callbacks.progress_bar", "callbacks.rich", "logger.")
MEDIA = (".png", ".jpg", ".jpeg", ".gif", ".csv", ".html", ".txt")


@dataclass
class Run:
    path: Path
    config: dict[str, Any]                       # flattened: {"model.n_layer": 4, ...}
    metrics: dict[str, float] | None             # None: unfinished (no metrics.json)
    curves: Any = None                           # pandas DataFrame of csv/metrics.csv, or None
    name: str = ""
    media: list[Path] = field(default_factory=list)
    problem: str = ""                            # a damaged file of the run (empty metrics.json, ...): shown
    lineage: dict[str, Any] | None = None        # lineage.json: code, environment, machine (attnlab.lineage)

    @property
    def finished(self) -> bool:
        return self.metrics is not None

    @property
    def task(self) -> str:
        target = self.config.get("model._target_") or self.config.get("task_name") or "?"
        return str(target).rsplit(".", 1)[-1]

    @property
    def last_step(self) -> int | None:
        if self.curves is None or "step" not in self.curves or self.curves["step"].dropna().empty:
            return None
        return int(self.curves["step"].max())

    def final(self) -> dict[str, float]:
        """metrics.json, or for an unfinished run the last value logged of each metric."""
        if self.metrics is not None:
            return dict(self.metrics)
        if self.curves is None:
            return {}
        out = {}
        for col in self.curves.columns:
            values = self.curves[col].dropna()
            if col not in ("step", "epoch") and not values.empty:
                out[col] = float(values.iloc[-1])
        return out

    def status(self) -> str:
        if self.problem:
            return f"damaged: {self.problem}"
        if getattr(AttemptEnd.of(self.lineage), "outcome", None) is Outcome.PRUNED:  # an Optuna sweep's pruner
            return f"pruned (step {self.lineage.get('global_step', self.last_step)})"
        if self.finished:
            return "finished"
        step = self.last_step
        return f"unfinished (step {step})" if step is not None else "unfinished (nothing logged)"


def load_run(path: Path) -> Run:
    """A run folder read as plain data: its config.yaml by YAML's safe loader (no interpolation or resolver is ever
    resolved: ${oc.env:...} stays as written), every text it holds without control characters (`clean`)."""
    import pandas as pd
    import yaml

    try:
        config = yaml.load((path / "config.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if not isinstance(config, dict) or not config:
            raise ValueError("empty" if not config else "not a mapping of settings")
    except Exception as e:
        raise DamagedRun(f"{path}: its config.yaml cannot be read ({type(e).__name__}: "
                         f"{clean(str(e).splitlines()[0][:120]) if str(e) else 'empty'})") from None
    metrics, curves, problems = None, None, []
    if (path / "metrics.json").is_file():
        try:
            metrics = {clean(k): float(v) for k, v in json.loads((path / "metrics.json").read_text()).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
        except (ValueError, AttributeError, OSError):
            problems.append("metrics.json unreadable")
    csv = path / "csv" / "metrics.csv"
    if csv.is_file() and csv.stat().st_size:
        try:
            curves = pd.read_csv(csv).rename(columns=clean)
        except (ValueError, OSError):
            problems.append("csv/metrics.csv unreadable")
    media = sorted(p for p in (path / "media").rglob("*") if p.suffix.lower() in MEDIA) \
        if (path / "media").is_dir() else []
    from attnlab import lineage

    return Run(path, clean(flatten(config)), metrics, curves, media=media, problem=", ".join(problems),
               lineage=clean(lineage.read(path)))


def clean(node: Any) -> Any:
    """A run folder's data without control characters in any text (keys and values, at any depth)."""
    from attnlab.utils.printable import printable

    if isinstance(node, dict):
        return {clean(k): clean(v) for k, v in node.items()}
    if isinstance(node, list):
        return [clean(v) for v in node]
    return printable(node) if isinstance(node, str) else node


class DamagedRun(Exception):
    """A run directory whose config.yaml cannot be read: left out of the comparison, and named."""


def find_runs(inputs: list[str]) -> list[Run]:
    """Runs from any mix of run directories, multirun/sweep directories (their runs, found below them) and glob
    patterns. One paragraph when nothing is found."""
    paths: list[Path] = []
    for item in inputs:
        matches = sorted(glob.glob(item, recursive=True)) if any(c in item for c in "*?[") else [item]
        for m in matches:
            p = Path(m).expanduser()
            if (p / "config.yaml").is_file():
                paths.append(p)
            elif p.is_dir():
                paths += sorted(c.parent for c in p.rglob("config.yaml") if ".hydra" not in c.parts)
    paths = list(dict.fromkeys(p.resolve() for p in paths))
    if not paths:
        raise UserError(f"no runs found in {', '.join(inputs)}: a run is a directory with the config.yaml that "
                        "train.py writes (logs/<task>/runs/<time>/, or the numbered jobs of a multirun under "
                        "logs/<task>/multiruns/<time>/). Give run or multirun directories, or a glob such as "
                        "'logs/*/multiruns/*'.")
    runs, damaged = [], []
    for p in paths:
        try:
            runs.append(load_run(p))
        except DamagedRun as e:
            damaged.append(str(e))
    for line in damaged:  # the others are compared; each one left out is named
        log.warning("left out %s", line)
    if not runs:
        raise UserError(f"no run in {', '.join(inputs)} can be read: " + "; ".join(damaged) + ". Fix or remove "
                        "those files (a run's config.yaml is written when it starts), or give other runs.")
    paths = [r.path for r in runs]
    names = _short_names(paths)
    for run, name in zip(runs, names):
        run.name = clean(name)
    return runs


def _short_names(paths: list[Path]) -> list[str]:
    """The shortest path tails that tell the runs apart (e.g. 2026-11-26_10-00-00/3)."""
    for depth in range(1, 6):
        names = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


def differing_keys(runs: list[Run]) -> list[str]:
    """The config keys whose values are not the same in every run (a key some runs lack counts), without the
    keys that only place or print a run."""
    keys = sorted({k for r in runs for k in r.config})
    missing = object()
    out = []
    for k in keys:
        if k.startswith(NOT_SETTINGS) or any(_inside(r.config.get(k), r) for r in runs):
            continue  # where the run wrote (its checkpoint folder, ...), not what it computed
        values = {json.dumps(r.config.get(k, missing), sort_keys=True, default=str) for r in runs}
        if len(values) > 1:
            out.append(k)
    return out


def _inside(value: Any, run: Run) -> bool:
    """Whether a config value names a place in the run's folder: where the folder is now, or where the run wrote it
    (its paths.output_dir: a folder copied off a cluster, or reached through a link, still names that one)."""
    if not isinstance(value, str):
        return False
    folders = [str(f) for f in (run.path, run.config.get("paths.output_dir")) if f and Path(str(f)).is_absolute()]
    return any(value == f or value.startswith(f.rstrip("/") + "/") for f in folders)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (isinstance(x, float) and math.isnan(x))
