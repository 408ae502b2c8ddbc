"""dtype names, numpy dtypes and ONNX TensorProto enums, mapped in one place."""

from __future__ import annotations

import numpy as np

from geode.errors import DTypeError

#: ``TensorProto.STRING`` (onnx itself is imported only when a dtype enum is converted:
#: importing it costs about 0.1 s of ``import geode``)
_ONNX_STRING = 8

#: dtypes geode's kernels and reference engines handle.
SUPPORTED = (
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.float16),
    np.dtype(np.int8),
    np.dtype(np.int16),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.uint8),
    np.dtype(np.uint16),
    np.dtype(np.uint32),
    np.dtype(np.uint64),
    np.dtype(np.bool_),
)

FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))
SIGNED_INTS = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
UNSIGNED_INTS = frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
INTS = SIGNED_INTS | UNSIGNED_INTS
NUMERIC = FLOATS | INTS
BOOL = frozenset([np.dtype(np.bool_)])
ALL = NUMERIC | BOOL
INDEX = frozenset(np.dtype(t) for t in (np.int32, np.int64))


def _ml_dtypes(*names: str) -> frozenset:
    """The ml_dtypes (onnx's dependency for its narrow types) of these names, if installed."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - onnx >= 1.17 depends on ml_dtypes
        return frozenset()
    return frozenset(np.dtype(getattr(ml_dtypes, n)) for n in names if hasattr(ml_dtypes, n))


#: bfloat16 (a storage dtype: see STORAGE)
BFLOAT16 = _ml_dtypes("bfloat16")
#: 8-bit floats (ONNX FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, FLOAT8E8M0)
FLOAT8 = _ml_dtypes(
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"
)
#: 4-bit float (ONNX FLOAT4E2M1)
FLOAT4 = _ml_dtypes("float4_e2m1fn")
#: 4- and 2-bit integers (ONNX INT4, UINT4, INT2, UINT2), one element per byte in memory
SUB_BYTE_INTS = _ml_dtypes("int4", "uint4", "int2", "uint2")
#: Storage dtypes: Cast, CastLike, the quantization ops and the data-movement ops
#: (Identity, Reshape, Transpose, ...) carry them, on the reference engines only; geode
#: does no arithmetic in them and never compiles them into kernels.
STORAGE = BFLOAT16 | FLOAT8 | FLOAT4 | SUB_BYTE_INTS
#: every dtype a tensor may have in geode
ANY = ALL | STORAGE


def to_numpy(dtype: object, where: str = "") -> np.dtype:
    """Turn a dtype given as a name, numpy type or ONNX enum into a numpy dtype."""
    try:
        if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
            if int(dtype) == _ONNX_STRING:
                return np.dtype(object)
            from onnx import helper

            return np.dtype(helper.tensor_dtype_to_np_dtype(int(dtype)))
        if isinstance(dtype, str) and dtype in ("bool", "boolean"):
            return np.dtype(np.bool_)
        return np.dtype(dtype)
    except (TypeError, KeyError, ValueError) as exc:
        at = f" at {where}" if where else ""
        raise DTypeError(f"unknown dtype {dtype!r}{at}") from exc


def to_onnx(dtype: object) -> int:
    """The ONNX TensorProto enum for a dtype."""
    np_dtype = to_numpy(dtype)
    if np_dtype == np.dtype(object):
        return _ONNX_STRING
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(np_dtype))


def name(dtype: object) -> str:
    """Short readable name: float32, int64, bool."""
    d = to_numpy(dtype)
    return "bool" if d == np.bool_ else str(d)
