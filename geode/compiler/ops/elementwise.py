"""Elementwise and broadcasting math ops (reference kernels follow ONNX semantics)."""

from __future__ import annotations

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ops.common import binary, unary

# -- binary arithmetic ---------------------------------------------------------------
binary("Add", lambda a, b, _: a + b, doc="A + B with broadcasting")
binary("Sub", lambda a, b, _: a - b, doc="A - B with broadcasting")
binary("Mul", lambda a, b, _: a * b, doc="A * B with broadcasting")


def _div(a: np.ndarray, b: np.ndarray, _: dict) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates toward zero
    return a / b


binary("Div", _div, doc="A / B with broadcasting (integer division truncates)")

# -- unary math ------------------------------------------------------------------------
unary("Neg", lambda x, _: -x, types=dtypes.NUMERIC - dtypes.UNSIGNED_INTS)
unary("Abs", lambda x, _: np.abs(x), types=dtypes.NUMERIC)
unary("Exp", lambda x, _: np.exp(x))
unary("Sqrt", lambda x, _: np.sqrt(x))
unary("Relu", lambda x, _: np.maximum(x, 0), types=dtypes.NUMERIC - dtypes.UNSIGNED_INTS)
