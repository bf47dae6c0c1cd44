"""What every entry point does around its work: warnings, the config print-out, and user-facing errors."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# fail, fail_before_hydra and user_message are attnlab.errors', importable here too
from attnlab.errors import ERROR_MARK, UserError, fail, fail_before_hydra, user_message  # noqa: F401

log = logging.getLogger("attnlab")


def run_app(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run an entry point's work on its composed config: warnings as configured, a UserError (or a fault of the
    machine, cli/faults.py) shown as one paragraph with exit status 2, and nothing left behind for the next job of a
    multirun (W&B run, process group)."""
    extras = cfg.get("extras") or {}
    if extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
        logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    env_before = dict(os.environ)
    try:
        return fn(cfg)
    except UserError as e:
        fail(e)
    except Exception as e:  # a UserError raised in a DataLoader worker comes back as another type
        if ERROR_MARK in str(e):
            fail(e)
        from attnlab.cli.faults import explain

        fault = explain(e, cfg)  # a full disk, a read-only folder, shared memory too small: one paragraph
        if fault is not None:
            fail(fault)
        raise
    finally:
        _finish_wandb()
        _reset_distributed(env_before)


def begin(cfg: DictConfig) -> None:
    """What every entry point does first with its composed config: the user's modules imported and the platform
    keys filled in (attnlab.config.prepare), a model/data pair of other kinds refused (before an interpolation
    between them fails to resolve), then the config tree printed where extras.print_config asks."""
    from attnlab.config import check_compatible, prepare

    prepare(cfg)
    if "model" in cfg and "data" in cfg:
        check_compatible(cfg)
    if (cfg.get("extras") or {}).get("print_config") and _is_rank_zero():
        from attnlab.utils.rich_config import print_config_tree

        print_config_tree(cfg, Path(cfg.paths.output_dir) / "config_tree.log")


def run_process(main: Callable[[], Any]) -> None:
    """A script's whole process: `main()`, then what a normal exit runs (non-daemon threads joined, the atexit
    handlers: log files, W&B, DataLoader workers), then the end of the process without the interpreter's teardown
    of its modules. With torch loaded, that teardown takes over a second and pages in about 0.13 GB: more than
    a small run's training adds to its peak memory. An exception ends the usual way, with its traceback."""
    try:
        main()
        code: Any = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:  # Ctrl-C outside training (Lightning handles it in fit): one line, no traceback
        print("\nattnlab: interrupted (Ctrl-C); run the same command again to start over (caches and checkpoints "
              "are written whole or not at all).", file=sys.stderr)
        code = 130
    if "torch" not in sys.modules:  # nothing heavy to tear down (--help, --cfg job)
        sys.exit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream
            pass
    os._exit(code or 0)


def null_groups(argv: list[str], conf_dir: Path) -> list[str]:
    """`logger=null` (or `none`) for a config group means "no logger": Hydra's own spelling is `~logger`, and Hydra
    stops at `group=null` with a traceback."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and value.lower() in ("null", "none") and key.isidentifier() and (conf_dir / key).is_dir() \
                and not (conf_dir / key / f"{value}.yaml").is_file():
            arg = f"~{key}"
        out.append(arg)
    return out


# where a run writes, from the environment or the command line: checked before Hydra creates the run directory
_OUTPUT_ENV = ("ATTNLAB_LOG_DIR", "ATTNLAB_CACHE_DIR")
_OUTPUT_KEYS = ("paths.log_dir", "paths.cache_dir", "paths.root_dir", "hydra.run.dir", "hydra.sweep.dir")


def check_output_paths(argv: list[str]) -> None:
    """A log or cache folder that cannot be created (a path under a regular file) or written is named with the
    fix, instead of Hydra's traceback when it makes the run directory."""
    given = [(k, os.environ[k]) for k in _OUTPUT_ENV if os.environ.get(k)]
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key in _OUTPUT_KEYS and value and "${" not in value:
            given.append((key, value))
    for name, value in given:
        path = Path(value).expanduser().absolute()
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            raise UserError(f"{name}={value} cannot be created: {existing} is a file, not a folder. Point {name} at a "
                            "folder (it is created when missing).")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"{name}={value} cannot be written: this user may not write in {existing}. Point {name} "
                            "at a folder you can write to.")


def _is_rank_zero() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def _reset_distributed(env_before: dict[str, str]) -> None:
    """Leave no process group or rendezvous variables behind for the next job of a multirun."""
    if "torch" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    for key in set(os.environ) - set(env_before):
        del os.environ[key]


def _finish_wandb() -> None:
    """End the W&B run so the next job of a multirun starts its own."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()


def save_resolved_config(cfg: DictConfig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, path, resolve=True)
