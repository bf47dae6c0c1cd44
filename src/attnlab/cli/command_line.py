"""The one step before Hydra: an entry point's command line checked and made ready for it (`before_hydra`).

Secrets are taken off it, and a mistake that Hydra would answer with a traceback or its own message (a plugin that is
not installed, an output folder that cannot be written, an option or key that does not compose) is answered first
with one paragraph.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Command:
    argv: list[str]                                # what Hydra reads
    rerun: tuple[Path, list[str]] | None = None    # train.py --rerun <run dir>: the folder and the keys changed


def before_hydra(argv: list[str], entry: str) -> Command:
    """`argv` of the entry point `entry` (train, eval, predict, export: its config's name), checked and rewritten;
    a mistake ends the process with one paragraph (exit status 2)."""
    from attnlab.cli.app import check_output_paths, null_groups
    from attnlab.cli.hydra_errors import check_composes
    from attnlab.compat import pin_hydra_mode
    from attnlab.config import CONF_DIR
    from attnlab.errors import UserError, fail, fail_before_hydra
    from attnlab.redact import take_secret_overrides

    argv = take_secret_overrides(argv)  # kept from Hydra's files and the lineage
    rerun = None
    if entry == "train":
        from attnlab.cli import rerun as reruns

        try:
            rerun_dir, argv = reruns.split_argv(argv)
            if rerun_dir is not None:  # the run's own config replaces the composed one (cli/rerun.py)
                rerun, argv = (rerun_dir, argv), reruns.overrides(rerun_dir, argv)
        except UserError as e:
            fail(e)
        reruns.record_sweep_command(argv)
    argv = null_groups(argv, CONF_DIR)
    if entry == "train":
        from attnlab.cli.plugins import check_plugins

        fail_before_hydra(check_plugins, argv, CONF_DIR)
    fail_before_hydra(check_output_paths, argv)
    composed = fail_before_hydra(check_composes, argv, CONF_DIR, entry)  # each variant of a sweep, once
    pin_hydra_mode(composed.mode if composed else None)
    if entry == "train":
        from attnlab.cli.slurm import fit_command_line

        try:
            argv = fit_command_line(argv, composed)
        except UserError as e:
            fail(e)
    return Command(argv, rerun)
