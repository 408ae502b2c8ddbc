"""Modules imported on first use: ``from geode.lazy import sympy``.

sympy takes about 0.3 s to import, most of what ``import geode`` would cost, and only
the compiler needs it: loading a model file and running it never touches a symbolic
expression (dims read from a file are :class:`~geode.compiler.stored_dims.StoredDim`
data). Modules that use sympy only inside their functions import this stand-in, which
imports the real module on the first attribute read (``sympy.Add``,
``isinstance(d, sympy.Expr)``) and then keeps each attribute it handed out.
:func:`imported` says whether that has happened.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from geode.errors import MissingDependencyError

__all__ = ["LazyModule", "imported", "require_numba", "sympy"]


class LazyModule:
    """Stands in for module ``name`` until an attribute is read (see the module docstring)."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _module(self) -> ModuleType:
        return importlib.import_module(object.__getattribute__(self, "_name"))

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._module(), attr)
        object.__setattr__(self, attr, value)  # the next read is a plain attribute hit
        return value

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"{self._name} is imported lazily: set {attr!r} on the real module")

    def __repr__(self) -> str:
        state = "imported" if imported(self._name) else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


def imported(name: str) -> bool:
    """Whether module ``name`` has really been imported in this process."""
    return name in sys.modules


#: how to get numba, an optional dependency (the ``numba`` extra)
NUMBA_HINT = 'install it with pip install "geode[numba]" (or use the default backend="llvm")'


def require_numba(purpose: str) -> ModuleType:
    """numba, imported for ``purpose``; :class:`~geode.errors.MissingDependencyError`
    naming the ``numba`` extra if it is not installed (geode needs numba only for the
    numba backend: ``backend="numba"`` / ``GEODE_BACKEND=numba``)."""
    try:
        return importlib.import_module("numba")
    except ImportError as exc:
        raise MissingDependencyError(
            f"{purpose} needs numba, which is not installed: {NUMBA_HINT}"
        ) from exc


#: sympy, imported when geode first builds or inspects a symbolic dim
sympy: Any = LazyModule("sympy")
