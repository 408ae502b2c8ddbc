"""A caching allocator for model outputs.

Outputs are handed to the user, so they cannot live in the activation arena. Fresh
large allocations pay for page faults and zeroing on first touch (about as much as
the kernel that fills them); a model called in a loop frees last call's outputs just
before needing the same sizes again. The pool keeps freed blocks and lends them out
again: an output array's memory returns to the pool when the array (and every view of
it) is garbage-collected, never earlier, so user data is never overwritten.

Each lent array starts at an offset within its 4 KiB page chosen away from those of the
arrays the same kernel reads and writes (:func:`spread_offset`): see :data:`PAGE`.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence

import numpy as np

#: arrays smaller than this come from numpy directly (page faults do not matter)
MIN_POOLED_BYTES = 1 << 20

#: pooled arrays start on a multiple of this many bytes (a cache line; whole-vector
#: streaming stores need their address aligned to the vector size, at most 64)
ALIGNMENT = 64

#: the span of address bits a CPU compares first when it checks a load against the
#: stores still in flight before it (the low 12 on x86). A kernel that stores to one
#: array while loading from another at nearly the same offset within a page sees false
#: dependencies ("4K aliasing") on every vector: its loads wait for unrelated stores.
#: numpy's large arrays start 16 bytes into a page and a cache-line aligned block 64
#: bytes in, close enough to collide, so a pooled array starts mid-way in the widest
#: gap between the page offsets of the arrays its kernel reads and writes (two outputs
#: of inputs from numpy: 2048 and 3072). Measured on two Zen 4 cores, float32,
#: [4096, 4096] inputs from numpy, paired in one process against outputs at page
#: offset 64 (the cache-line aligned block this replaced): the LSTM gates 0.92-0.97 of
#: the time (median 0.945), the tanh GELU 0.93-0.95, softmax 0.95-0.99, RMSNorm,
#: LayerNorm and the reduce chain 0.98-1.02. The slack costs one page per pooled block.
PAGE = 4096


def page_offset(a: np.ndarray) -> int:
    """Where ``a``'s data starts within its :data:`PAGE`."""
    return a.ctypes.data % PAGE


def spread_offset(taken: Sequence[int]) -> int:
    """The multiple of :data:`ALIGNMENT` in ``[0, PAGE)`` that lies mid-way in the widest
    gap between the page offsets ``taken`` (read circularly; 0 when none are taken).

    >>> spread_offset([16])
    2048
    >>> spread_offset([16, 2048])
    3072
    """
    if not taken:
        return 0
    marks = sorted(t % PAGE for t in taken)
    gaps = [(b - a, a) for a, b in zip(marks, [*marks[1:], marks[0] + PAGE])]
    width, lo = max(gaps, key=lambda g: (g[0], -g[1]))
    mid = lo + width // 2
    return (mid - mid % ALIGNMENT) % PAGE


class _Lease:
    """Owner of a lent block. Arrays made from it (and all their views) hold it as
    their numpy ``base``: numpy collapses view chains only through ndarrays, so the
    lease lives exactly as long as any array over the block."""

    def __init__(self, block: np.ndarray, start: int, shape: tuple[int, ...], dtype: np.dtype):
        self.block = block
        self.__array_interface__ = {
            "data": (block.ctypes.data + start, False),
            "shape": tuple(int(d) for d in shape),
            "typestr": dtype.str,
            "version": 3,
        }


class OutputPool:
    """Free blocks by exact byte size, bounded in total bytes kept."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._kept = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def empty(
        self, shape: tuple[int, ...], dtype: np.dtype, near: Sequence[object] = ()
    ) -> np.ndarray:
        """An uninitialised array; pooled (and cache-line aligned) when large, then
        starting at the page offset :func:`spread_offset` picks away from those of the
        arrays in ``near`` (what the kernel that writes it also reads and writes; other
        values there are ignored)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
        if nbytes < MIN_POOLED_BYTES:
            return np.empty(shape, dtype)
        size = nbytes + PAGE  # the slack lets the array start at any page offset
        with self._lock:
            blocks = self._free.get(size)
            block = blocks.pop() if blocks else None
            if block is not None:
                self._kept -= size
                self.hits += 1
            else:
                self.misses += 1
        if block is None:
            block = np.empty(size, np.uint8)
        taken = [page_offset(a) for a in near if type(a) is np.ndarray]
        start = (spread_offset(taken) - page_offset(block)) % PAGE
        lease = _Lease(block, start, shape, dtype)
        weakref.finalize(lease, self._release, block)
        return np.asarray(lease)

    def _release(self, block: np.ndarray) -> None:
        with self._lock:
            if self._kept + block.nbytes > self.max_bytes:
                return
            self._free.setdefault(block.nbytes, []).append(block)
            self._kept += block.nbytes

    @property
    def kept_bytes(self) -> int:
        """Bytes held in free blocks."""
        return self._kept

    def clear(self) -> None:
        """Drop every free block."""
        with self._lock:
            self._free.clear()
            self._kept = 0
