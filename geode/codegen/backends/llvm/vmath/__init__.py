"""Vectorizable math functions as LLVM IR text: exp, expm1, log, log1p, tanh,
``1 + tanh``, sigmoid, erf, sin, cos and ``a / (1 + exp(t))`` in float32 and float64.

The LLVM backend's port of the numba library :mod:`geode.codegen.backends.vmath`: the
same algorithms, coefficients, special values and accuracy, bit for bit (tested against
it), except float32 erf on targets with FMA: geode's own cheaper form (:mod:`.erf`; the
numba one is kept as ``erf_legacy``), so the two backends' float32 erf may differ by an
ulp. Each function is straight-line code (clamps and special cases are ``select``;
``llvm.fmuladd``, ``llvm.fma``, ``llvm.rint``, ``llvm.copysign`` and bit tests), so a
loop calling it vectorizes once it is inlined.

Use: ask :func:`function_name` for the name of ``(op, dtype)``, call it from the kernel
(``call float @geode.vm.exp.f32(float %x)``), and add :func:`definitions` of all the
names a module calls to the module: it returns a :class:`VmathModule` with the function
texts, the constant tables and the intrinsic declarations (by name, so the caller can
merge them with its own). Every function is ``internal`` and ``alwaysinline nounwind``.

Fast math: no vmath instruction has fast-math flags (nor the function any fp-math
attribute), so inlined into a caller whose own instructions are ``fast`` the vmath code
stays IEEE: LLVM keeps each instruction's flags when it inlines. Do not put fast-math
flags on the call itself; the ``_ieee`` variants of tanh and sigmoid (``ieee=True``)
skip a NaN test that only a caller with ``nnan`` needs.

Families: :mod:`.exp` (exp, expm1), :mod:`.log` (log, log1p), :mod:`.tanh` (tanh,
sigmoid, one_plus_tanh, div_one_plus_exp), :mod:`.erf`, :mod:`.trig` (sin, cos).
"""

from __future__ import annotations

from geode.errors import CodegenError

from . import erf, exp, log, tanh, trig  # noqa: F401  (registers the functions)
from ._registry import fn_name
from .module import FUNCTION_ATTRS, VmathModule, definitions
from .target import VmathTarget

__all__ = [
    "DTYPES",
    "FUNCTION_ATTRS",
    "IEEE_OPS",
    "OPS",
    "VmathModule",
    "VmathTarget",
    "arity",
    "available",
    "definitions",
    "function_name",
]

#: the ops with a function (names as in :data:`geode.codegen.ast.UN_OPS`, plus expm1,
#: log1p, sigmoid, one_plus_tanh and the two-argument div_one_plus_exp)
OPS = frozenset(
    {
        "exp",
        "expm1",
        "log",
        "log1p",
        "tanh",
        "one_plus_tanh",
        "sigmoid",
        "erf",
        "sin",
        "cos",
        "div_one_plus_exp",
    }
)
#: ops with a variant for callers without ``nnan`` (no final NaN test)
IEEE_OPS = frozenset({"tanh", "sigmoid"})
#: dtype name -> function name suffix
DTYPES = {"float32": "f32", "float64": "f64"}


def available(op: str, dtype: str) -> bool:
    """Whether there is a vmath function for ``op`` in ``dtype``."""
    return op in OPS and dtype in DTYPES


def arity(op: str) -> int:
    """Number of arguments of ``op``'s functions (2 for div_one_plus_exp, else 1)."""
    if op not in OPS:
        raise CodegenError(f"vmath: no function {op!r} (known: {', '.join(sorted(OPS))})")
    return 2 if op == "div_one_plus_exp" else 1


def function_name(op: str, dtype: str, ieee: bool = False) -> str:
    """The IR name (unquoted, e.g. ``geode.vm.exp.f32``) of ``op`` in ``dtype``.

    ``ieee=True`` asks for the variant without the final NaN test (for callers without
    the ``nnan`` flag) where one exists (tanh, sigmoid), else the normal function.
    Signature: ``float (float)`` / ``double (double)``; ``div_one_plus_exp(a, t) = a /
    (1 + exp(t))`` takes two arguments of the type.
    """
    if not available(op, dtype):
        raise CodegenError(
            f"vmath: no function for {op!r} in {dtype!r} "
            f"(ops: {', '.join(sorted(OPS))}; dtypes: {', '.join(DTYPES)})"
        )
    return fn_name(f"{op}_ieee" if ieee and op in IEEE_OPS else op, DTYPES[dtype])
