"""What a run continues from (`ckpt_path=`, `ckpt_path=last`: the newest run's, or with `resume=true` the run
directory's own last.ckpt), the metadata attnlab stores in its checkpoints, and the refusals of a checkpoint that
cannot continue this run (another task, another network, another optimizer)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab.checkpoints.reading import load_checkpoint, newest_last
from attnlab.errors import UserError
from attnlab.utils.dotted import flatten
from attnlab.checkpoints.sharded import is_checkpoint

log = logging.getLogger("attnlab")


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run starts from: none, `ckpt_path=` (or, with train=false, the one it tests), or its run
    directory's own last.ckpt (`in_run_dir`); `meta` is what attnlab stored in it."""

    ckpt_path: str | None = None
    in_run_dir: bool = False
    meta: dict = field(default_factory=dict)


def resume_point(ckpt_path: str | None, log_dir: Path, task_name: str, checkpoints: Path, train: bool,
                 resume: bool, model_target: str) -> ResumePoint:
    """Where the run starts from, its checkpoint read and checked against the task the run builds."""
    given = resolve_checkpoint(ckpt_path, str(log_dir), task_name)
    if not train and not given:
        raise UserError("train=false tests a trained model, but no ckpt_path was given: add "
                        "ckpt_path=<run dir>/checkpoints/best.ckpt (or ckpt_path=last), or drop train=false.")
    own = checkpoint_in_run_dir(checkpoints, resume) if not given and train else None
    path = given or own
    if not path:
        return ResumePoint()
    meta = read_run_metadata(path)
    check_same_task(meta, model_target, path, run_dir=bool(own))
    return ResumePoint(path, bool(own), meta)


def resolve_checkpoint(ckpt_path: str | None, log_dir: str, task_name: str | None = None) -> str | None:
    if not ckpt_path:
        return None
    if str(ckpt_path) == "last":
        last = newest_last(Path(log_dir) / task_name if task_name else Path(log_dir))
        if last is None:
            where = Path(log_dir) / (task_name or "")
            raise UserError(
                f"ckpt_path=last: no last.ckpt under {where}. Train first, or give the checkpoint's path "
                "(ckpt_path=logs/<task>/runs/<time>/checkpoints/last.ckpt)."
            )
        log.info("ckpt_path=last: %s", last)
        return str(last)
    path = Path(ckpt_path)
    if not is_checkpoint(path):
        near = sorted(str(p) for p in path.parent.glob("*.ckpt")) if path.parent.is_dir() else []
        raise UserError(
            f"ckpt_path={ckpt_path} does not exist. "
            + (f"Checkpoints in {path.parent}: {', '.join(near)}. " if near else "")
            + "Give the path of a .ckpt written by train.py (in <run dir>/checkpoints/), or ckpt_path=last."
        )
    return str(path)


def checkpoint_in_run_dir(checkpoints: Path, resume: bool) -> str | None:
    """The run directory's own last.ckpt (in `checkpoints`, its checkpoint folder) when there is one and `resume` is
    on: an interrupted run started again in its directory continues at the step and batch it stopped. With `resume`
    off, a warning that the run starts over, and None."""
    last = checkpoints / "last.ckpt"  # a file, or the folder of a sharded checkpoint (attnlab.checkpoints.sharded)
    if not is_checkpoint(last):
        return None
    if not resume:
        log.warning("resume=false: starting over in %s; its checkpoints will be replaced", last.parents[1])
        return None
    log.info("resuming from %s: this run directory holds an earlier run of it (resume=false starts over)", last)
    return str(last)


def read_run_metadata(ckpt_path: str) -> dict:
    """The run metadata attnlab stored in a checkpoint (resolved config, W&B id, lineage, ...), with the checkpoint's
    `global_step` and its weights' `shapes`; UserError for a checkpoint attnlab did not write."""
    ckpt = load_checkpoint(ckpt_path, mmap=True)
    meta = ckpt.get("attnlab")
    if not meta:
        raise UserError(f"{ckpt_path} was not written by attnlab's train.py (it holds no run config): "
                        "give a checkpoint from <run dir>/checkpoints/.")
    shapes = {k: tuple(v.shape) for k, v in (ckpt.get("state_dict") or {}).items() if isinstance(v, torch.Tensor)}
    return dict(meta) | {"global_step": ckpt.get("global_step"), "shapes": shapes}


