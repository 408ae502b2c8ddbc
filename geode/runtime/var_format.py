"""Storage formats of session variables (GE's variable formats and conversion paths).

A variable's *format* says how the VarManager stores its data relative to the layout
the user sees (the layout of its initial value, of ``session.get_variable`` and of
``session.set_variable``):

* ``"ND"`` (:data:`ND`), and any other label without a conversion (``"NCHW"``): stored
  as the user sees it;
* ``"TRANSPOSED(p0,p1,...)"``: stored as ``user.transpose(p)``. The variable-format
  pass (``geode/compiler/passes/variable_format.py``) picks it for a weight whose every
  reader transposes it the same way, so the transpose runs once instead of every call.

:func:`to_storage` and :func:`from_storage` convert between the two layouts and count
every conversion that moves data (:func:`conversions`): tests check that a weight is
converted once, not per call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import numpy as np

from geode.errors import GeodeError

__all__ = [
    "ND",
    "FormatError",
    "conversions",
    "from_storage",
    "permutation",
    "storage_shape",
    "to_storage",
    "transposed",
    "user_shape",
]

#: the plain format: storage is the user's layout
ND = "ND"

_TRANSPOSED = re.compile(r"TRANSPOSED\((\d+(?:,\d+)*)\)\Z")

_count = 0
_count_lock = threading.Lock()


class FormatError(GeodeError):
    """A storage format that is malformed or does not fit a tensor's rank."""


def transposed(perm: Sequence[int]) -> str:
    """The format of a tensor stored as ``user.transpose(perm)``; ``"ND"`` for the
    identity permutation."""
    p = tuple(int(i) for i in perm)
    if sorted(p) != list(range(len(p))):
        raise FormatError(f"{list(p)} is not a permutation")
    if p == tuple(range(len(p))):
        return ND
    return "TRANSPOSED(" + ",".join(str(i) for i in p) + ")"


def permutation(fmt: str) -> tuple[int, ...] | None:
    """The permutation of a ``TRANSPOSED(...)`` format; None for formats stored as the
    user sees them (``ND`` and labels such as ``NCHW``)."""
    if not isinstance(fmt, str):
        raise FormatError(f"a format is a string, got {type(fmt).__name__}")
    if not fmt.startswith("TRANSPOSED"):
        return None
    m = _TRANSPOSED.match(fmt)
    if m is None:
        raise FormatError(f"format {fmt!r} is malformed (expected TRANSPOSED(p0,p1,...))")
    perm = tuple(int(i) for i in m.group(1).split(","))
    if sorted(perm) != list(range(len(perm))):
        raise FormatError(f"format {fmt!r}: {list(perm)} is not a permutation")
    return perm


def _perm_for(fmt: str, rank: int) -> tuple[int, ...] | None:
    perm = permutation(fmt)
    if perm is not None and len(perm) != rank:
        raise FormatError(f"format {fmt!r} does not fit a tensor of rank {rank}")
    return perm


def storage_shape(shape: Sequence[int], fmt: str) -> tuple[int, ...]:
    """The stored shape of a tensor of user shape ``shape``."""
    dims = tuple(shape)
    perm = _perm_for(fmt, len(dims))
    return dims if perm is None else tuple(dims[i] for i in perm)


def user_shape(shape: Sequence[int], fmt: str) -> tuple[int, ...]:
    """The user's shape of a tensor stored with shape ``shape``."""
    dims = tuple(shape)
    perm = _perm_for(fmt, len(dims))
    if perm is None:
        return dims
    out = [0] * len(dims)
    for k, i in enumerate(perm):
        out[i] = dims[k]
    return tuple(out)


def _counted(arr: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    global _count
    with _count_lock:
        _count += 1
    return np.ascontiguousarray(arr.transpose(perm))


def to_storage(arr: np.ndarray, fmt: str) -> np.ndarray:
    """``arr`` (user layout) in storage layout: a new C-contiguous array when the format
    moves data (counted), else ``arr`` itself."""
    a = np.asarray(arr)
    perm = _perm_for(fmt, a.ndim)
    return a if perm is None else _counted(a, perm)


def from_storage(arr: np.ndarray, fmt: str) -> np.ndarray:
    """``arr`` (storage layout) in the user's layout: a new C-contiguous array when the
    format moves data (counted), else ``arr`` itself."""
    a = np.asarray(arr)
    perm = _perm_for(fmt, a.ndim)
    if perm is None:
        return a
    inverse = tuple(int(i) for i in np.argsort(perm))
    return _counted(a, inverse)


def conversions() -> int:
    """How many conversions that move data :func:`to_storage` and :func:`from_storage`
    have made in this process."""
    return _count
