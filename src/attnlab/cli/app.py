"""What every entry point does around its work: warnings, the config print-out, and user-facing errors."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf

# fail, fail_before_hydra and user_message are attnlab.errors', importable here too
from attnlab.errors import ERROR_MARK, UserError, fail, fail_before_hydra, user_message  # noqa: F401


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
    """What every entry point does first with its composed config: prepared (attnlab.config.prepare), a model/data
    pair of other kinds refused, then, where extras.print_config asks, the config (secrets redacted) printed as a Rich
    tree, one branch per group, and saved to the run's config_tree.log."""
    from attnlab.checkpoints import trust
    from attnlab.config import check_compatible, prepare

    prepare(cfg)
    if "model" in cfg and "data" in cfg:
        check_compatible(cfg)
    trust.from_command(cfg)  # whether this command trusts its files, and what its own config names
    from attnlab.redact import redact, redact_logs, restore

    redact_logs()  # the run's log lines, on the console and in its log file, never hold a secret's value
    printed = (cfg.get("extras") or {}).get("print_config") and _is_rank_zero()
    shown = OmegaConf.create(redact(OmegaConf.to_container(cfg, resolve=True))) if printed else None
    restore(cfg)  # the secrets taken off the command line, in memory only (attnlab.redact)
    if shown is None:
        return
    import rich
    import rich.syntax
    import rich.tree

    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    for key in [k for k in TREE_ORDER if k in shown] + [k for k in shown if k not in TREE_ORDER and k != "hydra"]:
        branch = tree.add(key, style="bold", guide_style="dim")
        if OmegaConf.is_missing(shown, key):  # a required value the command line did not give: the app says which
            branch.add(rich.syntax.Syntax("???", "yaml"))
            continue
        node = shown[key]
        text = OmegaConf.to_yaml(node, resolve=True) if isinstance(node, DictConfig) else str(node)
        branch.add(rich.syntax.Syntax(text, "yaml"))
    rich.print(tree)
    save_to = Path(cfg.paths.output_dir) / "config_tree.log"
    save_to.parent.mkdir(parents=True, exist_ok=True)
    with open(save_to, "w") as f:
        rich.print(tree, file=f)


# the order in which the printed tree shows the config groups; any other key follows, `hydra` never
TREE_ORDER = ("data", "model", "optimizer", "scheduler", "callbacks", "logger", "trainer", "paths", "extras")


def run_process(main: Callable[[], Any]) -> None:
    """A script's whole process: `main()`, then, with torch loaded, the end of the process without the interpreter's
    teardown of the modules (`end_process`), which takes over a second. An exception ends with its traceback and
    status 1; Ctrl-C outside training with one line and status 130."""
    try:
        main()
        code: Any = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:  # Ctrl-C outside training (Lightning handles it in fit): one line, no traceback
        print("\nattnlab: interrupted (Ctrl-C); run the same command again to start over (caches and checkpoints "
              "are written whole or not at all).", file=sys.stderr)
        code = 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    if "torch" not in sys.modules:  # nothing heavy to tear down (--help, --cfg job)
        sys.exit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    end_process(code or 0)


# how long the end of a process may wait for threads and exit handlers before it exits without them
EXIT_GRACE_ENV = "ATTNLAB_EXIT_GRACE_S"
DEFAULT_EXIT_GRACE_S = 60.0


def end_process(code: int) -> NoReturn:
    """End the process with status `code` through `sys.exit` (threads joined, exit handlers run), then `os._exit`,
    skipping the teardown of the modules. Bounded: if a thread or a handler still holds the process after
    $ATTNLAB_EXIT_GRACE_S seconds (60), one line names what, and the process exits with `code`."""
    import threading

    from attnlab.utils.env import seconds

    grace = seconds(EXIT_GRACE_ENV, DEFAULT_EXIT_GRACE_S)
    watchdog = threading.Thread(target=_exit_after, args=(grace, code), name="attnlab-exit-watchdog", daemon=True)
    watchdog.start()
    atexit.register(_end_without_teardown, code)
    sys.exit(code)


def _end_without_teardown(code: int) -> None:
    """The first exit handler the interpreter calls (the last registered): the other handlers, then `os._exit`."""
    from attnlab.compat import run_exit_handlers

    atexit.unregister(_end_without_teardown)
    if not run_exit_handlers():  # another interpreter: it calls the handlers itself, then tears the modules down
        return
    _flush_streams()
    os._exit(code)


def _exit_after(grace: float, code: int) -> None:
    """The watchdog of `end_process`: a daemon thread, so it runs while the main thread waits."""
    import threading
    import time

    time.sleep(grace)
    held = [t.name for t in threading.enumerate()
            if t is not threading.current_thread() and t is not threading.main_thread() and not t.daemon]
    what = f"threads still running: {', '.join(held)}" if held else "an exit handler has not returned"
    _flush_streams()
    print(f"attnlab: the run had ended (status {code}) but the process was still held after {grace:g} s ({what}); "
          f"exiting without waiting further (${EXIT_GRACE_ENV} sets the wait).", file=sys.stderr, flush=True)
    os._exit(code)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream
            pass


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
