"""A caching allocator for model outputs.

Outputs are handed to the user, so they cannot live in the activation arena. Fresh
large allocations pay for page faults and zeroing on first touch (about as much as
the kernel that fills them); a model called in a loop frees last call's outputs just
before needing the same sizes again. The pool keeps its blocks and lends them out
again: a block is free once nothing refers to it but the pool, i.e. when the array lent
from it (and every view of it) is gone, never earlier, so user data is never
overwritten. CPython counts each view's reference to its base array, so the block's
reference count tells, and nothing has to be notified when an output dies (the pool
used weak-reference finalizers before; measurements: ``docs/performance.md``).

Each lent array starts at an offset within its 4 KiB page chosen away from those of the
arrays the same kernel reads and writes (:func:`spread_offset`): see :data:`PAGE`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence

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
#: of inputs from numpy: 2048 and 3072). Measurements:
#: ``docs/performance.md`` (``PAGE``). The slack costs one page per pooled block.
PAGE = 4096


def page_offset(a: np.ndarray) -> int:
    """Where ``a``'s data starts within its :data:`PAGE`."""
    return int(a.__array_interface__["data"][0]) % PAGE


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


def lent(nbytes: int) -> bool:
    """Whether :meth:`OutputPool.empty` lends an array of ``nbytes`` from its blocks
    (else numpy allocates it): the one place the threshold is read."""
    return nbytes >= MIN_POOLED_BYTES


class OutputPool:
    """Blocks of memory lent out as large arrays, kept by exact byte size, bounded in
    total bytes; a block is lent again once nothing else refers to it (see the module
    docstring). Not thread-safe: each executor (one per thread) has its own."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._blocks: dict[int, list[np.ndarray]] = {}
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
        if not lent(nbytes):
            return np.empty(shape, dtype)
        size = nbytes + PAGE  # the slack lets the array start at any page offset
        block = self._lend(size)
        taken = [page_offset(a) for a in near if type(a) is np.ndarray]
        start = (spread_offset(taken) - page_offset(block)) % PAGE
        return np.ndarray(shape, dtype, buffer=block, offset=start)

    def _lend(self, size: int) -> np.ndarray:
        """A block of ``size`` bytes that nothing but the pool refers to: a kept one, or
        a new one (kept too while the pool's blocks stay within ``max_bytes``)."""
        blocks = self._blocks.setdefault(size, [])
        block = next(_free(blocks), None)
        if block is not None:
            self.hits += 1
            return block
        self.misses += 1
        block = np.empty(size, np.uint8)
        held = sum(n * len(bs) for n, bs in self._blocks.items())
        if held + size <= self.max_bytes:
            blocks.append(block)
        return block

    @property
    def kept_bytes(self) -> int:
        """Bytes held in free blocks."""
        return sum(b.nbytes for bs in self._blocks.values() for b in _free(bs))

    def clear(self) -> None:
        """Drop every free block (lent ones stay with their arrays)."""
        for blocks in self._blocks.values():
            free = {id(b) for b in _free(blocks)}
            blocks[:] = [b for b in blocks if id(b) not in free]


def _free(blocks: list[np.ndarray]) -> Iterator[np.ndarray]:
    """The blocks of ``blocks`` nothing refers to but the list: while one is tested, its
    references are the list's, the loop variable's and ``sys.getrefcount``'s argument
    (the caller holds only the block yielded before)."""
    for block in blocks:
        if sys.getrefcount(block) == 3:
            yield block
