"""What pruning saves: the same 8-trial Optuna sweep of the digits ViT (`hparams_search=vit_digits_optuna`), half of
its trials hopeless (learning rates 100x too large), run with `hydra.sweeper.pruner=median` and without a pruner.

    python benchmarks/optuna_pruning.py [--epochs 6] [--out DIR] [overrides ...]

The 8 trials are enqueued in the study before the sweep starts (Optuna's `study.enqueue_trial`; the sweep continues
the study and asks for the enqueued trials first), in the order a real search meets them: two good learning rates
first, then bad and good ones mixed. Only the learning rate varies; the other searched keys are fixed. The median
pruner compares each validation's `val/acc_best` with the completed trials' at the same step, from the third trial
on (n_startup_trials=2) and from the first validation (n_warmup_steps=0).

Each sweep is one `python train.py -m ...` process, with its own study (SQLite) and log folder, under a temporary
folder unless `--out DIR` is given. Prints a markdown table: wall time, trials completed and pruned, the best
`val/acc_best`. Exits non-zero unless both sweeps finished all 8 trials, the sweep with the median pruner pruned at
least one hopeless trial, and the sweep without a pruner pruned none. (The median pruner may also stop a good trial
that is below the median at some validation: it is listed in the table.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
GOOD, BAD = [2e-3, 1.5e-3, 2.5e-3, 3e-3], [0.2, 0.3, 0.4, 0.5]
LRS = [GOOD[0], GOOD[1], BAD[0], GOOD[2], BAD[1], BAD[2], GOOD[3], BAD[3]]  # good ones first, as in a real search
MEDIAN = "{name: median, n_startup_trials: 2, n_warmup_steps: 0}"
FIXED = ["optimizer.lr=tag(log, interval(1e-4, 1.0))", "optimizer.weight_decay=0.05", "model.label_smoothing=0.1",
         "+model.backbone_kwargs.depth=4"]
QUIET = ["extras.print_config=false", "callbacks.progress_bar=null", "callbacks.model_summary=null"]


def sweep(name: str, pruner: str | None, epochs: int, out: Path, overrides: list[str], lrs: list[float]) -> dict:
    """One sweep in a process of its own; its study, read back when it ends."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    storage, study_name = f"sqlite:///{folder / 'study.db'}", f"pruning_{name}"
    study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize")
    for lr in lrs:
        study.enqueue_trial({"optimizer.lr": lr})
    argv = [sys.executable, str(ROOT / "train.py"), "-m", "hparams_search=vit_digits_optuna",
            f"hydra.sweeper.n_trials={len(lrs)}", f"hydra.sweeper.storage={storage}",
            f"hydra.sweeper.study_name={study_name}", f"hydra.sweeper.pruner={pruner or 'null'}",
            f"trainer.max_epochs={epochs}", *FIXED, *QUIET, *overrides]
    env = os.environ | {"ATTNLAB_LOG_DIR": str(folder / "logs")}
    start = time.perf_counter()
    run = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    (folder / "sweep.log").write_text(run.stdout)
    if run.returncode != 0:
        sys.exit(f"the sweep '{name}' failed (exit {run.returncode}):\n{run.stdout[-4000:]}")
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    return {"name": name, "wall": wall, "trials": trials, "complete": complete, "pruned": pruned,
            "best": max((t.value for t in complete), default=None)}


def table(rows: list[dict]) -> str:
    lines = ["| pruner | wall time | trials completed | trials pruned | best val/acc_best "
             "| pruned trials (lr @ step) |", "|---|---|---|---|---|---|"]
    for r in rows:
        pruned = ", ".join(f"{t.params['optimizer.lr']:g} @ {t.last_step}" for t in r["pruned"]) or "-"
        best = f"{r['best']:.4f}" if r["best"] is not None else "-"
        lines.append(f"| {r['name']} | {r['wall']:.0f} s | {len(r['complete'])} | {len(r['pruned'])} | {best} "
                     f"| {pruned} |")
    base, median = rows
    lines.append(f"\nwall time with the median pruner / without: {median['wall'] / base['wall']:.2f}")
    return "\n".join(lines)


def problems(base: dict, median: dict, trials: int, learns: bool = True) -> list[str]:
    """What the sweeps must show: all trials finished, none pruned without a pruner, and (when the trials train long
    enough to tell a hopeless learning rate from a good one) hopeless ones pruned."""
    found = []
    for r in (base, median):
        finished = len(r["complete"]) + len(r["pruned"])
        if finished != trials:
            found.append(f"{r['name']}: {finished} of {trials} trials finished")
    if base["pruned"]:
        found.append(f"none: {len(base['pruned'])} trials pruned without a pruner")
    lrs = [t.params["optimizer.lr"] for t in median["pruned"]]
    if learns and not any(lr in BAD for lr in lrs):
        found.append("median: no hopeless trial was pruned")
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=6, help="trainer.max_epochs of each trial")
    p.add_argument("--out", type=Path, default=None, help="keep the sweeps here (default: a temporary folder)")
    p.add_argument("--smoke", action="store_true", help="a budget too small to learn: check that both sweeps run "
                   "every trial, not which ones the pruner stops")
    p.add_argument("--trials", type=int, default=len(LRS), help="the first this many of the learning rates")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every trial, e.g. trainer.limit_train_batches=8")
    args = p.parse_intermixed_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        rows = [sweep(name, pruner, args.epochs, out, args.overrides, LRS[:args.trials])
                for name, pruner in (("none", None), ("median", MEDIAN))]
        text = table(rows)
        print(text)
        (out / "pruning.md").write_text(text + "\n")
    found = problems(*rows, trials=args.trials, learns=not args.smoke)
    if found:
        sys.exit("pruning benchmark: " + "; ".join(found))


if __name__ == "__main__":
    main()
