"""dtypes of the LLVM backend: IR types, numpy promotion, the float a math op runs in.

Every AST expression has a numpy dtype (see :mod:`geode.codegen.backends.llvm` for the
rules). In IR a value of dtype ``d`` has type :func:`value_type` and sits in memory as
:func:`memory_type`:

========== ========== =========== ===============================================
dtype      value      memory      note
========== ========== =========== ===============================================
float16    ``float``  ``half``    carried as float32, rounded to float16 after
                                  every operation (numpy's own float16 rule)
float32    ``float``  ``float``
float64    ``double`` ``double``
bool       ``i1``     ``i8``      numpy stores one byte per bool
int/uint N ``iN``     ``iN``      signedness lives in the dtype, not the type
========== ========== =========== ===============================================

Local temporaries and registers of dtype float16 hold their float32 carrier
(``float``), as the numba backend did: only kernel arguments are ``half`` in memory.
"""

from __future__ import annotations

import numpy as np

from geode.errors import CodegenError

__all__ = [
    "ALL",
    "FLOATS",
    "SINTS",
    "UINTS",
    "WEAK",
    "bits",
    "check_dtype",
    "float_for",
    "is_float",
    "is_int",
    "is_signed",
    "memory_type",
    "promote",
    "temp_type",
    "value_type",
]

FLOATS = ("float16", "float32", "float64")
SINTS = ("int8", "int16", "int32", "int64")
UINTS = ("uint8", "uint16", "uint32", "uint64")
ALL = (*FLOATS, *SINTS, *UINTS, "bool")
#: dtypes a literal ``Const`` takes when it stands for a Python scalar (NEP 50 "weak")
WEAK = ("int64", "float64", "bool")

_VALUE = {"float16": "float", "float32": "float", "float64": "double", "bool": "i1"}
_MEMORY = {"float16": "half", "bool": "i8"}


def check_dtype(dtype: str, where: str) -> str:
    """The canonical numpy name of ``dtype``; :class:`CodegenError` naming ``where`` when
    the backend has no such dtype."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise CodegenError(f"{where}: unknown dtype {dtype!r}") from None
    if name not in ALL:
        raise CodegenError(f"{where}: dtype {name} is not supported by the LLVM backend")
    return name


def is_float(dtype: str) -> bool:
    """float16, float32 or float64."""
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    """A signed or unsigned integer dtype (not bool)."""
    return dtype in SINTS or dtype in UINTS


def is_signed(dtype: str) -> bool:
    """A signed integer dtype."""
    return dtype in SINTS


def bits(dtype: str) -> int:
    """Width in bits of an integer or float dtype (1 for bool)."""
    return 1 if dtype == "bool" else np.dtype(dtype).itemsize * 8


def value_type(dtype: str) -> str:
    """The IR type a value of ``dtype`` has in registers."""
    return _VALUE.get(dtype) or f"i{bits(dtype)}"


def memory_type(dtype: str) -> str:
    """The IR type of one element of a kernel argument of ``dtype``."""
    return _MEMORY.get(dtype) or value_type(dtype)


def temp_type(dtype: str) -> str:
    """The IR type of one element of a local temporary or register of ``dtype``
    (float16 temporaries hold their float32 carrier)."""
    return "i8" if dtype == "bool" else value_type(dtype)


def _weak_scalar(dtype: str) -> object:
    return {"int64": 0, "float64": 0.0, "bool": False}[dtype]


def promote(a: str, a_weak: bool, b: str, b_weak: bool) -> str:
    """numpy 2 (NEP 50) promotion; a weak operand acts as a Python scalar of its kind.

    >>> promote("float32", False, "float64", True)
    'float32'
    >>> promote("int32", False, "float64", True)
    'float64'
    >>> promote("int8", False, "uint8", False)
    'int16'
    """
    if a_weak and not b_weak:
        return np.result_type(_weak_scalar(a), np.dtype(b)).name
    if b_weak and not a_weak:
        return np.result_type(np.dtype(a), _weak_scalar(b)).name
    return np.promote_types(a, b).name


def float_for(dtype: str) -> str:
    """The float dtype numpy computes a math function of ``dtype`` in.

    >>> float_for("int16"), float_for("int64"), float_for("float16")
    ('float32', 'float64', 'float16')
    """
    if dtype in FLOATS:
        return dtype
    return np.promote_types(dtype, np.float16).name
