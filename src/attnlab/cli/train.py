"""python train.py [group=option ...] [key=value ...]  — see README.md for the grammar."""

from __future__ import annotations

import sys
from functools import partial

import hydra
from omegaconf import DictConfig

from attnlab.cli.app import run_process
from attnlab.config import CONF_DIR, register_resolvers

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    from attnlab.cli.app import run_app
    from attnlab.cli.training import train

    return run_app(train, cfg)


def main() -> float | None:
    from attnlab.cli.app import check_output_paths, fail_before_hydra, null_groups
    from attnlab.cli.hydra_errors import check_composes

    sys.argv[1:] = null_groups(sys.argv[1:], CONF_DIR)
    from attnlab.cli.plugins import check_plugins

    fail_before_hydra(check_plugins, sys.argv[1:], CONF_DIR)  # a launcher or sweeper plugin that is not installed
    fail_before_hydra(check_output_paths, sys.argv[1:])
    fail_before_hydra(check_composes, sys.argv[1:], CONF_DIR, "train")  # attnlab's paragraph, not Hydra's
    return _main()


# the `train.py` script and the `attnlab-train` command: main(), then the process ends without teardown
run = partial(run_process, main)


if __name__ == "__main__":
    run()