def check_continues(point: ResumePoint, model: torch.nn.Module, config: dict) -> None:
    """The checkpoint a run continues must fit the run built from `config` (resolved): one given with ckpt_path= its
    optimizer's kind and its network's shapes (check_resumable), its run directory's own its whole model config."""
    if point.ckpt_path and not point.in_run_dir:
        check_resumable(point.meta, model, config.get("optimizer"), point.ckpt_path)
    elif point.in_run_dir:
        check_same_model(point.meta, config["model"], point.ckpt_path)


def check_resumable(meta: dict, model: torch.nn.Module, optimizer_cfg: dict | None, ckpt_path: str) -> None:
    """A checkpoint continued with ckpt_path= must fit the run being built: its optimizer state the optimizer's
    kind, its weights the network's shapes (`ckpt_path=last` takes the newest run of the task, whatever its
    settings)."""
    before = (meta["config"].get("optimizer") or {}).get("_target_")
    now = (optimizer_cfg or {}).get("_target_")
    if before and now and before != now:
        raise UserError(
            f"checkpoint {ckpt_path} was trained with optimizer {before}, whose state cannot continue in this run's "
            f"{now}. Resume with the checkpoint's optimizer (its run's config.yaml), or start a new run without "
            "ckpt_path."
        )
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes = meta.get("shapes") or {}
    wrong = sorted(k for k in own.keys() & shapes.keys() if own[k] != shapes[k])
    if wrong:
        shown = ", ".join(f"{k}: {shapes[k]} in the checkpoint, {own[k]} here" for k in wrong[:3])
        raise UserError(
            f"checkpoint {ckpt_path} holds a network of other sizes than this run builds ({shown}"
            f"{', ...' if len(wrong) > 3 else ''}). Resume with the checkpoint's own model and data settings (its "
            "run's config.yaml), or start a new run without ckpt_path."
        )


def check_same_task(meta: dict, model_target: str, ckpt_path: str, run_dir: bool = False) -> None:
    ckpt_target = meta["config"]["model"]["_target_"]
    if ckpt_target == model_target:
        return
    if run_dir:
        raise UserError(
            f"this run directory holds a run of task {ckpt_target} ({ckpt_path}), which resume=true would "
            f"continue, but this run's model config uses {model_target}. Give the run its own directory (leave "
            "hydra.run.dir out, or pick a new one), or resume=false to start over here (its checkpoints are replaced)."
        )
    raise UserError(
        f"checkpoint {ckpt_path} was trained by task {ckpt_target}, but this run's model config uses "
        f"{model_target}. Pick the model config of that checkpoint's run (its config is in the checkpoint, and "
        "in the run's config.yaml), or start without ckpt_path."
    )


RUNTIME_KEYS = ("compile", "activation_checkpointing")  # how the model runs, not what it is


def check_same_model(meta: dict, model_cfg: dict, ckpt_path: str) -> None:
    """An auto-resumed run must build the model the run directory's checkpoint holds (its runtime keys aside)."""
    before = flatten(meta["config"]["model"], keep_empty=False)
    now = flatten(model_cfg, keep_empty=False)
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k) and k not in RUNTIME_KEYS)
    if changed:
        shown = ", ".join(f"model.{k}: {before.get(k)} -> {now.get(k)}" for k in changed[:6])
        raise UserError(
            f"this run directory holds a run whose model differs from this one ({shown}), and resume=true would "
            f"continue it from {ckpt_path}. Give the new run its own directory (leave hydra.run.dir out, or pick a "
            "new one), or resume=false to start over here (its checkpoints are replaced)."
        )
