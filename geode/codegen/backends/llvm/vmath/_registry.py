"""The registry of vmath IR functions and constant tables, filled by the family
modules (:mod:`.exp`, :mod:`.log`, ...) when the package is imported."""

from __future__ import annotations

from collections.abc import Callable

from ._ir import FunctionBuilder
from .target import VmathTarget

__all__ = ["FUNCTIONS", "TABLES", "Emitter", "fn_name", "register", "register_table"]

#: writes the body of one function for a target
Emitter = Callable[[VmathTarget], FunctionBuilder]

#: function name -> its emitter
FUNCTIONS: dict[str, Emitter] = {}
#: table name -> writer of its global definition (the whole ``@name = ...`` line)
TABLES: dict[str, Callable[[], str]] = {}


def register(name: str, emit: Emitter) -> None:
    """Register the emitter of function ``name``."""
    if name in FUNCTIONS:
        raise AssertionError(f"vmath function {name} registered twice")
    FUNCTIONS[name] = emit


def register_table(name: str, write: Callable[[], str]) -> None:
    """Register the writer of constant table ``name``."""
    if name in TABLES:
        raise AssertionError(f"vmath table {name} registered twice")
    TABLES[name] = write


def fn_name(op: str, suffix: str) -> str:
    """The IR name of vmath function ``op`` for type suffix ``f32``/``f64``.

    >>> fn_name("exp", "f32")
    'geode.vm.exp.f32'
    """
    return f"geode.vm.{op}.{suffix}"
