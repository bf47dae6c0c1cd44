"""Comparing runs offline: `attnlab-compare` (attnlab.compare.cli), from run folders alone."""

from attnlab.compare.cli import compare, main, show_diff

__all__ = ["compare", "main", "show_diff"]
