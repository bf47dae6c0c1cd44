"""Lightning without paying at start-up for the optional packages that torchmetrics imports for metrics a run may
never compute, and without hiding them from any code that does.

Lightning imports torchmetrics, whose `__init__` imports every metric module, and some of those import optional
packages at import time when they are installed: torchvision (and with it `torch._dynamo`; ARNIQA, LPIPS, DISTS,
the detection metrics) and transformers (BERTScore, InfoLM, CLIPScore). On 2 CPU cores that is about 1.8 s of a
run's start that a GPT or BERT run never uses.

`import_lightning()` imports Lightning with those packages *deferred*, not absent: every availability check still
answers as the machine is (nothing is patched), and every `import torchvision` / `from transformers import X` that
runs while torchmetrics imports binds a stand-in that imports the real package the first time it is used (called,
read, subclassed, used in `isinstance`). A code path that needs the package gets it, with the same objects a plain
import gives; a path that never touches it never pays for it. Once Lightning is imported the stand-ins leave
`sys.modules`, so every later import, of these packages or of their submodules, is the ordinary one.

`ATTNLAB_LEAN_IMPORTS=0` imports everything at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import types
from typing import Any

# the optional packages torchmetrics would import when it is imported
DEFERRED = ("torchvision", "transformers")


def import_lightning() -> None:
    """Import lightning.pytorch (and torchmetrics), deferring DEFERRED's imports made meanwhile (see above)."""
    if "torchmetrics" in sys.modules or os.environ.get("ATTNLAB_LEAN_IMPORTS", "1") == "0":
        import lightning.pytorch  # noqa: F401

        return
    finder = _DeferringFinder()
    sys.meta_path.insert(0, finder)
    try:
        import torchmetrics  # noqa: F401
        import lightning.pytorch  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, DeferredModule)]:
            del sys.modules[name]


def _top(name: str) -> str:
    return name.partition(".")[0]


class _DeferringFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds DEFERRED's modules (not yet imported for real) as DeferredModule stand-ins."""

    def find_spec(self, name, path=None, target=None):
        top = _top(name)
        if top not in DEFERRED or (top in sys.modules and not isinstance(sys.modules[top], DeferredModule)):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return DeferredModule(spec.name)

    def exec_module(self, module):
        pass


class DeferredModule(types.ModuleType):
    """A module of a deferred package: its attributes are Deferred values until the real module is imported."""

    def __getattr__(self, attr: str) -> Any:
        if attr == "__version__":  # a version check needs no import
            return importlib.metadata.version(_top(self.__name__))
        if attr.startswith("__"):  # what the import system and introspection probe for: absent, as on a new module
            raise AttributeError(attr)
        return Deferred(self.__name__, attr)


def _real_module(name: str) -> types.ModuleType:
    module = sys.modules.get(name)
    if isinstance(module, DeferredModule):  # still a stand-in: only while Lightning imports
        for stale in [n for n in sys.modules if _top(n) == _top(name)]:
            if isinstance(sys.modules[stale], DeferredModule):
                del sys.modules[stale]
    return importlib.import_module(name)


class Deferred:
    """`module.attr` of a deferred module: the real object, imported at its first use."""

    __slots__ = ("_module", "_attr", "_value")

    def __init__(self, module: str, attr: str):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_attr", attr)

    def resolve(self) -> Any:
        try:
            return object.__getattribute__(self, "_value")
        except AttributeError:
            pass
        module, attr = object.__getattribute__(self, "_module"), object.__getattribute__(self, "_attr")
        real = _real_module(module)
        try:
            value = getattr(real, attr)
        except AttributeError:  # a submodule that its package does not import itself
            value = importlib.import_module(f"{module}.{attr}")
        object.__setattr__(self, "_value", value)
        return value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resolve(), name)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __getitem__(self, key):
        return self.resolve()[key]

    def __iter__(self):
        return iter(self.resolve())

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, self.resolve())

    def __subclasscheck__(self, cls) -> bool:
        return issubclass(cls, self.resolve())

    def __mro_entries__(self, bases):  # `class X(deferred_class)`: the real class is the base
        return (self.resolve(),)

    def __or__(self, other):
        return self.resolve() | other

    def __ror__(self, other):
        return other | self.resolve()

    def __repr__(self) -> str:
        module, attr = object.__getattribute__(self, "_module"), object.__getattribute__(self, "_attr")
        return f"<deferred {module}.{attr}>"
