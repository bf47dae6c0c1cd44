"""The one step before Hydra: an entry point's command line checked and made ready for it (`before_hydra`); and the
entry points built on it (`entry_point`: train, eval, export, predict).

Secrets are taken off it, and a mistake that Hydra would answer with a traceback or its own message (a plugin that is
not installed, an output folder that cannot be written, an option or key that does not compose) is answered first
with one paragraph.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any


def before_hydra(argv: list[str], entry: str) -> list[str]:
    """`argv` of the entry point `entry` (train, eval, predict, export: its config's name), checked and rewritten;
    a mistake ends the process with one paragraph (exit status 2)."""
    from attnlab.cli.app import check_output_paths, null_groups
    from attnlab.cli.hydra_errors import check_composes
    from attnlab.compat import pin_hydra_mode
    from attnlab.config import CONF_DIR
    from attnlab.errors import UserError, fail
    from attnlab.redact import take_secret_overrides

    argv = take_secret_overrides(argv)  # kept from Hydra's files and the lineage
    try:
        if entry == "train":
            from attnlab.cli import rerun as reruns

            rerun_dir, argv = reruns.split_argv(argv)
            if rerun_dir is not None:  # the run's own config replaces the composed one (cli/rerun.py)
                argv = reruns.overrides(rerun_dir, argv)
            reruns.record_sweep_command(argv)
        argv = null_groups(argv, CONF_DIR)
        if entry == "train":
            from attnlab.cli.plugins import check_plugins

            check_plugins(argv, CONF_DIR)
        check_output_paths(argv)
        composed = check_composes(argv, CONF_DIR, entry)  # each variant of a sweep, once
        pin_hydra_mode(composed.mode if composed else None)
        if entry == "train":
            from attnlab.cli.slurm import fit_command_line

            argv = fit_command_line(argv, composed)
    except UserError as e:
        fail(e)
    return argv


def entry_point(config_name: str, work: Callable[[Any], Any], prepare: Callable[[list[str]], list[str]] | None = None
                ) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(main, run) of the entry point of the config `config_name`: `main()` readies the command line (`prepare`, then
    `before_hydra`), composes the config and runs `work(cfg)` through `run_app`; `run()`, the script and its command,
    is `main()`, then the end of the process without teardown."""
    import hydra

    from attnlab.cli.app import run_app, run_process
    from attnlab.config import CONF_DIR, register_resolvers

    register_resolvers()  # the resolvers the configs name, before Hydra composes (or a job of a sweep resolves) them

    def task(cfg):
        return run_app(work, cfg)

    task.__module__ = f"attnlab.cli.{config_name}"  # what Hydra names the job, and its <job>.log, after
    composed = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)(task)

    def main():
        if prepare is not None:
            sys.argv = prepare(sys.argv)
        sys.argv[1:] = before_hydra(sys.argv[1:], config_name)  # the one step before Hydra
        return composed()

    return main, partial(run_process, main)
