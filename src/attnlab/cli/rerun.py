"""`python train.py --rerun <run dir> [key=value ...]`: train a run's own config again, into a new run folder.

The config is the one the run composed (`<run dir>/.hydra/config.yaml`, interpolations unresolved), not a new
composition of its overrides, so a run (a sweep's job too) is reproduced as it ran; paths resolve anew, and the plan
decides again on this machine. Each decision that differs from the run's, and each lineage key that differs (the
code's commit or uncommitted changes, package versions, the hardware), is one warning line."""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.errors import UserError
from attnlab.utils.printable import printable

log = logging.getLogger("attnlab")
FLAG = "--rerun"
# the run being trained again, and a sweep's own command line, as lineage records them (attnlab.lineage)
RERUN_ENV, SWEEP_COMMAND_ENV = "ATTNLAB_RERUN_OF", "ATTNLAB_SWEEP_COMMAND"
# lineage keys whose difference can change results
_COMPARED = ("attnlab", "git.commit", "git.dirty", "python", "packages.", "accelerator.")
# in a rerun (set by `config`): the run folder, and the keys the run and this command line give (Hydra's own task
# overrides are only the rerun's task_name)
_run_dir: Path | None = None
_asked: list[str] = []
# what --rerun was given: the run folder, or a file in it (a checkpoint, read as every checkpoint is: check_given)
_given: Path | None = None
# `--rerun <run dir> [key=value ...]` on this command line (split_argv): (the run folder, the keys changed on purpose),
# which cli/train.py trains instead of the composed config
_request: tuple[Path, list[str]] | None = None
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")


def split_argv(argv: list[str]) -> tuple[Path | None, list[str]]:
    """(the run folder given to --rerun, the other arguments), kept as the rerun asked for (`_request`)."""
    global _given, _request
    _request = None
    for i, arg in enumerate(argv):
        if arg == FLAG or arg.startswith(FLAG + "="):
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            rest = argv[:i] + argv[i + (1 if "=" in arg else 2):]
            if not value or value.startswith("-"):
                raise UserError(f"{FLAG} needs the run folder to train again: python train.py {FLAG} "
                                "logs/train/runs/<time> (the folder a run prints as 'run directory:').")
            _given = Path(value)
            _request = (run_folder(Path(value)), rest)
            return _request
    return None, argv


def run_folder(given: Path) -> Path:
    """The run folder holding `given` (the folder itself, or a file or folder inside it, such as a checkpoint)."""
    path = given.expanduser().absolute()
    for folder in (path, *path.parents):
        if (folder / ".hydra" / "config.yaml").is_file():
            return folder
    raise UserError(f"{FLAG} {given}: not a run folder of attnlab (no .hydra/config.yaml in it or above it). Give "
                    "the folder a run printed as 'run directory:', e.g. logs/train/runs/<time>, or a job folder of a "
                    "multirun, logs/train/multiruns/<time>/<job>.")


def overrides(run_dir: Path, extra: list[str]) -> list[str]:
    """What Hydra composes for the rerun: a single run of the run's task (its config replaces the composed one in
    `config`); `extra` are keys changed on purpose (`seed=1`), applied to the run's config instead."""
    bad = [a for a in extra if a.startswith("-") or "=" not in a or a.startswith(("~", "hydra."))]
    if bad:
        raise UserError(f"{FLAG} trains a run's own config again; {bad[0]} cannot go with it. Give key=value pairs "
                        f"to change on purpose (python train.py {FLAG} {run_dir} seed=1), or start a new run.")
    os.environ[RERUN_ENV] = str(run_dir)
    return [f"task_name={saved(run_dir).get('task_name', 'train')}", "hydra.mode=RUN"]


def saved(run_dir: Path) -> DictConfig:
    try:
        cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    except Exception as e:  # a truncated or hand-edited file
        raise UserError(f"{FLAG} {run_dir}: its .hydra/config.yaml cannot be read ({e}). Rerun another run, or "
                        "start this one anew from its command (lineage.json, 'command').") from None
    assert isinstance(cfg, DictConfig)
    return cfg


