"""`train` (attnlab.cli.train) and a sweep's results-table writer `append_row` (attnlab.cli.report) under one
import path, for notebooks, tests and sweepers."""

from attnlab.cli.report import append_row
from attnlab.cli.train import train

__all__ = ["append_row", "train"]
