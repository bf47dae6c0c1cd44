"""attnlab: train, compare and sweep attention models with PyTorch Lightning and Hydra.

Importing the package is cheap: torch, timm and datasets are imported only by the modules that need them.
"""

__version__ = "0.1.0"
