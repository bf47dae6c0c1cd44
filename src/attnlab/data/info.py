"""`DataInfo`, what a prepared data module tells the task: declared with the data module's other hooks in
attnlab.protocols.data, and importable here."""

from attnlab.protocols.data import DataInfo

__all__ = ["DataInfo"]
