"""Plain pickles attnlab reads but did not write (torch.distributed.checkpoint's `.metadata`, CIFAR's python batches),
read through one unpickler that admits only the globals the format needs (`allowed`): a pickle that asks for any other
stops at that global (`UnsafeGlobal`) before anything in it runs. `torch.save` checkpoints are not read here."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# numpy arrays and their dtypes, as numpy pickles them (protocol 2 and 5, numpy 1.x and 2.x module names): a
# constructor of an empty array of the class the pickle names (which must itself be allowed), the array's class, the
# dtype's constructor, and the one that rebuilds an array from a buffer (and, in numpy_globals, _codecs.encode, which
# a protocol-2 pickle calls to turn a str back into bytes)
NUMPY_ARRAYS = (("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
                ("numpy", "ndarray"), ("numpy", "dtype"))
# the kinds of dtype an array read from a pickle may have: bool, integers, floats, complex, bytes and str. Never
# object ("O"), whose bytes would be read as object pointers, nor a structured or void one that could hold objects
PLAIN_KINDS = frozenset("biufcSU")


def _check_dtype(dtype: Any, path: Any = "a pickle", what: str = "a plain pickle") -> Any:
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind not in PLAIN_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise UnsafeGlobal(f"a numpy array of dtype {dtype.str!r}", path, what)
    return dtype


def numpy_globals() -> dict[tuple[str, str], Any]:
    """The globals a pickle of numpy arrays needs (NUMPY_ARRAYS), each looked up in numpy itself, the array's class
    and the dtype's constructor admitting plain dtypes only (PLAIN_KINDS)."""
    import importlib

    import numpy as np

    class PlainArray(np.ndarray):
        """The class a pickled array is rebuilt as: its state's dtype checked before numpy reads its bytes (`load`
        hands it back as a plain ndarray)."""

        def __setstate__(self, state):
            if not isinstance(state, tuple) or len(state) < 3:
                raise pickle.UnpicklingError("a numpy array whose state is not numpy's")
            _check_dtype(state[2] if len(state) == 5 else state[1])  # (version,) shape, dtype, fortran, bytes
            return super().__setstate__(state)

    def dtype(spec, *args):
        return _check_dtype(np.dtype(spec, *args[:2]))

    found: dict[tuple[str, str], Any] = {}
    for module, name in NUMPY_ARRAYS:
        here = module.replace("numpy.core.", "numpy._core.") if int(np.__version__.split(".")[0]) >= 2 else module
        try:
            found[(module, name)] = getattr(importlib.import_module(here), name)
        except (ImportError, AttributeError):  # a numpy without that module: its pickles do not name it either
            pass
    found[("numpy", "ndarray")], found[("numpy", "dtype")] = PlainArray, dtype
    for key in [k for k in found if k[1] == "_frombuffer"]:
        found[key] = functools.partial(_frombuffer, found[key])
    for cls in vars(np.dtypes).values() if hasattr(np, "dtypes") else ():  # numpy 2 may name a dtype's class
        if isinstance(cls, type) and issubclass(cls, np.dtype) and getattr(cls, "type", None) is not None and \
                np.dtype(cls.type).kind in PLAIN_KINDS:
            found[("numpy.dtypes", cls.__name__)] = cls
    import _codecs

    found[("_codecs", "encode")] = _codecs.encode  # bytes in a protocol-2 pickle: str -> bytes, as torch admits it
    return found


def _frombuffer(frombuffer, buffer, dtype, shape, order):
    return frombuffer(buffer, _check_dtype(dtype), shape, order)


def _plain(value: Any) -> Any:
    """The arrays of a loaded object as plain ndarrays (numpy_globals' PlainArray is their class while loading)."""
    import sys

    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray) and type(value) is not np.ndarray:
        return value.view(np.ndarray)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


class UnsafeGlobal(pickle.UnpicklingError):
    """A pickle asks for a global outside what its format needs."""

    def __init__(self, name: str, path: Path, what: str):
        super().__init__(f"{path} asks for {name}, which {what} never holds")
        self.name, self.path = name, path


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in `allowed` ((module, name) -> the object); `what` names the
    format in the refusal ("a CIFAR python batch")."""

    def __init__(self, file, allowed: Mapping[tuple[str, str], Any], path: Path, what: str, **kwargs: Any):
        super().__init__(file, **kwargs)
        self.allowed, self.path, self.what = allowed, path, what

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise UnsafeGlobal(f"{module}.{name}", self.path, self.what)
        return found

    def persistent_load(self, pid: Any) -> Any:  # a reference to outside storage: no plain format has one
        raise pickle.UnpicklingError(f"{self.path} refers to external storage ({str(pid)[:60]}), which "
                                     f"{self.what} never holds")


_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING"}


def globals_in(data: bytes, every: bool = False) -> list[str]:
    """The globals a pickle asks for ("module.name"), read from its opcodes without running anything (pickletools);
    empty when the bytes are no pickle; `every`: of each pickle of several written one after the other (torch.save's
    legacy format). A STACK_GLOBAL is named by the two strings pushed (or fetched from the memo) last."""
    import io
    import pickletools

    found, stream = [], io.BytesIO(data)
    while stream.tell() < len(data):
        start = stream.tell()
        found += _globals_of_one(pickletools, stream)
        if not every or stream.tell() == start:
            break
    return list(dict.fromkeys(found))


def _globals_of_one(pickletools, stream) -> list[str]:
    found, strings, memo = [], [], {}
    try:
        for op, arg, _ in pickletools.genops(stream):
            if op.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif op.name in _STRINGS:
                strings.append(arg.decode("latin1") if isinstance(arg, bytes) else str(arg))
            elif op.name == "MEMOIZE" and strings:
                memo[len(memo)] = strings[-1]
            elif op.name in ("PUT", "BINPUT", "LONG_BINPUT") and strings:
                memo[arg] = strings[-1]
            elif op.name in ("GET", "BINGET", "LONG_BINGET") and arg in memo:
                strings.append(memo[arg])
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # cut short, or no pickle: what was read so far
        stream.seek(0, 2)
    return found


def load(path: str | Path, allowed: Mapping[tuple[str, str], Any], what: str, **kwargs: Any) -> Any:
    """The object a pickle file holds, its globals restricted to `allowed` (UnsafeGlobal for any other); `kwargs`
    are pickle's own (encoding="latin1" for Python 2's pickles)."""
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            return _plain(RestrictedUnpickler(fh, allowed, path, what, **kwargs).load())
        except UnsafeGlobal as e:
            raise UnsafeGlobal(e.name, path, what) from None
