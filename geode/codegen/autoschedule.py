"""Default schedules, one per group pattern, built from the schedule primitives.

* **inline**: every Trivial block that writes a temporary is inlined into its readers,
  except, in a row-reduce group, a block read by several passes (a reduction and a
  later epilogue): it stays and is computed once per row into a row buffer.
* **elementwise**: output nests with the same extents share one nest
  (``compute_at``); the outer loops are fused into one parallel loop and the innermost
  loop is vectorized (a single pass over each row gets no software prefetch unless its
  output is streamed: the hardware prefetcher streams it). A producer
  whose value reaches a consumer's store through two or more math functions in series
  gets a vectorized loop of its own in each row, before its consumers' loop, which
  re-reads its row from the L1 (the LSTM gates' ``c'``; see :func:`_splits_chain`); the
  costliest such pass is cut in short chunks over which the next row is prefetched into
  the L2 (:func:`_chunk_elementwise_rows`). An output that such a later pass reads
  is staged in a row buffer and streamed to the output a part per chunk of that pass
  once the kernel's arrays outgrow the last-level cache (``stream_row``;
  :func:`_stream_split_rows`); an output no pass reads is then stored with
  non-temporal stores straight from the registers of its vector loop
  (``store_nontemporal``; :func:`_nontemporal_rows`). A nest
  that transposes a large input (its innermost loop does not walk the input's last
  axis, another loop does, with unit stride) is tiled instead (``split`` both axes,
  ``reorder`` the two tile loops innermost, ``fuse`` the rest into the parallel loop;
  see :func:`_tile_transpose`).
* **row_reduce / reduce_broadcast** (reduce axes trailing): every nest is aligned to
  ``for sp`` [``for rb``]; all blocks move under the last block's ``sp`` loop in
  program order, so one row is reduced, normalised and written while it is in cache;
  ``sp`` runs in parallel and every ``rb`` loop is vectorized (reductions may be
  reassociated: see ``geode.config.ACCURACY_POLICY``); a row buffer whose last reader
  writes an output lives in that output (``reuse_output``) unless that output is
  streamed (below), which it is only where the next row is prefetched over a costly
  pass cut in chunks (softmax's rows of 1024 and up; see :func:`_reuse_outputs`).
  With several passes over long rows: a costly later pass (softmax's
  exp, :attr:`Choices.pipeline_max_host_ops`) is cut into chunks over which the next row is
  prefetched into the L2 (``split``, ``prefetch_next(spread=...)``); otherwise, where
  the host pass (the first that writes an output) is cheap, the row loop is
  software-pipelined (``software_pipeline``): the next row's first pass runs inside the
  host, so reading the next row overlaps writing this one; where that is illegal (a
  first pass that writes more than registers), or where the output is streamed and its
  pass reads the row, the next row of each input is prefetched instead: spread over the
  streamed chunks into the L2, or in one burst after the first pass
  (``prefetch_next``). Every such prefetch fetches the row about 64 KiB of rows ahead,
  not the next one (``distance``; :func:`prefetch_distance`). A streamed last pass
  after a costly chunked pass (softmax's scale after its exp) then runs inside the next
  row's costly pass (``defer_last_pass``), so its streaming stores overlap that pass's
  arithmetic. Loop-invariant row indices are computed once per row by the backend.
* **reduce_tree** (chained reductions over different axes): the row loops of the last
  nest (the leading axes no reduction reduces) fused into one parallel row loop, every
  other nest moved under it (``compute_at``: each level's intermediate becomes a row
  buffer or a register), innermost loops vectorized (:func:`_reduce_tree`).
* **stitch_reduce** (a row and a column reduction of one input side by side): one pass
  over the input, row blocks in parallel with private column partials, each row's
  column loop vectorized for both reductions, then the partials combined
  (:func:`geode.codegen.stitch_schedule.schedule_stitch`).
* **column_reduce**: a reduction whose input is contiguous along spatial axes after
  its reduce axes runs ``outer spatial | reduce | inner spatial``, the inner spatial
  loops fused and vectorized (measurements: ``docs/performance.md``); each nest's outer loop runs
  in parallel unless it has a single iteration (see :func:`_single_iteration`).
* **merged views** (every pattern, last): a kernel argument or local temp that a fused
  loop indexes digit by digit (``x[.., rb // W, rb % W]``) is viewed with those dims
  merged (``merge_dims``; the step reshapes the array, see ``driver.arg_views``).
* **streaming stores** (elementwise and row patterns): an output written by one cheap
  block (:attr:`Choices.stream_max_ops`) and read by none, whose rows are whole cache lines and
  at least :attr:`Choices.stream_min_run_bytes` long (when static), is written through staging
  chunks with non-temporal stores once it reaches ``stream_min_bytes``
  (``stream_output``); in an elementwise nest, also that of a block with one
  transcendental function (:attr:`Choices.stream_max_ops_heavy`) once it reaches the L2 size,
  straight from the registers where its rows allow (``store_nontemporal``:
  :func:`_store_direct`), and every streamed element loop there is interleaved (``interleave``,
  :attr:`Choices.stream_interleave`; measurements: ``docs/performance.md``). A streamed
  output pass that also reads the row is not pipelined, one that only writes is (see ``_host_reads_inputs``).

* **full reductions** (every pattern, first): a group whose every output is one
  element reduced from many (a sum of ``[N, 1024]`` to a scalar) runs each reduction in
  two steps, contiguous runs in parallel, then their partials (:func:`_full_reduce`).

If a step's requirements fail, the schedule falls back to a simpler one (and, last,
to the unscheduled kernel); the reason is kept in ``Schedule.notes``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from geode.codegen import ast as A
from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import LINE_BYTES, Schedule
from geode.codegen.stitch_schedule import schedule_stitch
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.stitch import STITCH_PARTIALS
from geode.config import OptionError
from geode.debug import log
from geode.errors import ScheduleError


@dataclass(frozen=True)
class Choices:
    """The default schedules' tuning choices: thresholds, chunk sizes and distances.

    The schedules read the current choices through :func:`choices`: these defaults, or
    the set that an enclosing :func:`override_choices` installs (per thread and per
    async task)::

        with autoschedule.override_choices(pipeline_max_host_ops=1000):
            sch = autoschedule.schedule_group(lowered, group)

    ``schedule_group(..., choices=Choices(...))`` does the same for one call.
    """

    #: innermost chunk for 1-D elementwise nests (outer part runs in parallel)
    vector_chunk: int = 4096
    #: a group whose domain is static and smaller than this runs on one thread: forking
    #: costs more than the work, and a serial kernel compiles several times faster
    parallel_min_elements: int = 1 << 15
    #: whether any loop may run in parallel (0: every kernel on the calling thread)
    parallel: int = 1
    #: a Trivial block with at most this many arithmetic ops (none of them costly) is
    #: recomputed in each pass that reads it instead of being kept in a row buffer
    recompute_max_ops: int = 4
    #: a producer whose value reaches its consumer's store through at least this many math
    #: functions in series (its own, then the consumer's after the load) gets a loop of its
    #: own in each row (:func:`_splits_chain`)
    split_min_chain: int = 2
    #: ... and when its row, which the consumer's loop re-reads, fits in this many bytes (L1)
    split_max_row_bytes: int = 16 << 10
    #: a transposed input smaller than this (bytes, static shape) is not tiled: it sits in
    #: the L1 and L2 caches whatever the loop order
    transpose_min_bytes: int = 1 << 16
    #: tile edge (bytes) of a transposed nest: 128 bytes is two cache lines of the input
    #: per tile row, 32 float32 elements (two AVX-512 vectors) per output tile row; a
    #: 32 x 32 float32 tile of both arrays (8 KiB) stays in the L1
    transpose_tile_bytes: int = 128
    #: rows shorter than this (elements) are left to the hardware prefetcher
    prefetch_min_row: int = 1024
    #: a host pass costing more than this many vector instructions per element (see
    #: :func:`element_cost`) is neither pipelined nor followed by a next-row prefetch:
    #: its arithmetic already hides the next row's fetch. Measurements:
    #: ``docs/performance.md`` (``pipeline_max_host_ops``).
    pipeline_max_host_ops: int = 8
    #: elements per chunk of a costly row pass cut up to carry the next row's prefetch
    #: (as :attr:`Choices.stream_chunk`, which softmax's streamed scale pass uses on the same row)
    prefetch_chunk: int = 128
    #: elements per chunk of an elementwise nest's costly pass cut up to carry the next
    #: row's prefetch (two vectors of float32 at 512 bits: the fetch is spread finely)
    elementwise_prefetch_chunk: int = 32
    #: elements per part of a row buffer streamed over a later pass of its row
    #: (:func:`_stream_split_rows`): the pass is cut in chunks of this many elements and each
    #: chunk streams one part of the row (float32: four cache lines)
    row_stream_chunk: int = 64
    #: how far ahead, in bytes of the prefetched inputs' rows, a row loop's software
    #: prefetch fetches (:func:`prefetch_distance`; at least one row, at most
    #: :attr:`Choices.prefetch_max_rows`). Measurements: ``docs/performance.md``
    #: (``prefetch_ahead_bytes``).
    prefetch_ahead_bytes: int = 64 << 10
    prefetch_max_rows: int = 8
    #: elements per staged chunk of a streamed output row (512 B of float32: 8 cache
    #: lines). Measurements: ``docs/performance.md`` (``stream_chunk``).
    stream_chunk: int = 128
    #: the fewest contiguous bytes per streamed chunk (a row shorter than a chunk is one
    #: chunk): below it the staging and fencing cost more than the read-for-ownership
    #: they save. Measurements: ``docs/performance.md`` (``stream_min_run_bytes``).
    stream_min_run_bytes: int = 512
    #: a block streams its output only when it costs at most this many vector
    #: instructions per element: streaming adds a store and a load per element (the
    #: staging buffer), which a memory-bound block hides and a compute-bound one pays
    #: for. Measurements: ``docs/performance.md`` (``stream_max_ops``).
    stream_max_ops: int = 20
    #: an elementwise block costing from :attr:`Choices.stream_min_ops_heavy` to this many vector
    #: instructions per element (one transcendental function and some arithmetic: erf GELU
    #: 33, 37 as torch exports it, tanh GELU 34; not the LSTM cell's h, 50) streams its output once it reaches the
    #: L2 size, with its vector loop interleaved (:attr:`Choices.stream_interleave`): a compute-heavy
    #: block writes slowly, so skipping the read-for-ownership pays even for outputs the L3
    #: could hold, and a reader of the output loses little by fetching it from memory.
    stream_max_ops_heavy: int = 40
    #: the low end of that band. Measurements: ``docs/performance.md``
    #: (``stream_min_ops_heavy``).
    stream_min_ops_heavy: int = 28
    #: the interleave factor of a streamed elementwise nest's vector loop on targets
    #: with 32 vector registers (AVX-512: four chains of a tanh GELU and its dozen or so
    #: constants fit without spills; :func:`stream_interleave`; 1 elsewhere). A chain
    #: of 20-40 dependent vector instructions per element (a transcendental function)
    #: leaves the out-of-order window with two or three chains
    #: in flight when LLVM lays the vectors of its unrolled loop one after another;
    #: interleaving four keeps the FMA units busy. Measurements: ``docs/performance.md``
    #: (``stream_interleave``).
    stream_interleave: int = 4
    #: partial results of a full reduction to a scalar (two-step reduce, see
    #: :func:`_full_reduce`): the reduction is cut into this many contiguous runs, one
    #: parallel iteration each, so every thread takes a share (64 runs balance well on
    #: up to 16 threads and add 64 elements to the second step); 1 turns it off
    rfactor_partials: int = 64
    #: ... for a group whose every output holds at most this many elements (static): 1,
    #: reductions to a scalar; more takes reductions of a few rows too (each partial run
    #: then covers every row), where the rows alone are too few to share out
    rfactor_max_outputs: int = 1
    #: a column reduction (the sum over axis 0 of ``[N, C]``) cut into this many
    #: contiguous runs of rows, each run's partial sums a parallel iteration, then the
    #: partials added up (:func:`_tiled_column_reduce`); 1: the rows in one serial pass
    column_partials: int = 1
    #: the columns of a column reduction cut in tiles of this many elements, the tile
    #: loop outermost (in parallel when the rows are not cut): each tile's accumulators
    #: stay in vector registers over all the rows; 0: one pass over whole rows
    column_tile: int = 0
    #: row blocks of a stitch kernel (a row and a column reduction of one input in one
    #: pass, :func:`geode.codegen.stitch_schedule.schedule_stitch`), each with a private
    #: row of column partials: every thread gets blocks, and the combine reads this many
    #: rows of partials (the profitability model assumes the same: ``STITCH_PARTIALS``)
    stitch_partials: int = STITCH_PARTIALS
    #: cache line size (bytes) the schedules assume when they decide which rows to
    #: stream: a streamed row must be whole cache lines
    line_bytes: int = LINE_BYTES


_DEFAULT_CHOICES = Choices()
_CHOICES: contextvars.ContextVar[Choices | None] = contextvars.ContextVar(
    "geode_autoschedule_choices", default=None
)


def choices() -> Choices:
    """The tuning choices in effect (the defaults unless overridden)."""
    return _CHOICES.get() or _DEFAULT_CHOICES


@contextlib.contextmanager
def override_choices(base: Choices | None = None, **changes: int) -> Iterator[Choices]:
    """Use ``base`` (default: the current choices) with ``changes`` applied while the
    block runs; unknown names raise :class:`~geode.config.OptionError`."""
    start = base if base is not None else choices()
    known = {f.name for f in dataclasses.fields(Choices)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise OptionError(f"unknown choices {unknown}; known: {sorted(known)}")
    token = _CHOICES.set(dataclasses.replace(start, **changes))
    try:
        yield choices()
    finally:
        _CHOICES.reset(token)


def wants_parallel(group: Group) -> bool:
    """False for groups with a static domain too small to be worth threads (and for
    every group when :attr:`Choices.parallel` is 0)."""
    if not choices().parallel:
        return False
    n = 1
    for d in group.domain:
        if not isinstance(d, int):
            return True
        n *= d
    return n >= choices().parallel_min_elements


def schedule_group(
    lowered: LoweredKernel,
    group: Group,
    stream_min_bytes: int | None = None,
    interleave: int = 1,
    heavy_stream_min_bytes: int | None = None,
    tuning: Choices | None = None,
) -> Schedule:
    """The default schedule of a lowered group (never raises ScheduleError).

    ``stream_min_bytes``: outputs of at least this many bytes written by cheap blocks
    are stored with streaming stores (:meth:`Schedule.stream_output`; the driver passes
    the last-level cache size); None never streams. ``interleave``: the interleave
    factor of a streamed elementwise nest's vector loop (the driver passes
    :func:`stream_interleave` of the target; 1 leaves it to the backend). With ``interleave > 1`` an
    elementwise block costing :attr:`Choices.stream_min_ops_heavy` to :attr:`Choices.stream_max_ops_heavy`
    streams outputs of at least ``heavy_stream_min_bytes`` (the driver passes the L2
    size; None: ``stream_min_bytes``). ``tuning`` replaces the current :func:`choices`
    for this call."""
    if tuning is not None:
        with override_choices(tuning):
            return schedule_group(
                lowered, group, stream_min_bytes, interleave, heavy_stream_min_bytes
            )
    notes: list[str] = []
    pattern = group.pattern_name()
    for level in ("full", "inline"):
        sch = Schedule(lowered.kernel)
        try:
            if level in ("full", "inline"):
                _inline(sch, group, row_buffers=pattern in ("row_reduce", "reduce_broadcast"))
            if level == "full":
                par = wants_parallel(group)
                rows = None
                if pattern == "reduce_tree":
                    _reduce_tree(sch, group, par)
                elif pattern == "stitch_reduce":
                    schedule_stitch(sch, group, par, choices().stitch_partials)
                elif par and _full_reduce(sch):
                    pass  # every reduction to a scalar cut in parallel runs
                elif pattern == "elementwise":
                    rows = _elementwise(sch, par)
                elif pattern in ("row_reduce", "reduce_broadcast"):
                    rows = _row_reduce(sch, lowered, group, par, stream_min_bytes)
                elif par:
                    _column_reduce(sch, lowered, group)
                if stream_min_bytes is not None and pattern not in (
                    "column_reduce",
                    "reduce_tree",
                    "stitch_reduce",
                ):
                    wide = pattern == "elementwise" and interleave > 1
                    heavy = heavy_stream_min_bytes
                    if heavy is None:
                        heavy = stream_min_bytes
                    streamed = _stream_outputs(sch, stream_min_bytes, heavy if wide else None)
                    for loop in streamed if wide else []:
                        sch.interleave(loop, interleave)
                if rows is not None and pattern == "elementwise":
                    _chunk_elementwise_rows(sch, rows)
                if rows is not None:
                    _prefetch_rows(sch, rows, bursts=pattern != "elementwise")
                if rows is not None and pattern == "elementwise":
                    _stream_split_rows(sch, rows, stream_min_bytes)
                _merge_digit_dims(sch)
                if rows is not None:
                    _defer_output_pass(sch, rows)
                if rows is not None and pattern == "elementwise":
                    _nontemporal_rows(sch, rows, stream_min_bytes)
            sch.notes = notes  # type: ignore[attr-defined]
            sch.level = level  # type: ignore[attr-defined]
            return sch
        except ScheduleError as exc:
            notes.append(f"{level} schedule failed: {exc}")
            log.debug("kernel %s: %s", lowered.kernel.name, notes[-1])
    sch = Schedule(lowered.kernel)
    sch.notes = notes  # type: ignore[attr-defined]
    sch.level = "none"  # type: ignore[attr-defined]
    return sch


def _temp_names(sch: Schedule) -> set[str]:
    return {b.name for b in sch.kernel.temps}


def _writes(block: A.Block) -> set[str]:
    return {s.buffer for s in A.walk_stmts(block.body) if isinstance(s, A.Store)}


def _is_trivial(block: A.Block) -> bool:
    return block.reduce_of is None and all(iv.kind == "spatial" for iv in block.iter_vars)


def _inline(sch: Schedule, group: Group, row_buffers: bool) -> None:
    """Inline Trivial temp-writing blocks into their readers (reverse program order)."""
    for name in reversed(sch.blocks()):
        b = sch.get_block(name)
        if not _is_trivial(b):
            continue
        bufs = _writes(b)
        if not bufs or not bufs <= _temp_names(sch):
            continue
        if (
            row_buffers
            and _reader_count(sch, name, bufs) > 1
            and not _reads_only_reduced(b, sch)
            and not _cheap_to_recompute(b)
        ):
            continue  # read by several passes over the row: keep it in a row buffer
        try:
            sch.compute_inline(name)
        except ScheduleError as exc:
            log.debug("inline %s skipped: %s", name, exc)


def _reader_count(sch: Schedule, name: str, bufs: set[str]) -> int:
    """How many blocks other than ``name`` read one of ``bufs``."""
    readers: set[str] = set()
    for buf in bufs:
        readers |= set(sch.readers(buf))
    readers.discard(name)
    return len(readers)


#: ops whose recomputation in every pass costs more than keeping a row buffer
_COSTLY_OPS = A.UN_OPS - {
    "neg",
    "not",
    "bitnot",
    "abs",
    "isnan",
    "isinf",
    "isposinf",
    "isneginf",
    "fence",
}


def _cheap_to_recompute(b: A.Block) -> bool:
    """A few cheap arithmetic ops per element (LayerNorm's ``x - mean``): recomputing them
    in each pass is cheaper than a row buffer, which the last pass would have to re-read
    and rewrite in place (an extra pass over the output row)."""
    ops = 0
    for st in A.walk_stmts(b.body):
        if not isinstance(st, A.Store):
            continue
        for e in A.walk(st.value):
            if isinstance(e, A.Un):
                if e.op in _COSTLY_OPS:
                    return False
                ops += 1
            elif isinstance(e, A.Bin):
                if e.op in ("/", "//", "%", "fmod", "pow"):
                    return False
                ops += 1
    return ops <= choices().recompute_max_ops


def _reads_only_reduced(b: A.Block, sch: Schedule) -> bool:
    """A block whose output is per row (cheap scalar math): inlining it costs nothing."""
    buf = next(iter(_writes(b)))
    shape = sch.kernel.buffer(buf).shape
    return all(isinstance(d, A.Const) and d.value == 1 for d in shape[-1:])


def _nest_loops(sch: Schedule, block: str) -> list[str]:
    return sch.get_loops(block)


def _elementwise(sch: Schedule, par: bool) -> str | None:
    """One parallel, vectorized loop nest per iteration space (producers computed at
    their consumer's innermost loop, or in a loop of their own per row where that
    splits a long chain of math functions: :func:`_splits_chain`). Returns the parallel
    row loop when there is one nest of rows (the loop :func:`_prefetch_rows` may
    prefetch over once the outputs are streamed), else None."""
    blocks = sch.blocks()
    if not blocks:
        return None
    anchor = blocks[-1]
    loops = _nest_loops(sch, anchor)
    split = False
    for name in reversed(blocks[:-1]):
        if loops and _extents(sch, name) == _extents(sch, anchor):
            if len(loops) >= 2 and _splits_chain(sch, name):
                sch.compute_at(name, loops[-2])
                split = True
            else:
                sch.compute_at(name, loops[-1])
    done: set[str] = set()
    for name in sch.blocks():
        loops = _nest_loops(sch, name)
        if not loops or loops[0] in done:
            continue  # scalar block, or its nest was already scheduled
        if not _tile_transpose(sch, name, par):
            _parallel_vector(sch, loops, par)
        done.add(_nest_loops(sch, name)[0])
    if split:  # the split producers' loops run beside the anchor's vectorized one
        top = _nest_loops(sch, anchor)[0]
        for name in sch.blocks():
            loops = _nest_loops(sch, name)
            if loops and loops[0] == top and sch.get_loop(loops[-1]).kind is A.ForKind.SERIAL:
                sch.vectorize(loops[-1])
    if len(done) != 1:
        return None
    (top,) = done
    return top if sch.get_loop(top).kind is A.ForKind.PARALLEL else None


#: math functions with a long dependency chain (tens of cycles each: range reduction,
#: a polynomial, scaling, often a division)
_LONG_OPS = _COSTLY_OPS - {"floor", "ceil", "round", "sign"}


def _chain(e: A.Expr, buffers: set[str] | None = None) -> int:
    """The most :data:`_LONG_OPS` on one path from ``e`` down to a load (of one of
    ``buffers``, when given; -1 when ``e`` loads none of them). Index expressions do not
    count."""
    if isinstance(e, A.Load):
        return 0 if buffers is None or e.buffer in buffers else -1
    kids = A.children(e)
    depth = max((_chain(k, buffers) for k in kids), default=0 if buffers is None else -1)
    if depth >= 0 and isinstance(e, A.Un) and e.op in _LONG_OPS:
        depth += 1
    return depth


def _stored_values(b: A.Block) -> list[A.Expr]:
    return [s.value for s in A.walk_stmts(b.body) if isinstance(s, A.Store)]


def _splits_chain(sch: Schedule, name: str) -> bool:
    """Whether producer ``name`` of an elementwise nest should run in a loop of its own
    in each row, before its consumers' loop (``compute_at`` on the row loop) instead
    of inside it: when its value reaches a consumer's store through
    :attr:`Choices.split_min_chain` or more math functions in series, and its static row fits
    :attr:`Choices.split_max_row_bytes`.

    Why: a math function is a chain of dependent vector instructions tens of cycles
    long; two in series make one iteration of the fused loop longer than the core's
    out-of-order window can overlap with the next, so the loop runs at the chain's
    latency, not at the core's throughput. Split, each loop holds independent chains
    (the LSTM gates: ``sigmoid(o) * tanh(c')`` after ``c' = sigmoid(f) * c +
    sigmoid(i) * tanh(g)``), and the consumer re-reads the producer's row from the L1;
    it pays with the data in memory and more with it in the cache
    (measurements: ``docs/performance.md``)."""
    b = sch.get_block(name)
    bufs = _writes(b)
    own = max((_chain(v) for v in _stored_values(b)), default=0)
    after = -1
    for other in sch.blocks():
        if other == name:
            continue
        for v in _stored_values(sch.get_block(other)):
            after = max(after, _chain(v, bufs))
    if after < 0 or own + after < choices().split_min_chain:
        return False
    extent = sch.get_loop(_nest_loops(sch, name)[-1]).extent
    if not isinstance(extent, A.Const):
        return False
    itemsize = max(np.dtype(sch.kernel.buffer(x).dtype).itemsize for x in bufs)
    return int(extent.value) * itemsize <= choices().split_max_row_bytes


def _transposed_axis(sch: Schedule, block: str, loops: list[str]) -> str | None:
    """The loop ``a`` along which a large input of ``block`` is contiguous when the
    innermost loop is not: the load's last index does not use the innermost loop but
    moves by one with ``a``, and another of its indices uses the innermost loop (a
    transpose; a broadcast along the innermost loop is not one). None when every large
    input is read along the innermost loop."""
    inner = loops[-1]
    k = sch.kernel
    args = {b.name: b for b in k.inputs}
    for buf, strides in sch.load_strides(block, inner):
        if buf not in args or len(strides) < 2 or strides[-1] != 0 or not any(strides[:-1]):
            continue
        size = A.prod(list(args[buf].shape))
        itemsize = np.dtype(args[buf].dtype).itemsize
        if isinstance(size, A.Const) and int(size.value) * itemsize < choices().transpose_min_bytes:
            continue
        for a in loops[:-1]:
            if dict(sch.load_strides(block, a)).get(buf, [None])[-1] == 1:
                return a
    return None


def _tile_edge(extent: A.Expr, itemsize: int) -> int | None:
    """The tile edge for a loop of ``extent``: :attr:`Choices.transpose_tile_bytes` worth of
    elements, or the largest divisor of a static extent from half of that up (no tail
    tile); None when a static extent fits in one tile (the loop stays whole)."""
    edge = max(8, choices().transpose_tile_bytes // itemsize)
    if not isinstance(extent, A.Const):
        return edge
    n = int(extent.value)
    if n <= edge:
        return None
    for t in range(edge, edge // 2 - 1, -1):
        if n % t == 0:
            return t
    return edge


def _tile_transpose(sch: Schedule, block: str, par: bool) -> bool:
    """Tile a transposing nest (see :func:`_transposed_axis`) so that both the input and
    the output are walked in cache-resident tiles: the innermost loop and the loop ``a``
    along which the input is contiguous are split into tiles (:func:`_tile_edge`), the
    two tile loops move innermost (``a``'s outside), the other loops are fused into one
    parallel loop and the innermost tile loop is vectorized (contiguous stores, the
    input read from the L1 across the tile's rows). A tile of ``[4, 1024, 1024]``
    transposed over its last two axes walked 32 rows of the input per 128-byte line
    instead of 1024 pages per output row. Returns False (the nest unchanged) when the
    nest is no transpose, fits in one tile, or a step fails."""
    loops = sch.get_loops(block)
    if len(loops) < 2:
        return False
    a = _transposed_axis(sch, block, loops)
    if a is None:
        return False
    inner = loops[-1]
    itemsize = max(np.dtype(b.dtype).itemsize for b in sch.kernel.inputs + sch.kernel.outputs)
    edges = {v: _tile_edge(sch.get_loop(v).extent, itemsize) for v in (a, inner)}
    if edges[a] is None and edges[inner] is None:
        return False
    kernel, steps = sch.kernel.copy(), list(sch.trace.steps)
    try:
        _apply_tiles(sch, loops, a, inner, edges, par)
    except ScheduleError as exc:
        sch.kernel, sch.trace.steps = kernel, steps
        log.debug("transpose nest of %s not tiled: %s", block, exc)
        return False
    return True


def _apply_tiles(
    sch: Schedule, loops: list[str], a: str, inner: str, edges: dict[str, int | None], par: bool
) -> None:
    """Split ``a`` and ``inner`` by their tile edges, move the two tile loops innermost,
    fuse the rest into one (parallel) loop and vectorize the innermost tile loop."""
    order: list[str] = []
    tiles: list[str] = []
    for v in loops:
        if v in (a, inner) and edges[v] is not None:
            hi, lo = sch.split(v, [None, edges[v]])
            order.append(hi)
            tiles.append(lo)
        elif v in (a, inner):
            tiles.append(v)
        else:
            order.append(v)
    sch.reorder(order + tiles)
    outer = sch.fuse(order) if len(order) > 1 else order[0]
    if par:
        sch.parallel(outer)
    sch.vectorize(tiles[-1])


def _parallel_vector(sch: Schedule, loops: list[str], par: bool) -> None:
    if len(loops) >= 3:
        outer = sch.fuse(loops[:-1])
        loops = [outer, loops[-1]]
    if len(loops) == 1:
        ext = sch.get_loop(loops[0]).extent
        if isinstance(ext, A.Const) and ext.value <= choices().vector_chunk:
            sch.vectorize(loops[0])
            return
        if not par:
            sch.vectorize(loops[0])
            return
        loops = sch.split(loops[0], [None, choices().vector_chunk])
    if par:
        sch.parallel(loops[0])
    sch.vectorize(loops[-1])


def _extents(sch: Schedule, block: str) -> list[str]:
    return [A.expr_str(sch.get_loop(lp).extent) for lp in sch.get_loops(block)]


def _row_reduce(
    sch: Schedule, lowered: LoweredKernel, group: Group, par: bool, stream_min_bytes: int | None
) -> str | None:
    """Schedule a row-reduce group; returns the row loop whose next row should be
    prefetched once the outputs are streamed (see :func:`_prefetch_rows`), or None."""
    rank = len(group.domain)
    axes = sorted(group.axes)
    for name in sch.blocks():
        b = sch.get_block(name)
        if b.reduce_of is not None:
            continue
        full = (
            len(b.iter_vars) == rank
            and not any(iv.kind == "reduce" for iv in b.iter_vars)
            and all(_same_extent(b.iter_vars[i].extent, lowered, group, i) for i in range(rank))
        )
        sch.align(name, reduce_axes=axes if full else None)
    for name in sch.blocks():
        b = sch.get_block(name)
        if b.reduce_of is not None:
            sch.align(name)
    blocks = [n for n in sch.blocks() if sch.get_block(n).reduce_of is None]
    anchor = blocks[-1]
    sp = _nest_loops(sch, anchor)[0]
    for name in reversed(blocks[:-1]):
        sch.compute_at(name, sp)
    if par:
        sch.parallel(sp)
    for name in sch.blocks():
        loops = _nest_loops(sch, name)
        if len(loops) >= 2 and sch.get_loop(loops[-1]).kind is A.ForKind.SERIAL:
            sch.vectorize(loops[-1], allow_reassoc=True)
    _fuse_row_passes(sch, sp)
    _reuse_outputs(sch, sp, par, stream_min_bytes)
    streamed = any(_streams(sch, b, stream_min_bytes) for b in sch.blocks())
    if not par:
        return None
    if _chunk_costly_pass(sch, sp):
        return sp  # its arithmetic hides the next row's fetch, spread over its chunks
    if _host_cost(sch, sp) > choices().pipeline_max_host_ops:
        return None  # a compute-bound host that cannot be chunked: no prefetch either
    if (streamed and _host_reads_inputs(sch, sp)) or not _pipeline_rows(sch, sp):
        return sp
    return None


#: rows per chunk of a software-pipelined row loop (each chunk's first row is not
#: overlapped), and the fewest chunks a row loop is cut into (threads to share them)
PIPELINE_CHUNK, PIPELINE_MIN_CHUNKS = 64, 8


def _pipeline_rows(sch: Schedule, sp: str) -> bool:
    """Software-pipeline long rows: the next row's first pass (reading it from memory)
    runs inside the current row's first pass that writes an output (which fetches the
    output row from memory, and in softmax also computes the exp), so reads, writes and
    arithmetic overlap; this beats the unpipelined loop with a next-row prefetch
    (measurements: ``docs/performance.md``)."""
    loop = sch.get_loop(sp)
    passes = [s for s in loop.body if isinstance(s, A.For)]
    if len(passes) < 2:
        return False
    ext = passes[0].extent
    if isinstance(ext, A.Const) and int(ext.value) < choices().prefetch_min_row:
        return False
    try:
        sch.software_pipeline(sp, PIPELINE_CHUNK, PIPELINE_MIN_CHUNKS, into=pipeline_host(sch, sp))
    except ScheduleError as exc:
        log.debug("rows of %s not pipelined: %s", sp, exc)
        return False
    return True


def _host_loop(sch: Schedule, sp: str) -> A.For | None:
    """The pass of row loop ``sp`` that :func:`pipeline_host` names (default: the last)."""
    host = pipeline_host(sch, sp)
    passes = [s for s in sch.get_loop(sp).body if isinstance(s, A.For)]
    return next((p for p in passes if p.var == host), passes[-1] if passes else None)


def _host_cost(sch: Schedule, sp: str) -> int:
    """Vector instructions per element of the host pass's blocks."""
    loop = _host_loop(sch, sp)
    return _pass_cost(loop) if loop is not None else 0


def _host_reads_inputs(sch: Schedule, sp: str) -> bool:
    """Whether the pass that would host the next row's first pass reads a kernel input
    (LayerNorm's normalise pass reads ``x``, the reduce chain's broadcast pass reads
    nothing). A streamed output pass that also reads the row is not pipelined: the extra
    stream of the next row costs it more than the overlap saves (LayerNorm); a write-only
    host overlaps the next row's reads with its streaming stores (the reduce chain)
    (measurements: ``docs/performance.md``)."""
    loop = _host_loop(sch, sp)
    if loop is None:
        return False
    inputs = {b.name for b in sch.kernel.inputs}
    for b in A.blocks(loop.body):
        for st in A.walk_stmts(b.body):
            if isinstance(st, A.Store) and any(ld.buffer in inputs for ld in A.loads(st.value)):
                return True
    return False


def pipeline_host(sch: Schedule, sp: str) -> str | None:
    """The pass of row loop ``sp`` that hosts the next row's first pass: the first later
    pass writing a kernel output (it fetches the output row; in softmax it also computes
    the exp), or None (the last pass)."""
    passes = [s for s in sch.get_loop(sp).body if isinstance(s, A.For)]
    outputs = {b.name for b in sch.kernel.outputs}
    return next(
        (p.var for p in passes[1:] if any(_writes(b) & outputs for b in A.blocks(p.body))),
        None,
    )


def _pass_cost(p: A.For) -> int:
    """Vector instructions per element of pass ``p``'s blocks (see :func:`element_cost`)."""
    return sum(element_cost(b) for b in A.blocks(p.body))


def _chunk_costly_pass(
    sch: Schedule,
    sp: str,
    first: int = 1,
    chunk: int | None = None,
    reassoc: bool = True,
) -> bool:
    """Cut the costliest pass over each row from pass ``first`` on (softmax's exp, after
    its max pass; an elementwise nest's costliest pass) into serial chunks of ``chunk``
    vectorized elements when it costs more than :attr:`Choices.pipeline_max_host_ops` per
    element and its row length is a constant multiple of the chunk of at least
    :attr:`Choices.prefetch_min_row`; :func:`_prefetch_rows` then spreads the next row's fetch
    over those chunks, where the arithmetic hides it. ``reassoc``: the chunk loop may
    reassociate (a reduction's pass). Returns whether it did. ``chunk`` defaults to
    :attr:`Choices.prefetch_chunk` (read when called, so overridden choices apply)."""
    chunk = choices().prefetch_chunk if chunk is None else chunk
    top = _costly_pass(sch, sp, first, chunk)
    if top is None:
        return False
    _, inner = sch.split(top.var, [None, chunk])
    sch.vectorize(inner, allow_reassoc=reassoc)
    return True


def _costly_pass(sch: Schedule, sp: str, first: int = 1, chunk: int | None = None) -> A.For | None:
    """The pass :func:`_chunk_costly_pass` would cut in chunks, or None."""
    chunk = choices().prefetch_chunk if chunk is None else chunk
    passes = [s for s in sch.get_loop(sp).body if isinstance(s, A.For)]
    top = max(passes[first:], key=_pass_cost, default=None)
    if top is None or _pass_cost(top) <= choices().pipeline_max_host_ops:
        return None
    n = int(top.extent.value) if isinstance(top.extent, A.Const) else 0
    return None if n < choices().prefetch_min_row or n % chunk else top


def _chunk_elementwise_rows(sch: Schedule, sp: str) -> None:
    """In an elementwise nest with two or more passes over each row (a split chain:
    :func:`_splits_chain`) of long rows that no streamed output already cut in chunks,
    cut the costliest pass (more than :attr:`Choices.pipeline_max_host_ops` vector instructions
    per element) in chunks of :attr:`Choices.elementwise_prefetch_chunk`, over which
    :func:`_prefetch_rows` spreads the next row's fetch into the L2.

    Why: each pass walks a few 4 KiB pages of the row side by side and the hardware
    prefetcher starts each page of the next row cold, while the passes' arithmetic
    leaves the memory idle; spreading the next row's fetch over the chunks fills that
    gap. Single-pass nests keep the hardware prefetcher alone: there the same chunks
    gained nothing or cost time (measurements: ``docs/performance.md``)."""
    passes = [s for s in sch.get_loop(sp).body if isinstance(s, A.For)]
    if len(passes) < 2 or any(p.kind is A.ForKind.SERIAL for p in passes):
        return  # one pass, or already chunked (a streamed output): see the docstring
    _chunk_costly_pass(sch, sp, first=0, chunk=choices().elementwise_prefetch_chunk, reassoc=False)


def _stream_split_rows(sch: Schedule, sp: str, min_bytes: int | None) -> None:
    """In an elementwise nest split into passes over each row (:func:`_splits_chain`),
    write each output that a later pass of the row reads through a row buffer
    (``stream_row``): the later passes read the buffer from the L1, and the buffer is
    streamed to the output a part at a time over the next pass, cut in chunks of
    :attr:`Choices.row_stream_chunk` for that, so the output's lines are not fetched from memory
    before they are overwritten and its stores overlap that pass's arithmetic. Only
    where the kernel's arrays together hold at least ``min_bytes`` (the driver passes
    the last-level cache size: smaller, the output would still be in the cache for its
    next reader), for rows of whole cache lines that fit :attr:`Choices.split_max_row_bytes`
    (one row buffer per thread).

    Streaming the row a part per chunk of the next pass, rather than copying the whole
    row in one burst after its pass, keeps the stores from stalling on the output's
    lines where the arrays still fit the last-level cache. An output that no pass reads
    (the LSTM cell's ``h``) gains too little from the staging: it is stored from the
    registers instead, see :func:`_nontemporal_rows` (measurements:
    ``docs/performance.md``)."""
    for out, writer, share in _split_row_outputs(sch, sp, min_bytes):
        row_bytes = _row_bytes(out)
        if (
            not sch.readers(out.name)
            or row_bytes is None
            or row_bytes % choices().line_bytes
            or row_bytes > choices().split_max_row_bytes
        ):
            continue
        try:
            spread = _chunk_next_pass(sch, sp, writer)
            sch.stream_row(writer, sp, share, spread)
        except ScheduleError as exc:
            log.debug("output %s not streamed by rows: %s", out.name, exc)


def _split_row_outputs(
    sch: Schedule, sp: str, min_bytes: int | None
) -> list[tuple[A.Buffer, str, int]]:
    """In a nest with two or more passes over each row of loop ``sp``: each output with
    one writer, that writer and the output's share of ``min_bytes``
    (:func:`_output_share`), unless the output is statically smaller than its share
    (then the output would stay in the cache for its next reader). None at all when
    ``min_bytes`` is None."""
    passes = [s for s in sch.get_loop(sp).body if isinstance(s, A.For)]
    if min_bytes is None or len(passes) < 2:
        return []
    out = []
    for buf in sch.kernel.outputs:
        writers = sch.writers(buf.name)
        share = _output_share(sch, buf, min_bytes)
        size = A.prod(list(buf.shape))
        if len(writers) != 1 or (
            isinstance(size, A.Const) and int(size.value) * _itemsize(buf) < share
        ):
            continue
        out.append((buf, writers[0], share))
    return out


def _nontemporal_rows(sch: Schedule, sp: str, min_bytes: int | None) -> None:
    """In an elementwise nest split into passes over each row (:func:`_splits_chain`),
    write each output that no pass reads and nothing streams yet with streaming stores
    straight from the registers (``store_nontemporal``), under the same size rule as
    :func:`_stream_split_rows`: the LSTM cell's ``h``, whose costly arithmetic
    (``sigmoid(o) * tanh(c')``) made a staged copy cost more than it saved (see there).
    The output's lines are then neither read from memory before they are overwritten
    nor waited for by the stores (measurements: ``docs/performance.md``)."""
    for out, writer, share in _split_row_outputs(sch, sp, min_bytes):
        if sch.readers(out.name):
            continue
        try:
            sch.store_nontemporal(writer, share)
        except ScheduleError as exc:
            log.debug("output %s not stored non-temporally: %s", out.name, exc)


def _chunk_next_pass(sch: Schedule, sp: str, block: str) -> str | None:
    """Cut the pass after ``block``'s in row loop ``sp`` in vectorized chunks of
    :attr:`Choices.row_stream_chunk` (a vectorized pass whose static extent is a larger multiple
    of it) and return the chunk loop; else None."""
    body = sch.get_loop(sp).body
    loops = set(sch.get_loops(block))
    at = next((i for i, s in enumerate(body) if isinstance(s, A.For) and s.var in loops), None)
    nxt = None if at is None else next((s for s in body[at + 1 :] if isinstance(s, A.For)), None)
    if (
        nxt is None
        or nxt.kind is not A.ForKind.VECTORIZED
        or not isinstance(nxt.extent, A.Const)
        or int(nxt.extent.value) % choices().row_stream_chunk
        or int(nxt.extent.value) == choices().row_stream_chunk
    ):
        return None
    outer, inner = sch.split(nxt.var, [None, choices().row_stream_chunk])
    sch.vectorize(inner, allow_reassoc=False)
    return outer


def _itemsize(buf: A.Buffer) -> int:
    return np.dtype(buf.dtype).itemsize


def _row_bytes(buf: A.Buffer) -> int | None:
    """The static size in bytes of one row (all but the first axis) of ``buf``, or None."""
    row = A.prod(list(buf.shape[1:]))
    if not buf.shape or not isinstance(row, A.Const):
        return None
    return int(row.value) * _itemsize(buf)


def _output_share(sch: Schedule, out: A.Buffer, total: int) -> int:
    """The size ``out`` has when the kernel's arguments together hold ``total`` bytes,
    where they all have ``out``'s first axis and static rows (their sizes then keep one
    ratio); else ``total`` itself."""
    args = sch.kernel.inputs + sch.kernel.outputs
    rows = [_row_bytes(b) for b in args]
    if any(r is None or b.shape[0] != out.shape[0] for r, b in zip(rows, args)):
        return total
    mine = _row_bytes(out)
    assert mine is not None
    return -(-total * mine // sum(r for r in rows if r is not None))


def _prefetch_rows(sch: Schedule, sp: str, bursts: bool = True) -> None:
    """With two or more passes over each row, or one pass cut in chunks (a streamed
    elementwise row), prefetch a row ahead of every input read row by row (the row
    :func:`prefetch_distance` rows on), so fetching it overlaps the later passes or
    chunks instead of stalling a later row's first pass. Where a pass is cut in chunks
    (an output streamed in chunks, or a costly pass: :func:`_chunk_costly_pass`), the
    prefetch is spread over the costliest such pass into the L2 (each chunk fetches its
    share of the row ahead while its streaming stores drain or its arithmetic runs: the
    read stream overlaps the rest as in a copy); otherwise it is one burst into every
    cache level once the first pass is done. Spread into the L2 beats spread into the
    L1, one burst into the L2 and no prefetch; streamed elementwise rows gain from it
    too (measurements: ``docs/performance.md``).

    ``bursts=False`` (elementwise nests) prefetches only spread over chunks: the hardware
    prefetcher streams whole vectorized passes, and the burst made the LSTM gates, split
    into two passes per row (:func:`_splits_chain`), slower than no prefetch
    (measurements: ``docs/performance.md``)."""
    loop = sch.get_loop(sp)
    passes = [s for s in loop.body if isinstance(s, A.For)]
    chunked = [s for s in passes if s.kind is A.ForKind.SERIAL]
    if (len(passes) < 2 or not bursts) and not chunked:
        return
    spread = max(chunked, key=_pass_cost).var if chunked else None
    bufs = [b for b in sch.kernel.inputs if long_rows(b) and sch.reads_rows(sp, b.name)]
    distance = prefetch_distance(bufs)
    for buf in bufs:
        try:
            sch.prefetch_next(
                sp, buf.name, spread=spread, level=1 if spread is None else 2, distance=distance
            )
        except ScheduleError as exc:
            log.debug("no prefetch of %s: %s", buf.name, exc)


def long_rows(buf: A.Buffer) -> bool:
    """Are ``buf``'s rows symbolic or at least :attr:`Choices.prefetch_min_row` elements long?"""
    row = _row_bytes(buf)
    return row is None or row >= choices().prefetch_min_row * _itemsize(buf)


def prefetch_distance(bufs: Sequence[A.Buffer]) -> int:
    """Rows ahead that a row loop prefetches ``bufs`` (see :attr:`Choices.prefetch_ahead_bytes`):
    enough rows of all of them to make up that many bytes, from 1 to
    :attr:`Choices.prefetch_max_rows`; rows of symbolic length count as
    :attr:`Choices.prefetch_min_row` elements."""
    row_bytes = sum(
        choices().prefetch_min_row * _itemsize(b) if (n := _row_bytes(b)) is None else n
        for b in bufs
    )
    if row_bytes <= 0:
        return 1
    return max(1, min(choices().prefetch_max_rows, -(-choices().prefetch_ahead_bytes // row_bytes)))


def _defer_output_pass(sch: Schedule, sp: str) -> None:
    """Where a row's last pass streams an output in chunks right after a costly chunked
    pass (softmax: the scale pass after the exp pass), run it inside the next row's
    costly pass (``defer_last_pass``), so the output's streaming stores overlap that
    pass's arithmetic; the results are unchanged (measurements: ``docs/performance.md``)."""
    body = sch.get_loop(sp).body
    passes = [s for s in body if isinstance(s, A.For)]
    if len(passes) < 2 or passes[-1] is not body[-1]:
        return
    host, last = passes[-2], passes[-1]
    if host.kind is not A.ForKind.SERIAL or _pass_cost(host) <= choices().pipeline_max_host_ops:
        return
    if not any(isinstance(s, A.StreamStore) for s in A.walk_stmts([last])):
        return
    try:
        sch.defer_last_pass(sp, host.var, PIPELINE_CHUNK, PIPELINE_MIN_CHUNKS)
    except ScheduleError as exc:
        log.debug("last pass of %s not deferred: %s", sp, exc)


def _reuse_outputs(sch: Schedule, sp: str, par: bool, stream_min_bytes: int | None) -> None:
    """Keep each row buffer in the output its last reader writes, where legal (softmax
    writes its exp values into ``y`` and scales them in place: one buffer less to walk),
    unless that reader would stream the output (see :func:`_streams`) and the next row
    will be prefetched over a costly pass cut in chunks (:func:`_chunk_costly_pass`,
    parallel rows of at least :attr:`Choices.prefetch_min_row`): an output read back cannot be
    streamed, and an ordinary store first reads the line from memory. The separate
    streamed row buffer wins where that prefetch runs; without it the in-place row is
    mostly as fast or faster, the streamed one losing most on short rows
    (measurements: ``docs/performance.md``)."""
    prefetched = par and _costly_pass(sch, sp) is not None
    for name in [t.name for t in sch.kernel.temps if t.scope == "local"]:
        readers = sch.readers(name)
        if not readers:
            continue
        if prefetched and _streams(sch, readers[-1], stream_min_bytes):
            log.debug("row buffer %s stays: %s streams its output", name, readers[-1])
            continue
        try:
            sch.reuse_output(name, readers[-1])
        except ScheduleError as exc:
            log.debug("row buffer %s stays: %s", name, exc)


def _fuse_row_passes(sch: Schedule, sp: str) -> None:
    """Merge consecutive passes over a row where legal (an exp pass and the sum pass that
    reads it become one loop), so each row is walked as few times as possible."""
    i = 0
    while True:
        loops = [s for s in sch.get_loop(sp).body if isinstance(s, A.For)]
        if i + 1 >= len(loops):
            return
        try:
            sch.fuse_siblings(loops[i].var, loops[i + 1].var)
        except ScheduleError as exc:
            log.debug("row passes %s and %s stay apart: %s", loops[i].var, loops[i + 1].var, exc)
            i += 1


def _same_extent(ext: A.Expr, lowered: LoweredKernel, group: Group, i: int) -> bool:
    d = group.domain[i]
    want = str(d) if not isinstance(d, int) else str(d)
    got = A.expr_str(ext)
    if isinstance(d, int):
        return got == str(d)
    names = {k: v for k, v in lowered.dim_exprs.items()}
    return any(str(v) == want and got == k for k, v in names.items())


def _merge_digit_dims(sch: Schedule) -> None:
    """Merge the dims of every kernel argument that a fused loop indexes digit by digit
    (:meth:`Schedule.merge_dims`): a reduction over H and W of ``[N, C, H, W]`` runs one
    loop over ``H * W`` and read ``x[n, c, rb // W, rb % W]``, an integer division and
    a modulo per element that kept the loop from vectorizing; on the merged view it reads
    ``x[n, c, rb]`` (measurements: ``docs/performance.md``)."""
    local = [b for b in sch.kernel.temps if b.scope == "local"]
    for buf in [b.name for b in sch.kernel.inputs + sch.kernel.outputs + local]:
        while dims := sch.digit_dims(buf):
            sch.merge_dims(buf, dims[-1])


def _reduce_tree(sch: Schedule, group: Group, par: bool) -> None:
    """Schedule a reduce tree (chained reductions over different axes, see
    ``compiler/fusion/reduce_tree.py``): the leading loops of the last block's nest
    over the rows (the axes no level reduces, which lead every nest) are fused into one
    row loop, every other block moves under it in program order (``compute_at``: each
    level's result shrinks to a row buffer, or a register, unless it is an output),
    the row loop runs in parallel and every innermost loop is vectorized."""
    rows = 0
    while rows < len(group.domain) and rows not in group.axes:
        rows += 1
    blocks = [n for n in sch.blocks() if sch.get_block(n).reduce_of is None]
    anchor = blocks[-1]
    loops = _nest_loops(sch, anchor)
    if rows == 0 or len(loops) < rows:
        raise ScheduleError("reduce_tree", anchor, f"its nest has no {rows} row loops")
    row = sch.fuse(loops[:rows]) if rows > 1 else loops[0]
    for name in reversed(blocks[:-1]):
        if row not in _nest_loops(sch, name):
            sch.compute_at(name, row)
    if par:
        sch.parallel(row)
    for name in sch.blocks():
        loops = _nest_loops(sch, name)
        if (
            len(loops) >= 2
            and sch.get_loop(loops[-1]).kind is A.ForKind.SERIAL
            and not _single_iteration(sch, loops[-1])
        ):
            sch.vectorize(loops[-1], allow_reassoc=True)


def _column_reduce(sch: Schedule, lowered: LoweredKernel, group: Group) -> None:
    """Every nest runs its outer loop in parallel; a reduction whose input is contiguous
    along spatial axes (softmax over the middle axis of ``[N, 1000, 64]``, a mean over
    C of ``[N, C, H, W]``) first moves its reduce loops outside those axes and
    vectorizes them (:func:`_reduce_outside_inner_axes`). A 2-D column reduction may
    instead be cut in row runs and column tiles (:func:`_tiled_column_reduce`)."""
    if _tiled_column_reduce(sch):
        return
    for name in sch.blocks():
        if _is_reduce_update(sch.get_block(name)):
            try:
                _reduce_outside_inner_axes(sch, name)
            except ScheduleError as exc:
                log.debug("column reduce: %s keeps its loop order: %s", name, exc)
    for name in sch.blocks():
        loops = _nest_loops(sch, name)
        if loops and not _single_iteration(sch, loops[0]):
            try:
                sch.parallel(loops[0])
            except ScheduleError as exc:
                log.debug("column reduce: %s stays serial: %s", name, exc)


def _tiled_column_reduce(sch: Schedule) -> bool:
    """Schedule a reduction over the rows of a 2-D input contiguous along its columns
    (the sum over axis 0 of ``[N, C]``) with :attr:`Choices.column_partials` runs of
    rows (``rfactor(..., partials="outer")``: each run's partial sums one parallel
    iteration, then the partials added up, columns vectorized) and columns in tiles of
    :attr:`Choices.column_tile` elements (the tile loop outside the rows: a tile's
    accumulators stay in registers; in parallel when the rows are not cut). Returns
    False (the schedule unchanged) when both choices are off or the group is not such a
    reduction; raises ScheduleError when a step fails (the caller falls back)."""
    parts, tile = choices().column_partials, choices().column_tile
    updates = [n for n in sch.blocks() if _is_reduce_update(sch.get_block(n))]
    if (parts <= 1 and tile <= 0) or len(updates) != 1:
        return False
    (name,) = updates
    b = sch.get_block(name)
    loops = _nest_loops(sch, name)
    kinds = [iv.kind for iv in b.iter_vars]
    if kinds != ["spatial", "reduce"] or len(loops) != 2 or _inner_spatial(b) != [0]:
        return False
    col, row = loops
    if parts > 1:
        p, run = sch.rfactor(name, row, parts, partials="outer")
        (rf,) = [n for n in sch.blocks() if p in sch.get_loops(n)]
        col = _nest_loops(sch, rf)[0]
        inner = _column_tiles(sch, col, tile)
        sch.reorder([p, *inner[:-1], run, inner[-1]])
        sch.parallel(p)
        sch.vectorize(inner[-1])
    else:
        inner = _column_tiles(sch, col, tile)
        sch.reorder([*inner[:-1], row, inner[-1]])
        if len(inner) > 1:
            sch.parallel(inner[0])
        sch.vectorize(inner[-1])
    for n in sch.blocks():
        if n == name and parts <= 1 or (parts > 1 and n == f"{name}_rf"):
            continue
        nest = _nest_loops(sch, n)
        if len(nest) == 2:  # the partials' init and their sum: the columns innermost
            sch.reorder([nest[1], nest[0]])
            sch.vectorize(nest[0])
        elif nest and not _single_iteration(sch, nest[0]):
            sch.parallel(nest[0])
    return True


def _column_tiles(sch: Schedule, col: str, tile: int) -> list[str]:
    """``col`` split in tiles of ``tile`` elements (``[tiles, within]``), or ``[col]``
    when ``tile`` is 0 or not shorter than its static extent."""
    ext = sch.get_loop(col).extent
    if tile <= 0 or (isinstance(ext, A.Const) and int(ext.value) <= tile):
        return [col]
    return sch.split(col, [-1, tile])


def _small_outputs(sch: Schedule, most: int) -> bool:
    """Whether every kernel output has static dims and at most ``most`` elements."""
    for o in sch.kernel.outputs:
        if not all(isinstance(d, A.Const) for d in o.shape):
            return False
        if int(np.prod([int(d.value) for d in o.shape], dtype=np.int64)) > most:
            return False
    return True


def _full_reduce(sch: Schedule) -> bool:
    """Schedule a group whose every output is a scalar reduced from many elements (a
    ``ReduceSum`` of ``[N, 1024]`` to one value; or a few elements, up to
    :attr:`Choices.rfactor_max_outputs`) in two steps: each reduction's widest
    reduce loop is cut into :attr:`Choices.rfactor_partials` contiguous runs
    (``rfactor(..., partials="outer")``, :func:`_rfactor_loop`) whose loop moves
    outermost and runs in parallel, the innermost loop vectorized; then the partials are
    reduced into the output. Without it the whole reduction ran on one thread. Returns
    False (the schedule unchanged) when the group is not such a reduction; raises
    ScheduleError when a step fails (the caller falls back)."""
    updates = [n for n in sch.blocks() if _is_reduce_update(sch.get_block(n))]
    small = _small_outputs(sch, choices().rfactor_max_outputs)
    if not updates or not small or choices().rfactor_partials <= 1:
        return False
    for name in updates:
        loop, factor = _rfactor_loop(sch, name)
        p, _ = sch.rfactor(name, loop, factor, partials="outer")
        (rf,) = [n for n in sch.blocks() if p in sch.get_loops(n)]
        loops = _nest_loops(sch, rf)
        if loops[0] != p:
            sch.reorder([p] + [v for v in loops if v != p])
        sch.parallel(p)
    for name in sch.blocks():
        loops = _nest_loops(sch, name)
        if loops and sch.get_loop(loops[-1]).kind is A.ForKind.SERIAL:
            sch.vectorize(loops[-1], allow_reassoc=True)
    return True


def _rfactor_loop(sch: Schedule, block: str) -> tuple[str, int]:
    """The reduce loop of ``block`` to cut in runs, and how many: the outermost whose
    extent is symbolic or at least :attr:`Choices.rfactor_partials` (that many runs),
    else the longest (as many runs as it has iterations)."""
    b = sch.get_block(block)
    direct = {
        x.name
        for x, iv in zip(b.bindings, b.iter_vars)
        if isinstance(x, A.Var) and iv.kind == "reduce"
    }
    loops = [v for v in _nest_loops(sch, block) if v in direct]
    if not loops:
        raise ScheduleError("rfactor", block, "no reduce loop binds an iteration variable directly")
    want = choices().rfactor_partials
    for v in loops:
        ext = sch.get_loop(v).extent
        if not isinstance(ext, A.Const) or int(ext.value) >= want:
            return v, want
    v = max(loops, key=lambda x: int(sch.get_loop(x).extent.value))  # type: ignore[attr-defined]
    return v, int(sch.get_loop(v).extent.value)  # type: ignore[attr-defined]


def _single_iteration(sch: Schedule, loop: str) -> bool:
    """Whether ``loop`` has the static extent 1 (a batch of one). Such a loop is not made
    parallel: it has nothing to share, and numba lowers a parallel loop's body as a
    separate function in which the loops of a column reduction no longer vectorize
    (measurements: ``docs/performance.md``)."""
    ext = sch.get_loop(loop).extent
    return isinstance(ext, A.Const) and int(ext.value) == 1


def _is_reduce_update(b: A.Block) -> bool:
    return b.reduce_of is None and any(iv.kind == "reduce" for iv in b.iter_vars)


def _inner_spatial(b: A.Block) -> list[int]:
    """Positions of ``b``'s spatial iteration variables that every load of a
    reduced element indexes only after its last reduce variable (the axes the input is
    contiguous along); empty when any such load indexes them elsewhere."""
    red = {iv.name for iv in b.iter_vars if iv.kind == "reduce"}
    spatial = [i for i, iv in enumerate(b.iter_vars) if iv.kind != "reduce"]
    inner = set(spatial)
    for st in A.walk_stmts(b.body):
        if not isinstance(st, A.Store):
            continue
        for ld in A.loads(st.value):
            uses = [A.free_vars(i) for i in ld.indices]
            last = max((k for k, u in enumerate(uses) if u & red), default=None)
            if last is None:
                continue
            for i in spatial:
                if any(b.iter_vars[i].name in u for u in uses[: last + 1]):
                    inner.discard(i)
    return sorted(inner)


def _reduce_outside_inner_axes(sch: Schedule, block: str) -> None:
    """Loop order ``outer spatial | reduce | inner spatial`` for reduction ``block``, the
    inner spatial loops fused and vectorized: each reduce step then adds a contiguous
    run of the input to a row of accumulators, instead of the innermost reduce loop
    striding through memory with one scalar accumulator (softmax over axis 1 of
    [32, 1000, 64]: each element was a load 256 bytes from the last)."""
    b = sch.get_block(block)
    loops = _nest_loops(sch, block)
    inner = _inner_spatial(b)
    if not inner or len(loops) != len(b.iter_vars):
        return
    red = [i for i, iv in enumerate(b.iter_vars) if iv.kind == "reduce"]
    outer = [i for i in range(len(loops)) if i not in inner and i not in red]
    sch.reorder([loops[i] for i in outer + red + inner])
    inner_loops = [loops[i] for i in inner]
    vec = sch.fuse(inner_loops) if len(inner_loops) > 1 else inner_loops[0]
    sch.vectorize(vec)
    outer_loops = [loops[i] for i in outer]
    if len(outer_loops) > 1:
        sch.fuse(outer_loops)


# ---------------------------------------------------------------------------------
# streaming stores
# ---------------------------------------------------------------------------------


def stream_interleave(vector_registers: int) -> int:
    """:attr:`Choices.stream_interleave` on a target with 32 or more vector registers, else 1."""
    return choices().stream_interleave if vector_registers >= 32 else 1


#: approximate vector instructions per element of the costly operations (vmath's
#: functions, division and square root); every other operation counts 1. Counted in the
#: float32 loop ``y = f(x)`` the LLVM backend compiles for AVX-512 (its arithmetic: not
#: the loads, stores, register copies and loop control; a division 4), where exp (16),
#: tanh and sigmoid (22-24) agree with the table; float32 erf counts 29 since its own
#: form (``llvm/vmath/erf.py``; the old one counted 35, priced 26). Measurements:
#: ``docs/performance.md`` (the erf cost).
_OP_COST = {
    "fence": 0,
    "exp": 16,
    "log": 20,
    "log1p": 22,
    "tanh": 24,
    "sigmoid": 24,
    "erf": 29,
    "sin": 30,
    "cos": 30,
    "tan": 40,
    "asin": 40,
    "acos": 40,
    "atan": 40,
    "sinh": 30,
    "cosh": 30,
    "asinh": 40,
    "acosh": 40,
    "atanh": 40,
    "sqrt": 4,
    "/": 4,
    "pow": 45,
}


def element_cost(b: A.Block) -> int:
    """Approximate vector instructions per element of ``b``'s stores, counting only the
    part that varies along the block's last iteration variable (a row scalar such as
    ``1 / sqrt(mean + eps)`` is computed once per row)."""
    if not b.iter_vars:
        return 0
    inner = b.iter_vars[-1].name
    cost = 0

    def visit(e: A.Expr) -> None:
        nonlocal cost
        if not A.uses_var(e, inner):  # nor do its loads' indices, which are inside it
            return
        if isinstance(e, (A.Un, A.Bin)):
            cost += _OP_COST.get(e.op, 1)
        elif isinstance(e, (A.Select, A.Cast)):
            cost += 1
        for c in A.children(e):
            visit(c)

    for st in A.walk_stmts(b.body):
        if isinstance(st, A.Store):
            visit(st.value)
    return cost


def _streams(sch: Schedule, block: str, min_bytes: int | None, max_ops: int | None = None) -> bool:
    """Whether ``block`` is the cheap (at most ``max_ops`` per element, default
    :attr:`Choices.stream_max_ops`), only accessor of an output that may reach
    ``min_bytes`` (the candidates of :func:`_stream_outputs`)."""
    if min_bytes is None:
        return False
    max_ops = choices().stream_max_ops if max_ops is None else max_ops
    b = sch.get_block(block)
    outs = {o.name: o for o in sch.kernel.outputs}
    stores = [st for st in A.walk_stmts(b.body) if isinstance(st, A.Store)]
    if len(stores) != 1 or stores[0].buffer not in outs:
        return False
    out = outs[stores[0].buffer]
    if sch.writers(out.name) != [block] or sch.readers(out.name):
        return False
    itemsize = np.dtype(out.dtype).itemsize
    if itemsize not in (4, 8) or element_cost(b) > max_ops:
        return False
    if _stream_chunk(sch, block) * itemsize < choices().stream_min_run_bytes:
        return False
    row = out.shape[-1] if out.shape else A.Const(1)
    if isinstance(row, A.Const) and int(row.value) * itemsize % choices().line_bytes:
        return False  # chunks off the cache lines: the streaming stores would not apply
    size = A.prod(list(out.shape))
    return not isinstance(size, A.Const) or int(size.value) * itemsize >= min_bytes


def _stream_chunk(sch: Schedule, block: str) -> int:
    """:attr:`Choices.stream_chunk`, or the static extent of ``block``'s element loop when that is
    shorter: a chunk longer than the row only adds guarded iterations that do nothing (a
    row of 16 elements ran 128 iterations, 112 of them masked off)."""
    loops = sch.get_loops(block)
    extent = sch.get_loop(loops[-1]).extent if loops else None
    if isinstance(extent, A.Const) and 0 < int(extent.value) < choices().stream_chunk:
        return int(extent.value)
    return choices().stream_chunk


def _stream_outputs(sch: Schedule, min_bytes: int, heavy_min_bytes: int | None) -> list[str]:
    """Stream every output that a cheap block (:attr:`Choices.stream_max_ops`) writes once it
    reaches ``min_bytes``; with ``heavy_min_bytes`` also those of blocks costing
    :attr:`Choices.stream_min_ops_heavy` to :attr:`Choices.stream_max_ops_heavy` once they reach it, from
    the registers where it can (:func:`_store_direct`). Returns the streamed element
    loops."""
    loops = []
    for name in sch.blocks():
        at_least, max_ops = min_bytes, choices().stream_max_ops
        cost = element_cost(sch.get_block(name))
        heavy = cost > choices().stream_max_ops
        if heavy:
            if heavy_min_bytes is None or cost < choices().stream_min_ops_heavy:
                continue
            at_least, max_ops = heavy_min_bytes, choices().stream_max_ops_heavy
        if not _streams(sch, name, at_least, max_ops):
            continue
        chunk = _stream_chunk(sch, name)
        try:
            direct = _store_direct(sch, name, chunk, at_least) if heavy else None
            loops.append(direct or sch.stream_output(name, chunk, at_least)[-1])
        except ScheduleError as exc:
            log.debug("output of %s not streamed: %s", name, exc)
    return loops


def _store_direct(sch: Schedule, block: str, chunk: int, min_bytes: int) -> str | None:
    """Stream ``block``'s output straight from the registers (``store_nontemporal``) in
    vectorized chunks of ``chunk`` (the staged chunks of ``stream_output``, over which
    the next row is prefetched): where the block's element loop is vectorized with a
    static extent that ``chunk`` divides and the output is float32 or float64. Returns
    the chunks' element loop, or None (the store left as it was, for the staged stream;
    the loop may be cut in chunks already).

    The stage's store and load per element cost a compute-heavy block (see
    :attr:`Choices.stream_max_ops`), which storing from the registers saves; the cheap
    output passes of RMSNorm and LayerNorm gain nothing this way, so cheap blocks keep
    the staged stream (measurements: ``docs/performance.md``)."""
    (st,) = [s for s in A.walk_stmts(sch.get_block(block).body) if isinstance(s, A.Store)]
    loops = sch.get_loops(block)
    f = sch.get_loop(loops[-1]) if loops else None
    if (
        sch.kernel.buffer(st.buffer).dtype not in ("float32", "float64")
        or f is None
        or f.kind is not A.ForKind.VECTORIZED
        or not isinstance(f.extent, A.Const)
        or int(f.extent.value) % chunk
    ):
        return None
    inner = f.var
    if int(f.extent.value) > chunk:
        inner = sch.split(f.var, [None, chunk])[-1]
        sch.vectorize(inner, allow_reassoc=False)
    try:
        sch.store_nontemporal(block, min_bytes)
    except ScheduleError as exc:
        log.debug("output of %s not stored from the registers: %s", block, exc)
        return None
    return inner
