"""Lightning without paying at start-up for the optional packages that torchmetrics imports for metrics a run may
never compute, and without hiding them from any code that does, nor pretending they are there when they are not.

Lightning imports torchmetrics, whose `__init__` imports every metric module, and some of those import optional
packages at import time when they are installed: torchvision (and with it `torch._dynamo`; ARNIQA, LPIPS, DISTS,
the detection metrics), transformers (BERTScore, InfoLM, CLIPScore) and scipy (`import scipy.signal`, for the audio
metrics); and every metric module imports `torchmetrics.utilities.plot`, which imports matplotlib (and decorates its
functions with matplotlib's style at import) for `Metric.plot`. On 2 CPU cores that is about 3.5 s of a run's start
(scipy alone 1.1 s, matplotlib 0.45 s) that a GPT or BERT run never uses.

`import_lightning()` imports Lightning with those packages, and torchmetrics' plotting module, *deferred*, not
absent (a name of DEFERRED is a package or a module of one, with its submodules): every `import torchvision` /
`from transformers import X` that runs while torchmetrics imports binds a stand-in that imports the real package the
first time it is used (called, read, subclassed, used in `isinstance`). A code path that needs the package gets it,
with the same objects a plain import gives; a path that never touches it never pays for it. Once Lightning is
imported the stand-ins leave `sys.modules`, so every later import, of these packages or of their submodules, is the
ordinary one.

Nothing is patched, and the deferring finder answers as the machine is, without executing the packages:

- a package: the other finders on `sys.meta_path` are asked for it first; where none finds it (not installed, or
  blocked), there is no stand-in, so `import` raises ModuleNotFoundError, and `importlib.util.find_spec`,
  `package_available` and `RequirementCache`'s module check say it is absent;
- a submodule (`import torchvision.ops`): those finders are asked for it over the real package's folders, so a
  submodule that does not exist fails at import;
- a name (`from transformers import X`, `torchvision.models.resnet50`): a deferred module offers X when X is a
  submodule of it, or occurs as a whole word in its source file or in a Python file below the folder that holds
  that file (where its star imports and lazy import tables, such as transformers' `_import_structure` and the
  `__all__` lists its models folder is read for, spell it). Any other name raises ImportError at the import, as a
  plain import does. A module without a readable `.py` source offers every name. The rule reads text, so it can
  err two ways. A name that is spelled there but not bound (a word in a comment, a local variable) is offered: the
  import succeeds and the ImportError comes at the name's first use. A name bound without being spelled below the
  module's folder (a star import from another package, a name made at run time) is refused while Lightning
  imports, though a plain import would bind it; torchvision and transformers spell every name torchmetrics imports.

The same goes for wandb while timm is first imported (DEFERRED_WHILE): timm imports it at its start for a logging
helper of its own training scripts. Importing attnlab puts that finder on sys.meta_path (`install()`), and it makes
the first import of Lightning or torchmetrics, wherever it comes from, as `import_lightning()` makes it: a process
that imports attnlab's modules without an entry point (a benchmark's child process, a user's script or notebook)
starts as lean as `train.py`.

`ATTNLAB_LEAN_IMPORTS=0` imports everything at once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

# what importing torchmetrics would import that a run may never use: optional packages, and its plotting module
# (which imports matplotlib)
DEFERRED = ("torchvision", "transformers", "scipy", "torchmetrics.utilities.plot")
# scipy is imported for real where gammatone is installed: torchmetrics gives scipy.signal a `hamming` for gammatone
# when scipy (>= 1.13) has none, and a stand-in cannot tell whether it has one without importing it
FOR_REAL_WITH = {"scipy": "gammatone"}

# packages whose own import, whenever it comes, is made with others deferred: timm imports wandb as it starts, for a
# logging helper of its training scripts (timm.utils.summary): 0.5 s of every image run's start. Lightning and
# torchmetrics too, with deferred_packages(), for a process that imports attnlab's modules without an entry point
# (a benchmark's child process, a user's script or notebook): importing attnlab installs the finder (install())
LIGHTNING = ("lightning", "pytorch_lightning", "torchmetrics")
DEFERRED_WHILE = {"timm": ("wandb",), **{name: DEFERRED for name in LIGHTNING}}

# packages a deferred name has asked for for real: no longer deferred, even while the finder is still installed
_UNDEFERRED: set[str] = set()
# how many `deferring` blocks are running (see Deferred.__getattr__)
_DEFERRING = 0


def import_lightning() -> None:
    """Import lightning.pytorch (and torchmetrics), deferring DEFERRED's imports made meanwhile (see above)."""
    if "torchmetrics" in sys.modules or os.environ.get("ATTNLAB_LEAN_IMPORTS", "1") == "0":
        import lightning.pytorch  # noqa: F401

        return
    with deferring(deferred_packages()):
        import torchmetrics  # noqa: F401
        import lightning.pytorch  # noqa: F401
    install()


