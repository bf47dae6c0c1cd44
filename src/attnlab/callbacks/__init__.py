"""Lightning callbacks of the platform."""

from attnlab.callbacks.checkpoint import ModelCheckpoint
from attnlab.callbacks.nan_guard import NaNGuard
from attnlab.callbacks.optuna_pruning import OptunaPruning
from attnlab.callbacks.progress import ProgressBar
from attnlab.callbacks.summary import ModelSummary
from attnlab.callbacks.throughput import Throughput

__all__ = ["ModelCheckpoint", "ModelSummary", "NaNGuard", "OptunaPruning", "ProgressBar", "Throughput"]
