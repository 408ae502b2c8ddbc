"""Loop annotations: parallel, vectorize, interleave, unroll."""

from __future__ import annotations

import numpy as np

from geode.codegen.ast import Block, Const, For, ForKind, Store, expr_str, walk_stmts
from geode.codegen.schedule.base import ScheduleBase
from geode.codegen.schedule.blocks import reduction_combine
from geode.codegen.schedule.trace import primitive
from geode.errors import ScheduleError


class Annotations(ScheduleBase):
    """Loop annotations: parallel, vectorize, interleave, unroll."""

    @primitive
    def parallel(self, loop: str) -> None:
        """Run ``loop``'s iterations in parallel (``ForKind.PARALLEL``).

        Requirements: the loop is serial or already parallel and no loop around or
        inside it is parallel; no block inside binds a reduce iteration variable to it;
        every buffer stored inside is either a temp whose every access is inside the
        loop and independent of it (one private copy per iteration, see
        :func:`alloc_loop`) or accessed inside the loop only at locations that
        determine the loop variable the same way (so iterations touch disjoint
        elements).

        Example, ``parallel("i")``::

            serial for (i, 0, N)        ->      parallel for (i, 0, N)
              ...                                 ...
        """
        f, _, path = self._locate_loop("parallel", loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError("parallel", blk, f"loop {loop} is already {f.kind.value}")
        nested = [g.var for g in path if g.kind == ForKind.PARALLEL] + [
            s.var for s in walk_stmts(f.body) if isinstance(s, For) and s.kind == ForKind.PARALLEL
        ]
        if nested:
            raise ScheduleError("parallel", blk, f"nested parallel loops: {nested}")
        self._check_independent("parallel", f, path, None)
        f.kind = ForKind.PARALLEL
        return None

    @primitive
    def vectorize(self, loop: str, allow_reassoc: bool = False) -> None:
        """Mark innermost ``loop`` vectorized (``ForKind.VECTORIZED``).

        Requirements: the loop is serial (or already vectorized) and holds no loop;
        its body is blocks whose bodies are only stores; iterations are independent as
        for :meth:`parallel`, except that a reduction carried by the loop is allowed
        when its combine may be reassociated: ``max``/``min`` always, integer ``+``/``*``
        always, float ``+``/``*`` only with ``allow_reassoc=True`` (fastmath).

        Example, ``vectorize("j")``::

            serial for (j, 0, 16)       ->      vectorized for (j, 0, 16)
              ScheduleBlock(A) ...                ScheduleBlock(A) ...
        """
        f, _, path = self._locate_loop("vectorize", loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.VECTORIZED):
            raise ScheduleError("vectorize", blk, f"loop {loop} is already {f.kind.value}")
        for s in f.body:
            if not isinstance(s, Block):
                raise ScheduleError(
                    "vectorize", blk, f"loop {loop} is not innermost or holds a non-block statement"
                )
            if not all(isinstance(x, Store) for x in s.body):
                raise ScheduleError("vectorize", s.name, "the block body must be stores only")

        def reassoc(b: Block) -> bool:
            comb = reduction_combine(b)
            if comb is None:
                return False
            dt = np.dtype(self.kernel.buffer(comb[1].buffer).dtype)
            return comb[0] in ("max", "min") or dt.kind in "iub" or allow_reassoc

        self._check_independent("vectorize", f, path, reassoc)
        f.kind = ForKind.VECTORIZED
        return None

    @primitive
    def interleave(self, loop: str, factor: int) -> None:
        """Compute ``factor`` vectors of consecutive iterations of vectorized ``loop`` side
        by side (LLVM's interleave count). Each vector of a long per-element dependency
        chain (a transcendental function: 20-40 dependent instructions) then overlaps
        the others' latency; without it the out-of-order window holds only two or three
        chains. ``factor=1`` clears the hint. The numba backend can only pass the
        largest factor of a kernel to LLVM for the whole kernel (numba sets no loop
        metadata), so every loop of that kernel is interleaved alike.

        Requirements: the loop is vectorized; ``factor`` is a power of two from 1 to 16.

        Example, ``interleave("j", 4)``::

            vectorized for (j, 0, 128)  ->      vectorized for (j, 0, 128) interleave(4)
              ScheduleBlock(A) ...                ScheduleBlock(A) ...
        """
        f, _, _ = self._locate_loop("interleave", loop)
        blk = self._first_block(f)
        if f.kind != ForKind.VECTORIZED:
            raise ScheduleError("interleave", blk, f"loop {loop} is {f.kind.value}, not vectorized")
        ok = isinstance(factor, (int, np.integer)) and not isinstance(factor, bool)
        if not ok or not 1 <= factor <= 16 or factor & (factor - 1):
            raise ScheduleError(
                "interleave", blk, f"factor {factor!r} is not a power of two from 1 to 16"
            )
        f.interleave = int(factor)
        return None

    @primitive
    def unroll(self, loop: str, max_extent: int = 64) -> None:
        """Mark ``loop`` unrolled (``ForKind.UNROLLED``).

        Requirements: the loop is serial (or already unrolled) and its extent is a
        constant no larger than ``max_extent`` (64).

        Example, ``unroll("k")``::

            serial for (k, 0, 4)        ->      unrolled for (k, 0, 4)
        """
        f, _, _ = self._locate_loop("unroll", loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.UNROLLED):
            raise ScheduleError("unroll", blk, f"loop {loop} is already {f.kind.value}")
        if not isinstance(f.extent, Const):
            raise ScheduleError(
                "unroll", blk, f"extent {expr_str(f.extent)} of {loop} is not constant"
            )
        if int(f.extent.value) > max_extent:
            raise ScheduleError(
                "unroll", blk, f"extent {f.extent.value} of {loop} exceeds {max_extent}"
            )
        f.kind = ForKind.UNROLLED
        return None