def install() -> None:
    """_DeferWhile on sys.meta_path (once), while a package of DEFERRED_WHILE is still to be imported; nothing where
    ATTNLAB_LEAN_IMPORTS=0."""
    if os.environ.get("ATTNLAB_LEAN_IMPORTS", "1") == "0" or any(isinstance(f, _DeferWhile) for f in sys.meta_path):
        return
    if any(p not in sys.modules for p in DEFERRED_WHILE):
        sys.meta_path.insert(0, _DeferWhile())


def deferred_packages() -> tuple[str, ...]:
    """DEFERRED, less those FOR_REAL_WITH a package installed on this machine."""
    return tuple(p for p in DEFERRED if p not in FOR_REAL_WITH or _real_spec(FOR_REAL_WITH[p]) is None)


@contextlib.contextmanager
def deferring(packages: tuple[str, ...] = DEFERRED) -> Iterator[None]:
    """Within the block, imports of `packages` (those installed, not yet imported) bind DeferredModule stand-ins;
    on leaving it the stand-ins leave sys.modules."""
    global _DEFERRING
    finder = _DeferringFinder(packages)
    sys.meta_path.insert(0, finder)
    _DEFERRING += 1
    try:
        yield
    finally:
        _DEFERRING -= 1
        sys.meta_path.remove(finder)
        if not _DEFERRING:  # the outermost block: a block within another leaves its stand-ins to the other's end
            for name in [n for n, m in sys.modules.items() if isinstance(m, DeferredModule)]:
                _forget(name)


def _forget(name: str) -> None:
    """The stand-in `name` out of sys.modules, and out of its real parent package, which the import bound it to."""
    stand_in = sys.modules.pop(name)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules and getattr(sys.modules[parent], child, None) is stand_in:
        delattr(sys.modules[parent], child)


def _top(name: str) -> str:
    return name.partition(".")[0]


def _root(name: str, packages: tuple[str, ...]) -> str | None:
    """The name of `packages` that the module `name` is, or is a submodule of; None where there is none."""
    return next((p for p in packages if name == p or name.startswith(p + ".")), None)


def _real_spec(name: str, path: list[str] | None = None) -> importlib.machinery.ModuleSpec | None:
    """The spec the other finders on sys.meta_path give `name` (without executing anything): None where the machine
    has no such module. A finder that refuses it (ModuleNotFoundError) refuses it here too."""
    for finder in list(sys.meta_path):
        if isinstance(finder, (_DeferringFinder, _DeferWhile)) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, path, None)
        if spec is not None:
            return spec
    return None


def _real_spec_of(name: str, path: list[str] | None = None) -> importlib.machinery.ModuleSpec | None:
    """_real_spec of a module or submodule, a submodule looked for over its real parent package's folders."""
    if "." not in name:
        return _real_spec(name)
    parent_name = name.rpartition(".")[0]
    parent = sys.modules.get(parent_name)
    if isinstance(parent, DeferredModule):
        parent_spec = parent.__spec__.loader_state
    else:
        parent_spec = _real_spec_of(parent_name) if path is None else None
    locations = parent_spec.submodule_search_locations if parent_spec is not None else path
    return _real_spec(name, list(locations)) if locations else None


