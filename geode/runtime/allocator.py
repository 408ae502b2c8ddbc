"""A caching allocator for model outputs.

Outputs are handed to the user, so they cannot live in the activation arena. Fresh
large allocations pay for page faults and zeroing on first touch (about as much as
the kernel that fills them); a model called in a loop frees last call's outputs just
before needing the same sizes again. The pool keeps freed blocks and lends them out
again: an output array's memory returns to the pool when the array (and every view of
it) is garbage-collected, never earlier, so user data is never overwritten.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

#: arrays smaller than this come from numpy directly (page faults do not matter)
MIN_POOLED_BYTES = 1 << 20

#: pooled blocks start on a multiple of this many bytes (a cache line; whole-vector
#: streaming stores need their address aligned to the vector size, at most 64)
ALIGNMENT = 64


def _aligned_block(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialised bytes starting on an :data:`ALIGNMENT` boundary (a view
    of a slightly larger allocation, which it keeps alive)."""
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    shift = (-raw.ctypes.data) % ALIGNMENT
    return raw[shift : shift + nbytes]


class _Lease:
    """Owner of a lent block. Arrays made from it (and all their views) hold it as
    their numpy ``base``: numpy collapses view chains only through ndarrays, so the
    lease lives exactly as long as any array over the block."""

    def __init__(self, block: np.ndarray, shape: tuple[int, ...], dtype: np.dtype):
        self.block = block
        self.__array_interface__ = {
            "data": (block.ctypes.data, False),
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

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array; pooled (and cache-line aligned) when large."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
        if nbytes < MIN_POOLED_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            blocks = self._free.get(nbytes)
            block = blocks.pop() if blocks else None
            if block is not None:
                self._kept -= nbytes
                self.hits += 1
            else:
                self.misses += 1
        if block is None:
            block = _aligned_block(nbytes)
        lease = _Lease(block, shape, dtype)
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