def config(run_dir: Path, extra: list[str], out_dir: Path) -> DictConfig:
    """The run's own config with `extra` applied, also written as the new run's .hydra/config.yaml (so that it can be
    rerun in turn); the lineage differences warned about."""
    from attnlab.checkpoints import trust

    cfg = saved(run_dir)
    # a run folder can come from anywhere: it never trusts itself, and what its config names is built only when this
    # command names it too, or trusts it (trust_checkpoint=true here)
    trusted = [a for a in extra if a.lstrip("+").partition("=")[0] == trust.TRUST_KEY]
    extra = [a for a in extra if a not in trusted]
    asked_trust = any(yaml_value(a.partition("=")[2]) is True for a in trusted)
    with open_dict(cfg):
        cfg[trust.TRUST_KEY] = asked_trust
    OmegaConf.set_struct(cfg, True)
    for arg in extra:
        key, _, value = arg.lstrip("+").partition("=")
        node = OmegaConf.select(cfg, key, default=None)
        if isinstance(node, DictConfig):
            raise UserError(f"{FLAG}: {arg} would choose another {key} config; a rerun keeps the run's own groups. "
                            f"Change keys ({key}.<key>=...), or start a new run with {arg}.")
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>" and not arg.startswith("+"):
            raise UserError(f"{FLAG}: {key} is not a key of the run's config. Check its spelling against "
                            f"{run_dir}/config.yaml, or add a new key with +{arg}.")
        OmegaConf.update(cfg, key, yaml_value(value), force_add=arg.startswith("+"))
    trust.from_command({trust.TRUST_KEY: asked_trust}, overrides=extra, seal=True)  # never the folder's own
    check_given(_given)
    trust.check_names(OmegaConf.to_container(cfg, resolve=False), f"{FLAG} {run_dir} (its .hydra/config.yaml)")
    from attnlab.utils.atomic import write_text

    global _run_dir, _asked
    src = run_dir / ".hydra" / "overrides.yaml"
    job = [str(o) for o in OmegaConf.load(src)] if src.is_file() else []
    _run_dir, _asked = run_dir, [*job, *extra]
    hydra_dir = out_dir / ".hydra"
    if hydra_dir.is_dir():
        write_text(hydra_dir / "config.yaml", OmegaConf.to_yaml(cfg))
        write_text(hydra_dir / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(_asked)))
    log.info(f"rerun of {run_dir}: its own config{' with ' + ' '.join(extra) if extra else ''}, into {out_dir}")
    warn_lineage(run_dir)
    return cfg


def check_given(given: Path | None) -> None:
    """A checkpoint given to --rerun as the file of its run folder is read as every checkpoint is (what it asks for,
    what its config names), though the rerun trains anew without it: a file that cannot be loaded safely is refused,
    never passed over."""
    from attnlab.checkpoints.reading import load_checkpoint
    from attnlab.checkpoints.sharded import is_sharded

    path = given.expanduser() if given is not None else None
    if path is not None and (is_sharded(path) or path.is_file() and (
            path.suffix in CHECKPOINT_SUFFIXES or path.parent.name == "checkpoints")):
        load_checkpoint(path, FLAG, mmap=path.is_file())


def yaml_value(text: str) -> Any:
    return OmegaConf.create({"v": text}).v if text == "" else OmegaConf.create(f"v: {text}").v


def warn_lineage(run_dir: Path) -> None:
    """One warning line for each lineage key that differs from the run's and can change results."""
    import torch  # noqa: F401  (lineage records torch's threads once torch is loaded, as in the run)

    from attnlab import lineage

    before = lineage.read(run_dir)
    if before is None:
        return
    now, diff = lineage.collect()
    old, new = lineage.flatten(before), lineage.flatten(now)
    for key in sorted(set(old) | set(new)):
        if key.startswith(_COMPARED) and old.get(key) != new.get(key):  # the folder's text, shown printable
            log.warning(printable(f"rerun: {key} differs from the run's: {old.get(key)} -> {new.get(key)}"))
    if before.get("git") and now.get("git") and before["git"].get("dirty") and now["git"].get("dirty"):
        try:  # both dirty: the changes themselves compared
            if (run_dir / lineage.DIFF).read_text() != diff:
                log.warning("rerun: git.diff differs from the run's: lineage.diff -> other uncommitted changes")
        except OSError:
            pass


def warn_decisions(cfg: DictConfig, decided: dict[str, dict[str, Any]]) -> None:
    """In a rerun, one warning line for each key that the plan decided, for the run or for this rerun, whose value
    differs."""
    if _run_dir is None:
        return
    from attnlab import lineage

    record = lineage.read(_run_dir) or {}
    before = record.get("decided")  # None: a run written before decisions were kept apart
    try:
        used = OmegaConf.load(_run_dir / "config.yaml")
    except Exception:  # no config.yaml: a run that ended before it was written
        used = OmegaConf.create()
    for key in sorted(set(before or {}) | set(decided)):
        old = (before or {}).get(key)
        was = old["decided"] if old else OmegaConf.select(used, key, default=None)
        now = OmegaConf.select(cfg, key, default=None)
        if was is None or was == now:
            continue
        how = f"decided on {old['on']}" if old else "as asked" if before is not None else "as recorded"
        this = f"decided on {decided[key]['on']}" if key in decided else "as asked"
        log.warning(printable(f"rerun: {key}: the original run used {was} ({how}), this one {now} ({this})"))


def record_sweep_command(argv: list[str]) -> None:
    """A multirun's own command line, for the lineage of each of its jobs (whose own command Hydra rewrites)."""
    if {"-m", "--multirun"} & set(argv) or "hydra.mode=MULTIRUN" in argv:
        os.environ.setdefault(SWEEP_COMMAND_ENV, shlex.join(["train.py", *argv]))