class _DeferringFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of `packages` that exist (and are not yet imported for real) as DeferredModule stand-ins."""

    def __init__(self, packages: tuple[str, ...] = DEFERRED):
        self.packages = packages

    def find_spec(self, name, path=None, target=None):
        root = _root(name, self.packages)
        if root is None or root in _UNDEFERRED or (
                root in sys.modules and not isinstance(sys.modules[root], DeferredModule)):
            return None
        real = _real_spec_of(name, path)
        if real is None:  # not on this machine: the import fails as it would without this finder
            return None
        spec = importlib.machinery.ModuleSpec(name, self, origin=real.origin, loader_state=real,
                                              is_package=real.submodule_search_locations is not None)
        if real.submodule_search_locations is not None:
            spec.submodule_search_locations = list(real.submodule_search_locations)
        return spec

    def create_module(self, spec):
        return DeferredModule(spec.name)

    def exec_module(self, module):
        pass


class _DeferWhile(importlib.abc.MetaPathFinder):
    """Finds a package of DEFERRED_WHILE, at its first import, with a loader that executes it with its DEFERRED_WHILE
    packages deferred; leaves sys.meta_path once each of them is imported."""

    def find_spec(self, name, path=None, target=None):
        if name not in DEFERRED_WHILE:
            return None
        spec = _real_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        packages = deferred_packages() if name in LIGHTNING else DEFERRED_WHILE[name]
        spec.loader = _LoaderDeferring(spec.loader, tuple(p for p in packages if _top(p) not in sys.modules))
        if all(p in sys.modules or p == name for p in DEFERRED_WHILE) and self in sys.meta_path:
            sys.meta_path.remove(self)  # the import system stops at the spec found: its loop over sys.meta_path ends
        return spec


class _LoaderDeferring(importlib.abc.Loader):
    """A module's own loader, executing it with `packages` deferred (the rest of its interface is its loader's)."""

    def __init__(self, loader: importlib.abc.Loader, packages: tuple[str, ...]):
        self.loader, self.packages = loader, packages

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader  # the module's own loader, once it is found
        with deferring(self.packages):
            self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class DeferredModule(types.ModuleType):
    """A module of a deferred package: its names (see the module's docstring) are Deferred values until the real
    module is imported."""

    def __getattr__(self, attr: str) -> Any:
        if attr == "__version__":  # a version check needs no import
            return importlib.metadata.version(_top(self.__name__))
        if attr.startswith("__"):  # what the import system and introspection probe for: absent, as on a new module
            raise AttributeError(attr)
        spec = self.__dict__.get("__spec__")
        real = getattr(spec, "loader_state", None)
        if isinstance(real, importlib.machinery.ModuleSpec) and not _offers(real, attr):
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        return Deferred(self.__name__, attr)


_OFFERS: dict[tuple[str, str], bool] = {}


def _offers(real: importlib.machinery.ModuleSpec, attr: str) -> bool:
    """Whether the module `real` is the spec of offers the name `attr`: a submodule, or spelled in its sources."""
    key = (real.name, attr)
    if key not in _OFFERS:
        _OFFERS[key] = _is_submodule(real, attr) or _spelled(real.origin, attr)
    return _OFFERS[key]


def _is_submodule(real: importlib.machinery.ModuleSpec, attr: str) -> bool:
    if not real.submodule_search_locations:
        return False
    try:
        return _real_spec(f"{real.name}.{attr}", list(real.submodule_search_locations)) is not None
    except ImportError:
        return False


def _spelled(origin: str | None, attr: str) -> bool:
    """`attr` occurs as a whole word in the source file `origin` or in a Python file below its folder (True where
    there is no source to read)."""
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        return True
    word = re.compile(rb"(?<!\w)" + re.escape(attr.encode()) + rb"(?!\w)")
    if word.search(_source(origin)):
        return True
    return any(word.search(_read(path)) for path in _likely_first(_sources_below(os.path.dirname(origin)), attr))


@functools.lru_cache(maxsize=64)
def _source(path: str) -> bytes:
    return _read(path)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


@functools.lru_cache(maxsize=16)
def _sources_below(folder: str) -> tuple[tuple[str, frozenset[str]], ...]:
    """The Python files below `folder`, each with the pieces of its last three path parts (for _likely_first)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                parts = path.removesuffix(".py").split(os.sep)[-3:]
                pieces = {p for part in parts for p in (part.replace("_", ""), *part.split("_")) if len(p) > 2}
                found.append((path, frozenset(pieces)))
    return tuple(found)


def _likely_first(sources: tuple[tuple[str, frozenset[str]], ...], attr: str) -> list[str]:
    """The paths of `sources`, those whose folder or file name is part of `attr` first (models/clip/ for CLIPModel,
    resnet.py for resnet50): the order of the search, not its answer."""
    wanted = attr.lower().replace("_", "")
    scored = [(max((len(p) for p in pieces if p in wanted), default=0), path) for path, pieces in sources]
    return [path for score, path in sorted(scored, key=lambda s: -s[0])]


def _real_module(name: str) -> types.ModuleType:
    module = sys.modules.get(name)
    if isinstance(module, DeferredModule):  # still a stand-in: only while Lightning imports
        for stale in [n for n in sys.modules if _top(n) == _top(name)]:
            if isinstance(sys.modules[stale], DeferredModule):
                _forget(stale)
    # asked for for real: the finder, if still installed, lets the real import through
    _UNDEFERRED.add(_root(name, DEFERRED + sum(DEFERRED_WHILE.values(), ())) or _top(name))
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
        except AttributeError:  # a submodule that its package does not import itself, or a name it only spells
            try:
                value = importlib.import_module(f"{module}.{attr}")
            except ModuleNotFoundError as e:
                if e.name != f"{module}.{attr}":
                    raise
                raise ImportError(f"cannot import name {attr!r} from {module!r} (imported while deferred, by "
                                  f"attnlab.lean_imports)", name=module) from None
        object.__setattr__(self, "_value", value)
        return value

    def __getattr__(self, name: str) -> Any:
        if _DEFERRING and name.startswith("__"):  # typing's probes of an annotation (`Optional[_AX_TYPE]`) while
            raise AttributeError(name)  # deferred packages import, as on a DeferredModule: absent, nothing imported
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
