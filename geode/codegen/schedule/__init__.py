"""Schedule primitives over the loop AST, each recorded in a replayable trace.

A :class:`Schedule` owns a copy of a lowered :class:`~geode.codegen.ast.Kernel` and
rewrites it in place, one primitive at a time, in the style of CINN's IRSchedule:

* queries: :meth:`~Schedule.get_block`, :meth:`~Schedule.blocks`,
  :meth:`~Schedule.get_loops`, :meth:`~Schedule.producers`,
  :meth:`~Schedule.consumers`, :meth:`~Schedule.writers`, :meth:`~Schedule.readers`,
  :meth:`~Schedule.load_strides`;
* loop transformations: :meth:`~Schedule.split`, :meth:`~Schedule.fuse`,
  :meth:`~Schedule.reorder`, :meth:`~Schedule.align` / :meth:`~Schedule.align_all`
  (CINN's iteration-space alignment);
* block transformations: :meth:`~Schedule.compute_inline`,
  :meth:`~Schedule.reverse_compute_inline`, :meth:`~Schedule.rfactor` (two-step
  reduce), :meth:`~Schedule.compute_at`, :meth:`~Schedule.reuse_output` (a row buffer
  kept in the output it becomes);
* loop annotations: :meth:`~Schedule.parallel`, :meth:`~Schedule.vectorize`,
  :meth:`~Schedule.interleave`, :meth:`~Schedule.unroll`; cache hints:
  :meth:`~Schedule.prefetch_next`, :meth:`~Schedule.stream_output` (non-temporal
  stores through a staging buffer), :meth:`~Schedule.stream_row` (an output's row
  staged for the later passes that read it, then streamed),
  :meth:`~Schedule.store_nontemporal` (streaming stores straight from the registers);
* software pipelining of row passes: :meth:`~Schedule.software_pipeline`.

Loops are named by their loop variable, blocks by their name. Every primitive checks
its requirements first and raises :class:`~geode.errors.ScheduleError` naming the
primitive and the block concerned; a primitive that fails leaves the kernel exactly as
it was. Primitives that create loops return the new loop variables' names, which are
derived deterministically from the kernel's current names, so
:meth:`Trace.replay` on a fresh copy of the same kernel rebuilds the same AST.

Invariants the primitives rely on and preserve (the lowering establishes them):

* loop variables are unique in the kernel; block bodies use only their iteration
  variables and the kernel's dims; bindings and predicates use loop variables;
* for every block the map from its loops to its iteration variables is injective on
  the points where its predicate holds, and every predicate is a guard against the
  overrun of a non-dividing split (so dropping it for points inside the buffer's
  bounds never changes a value);
* a reduction block stores ``C[idx] = combine(C[idx], value)`` and is preceded by its
  init block (``reduce_of`` names it).

One documented exception to injectivity: the first-pass blocks that
:meth:`~Schedule.software_pipeline` moves into a later pass revisit a chunk's last row
(the "next" row is clamped to it); they only update registers that their row
re-initialises first, and the values of that extra visit are never read.

Index expressions are compared structurally first and then, when symbolic dims are
involved, with sympy (:mod:`geode.codegen.indexing`).

The rooms, one per primitive family, each a mixin of :class:`ScheduleBase`:

* ``base.py``: the kernel, the trace, the queries and shared internals;
* ``loops.py``: split, fuse, reorder, align, merge_dims;
* ``compute.py``: compute_inline, reverse_compute_inline, compute_at, fuse_siblings,
  reuse_output;
* ``reduction.py``: rfactor;
* ``cache_hints.py``: prefetch_next, stream_output, stream_row, store_nontemporal;
* ``pipelining.py``: software_pipeline, defer_last_pass;
* ``annotations.py``: parallel, vectorize, interleave, unroll;
* ``trace.py``: the trace and the ``primitive`` decorator;
* ``blocks.py``: block and statement queries and rewrites the families share.
"""

from __future__ import annotations

from geode.codegen.indexing import (
    LINE_BYTES,
    and_flags,
    conjuncts,
    exprs_equal,
    line_aligned,
)
from geode.codegen.schedule.annotations import Annotations
from geode.codegen.schedule.base import ScheduleBase
from geode.codegen.schedule.blocks import COMBINE_OPS, alloc_loop
from geode.codegen.schedule.cache_hints import CacheHints
from geode.codegen.schedule.compute import ComputeLocation
from geode.codegen.schedule.loops import LoopTransforms
from geode.codegen.schedule.pipelining import Pipelining
from geode.codegen.schedule.reduction import Reduction
from geode.codegen.schedule.trace import Trace, TraceStep

__all__ = [
    "COMBINE_OPS",
    "LINE_BYTES",
    "Schedule",
    "ScheduleBase",
    "Trace",
    "TraceStep",
    "alloc_loop",
    "and_flags",
    "conjuncts",
    "exprs_equal",
    "line_aligned",
]


class Schedule(
    LoopTransforms, ComputeLocation, Reduction, CacheHints, Pipelining, Annotations, ScheduleBase
):
    """Schedule primitives over a copy of a lowered kernel; see the package docstring.

    ``sch.kernel`` is the kernel being rewritten, ``sch.trace`` the primitives applied
    so far. ``str(sch)`` prints the current loop AST.
    """
