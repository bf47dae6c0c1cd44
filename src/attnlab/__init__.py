"""attnlab: train, compare and sweep attention models with PyTorch Lightning and Hydra.

Importing the package is cheap and changes nothing global: torch, Lightning, timm and datasets are imported by the
modules that use them.
"""

__version__ = "0.1.0"
