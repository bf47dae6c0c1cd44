"""attnlab: train, compare and sweep attention models with PyTorch Lightning and Hydra.

Importing the package is cheap: torch, timm and datasets are imported only by the modules that need them.
"""

from attnlab.lean_imports import install as _install_lean_imports

__version__ = "0.1.0"

_install_lean_imports()  # Lightning, whenever a module of attnlab first imports it, as the entry points import it
