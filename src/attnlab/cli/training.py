"""The training run's function and a sweep's results table, under the names earlier versions imported them by:
the run itself reads top to bottom in attnlab.cli.train."""

from attnlab.cli.report import append_row
from attnlab.cli.train import train

__all__ = ["append_row", "train"]
